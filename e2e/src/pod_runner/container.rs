//! Starting one container as a process, the part runc plays for a real
//! kubelet: the process joins its pod's network namespace, gets a mount
//! namespace of its own whose root is the container's copy of the image's
//! root filesystem with the pod's volumes, `/proc`, a few `/dev` nodes and
//! the kubelet-managed `/etc/hosts`, `/etc/resolv.conf` and
//! `/etc/hostname` bind-mounted in (read-only where the spec says so, the
//! whole root when `readOnlyRootFilesystem`), then `chroot`s into it,
//! drops to the container's user and groups, sets `no_new_privs`, and
//! executes the entrypoint with exactly the container's environment.
//!
//! Left out: PID, IPC and UTS namespaces (the process sees the host's
//! processes and hostname), cgroups (resource limits are not enforced),
//! seccomp filters and capability sets of containers that stay root (a
//! non-root user has no capabilities once it drops to its uid, which is
//! what the manifests tested here ask for), AppArmor/SELinux.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// A bind mount into the container.
#[derive(Clone, Debug)]
pub struct Mount {
    /// Host path (a file or a folder).
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: String,
    pub read_only: bool,
}

/// Everything a container start needs, resolved.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The container's own root filesystem (a copy of the image's).
    pub rootfs: PathBuf,
    /// `/run/netns/<name>` of the pod.
    pub netns: String,
    /// Entrypoint and arguments, already expanded; `argv[0]` is an
    /// absolute path inside the container.
    pub argv: Vec<String>,
    /// `NAME=value`, the whole environment.
    pub env: Vec<String>,
    pub working_dir: String,
    pub uid: u32,
    pub gid: u32,
    pub supplemental_groups: Vec<u32>,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub mounts: Vec<Mount>,
}

/// Host files that become the container's `/dev` nodes.
const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/random",
    "/dev/urandom",
    "/dev/full",
];

/// Creates the mount points the launch needs inside `rootfs` (the
/// container's own copy, so the image is not touched) and starts the
/// container, its output appended to `log`.
pub fn spawn(launch: &Launch, log: std::fs::File) -> anyhow::Result<tokio::process::Child> {
    let Some(program) = launch.argv.first() else {
        bail!("the container has neither an entrypoint nor a command");
    };
    if !program.starts_with('/') {
        bail!(
            "{program}: only absolute entrypoints are supported (the image has no shell to search PATH with)"
        );
    }
    let root = &launch.rootfs;
    let inside = |target: &str| root.join(target.trim_start_matches('/'));
    if !inside(program).is_file() {
        bail!("{program} is not a file in the image");
    }
    // Mount points, created as a runtime creates them.
    let mut binds: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
    for device in DEVICES {
        let target = inside(device);
        touch(&target)?;
        binds.push((PathBuf::from(device), target, false));
    }
    for mount in &launch.mounts {
        let target = inside(&mount.target);
        if mount.source.is_dir() {
            std::fs::create_dir_all(&target)
                .with_context(|| format!("create mount point {}", target.display()))?;
        } else {
            touch(&target)?;
        }
        binds.push((mount.source.clone(), target, mount.read_only));
    }
    let proc_dir = inside("/proc");
    std::fs::create_dir_all(&proc_dir)?;
    std::fs::create_dir_all(inside(&launch.working_dir))?;

    // Everything the child touches after fork is prepared here: between
    // fork and exec only system calls happen, no allocation.
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).context("path with a NUL byte");
    let netns = std::fs::File::open(&launch.netns)
        .with_context(|| format!("open the pod network namespace {}", launch.netns))?;
    let root_c = c(root)?;
    let proc_c = c(&proc_dir)?;
    let binds_c: Vec<(CString, CString, bool)> = binds
        .iter()
        .map(|(source, target, ro)| Ok((c(source)?, c(target)?, *ro)))
        .collect::<anyhow::Result<_>>()?;
    let workdir_c = CString::new(launch.working_dir.as_str())?;
    let slash = CString::new("/")?;
    let proc_type = CString::new("proc")?;
    let groups: Vec<libc::gid_t> = launch.supplemental_groups.clone();
    let (uid, gid) = (launch.uid, launch.gid);
    let read_only_root = launch.read_only_root;
    let no_new_privileges = launch.no_new_privileges;

    let mut command = tokio::process::Command::new(program);
    command
        .args(&launch.argv[1..])
        .env_clear()
        .envs(launch.env.iter().filter_map(|e| e.split_once('=')))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    // `program` is looked up after the chroot: execve takes the path as
    // given, inside the new root. The namespace's descriptor stays open in
    // this process until the child has forked (close-on-exec ends the
    // child's copy).
    let netns_fd = {
        use std::os::fd::AsRawFd as _;
        netns.as_raw_fd()
    };
    // SAFETY: the closure runs in the forked child before exec and makes
    // only system calls on data prepared above (no allocation, no locks).
    unsafe {
        command.pre_exec(move || {
            let check = |result: libc::c_int| {
                if result == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            // Dies with the runner rather than outliving it.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
            check(libc::setns(netns_fd, libc::CLONE_NEWNET))?;
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing mounted here propagates back to the host.
            check(libc::mount(
                std::ptr::null(),
                slash.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // The root a mount of its own, so it can be made read-only.
            check(libc::mount(
                root_c.as_ptr(),
                root_c.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            for (source, target, read_only) in &binds_c {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                if *read_only {
                    check(libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
            }
            check(libc::mount(
                proc_type.as_ptr(),
                proc_c.as_ptr(),
                proc_type.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            if read_only_root {
                check(libc::mount(
                    std::ptr::null(),
                    root_c.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                ))?;
            }
            check(libc::chroot(root_c.as_ptr()))?;
            check(libc::chdir(workdir_c.as_ptr()))?;
            check(libc::setgroups(groups.len(), groups.as_ptr()))?;
            check(libc::setresgid(gid, gid, gid))?;
            check(libc::setresuid(uid, uid, uid))?;
            if no_new_privileges {
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .with_context(|| format!("start {program}"))?;
    drop(netns);
    Ok(child)
}

fn touch(path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    if !path.exists() {
        std::fs::write(path, b"").with_context(|| format!("create {}", path.display()))?;
    }
    Ok(())
}

/// A copy of an unpacked image for one container: folders made anew, files
/// hard-linked (the image's files are root-owned and read-only to the
/// non-root users containers run as), symlinks copied.
pub fn clone_rootfs(image: &Path, dest: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dest).with_context(|| format!("create {}", dest.display()))?;
    std::fs::set_permissions(dest, std::fs::metadata(image)?.permissions())?;
    for entry in std::fs::read_dir(image).with_context(|| format!("read {}", image.display()))? {
        let entry = entry?;
        let source = entry.path();
        let target = dest.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&source)?;
        if meta.is_dir() {
            clone_rootfs(&source, &target)?;
        } else if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else {
            std::fs::hard_link(&source, &target)
                .or_else(|_| std::fs::copy(&source, &target).map(|_| ()))?;
        }
    }
    Ok(())
}
