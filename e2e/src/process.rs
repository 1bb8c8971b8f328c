//! Child processes that never outlive the harness.
//!
//! Every process is stopped when its [`ManagedProcess`] is dropped, including
//! during a panic. If the test process itself dies without unwinding
//! (SIGKILL, abort), Linux's parent-death signal kills the children: it fires
//! when the *thread* that forked the child exits, so all children are forked
//! from one spawner thread that lives as long as the process.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;

/// A running child process whose output goes to a log file.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
    exited: Option<ExitStatus>,
}

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("process-spawner".into())
            .spawn(move || {
                for mut request in rx {
                    let _ = request.reply.send(request.command.spawn());
                }
            })
            .expect("spawn the process-spawner thread");
        Mutex::new(tx)
    })
}

impl ManagedProcess {
    /// Starts `command` with stdout and stderr appended to `log_path`.
    pub fn spawn(name: &str, mut command: Command, log_path: &Path) -> anyhow::Result<Self> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("open log file {}", log_path.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Own process group: a Ctrl-C in the terminal reaches the harness,
            // which then stops its children in order.
            .process_group(0);
        let parent = std::process::id();
        // SAFETY: prctl and getppid are async-signal-safe; nothing allocates.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let (reply, result) = mpsc::channel();
        spawner()
            .lock()
            .expect("spawner lock")
            .send(SpawnRequest { command, reply })
            .context("process-spawner thread is gone")?;
        let child = result
            .recv()
            .context("process-spawner thread is gone")?
            .with_context(|| format!("start {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log_path: log_path.to_owned(),
            exited: None,
        })
    }

    /// The process name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operating-system process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where its output goes.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The exit status if the process has ended (without blocking).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_of_file(&self.log_path, lines).unwrap_or_else(|e| format!("(cannot read log: {e})"))
    }

    /// Asks the process to stop (SIGTERM), waits up to `grace`, then kills it.
    pub fn stop(&mut self, grace: Duration) {
        if self.exit_status().is_some() {
            return;
        }
        // SAFETY: plain kill(2) on our own child's pid, which has not been reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if self.exit_status().is_some() {
            return;
        }
        let _ = self.child.kill();
        self.exited = self.child.wait().ok();
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- last lines of {} (pid {}, full log: {}) ----\n{}",
                self.name,
                self.child.id(),
                self.log_path.display(),
                self.log_tail(40)
            );
        }
        self.kill();
    }
}

fn tail_of_file(path: &Path, lines: usize) -> io::Result<String> {
    const MAX_BYTES: u64 = 64 * 1024;
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}

/// Whether a process with this pid exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The pids of the live direct children of process `parent`.
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut children = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return children;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name: state, ppid, ...
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && state != "Z" {
            children.push(pid);
        }
    }
    children
}

/// A child process that is started again whenever it exits, as a
/// Deployment's pod restarts: for upstream programs that leave on purpose
/// and expect a restart (KubeVirt's virt-controller when it loses its Lease
/// or when CDI's CRDs change). Each restart is noted in its log. Dropping it
/// stops the process for good.
pub struct Supervised {
    state: std::sync::Arc<Mutex<SupervisedState>>,
    task: tokio::task::JoinHandle<()>,
}

struct SupervisedState {
    process: ManagedProcess,
    restarts: u32,
    stopped: bool,
}

impl std::fmt::Debug for Supervised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().expect("supervised state");
        f.debug_struct("Supervised")
            .field("name", &state.process.name)
            .field("pid", &state.process.pid())
            .field("restarts", &state.restarts)
            .finish()
    }
}

impl Supervised {
    /// How long it waits before starting an exited process again (a pod's
    /// first restart back-off is 10 s; the harness need not wait that long).
    const RESTART_DELAY: Duration = Duration::from_secs(1);

    /// Takes over `process`, already started from `command()`, and starts
    /// `command()` again whenever it exits. Needs a Tokio runtime.
    pub fn watch(process: ManagedProcess, command: impl Fn() -> Command + Send + 'static) -> Self {
        let state = std::sync::Arc::new(Mutex::new(SupervisedState {
            process,
            restarts: 0,
            stopped: false,
        }));
        let watched = state.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let exited = {
                    let mut state = watched.lock().expect("supervised state");
                    if state.stopped {
                        return;
                    }
                    state.process.exit_status()
                };
                let Some(status) = exited else { continue };
                tokio::time::sleep(Self::RESTART_DELAY).await;
                let mut state = watched.lock().expect("supervised state");
                if state.stopped {
                    return;
                }
                let (name, log_path) = (state.process.name.clone(), state.process.log_path.clone());
                note_in_log(
                    &log_path,
                    &format!("harness: {name} exited ({status}); starting it again"),
                );
                match ManagedProcess::spawn(&name, command(), &log_path) {
                    Ok(process) => {
                        state.process = process;
                        state.restarts += 1;
                    }
                    Err(error) => {
                        note_in_log(
                            &log_path,
                            &format!("harness: cannot start {name} again: {error:#}"),
                        );
                    }
                }
            }
        });
        Self { state, task }
    }

    /// How often it was started again.
    pub fn restarts(&self) -> u32 {
        self.state.lock().expect("supervised state").restarts
    }

    /// The last `lines` lines of its log (all runs).
    pub fn log_tail(&self, lines: usize) -> String {
        self.state
            .lock()
            .expect("supervised state")
            .process
            .log_tail(lines)
    }

    /// The current run's process id.
    pub fn pid(&self) -> u32 {
        self.state.lock().expect("supervised state").process.pid()
    }

    /// Kills the current run (SIGKILL), as a crash would: it is started again.
    pub fn kill(&self) {
        self.state.lock().expect("supervised state").process.kill();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.task.abort();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.stopped = true;
        state.process.kill();
    }
}

fn note_in_log(path: &Path, line: &str) {
    use std::io::Write as _;
    if let Ok(mut log) = File::options().append(true).open(path) {
        let _ = writeln!(log, "{line}");
    }
}

#[cfg(test)]
mod supervised_tests {
    use super::*;

    #[tokio::test]
    async fn an_exited_process_is_started_again_and_stays_stopped_once_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("short.log");
        let command = || {
            let mut command = Command::new("sh");
            command.args(["-c", "echo run"]);
            command
        };
        let first = ManagedProcess::spawn("short", command(), &log).expect("spawn");
        let supervised = Supervised::watch(first, command);
        crate::wait::until("two restarts", Duration::from_secs(60), || {
            let restarts = supervised.restarts();
            async move { Ok((restarts >= 2).then_some(())) }
        })
        .await
        .expect("restarted");
        let pid = supervised.pid();
        drop(supervised);
        assert!(!is_alive(pid), "the last run is stopped");
        let text = std::fs::read_to_string(&log).expect("log");
        assert!(text.matches("run\n").count() >= 3, "{text}");
        assert!(text.contains("harness: short exited"), "{text}");
    }
}
