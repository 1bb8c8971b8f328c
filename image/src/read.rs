//! Reading an OCI image layout back: which images it holds, the config of
//! one platform's image, and its root filesystem unpacked into a folder
//! (what a container runtime does before it starts the entrypoint).
//!
//! Layouts whose `index.json` names manifests directly and layouts whose
//! `index.json` names an image index (as [`crate::layout`] writes) are both
//! read. Layers are applied in order with the whiteout rules of the
//! image-spec (`.wh.<name>` removes a path, `.wh..wh..opq` empties a
//! folder).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{Platform, REF_NAME_ANNOTATION, digest_of, media_type};

/// How an image starts: the parts of its config a runtime reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `uid[:gid]`, or empty for root.
    pub user: String,
    /// `NAME=value` entries.
    pub env: Vec<String>,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
}

/// One platform's image in a layout.
#[derive(Clone, Debug)]
pub struct ResolvedImage {
    /// The digest a reference pins: the index's when the layout names an
    /// index, else the manifest's.
    pub digest: String,
    pub manifest_digest: String,
    pub platform: Platform,
    pub config: RuntimeConfig,
    layers: Vec<(String, String)>,
}

/// An OCI image layout folder.
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn open(root: &Path) -> anyhow::Result<Self> {
        let marker = std::fs::read(root.join("oci-layout"))
            .with_context(|| format!("{} is not an OCI image layout", root.display()))?;
        let marker: Value = serde_json::from_slice(&marker).context("parse oci-layout")?;
        if marker["imageLayoutVersion"] != "1.0.0" {
            bail!(
                "unsupported imageLayoutVersion {}",
                marker["imageLayoutVersion"]
            );
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// A blob's bytes, checked against its digest.
    pub fn blob(&self, digest: &str) -> anyhow::Result<Vec<u8>> {
        let Some(hex) = digest.strip_prefix("sha256:") else {
            bail!("unsupported digest {digest}");
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("malformed digest {digest}");
        }
        let path = self.root.join("blobs/sha256").join(hex);
        let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        if digest_of(&bytes) != digest {
            bail!("blob {digest} does not match its digest");
        }
        Ok(bytes)
    }

    fn json_blob(&self, digest: &str) -> anyhow::Result<Value> {
        serde_json::from_slice(&self.blob(digest)?).with_context(|| format!("parse {digest}"))
    }

    /// The tags (`org.opencontainers.image.ref.name`) and digests the
    /// layout's `index.json` lists.
    pub fn tags(&self) -> anyhow::Result<Vec<(Option<String>, String)>> {
        let index: Value = serde_json::from_slice(
            &std::fs::read(self.root.join("index.json")).context("read index.json")?,
        )
        .context("parse index.json")?;
        Ok(index["manifests"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|m| {
                (
                    m["annotations"][REF_NAME_ANNOTATION]
                        .as_str()
                        .map(str::to_string),
                    m["digest"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    /// The image for `platform` under `tag` (or the layout's only entry
    /// when `tag` is `None`).
    pub fn resolve(&self, tag: Option<&str>, platform: &Platform) -> anyhow::Result<ResolvedImage> {
        let index: Value = serde_json::from_slice(&std::fs::read(self.root.join("index.json"))?)
            .context("parse index.json")?;
        let entries = index["manifests"].as_array().cloned().unwrap_or_default();
        let entry = match tag {
            Some(tag) => entries
                .iter()
                .find(|m| m["annotations"][REF_NAME_ANNOTATION] == tag)
                .with_context(|| format!("no image tagged {tag} in {}", self.root.display()))?,
            None if entries.len() == 1 => &entries[0],
            None => bail!(
                "{} holds {} images; name one by its tag",
                self.root.display(),
                entries.len()
            ),
        };
        let digest = entry["digest"]
            .as_str()
            .context("entry without digest")?
            .to_string();
        let manifest_digest = match entry["mediaType"].as_str() {
            Some(media_type::INDEX) => {
                let nested = self.json_blob(&digest)?;
                nested["manifests"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .find(|m| platform_of(&m["platform"]).is_some_and(|p| p.matches(platform)))
                    .and_then(|m| m["digest"].as_str())
                    .with_context(|| format!("image {digest} has no {platform} manifest"))?
                    .to_string()
            }
            Some(media_type::MANIFEST) => digest.clone(),
            other => bail!("unsupported media type {other:?} in index.json"),
        };
        let manifest = self.json_blob(&manifest_digest)?;
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .context("manifest without config")?;
        let config = self.json_blob(config_digest)?;
        let image_platform = platform_of(&config)
            .with_context(|| format!("config {config_digest} names no platform"))?;
        if !image_platform.matches(platform) {
            bail!("image {digest} is for {image_platform}, not {platform}");
        }
        let layers = manifest["layers"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|l| {
                Ok((
                    l["mediaType"]
                        .as_str()
                        .context("layer without mediaType")?
                        .to_string(),
                    l["digest"]
                        .as_str()
                        .context("layer without digest")?
                        .to_string(),
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let strings = |value: &Value| -> Vec<String> {
            value
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        let c = &config["config"];
        Ok(ResolvedImage {
            digest,
            manifest_digest,
            platform: image_platform,
            config: RuntimeConfig {
                entrypoint: strings(&c["Entrypoint"]),
                cmd: strings(&c["Cmd"]),
                user: c["User"].as_str().unwrap_or_default().to_string(),
                env: strings(&c["Env"]),
                working_dir: c["WorkingDir"].as_str().unwrap_or_default().to_string(),
                labels: c["Labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            layers,
        })
    }

    /// Unpacks the image's layers, in order, into `dest` (created if
    /// missing).
    pub fn unpack(&self, image: &ResolvedImage, dest: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dest).with_context(|| format!("create {}", dest.display()))?;
        for (media_type, digest) in &image.layers {
            let blob = self.blob(digest)?;
            let reader: Box<dyn std::io::Read> = match media_type.as_str() {
                media_type::LAYER_GZIP | "application/vnd.docker.image.rootfs.diff.tar.gzip" => {
                    Box::new(flate2::read::GzDecoder::new(blob.as_slice()))
                }
                media_type::LAYER_TAR => Box::new(blob.as_slice()),
                other => bail!("unsupported layer media type {other}"),
            };
            apply_layer(reader, dest).with_context(|| format!("apply layer {digest}"))?;
        }
        Ok(())
    }
}

/// `os`, `architecture` and `variant` of a descriptor's platform or of a
/// config.
fn platform_of(value: &Value) -> Option<Platform> {
    Some(Platform {
        os: value["os"].as_str()?.to_string(),
        architecture: value["architecture"].as_str()?.to_string(),
        variant: value["variant"].as_str().map(str::to_string),
    })
}

fn apply_layer(reader: impl std::io::Read, dest: &Path) -> anyhow::Result<()> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some(hidden) = name.strip_prefix(".wh.") {
            let parent = dest.join(path.parent().unwrap_or(Path::new("")));
            if !parent.starts_with(dest) || hidden.contains('/') {
                bail!("whiteout {} points outside the image", path.display());
            }
            if hidden == ".wh..opq" {
                if parent.is_dir() {
                    for child in std::fs::read_dir(&parent)? {
                        remove(&child?.path())?;
                    }
                }
            } else {
                remove(&parent.join(hidden))?;
            }
            // Drain the entry so the archive moves on.
            std::io::copy(&mut entry, &mut std::io::sink())?;
            continue;
        }
        if !entry.unpack_in(dest)? {
            bail!("layer entry {} points outside the image", path.display());
        }
    }
    Ok(())
}

fn remove(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path)?,
        Ok(_) => std::fs::remove_file(path)?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error.into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ImageSpec, LayerFile, LayoutWriter};

    fn write_layout(dir: &Path) -> String {
        let writer = LayoutWriter::create(dir).unwrap();
        let mut manifests = Vec::new();
        for (platform, binary) in [
            ("linux/amd64", "amd64 binary"),
            ("linux/arm64", "arm64 binary"),
        ] {
            let spec = ImageSpec {
                platform: Platform::parse(platform).unwrap(),
                files: vec![LayerFile {
                    path: "bin/tool".into(),
                    mode: 0o755,
                    contents: binary.as_bytes().to_vec(),
                }],
                entrypoint: vec!["/bin/tool".into()],
                user: "65532:65532".into(),
                labels: BTreeMap::from([("a".to_string(), "b".to_string())]),
                created: 0,
                created_by: "test".into(),
            };
            manifests.push((spec.platform.clone(), writer.image(&spec).unwrap()));
        }
        writer
            .finish(&manifests, &BTreeMap::new(), "v1")
            .unwrap()
            .digest
    }

    #[test]
    fn each_platform_unpacks_its_own_root_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let digest = write_layout(&dir.path().join("layout"));
        let layout = Layout::open(&dir.path().join("layout")).unwrap();
        assert_eq!(
            layout.tags().unwrap(),
            vec![(Some("v1".to_string()), digest.clone())]
        );
        for (platform, expected) in [
            ("linux/arm64", "arm64 binary"),
            ("linux/amd64", "amd64 binary"),
        ] {
            let image = layout
                .resolve(Some("v1"), &Platform::parse(platform).unwrap())
                .unwrap();
            assert_eq!(image.digest, digest);
            assert_eq!(image.config.entrypoint, ["/bin/tool"]);
            assert_eq!(image.config.user, "65532:65532");
            let root = dir.path().join(platform.replace('/', "-"));
            layout.unpack(&image, &root).unwrap();
            assert_eq!(
                std::fs::read_to_string(root.join("bin/tool")).unwrap(),
                expected
            );
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(root.join("bin/tool"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o755);
        }
        assert!(layout.resolve(Some("v2"), &Platform::host()).is_err());
        assert!(
            layout
                .resolve(Some("v1"), &Platform::parse("linux/s390x").unwrap())
                .is_err()
        );
    }

    #[test]
    fn a_tampered_blob_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let digest = write_layout(&dir.path().join("layout"));
        let path = dir
            .path()
            .join("layout/blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.push(b' ');
        std::fs::write(&path, bytes).unwrap();
        let layout = Layout::open(&dir.path().join("layout")).unwrap();
        let error = layout.resolve(Some("v1"), &Platform::host()).unwrap_err();
        assert!(error.to_string().contains("does not match"), "{error:#}");
    }

    #[test]
    fn whiteouts_remove_what_earlier_layers_wrote() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/old")).unwrap();
        std::fs::write(dir.path().join("etc/old/file"), "x").unwrap();
        std::fs::write(dir.path().join("etc/gone"), "x").unwrap();
        let files = [
            LayerFile {
                path: "etc/.wh.gone".into(),
                mode: 0o644,
                contents: Vec::new(),
            },
            LayerFile {
                path: "etc/old/.wh..wh..opq".into(),
                mode: 0o644,
                contents: Vec::new(),
            },
        ];
        let tar = crate::layout::layer_tar(&files, 0).unwrap();
        apply_layer(tar.as_slice(), dir.path()).unwrap();
        assert!(!dir.path().join("etc/gone").exists());
        assert!(dir.path().join("etc/old").is_dir());
        assert!(!dir.path().join("etc/old/file").exists());
    }
}
