//! The node's images: what the container runtime would pull, found here
//! instead of in a registry.
//!
//! Two kinds of entries:
//! - **OCI layouts**, such as the one `hack/image.sh` writes for tenantry:
//!   a pod's `image` matches when its repository and tag name the layout's
//!   image and, if it pins a digest (`…@sha256:…`, as a release does), the
//!   digest is the layout's index digest. A different digest does not
//!   match: the pull fails as it would against a registry that has
//!   another build under that tag.
//! - **Upstream programs built here from their Go modules**, for images
//!   whose Dockerfile puts one static binary on a distroless base (the
//!   Cluster API manager's `/manager`, user 65532): the root filesystem is
//!   that binary at the same path plus CA roots, the entrypoint and user are
//!   the Dockerfile's. The reference must name the exact version the binary
//!   was built from.
//!
//! Root filesystems are unpacked once per image into the cache folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context as _, bail};
use tenantry_image::Platform;
use tenantry_image::read::{Layout, RuntimeConfig};

/// An image reference split into its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `registry/path/name`, without tag or digest.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(text: &str) -> Self {
        let (name, digest) = match text.split_once('@') {
            Some((name, digest)) => (name, Some(digest.to_string())),
            None => (text, None),
        };
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match name[slash..].split_once(':') {
            Some((_, tag)) => (
                name[..slash + name[slash..].find(':').expect("found")].to_string(),
                Some(tag.to_string()),
            ),
            None => (name.to_string(), None),
        };
        Self {
            repository,
            tag,
            digest,
        }
    }
}

/// An image ready to run: its unpacked root filesystem and how it starts.
#[derive(Clone, Debug)]
pub struct PulledImage {
    pub rootfs: PathBuf,
    pub config: RuntimeConfig,
    /// `repository@digest`, as a container status's `imageID`.
    pub image_id: String,
}

enum Source {
    Layout {
        layout: PathBuf,
        tag: Option<String>,
    },
    Binary {
        binary: PathBuf,
        entrypoint: String,
        user: String,
    },
}

struct Entry {
    repository: String,
    tag: String,
    source: Source,
}

/// The images this node can run.
pub struct ImageStore {
    cache: PathBuf,
    entries: Vec<Entry>,
    pulled: Mutex<BTreeMap<String, PulledImage>>,
}

impl ImageStore {
    /// An empty store unpacking into `cache`.
    pub fn new(cache: &Path) -> Self {
        Self {
            cache: cache.to_path_buf(),
            entries: Vec::new(),
            pulled: Mutex::default(),
        }
    }

    /// Serves `repository:tag` (and `…@<index digest>`) from an OCI layout,
    /// the image tagged `layout_tag` in it (the only one when `None`).
    pub fn add_layout(
        &mut self,
        repository: &str,
        tag: &str,
        layout: &Path,
        layout_tag: Option<&str>,
    ) {
        self.entries.push(Entry {
            repository: repository.to_string(),
            tag: tag.to_string(),
            source: Source::Layout {
                layout: layout.to_path_buf(),
                tag: layout_tag.map(str::to_string),
            },
        });
    }

    /// Serves `repository:tag` as `binary` at `entrypoint`, run as `user`,
    /// on CA roots: an upstream image whose Dockerfile copies one static
    /// binary onto distroless.
    pub fn add_binary(
        &mut self,
        repository: &str,
        tag: &str,
        binary: &Path,
        entrypoint: &str,
        user: &str,
    ) {
        self.entries.push(Entry {
            repository: repository.to_string(),
            tag: tag.to_string(),
            source: Source::Binary {
                binary: binary.to_path_buf(),
                entrypoint: entrypoint.to_string(),
                user: user.to_string(),
            },
        });
    }

    /// The image a pod names, unpacked. The error reads like a registry's
    /// answer to a failed pull.
    pub fn pull(&self, image: &str) -> anyhow::Result<PulledImage> {
        if let Some(pulled) = self.pulled.lock().expect("pulled lock").get(image) {
            return Ok(pulled.clone());
        }
        let reference = Reference::parse(image);
        let tag = reference.tag.clone().unwrap_or_else(|| "latest".into());
        let entry = self
            .entries
            .iter()
            .find(|e| e.repository == reference.repository && e.tag == tag)
            .with_context(|| format!("{image}: not found (manifest unknown)"))?;
        let pulled = match &entry.source {
            Source::Layout { layout, tag } => {
                let layout_dir = layout;
                let layout = Layout::open(layout_dir)?;
                let resolved = layout.resolve(tag.as_deref(), &Platform::host())?;
                if let Some(digest) = &reference.digest
                    && *digest != resolved.digest
                {
                    bail!(
                        "{image}: not found (manifest unknown): the build under {}:{} is {}",
                        entry.repository,
                        entry.tag,
                        resolved.digest
                    );
                }
                let rootfs = self.unpacked(&resolved.manifest_digest, |dir| {
                    layout.unpack(&resolved, dir)
                })?;
                PulledImage {
                    rootfs,
                    config: resolved.config.clone(),
                    image_id: format!("{}@{}", entry.repository, resolved.digest),
                }
            }
            Source::Binary {
                binary,
                entrypoint,
                user,
            } => {
                if reference.digest.is_some() {
                    bail!("{image}: only tags are served for images built from their Go module");
                }
                let bytes =
                    std::fs::read(binary).with_context(|| format!("read {}", binary.display()))?;
                let digest = tenantry_image::digest_of(&bytes);
                let rootfs = self.unpacked(&digest, |dir| {
                    let path = dir.join(entrypoint.trim_start_matches('/'));
                    std::fs::create_dir_all(path.parent().expect("a parent"))?;
                    std::fs::write(&path, &bytes)?;
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
                    let roots = dir.join(tenantry_image::roots::BUNDLE_PATH);
                    std::fs::create_dir_all(roots.parent().expect("a parent"))?;
                    std::fs::write(roots, tenantry_image::roots::pem_bundle())?;
                    Ok(())
                })?;
                PulledImage {
                    rootfs,
                    config: RuntimeConfig {
                        entrypoint: vec![entrypoint.clone()],
                        user: user.clone(),
                        working_dir: "/".into(),
                        ..Default::default()
                    },
                    image_id: format!("{}@{digest}", entry.repository),
                }
            }
        };
        self.pulled
            .lock()
            .expect("pulled lock")
            .insert(image.to_string(), pulled.clone());
        Ok(pulled)
    }

    /// `cache/<digest>/rootfs`, filled by `fill` the first time.
    fn unpacked(
        &self,
        digest: &str,
        fill: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<PathBuf> {
        let dir = self.cache.join(digest.replace(':', "-"));
        let rootfs = dir.join("rootfs");
        if rootfs.is_dir() {
            return Ok(rootfs);
        }
        std::fs::create_dir_all(&dir)?;
        let partial = tempfile::Builder::new()
            .prefix("rootfs-")
            .tempdir_in(&dir)
            .context("create an unpack folder")?;
        fill(partial.path())?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(partial.path(), std::fs::Permissions::from_mode(0o755))?;
        let partial = partial.keep();
        // Another test may have unpacked the same image meanwhile.
        if std::fs::rename(&partial, &rootfs).is_err() {
            let _ = std::fs::remove_dir_all(&partial);
        }
        Ok(rootfs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_tag_and_digest() {
        let r = Reference::parse("ghcr.io/tenantry/tenantry:v0.1.0@sha256:abc");
        assert_eq!(r.repository, "ghcr.io/tenantry/tenantry");
        assert_eq!(r.tag.as_deref(), Some("v0.1.0"));
        assert_eq!(r.digest.as_deref(), Some("sha256:abc"));
        let r = Reference::parse("registry.local:5000/manager");
        assert_eq!(r.repository, "registry.local:5000/manager");
        assert_eq!(r.tag, None);
        let r = Reference::parse("registry.local:5000/manager:v1");
        assert_eq!(r.repository, "registry.local:5000/manager");
        assert_eq!(r.tag.as_deref(), Some("v1"));
    }
}
