//! `tenantry-image`: the steps of `hack/image.sh` that are not cargo.
//!
//! - `sync-tree` copies the files a commit holds into a fixed folder, so
//!   the release build always compiles from the same path (paths end up in
//!   panic messages; a fixed one keeps the binary independent of where the
//!   repository was cloned);
//! - `ca-roots` prints the CA bundle the image carries;
//! - `build` packs per-platform binaries into a multi-arch OCI image layout
//!   (and an archive of it) and prints the index digest;
//! - `inspect` prints what a layout holds.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tenantry_image::layout::{ImageSpec, LayerFile, LayoutWriter, archive};
use tenantry_image::read::Layout;
use tenantry_image::{Platform, roots};

#[derive(Parser)]
#[command(name = "tenantry-image", about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make DIR hold exactly the files whose relative paths arrive on stdin
    /// (NUL-separated, as `git ls-files -z` prints them), read from the
    /// current folder. Files whose bytes are unchanged keep their
    /// modification time, so cargo rebuilds only what changed.
    SyncTree {
        #[arg(long)]
        to: PathBuf,
    },
    /// Print the CA roots the image carries (PEM).
    CaRoots,
    /// Write the multi-arch image of the given binaries as an OCI layout.
    Build {
        /// The layout folder to write (replaced).
        #[arg(long)]
        out: PathBuf,
        /// Also write the layout as one tar archive (`oci-archive:`).
        #[arg(long)]
        archive: Option<PathBuf>,
        /// `PLATFORM=PATH`, e.g. `linux/amd64=target/…/tenantry`; once per platform.
        #[arg(long = "binary", required = true)]
        binaries: Vec<String>,
        /// The release version, also the tag (`v0.1.0`).
        #[arg(long)]
        version: String,
        /// The commit the binaries were built from.
        #[arg(long)]
        revision: String,
        /// The commit time, seconds since the epoch (SOURCE_DATE_EPOCH).
        #[arg(long)]
        created: i64,
        /// Where the source lives.
        #[arg(long)]
        source: String,
        /// SPDX license expression.
        #[arg(long, default_value = "Apache-2.0")]
        licenses: String,
    },
    /// Print the tags, digest and per-platform config of a layout.
    Inspect { layout: PathBuf },
}

/// Where the binary sits in the image, and how it starts.
const BINARY_PATH: &str = "tenantry";
/// The nonroot user of distroless images, which Kubernetes manifests of
/// controller-runtime providers run as.
const USER: &str = "65532:65532";

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::SyncTree { to } => sync_tree(&to),
        Command::CaRoots => {
            print!("{}", roots::pem_bundle());
            Ok(())
        }
        Command::Build {
            out,
            archive: archive_path,
            binaries,
            version,
            revision,
            created,
            source,
            licenses,
        } => {
            let labels = BTreeMap::from(
                [
                    ("org.opencontainers.image.title", "tenantry".to_string()),
                    (
                        "org.opencontainers.image.description",
                        "Cluster API infrastructure provider for KubeVirt and Proxmox VE, with the Kamaji tenant companion".to_string(),
                    ),
                    ("org.opencontainers.image.source", source),
                    ("org.opencontainers.image.version", version.clone()),
                    ("org.opencontainers.image.revision", revision),
                    ("org.opencontainers.image.licenses", licenses),
                    (
                        "org.opencontainers.image.created",
                        tenantry_image::layout::rfc3339(created),
                    ),
                ]
                .map(|(k, v)| (k.to_string(), v)),
            );
            if out.exists() {
                std::fs::remove_dir_all(&out)
                    .with_context(|| format!("remove {}", out.display()))?;
            }
            let writer = LayoutWriter::create(&out)?;
            let ca_roots = roots::pem_bundle().into_bytes();
            let mut manifests = Vec::new();
            for binary in &binaries {
                let (platform, path) = binary
                    .split_once('=')
                    .with_context(|| format!("--binary {binary:?} is not PLATFORM=PATH"))?;
                let platform = Platform::parse(platform)?;
                let contents =
                    std::fs::read(path).with_context(|| format!("read the binary {path}"))?;
                let spec = ImageSpec {
                    platform: platform.clone(),
                    files: vec![
                        LayerFile {
                            path: BINARY_PATH.into(),
                            mode: 0o755,
                            contents,
                        },
                        LayerFile {
                            path: roots::BUNDLE_PATH.into(),
                            mode: 0o644,
                            contents: ca_roots.clone(),
                        },
                    ],
                    entrypoint: vec![format!("/{BINARY_PATH}")],
                    user: USER.into(),
                    labels: labels.clone(),
                    created,
                    created_by: format!(
                        "hack/image.sh: the tenantry binary and CA roots ({platform})"
                    ),
                };
                manifests.push((platform, writer.image(&spec)?));
            }
            manifests.sort_by(|a, b| a.0.cmp(&b.0));
            let index = writer.finish(&manifests, &labels, &version)?;
            if let Some(path) = archive_path {
                archive(&out, &path, created)?;
            }
            println!("{}", index.digest);
            Ok(())
        }
        Command::Inspect { layout } => {
            let layout = Layout::open(&layout)?;
            for (tag, digest) in layout.tags()? {
                println!("{} {digest}", tag.as_deref().unwrap_or("<untagged>"));
                for platform in ["linux/amd64", "linux/arm64"] {
                    if let Ok(image) = layout.resolve(tag.as_deref(), &Platform::parse(platform)?) {
                        println!(
                            "  {} {} entrypoint={:?} user={}",
                            image.platform,
                            image.manifest_digest,
                            image.config.entrypoint,
                            image.config.user
                        );
                    }
                }
            }
            Ok(())
        }
    }
}

fn sync_tree(to: &Path) -> anyhow::Result<()> {
    let mut list = Vec::new();
    std::io::stdin().read_to_end(&mut list)?;
    let wanted: std::collections::BTreeSet<PathBuf> = list
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
        .collect();
    std::fs::create_dir_all(to)?;
    let mut changed = 0;
    for relative in &wanted {
        if relative.is_absolute() || relative.components().any(|c| c.as_os_str() == "..") {
            anyhow::bail!("{} is not a path inside the tree", relative.display());
        }
        let source = Path::new(".").join(relative);
        let dest = to.join(relative);
        let meta = match std::fs::symlink_metadata(&source) {
            Ok(meta) => meta,
            // Listed by git but deleted in the working tree.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error.into()),
        };
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&source)?;
            if std::fs::read_link(&dest).ok().as_ref() != Some(&target) {
                let _ = std::fs::remove_file(&dest);
                std::os::unix::fs::symlink(&target, &dest)?;
                changed += 1;
            }
            continue;
        }
        let contents = std::fs::read(&source)?;
        if std::fs::read(&dest).ok().as_ref() != Some(&contents) {
            let _ = std::fs::remove_file(&dest);
            std::fs::write(&dest, &contents)?;
            changed += 1;
        }
        std::fs::set_permissions(&dest, meta.permissions())?;
    }
    let removed = remove_unlisted(to, to, &wanted)?;
    eprintln!(
        "{}: {} files, {changed} written, {removed} removed",
        to.display(),
        wanted.len()
    );
    Ok(())
}

/// Removes files under `dir` that are not in `wanted`, and folders left empty.
fn remove_unlisted(
    root: &Path,
    dir: &Path,
    wanted: &std::collections::BTreeSet<PathBuf>,
) -> anyhow::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let relative = path.strip_prefix(root).expect("under root").to_path_buf();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            removed += remove_unlisted(root, &path, wanted)?;
            if std::fs::read_dir(&path)?.next().is_none() {
                std::fs::remove_dir(&path)?;
            }
        } else if !wanted.contains(&relative) {
            std::fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}
