//! Writing an OCI image layout: one image per platform (a single gzipped
//! layer, its config and manifest), an image index over them, and the
//! layout's own `index.json` naming that index by its tag.
//!
//! Reproducibility rules, each needed for two builds of one commit to give
//! one digest: layer entries sorted by path, owned by 0:0, modes fixed,
//! timestamps all set to [`ImageSpec::created`] (the commit time); gzip
//! written without a modification time or file name; JSON with keys in a
//! fixed (sorted) order.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::{Platform, REF_NAME_ANNOTATION, digest_of, media_type};

/// A file of a layer.
#[derive(Clone, Debug)]
pub struct LayerFile {
    /// Path inside the image, relative (`tenantry`, `etc/ssl/certs/…`).
    pub path: String,
    pub mode: u32,
    pub contents: Vec<u8>,
}

/// What one platform's image holds and how it starts.
#[derive(Clone, Debug)]
pub struct ImageSpec {
    pub platform: Platform,
    /// The files of its one layer; parent directories are added (0755).
    pub files: Vec<LayerFile>,
    pub entrypoint: Vec<String>,
    /// `uid:gid`.
    pub user: String,
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch: the image's `created` time and every
    /// entry's modification time (the commit time, for a release).
    pub created: i64,
    /// What the history entry says made the layer.
    pub created_by: String,
}

/// A blob written into the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

impl Descriptor {
    fn to_json(&self) -> Value {
        json!({ "mediaType": self.media_type, "digest": self.digest, "size": self.size })
    }
}

/// An OCI image layout folder being written.
pub struct LayoutWriter {
    root: PathBuf,
}

impl LayoutWriter {
    /// Starts a layout in `root`, which must not exist or be empty.
    pub fn create(root: &Path) -> anyhow::Result<Self> {
        if root.exists()
            && std::fs::read_dir(root)
                .with_context(|| format!("read {}", root.display()))?
                .next()
                .is_some()
        {
            anyhow::bail!("{} is not empty", root.display());
        }
        std::fs::create_dir_all(root.join("blobs/sha256"))
            .with_context(|| format!("create {}", root.display()))?;
        std::fs::write(
            root.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// Writes a blob (content-addressed) and describes it.
    pub fn blob(&self, media_type: &str, bytes: &[u8]) -> anyhow::Result<Descriptor> {
        let digest = digest_of(bytes);
        let hex = digest.trim_start_matches("sha256:");
        let path = self.root.join("blobs/sha256").join(hex);
        std::fs::write(&path, bytes).with_context(|| format!("write {}", path.display()))?;
        Ok(Descriptor {
            media_type: media_type.to_string(),
            digest,
            size: bytes.len() as u64,
        })
    }

    /// Writes one platform's layer, config and manifest; returns the
    /// manifest's descriptor.
    pub fn image(&self, spec: &ImageSpec) -> anyhow::Result<Descriptor> {
        let tar = layer_tar(&spec.files, spec.created)?;
        let diff_id = digest_of(&tar);
        let layer = self.blob(media_type::LAYER_GZIP, &gzip(&tar)?)?;
        let created = rfc3339(spec.created);
        let mut platform =
            json!({ "architecture": spec.platform.architecture, "os": spec.platform.os });
        if let Some(variant) = &spec.platform.variant {
            platform["variant"] = json!(variant);
        }
        let mut config = platform.clone();
        config["created"] = json!(created);
        config["config"] = json!({
            "User": spec.user,
            "Entrypoint": spec.entrypoint,
            "WorkingDir": "/",
            "Labels": spec.labels,
        });
        config["rootfs"] = json!({ "type": "layers", "diff_ids": [diff_id] });
        config["history"] = json!([{ "created": created, "created_by": spec.created_by }]);
        let config = self.blob(media_type::CONFIG, &to_json(&config))?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": media_type::MANIFEST,
            "config": config.to_json(),
            "layers": [layer.to_json()],
            "annotations": spec.labels,
        });
        self.blob(media_type::MANIFEST, &to_json(&manifest))
    }

    /// Writes the image index over the platforms' manifests and the layout's
    /// `index.json` naming it `tag`; returns the index's descriptor (its
    /// digest is the image's digest, what a release pins).
    pub fn finish(
        self,
        manifests: &[(Platform, Descriptor)],
        annotations: &BTreeMap<String, String>,
        tag: &str,
    ) -> anyhow::Result<Descriptor> {
        let entries: Vec<Value> = manifests
            .iter()
            .map(|(platform, descriptor)| {
                let mut entry = descriptor.to_json();
                let mut platform_json =
                    json!({ "architecture": platform.architecture, "os": platform.os });
                if let Some(variant) = &platform.variant {
                    platform_json["variant"] = json!(variant);
                }
                entry["platform"] = platform_json;
                entry
            })
            .collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": media_type::INDEX,
            "manifests": entries,
            "annotations": annotations,
        });
        let index = self.blob(media_type::INDEX, &to_json(&index))?;
        let mut top = index.to_json();
        top["annotations"] = json!({ REF_NAME_ANNOTATION: tag });
        let layout_index = json!({
            "schemaVersion": 2,
            "mediaType": media_type::INDEX,
            "manifests": [top],
        });
        std::fs::write(self.root.join("index.json"), to_json(&layout_index))?;
        Ok(index)
    }
}

/// Writes the whole layout folder `root` as one tar archive (what
/// `oci-archive:` transports read), with the same rules as a layer.
pub fn archive(root: &Path, out: &Path, mtime: i64) -> anyhow::Result<()> {
    let mut files = Vec::new();
    collect_files(root, root, &mut files)?;
    let tar = layer_tar(&files, mtime)?;
    std::fs::write(out, tar).with_context(|| format!("write {}", out.display()))
}

fn collect_files(root: &Path, dir: &Path, files: &mut Vec<LayerFile>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(root, &path, files)?;
        } else {
            let relative = path
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            files.push(LayerFile {
                path: relative,
                mode: 0o644,
                contents: std::fs::read(&path)?,
            });
        }
    }
    Ok(())
}

/// A tar archive of `files` and their parent directories, sorted by path,
/// owned by 0:0, every time `mtime`.
pub fn layer_tar(files: &[LayerFile], mtime: i64) -> anyhow::Result<Vec<u8>> {
    let mut directories = std::collections::BTreeSet::new();
    for file in files {
        let mut parent = Path::new(&file.path).parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            directories.insert(format!("{}/", dir.to_string_lossy()));
            parent = dir.parent();
        }
    }
    let mut entries: BTreeMap<String, Option<&LayerFile>> =
        directories.into_iter().map(|d| (d, None)).collect();
    for file in files {
        if file.path.starts_with('/') || file.path.split('/').any(|p| p == "..") {
            anyhow::bail!("layer path {:?} must be relative and inside", file.path);
        }
        if entries.insert(file.path.clone(), Some(file)).is_some() {
            anyhow::bail!("layer path {:?} given twice", file.path);
        }
    }
    let mut builder = tar::Builder::new(Vec::new());
    let mtime = u64::try_from(mtime).context("a time before 1970")?;
    for (path, file) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        match file {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder.append_data(&mut header, &path, std::io::empty())?;
            }
            Some(file) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(file.mode);
                header.set_size(file.contents.len() as u64);
                builder.append_data(&mut header, &path, file.contents.as_slice())?;
            }
        }
    }
    Ok(builder.into_inner()?)
}

/// Gzip with no modification time and no file name in the header.
fn gzip(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

fn to_json(value: &Value) -> Vec<u8> {
    serde_json::to_vec(&sorted(value)).expect("JSON serializes")
}

/// The value with every object's keys in sorted order, whatever order the
/// map type of this build of serde_json keeps.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let ordered: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, sorted(v))).collect();
            let mut out = serde_json::Map::new();
            for (k, v) in ordered {
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch.
pub fn rfc3339(epoch: i64) -> String {
    chrono::DateTime::from_timestamp(epoch, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(platform: &str, binary: &[u8]) -> ImageSpec {
        ImageSpec {
            platform: Platform::parse(platform).unwrap(),
            files: vec![
                LayerFile {
                    path: "tenantry".into(),
                    mode: 0o755,
                    contents: binary.to_vec(),
                },
                LayerFile {
                    path: "etc/ssl/certs/ca-certificates.crt".into(),
                    mode: 0o644,
                    contents: b"roots".to_vec(),
                },
            ],
            entrypoint: vec!["/tenantry".into()],
            user: "65532:65532".into(),
            labels: BTreeMap::from([(
                "org.opencontainers.image.version".to_string(),
                "v0.1.0".to_string(),
            )]),
            created: 1_764_979_200,
            created_by: "test".into(),
        }
    }

    fn write(dir: &Path, binary: &[u8]) -> Descriptor {
        let writer = LayoutWriter::create(dir).unwrap();
        let manifests: Vec<_> = ["linux/amd64", "linux/arm64"]
            .into_iter()
            .map(|p| {
                let spec = spec(p, binary);
                (spec.platform.clone(), writer.image(&spec).unwrap())
            })
            .collect();
        writer
            .finish(&manifests, &BTreeMap::new(), "v0.1.0")
            .unwrap()
    }

    #[test]
    fn the_same_inputs_give_the_same_index_digest() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = write(&a.path().join("layout"), b"binary");
        let second = write(&b.path().join("layout"), b"binary");
        assert_eq!(first, second);
        let other = write(&b.path().join("other"), b"binary2");
        assert_ne!(first.digest, other.digest);
    }

    #[test]
    fn layers_list_parents_first_and_sorted_with_fixed_owners() {
        let tar = layer_tar(&spec("linux/amd64", b"x").files, 7).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let entries: Vec<(String, u64, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        let paths: Vec<&str> = entries.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/ssl/",
                "etc/ssl/certs/",
                "etc/ssl/certs/ca-certificates.crt",
                "tenantry"
            ]
        );
        assert!(
            entries
                .iter()
                .all(|(_, uid, mtime)| *uid == 0 && *mtime == 7)
        );
    }

    #[test]
    fn paths_outside_the_image_are_refused() {
        for path in ["/abs", "../up", "a/../../b"] {
            let files = [LayerFile {
                path: path.into(),
                mode: 0o644,
                contents: Vec::new(),
            }];
            assert!(layer_tar(&files, 0).is_err(), "{path}");
        }
    }

    #[test]
    fn times_are_written_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_827_696), "2000-02-29T12:34:56Z");
        assert_eq!(rfc3339(1_796_515_200), "2026-12-06T00:00:00Z");
    }
}
