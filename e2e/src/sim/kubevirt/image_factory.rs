//! A local stand-in for the Talos image factory: plain HTTP on loopback,
//! the factory's download layout `GET /image/<schematicID>/<talosVersion>/
//! <platform>-<arch>.raw.xz` (also `.raw.gz` and `.raw`), serving a small raw
//! disk image it generates per schematic/version/platform and compresses.
//! Unknown schematics, versions or file names answer 404. Request counters
//! let tests see what was fetched.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

/// The schematic ID of the vanilla Talos image (no extensions, no extra
/// kernel arguments), as the real factory computes it.
pub const DEFAULT_SCHEMATIC: &str =
    "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// What the image factory knows.
#[derive(Clone, Debug)]
pub struct ImageFactoryConfig {
    /// Schematic IDs it serves; others answer 404.
    pub schematics: Vec<String>,
    /// Talos versions it serves (`v1.11.0`); others answer 404.
    pub versions: Vec<String>,
    /// Size of the raw disk image in bytes.
    pub image_size: usize,
    /// Delay before each answer.
    pub latency: Duration,
}

impl Default for ImageFactoryConfig {
    fn default() -> Self {
        Self {
            schematics: vec![DEFAULT_SCHEMATIC.into()],
            versions: vec!["v1.10.7".into(), "v1.11.0".into()],
            image_size: 2 << 20,
            latency: Duration::ZERO,
        }
    }
}

struct Served {
    config: ImageFactoryConfig,
    /// Compressed images by request path, built on first request.
    cache: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    requests: Mutex<BTreeMap<String, u64>>,
    total: AtomicU64,
    not_found: AtomicU64,
}

/// A running image factory. Dropping it stops the server.
pub struct ImageFactory {
    base_url: String,
    served: Arc<Served>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ImageFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageFactory")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Drop for ImageFactory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A file name the factory serves: platform, architecture, compression.
#[derive(Debug, PartialEq)]
struct ImageFile<'a> {
    platform: &'a str,
    arch: &'a str,
    compression: &'a str,
}

fn parse_file(file: &str) -> Option<ImageFile<'_>> {
    let (stem, compression) = if let Some(stem) = file.strip_suffix(".raw.xz") {
        (stem, "xz")
    } else if let Some(stem) = file.strip_suffix(".raw.gz") {
        (stem, "gz")
    } else if let Some(stem) = file.strip_suffix(".raw") {
        (stem, "none")
    } else {
        return None;
    };
    let (platform, arch) = stem.rsplit_once('-')?;
    let valid_platform = !platform.is_empty()
        && platform
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (valid_platform && matches!(arch, "amd64" | "arm64")).then_some(ImageFile {
        platform,
        arch,
        compression,
    })
}

/// The raw disk image for one schematic, version and platform: a boot
/// sector naming what it is, a GPT signature, some data unique to the
/// image, and zeros.
pub fn raw_image(schematic: &str, version: &str, platform_arch: &str, size: usize) -> Vec<u8> {
    let size = size.max(64 * 1024);
    let mut image = vec![0u8; size];
    let label = format!(
        "TENANTRY SIMULATED TALOS IMAGE schematic={schematic} version={version} platform={platform_arch}\n"
    );
    let label = label.as_bytes();
    image[..label.len().min(440)].copy_from_slice(&label[..label.len().min(440)]);
    image[510] = 0x55;
    image[511] = 0xaa;
    image[512..520].copy_from_slice(b"EFI PART");
    let mut block = Sha256::digest(label).to_vec();
    let data = &mut image[4096..4096 + 32 * 1024];
    for chunk in data.chunks_mut(32) {
        block = Sha256::digest(&block).to_vec();
        chunk.copy_from_slice(&block[..chunk.len()]);
    }
    image
}

fn compress(raw: &[u8], compression: &str) -> anyhow::Result<Vec<u8>> {
    Ok(match compression {
        "xz" => {
            let mut out = Vec::new();
            lzma_rs::xz_compress(&mut &raw[..], &mut out).context("xz compress")?;
            out
        }
        "gz" => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(raw)?;
            encoder.finish()?
        }
        _ => raw.to_vec(),
    })
}

async fn serve_image(
    State(served): State<Arc<Served>>,
    Path((schematic, version, file)): Path<(String, String, String)>,
) -> Response {
    let path = format!("/image/{schematic}/{version}/{file}");
    served.total.fetch_add(1, Ordering::Relaxed);
    *served
        .requests
        .lock()
        .expect("requests lock")
        .entry(path.clone())
        .or_default() += 1;
    if !served.config.latency.is_zero() {
        tokio::time::sleep(served.config.latency).await;
    }
    let known =
        served.config.schematics.contains(&schematic) && served.config.versions.contains(&version);
    let Some(parsed) = parse_file(&file).filter(|_| known) else {
        served.not_found.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    };
    let cached = served.cache.lock().expect("cache lock").get(&path).cloned();
    let bytes = match cached {
        Some(bytes) => bytes,
        None => {
            let size = served.config.image_size;
            let platform_arch = format!("{}-{}", parsed.platform, parsed.arch);
            let compression = parsed.compression.to_string();
            let built = tokio::task::spawn_blocking(move || {
                compress(
                    &raw_image(&schematic, &version, &platform_arch, size),
                    &compression,
                )
            })
            .await;
            match built {
                Ok(Ok(bytes)) => {
                    let bytes = Arc::new(bytes);
                    served
                        .cache
                        .lock()
                        .expect("cache lock")
                        .insert(path, bytes.clone());
                    bytes
                }
                Ok(Err(error)) => {
                    return (StatusCode::INTERNAL_SERVER_ERROR, format!("{error:#}"))
                        .into_response();
                }
                Err(error) => {
                    return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
                }
            }
        }
    };
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        bytes.as_ref().clone(),
    )
        .into_response()
}

async fn not_found(State(served): State<Arc<Served>>) -> Response {
    served.total.fetch_add(1, Ordering::Relaxed);
    served.not_found.fetch_add(1, Ordering::Relaxed);
    (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
}

impl ImageFactory {
    /// Starts the server on a free loopback port.
    pub async fn start(config: ImageFactoryConfig) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the image factory")?;
        let address = listener.local_addr()?;
        let served = Arc::new(Served {
            config,
            cache: Mutex::default(),
            requests: Mutex::default(),
            total: AtomicU64::new(0),
            not_found: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/image/{schematic}/{version}/{file}", get(serve_image))
            .fallback(not_found)
            .with_state(served.clone());
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(%error, "image factory stopped");
            }
        });
        Ok(Self {
            base_url: format!("http://{address}"),
            served,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`, what `imageFactoryURL` should be.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The URL of one image, e.g. `image_url(DEFAULT_SCHEMATIC, "v1.11.0",
    /// "openstack-amd64.raw.xz")`.
    pub fn image_url(&self, schematic: &str, version: &str, file: &str) -> String {
        format!("{}/image/{schematic}/{version}/{file}", self.base_url)
    }

    /// Every request so far, found or not.
    pub fn requests(&self) -> u64 {
        self.served.total.load(Ordering::Relaxed)
    }

    /// Requests for one path (`/image/<schematic>/<version>/<file>`).
    pub fn requests_for(&self, path: &str) -> u64 {
        self.served
            .requests
            .lock()
            .expect("requests lock")
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Requests answered 404.
    pub fn not_found(&self) -> u64 {
        self.served.not_found.load(Ordering::Relaxed)
    }

    /// Hex SHA-256 and size of the raw (decompressed) image a file name
    /// stands for, to compare with what an import wrote.
    pub fn raw_digest(&self, schematic: &str, version: &str, file: &str) -> Option<(String, u64)> {
        let parsed = parse_file(file)?;
        let raw = raw_image(
            schematic,
            version,
            &format!("{}-{}", parsed.platform, parsed.arch),
            self.served.config.image_size,
        );
        Some((hex::encode(Sha256::digest(&raw)), raw.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_follow_the_factory_layout() {
        assert_eq!(
            parse_file("openstack-amd64.raw.xz"),
            Some(ImageFile {
                platform: "openstack",
                arch: "amd64",
                compression: "xz"
            })
        );
        assert_eq!(
            parse_file("nocloud-arm64.raw.gz").map(|f| f.compression),
            Some("gz")
        );
        assert_eq!(
            parse_file("metal-amd64.raw").map(|f| f.compression),
            Some("none")
        );
        assert_eq!(parse_file("openstack-amd64.qcow2"), None);
        assert_eq!(parse_file("openstack-riscv.raw.xz"), None);
        assert_eq!(parse_file("-amd64.raw.xz"), None);
    }

    #[test]
    fn images_differ_per_version_and_compress() {
        let a = raw_image(DEFAULT_SCHEMATIC, "v1.11.0", "openstack-amd64", 256 * 1024);
        let b = raw_image(DEFAULT_SCHEMATIC, "v1.10.7", "openstack-amd64", 256 * 1024);
        assert_eq!(a.len(), 256 * 1024);
        assert_ne!(a, b);
        assert_eq!(&a[510..512], &[0x55, 0xaa]);
        // lzma-rs writes stored LZMA2 chunks: a real .xz container, not a
        // small one. gzip really compresses.
        let xz = compress(&a, "xz").unwrap();
        assert!(xz.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]));
        let mut back = Vec::new();
        lzma_rs::xz_decompress(&mut &xz[..], &mut back).unwrap();
        assert_eq!(back, a);
        let gz = compress(&a, "gz").unwrap();
        assert!(gz.len() < a.len() / 4, "gz {} of {}", gz.len(), a.len());
    }
}
