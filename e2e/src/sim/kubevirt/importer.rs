//! CDI's importer pod, as a task: it fetches an HTTP source for real,
//! decompresses it (detected by magic bytes, as CDI's format readers do),
//! verifies an optional checksum and the size, and reports progress while it
//! reads. Failures carry the termination messages CDI's importer writes
//! (`Unable to connect to http data source: ...`, `Unable to process data:
//! ...`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use sha2::{Digest, Sha256, Sha512};
use tokio::task::AbortHandle;

/// What an import reads from.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Source {
    Http {
        url: String,
        /// `algorithm:hex`, as in `spec.source.http.checksum`.
        checksum: Option<String>,
    },
    /// `spec.source.blank`: nothing to fetch.
    Blank,
    /// `spec.source.pvc`: a host-assisted clone of an existing PVC.
    Clone,
}

/// Limits and faults for one import.
#[derive(Clone, Debug, Default)]
pub(super) struct Limits {
    /// Bytes the target PVC holds; a larger image fails like CDI's
    /// "DataVolume too small to contain image".
    pub capacity: Option<u64>,
    pub min_duration: Option<Duration>,
    /// Injected: fail with this message once the source is read.
    pub error: Option<String>,
    /// Injected: fail for good with this message.
    pub fatal: Option<String>,
}

/// How an import ended.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Outcome {
    Succeeded {
        size: u64,
        sha256: String,
        compression: &'static str,
    },
    /// The importer exited with this termination message; CDI restarts it
    /// unless `fatal`.
    Failed {
        message: String,
        reason: &'static str,
        fatal: bool,
    },
}

/// The state an import task shares with the DataVolume controller.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Percent of the source read, if its size is known.
    pub percent: Option<f64>,
    pub outcome: Option<Outcome>,
}

struct Running {
    abort: AbortHandle,
    progress: Arc<Mutex<Progress>>,
}

/// Where an import reports to: CDI's controller watches the importer pod
/// and its metrics; here the task pushes its progress and, when it ends,
/// records the outcome where CDI keeps it (the PVC's annotations).
pub(super) trait Reporter: Send + Sync + 'static {
    /// Reports progress; `false` when the DataVolume is gone, which ends
    /// the import (CDI deletes the importer pod with its PVC).
    fn progress(&self, percent: f64) -> BoxFuture<'static, bool>;
    fn finished(&self, outcome: Outcome) -> BoxFuture<'static, anyhow::Result<()>>;
}

/// Every import task of one simulator, by DataVolume UID.
#[derive(Default)]
pub(super) struct Imports {
    running: Mutex<HashMap<String, Running>>,
    started: AtomicU64,
}

impl Imports {
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// The progress of the import for `uid`, if one runs or has ended
    /// without being collected.
    pub fn progress(&self, uid: &str) -> Option<(Option<f64>, Option<Outcome>)> {
        let running = self.running.lock().expect("imports lock");
        let progress = running.get(uid)?.progress.lock().expect("progress lock");
        Some((progress.percent, progress.outcome.clone()))
    }

    /// Forgets an ended import once its outcome has been recorded.
    pub fn collect(&self, uid: &str) {
        if let Some(running) = self.running.lock().expect("imports lock").remove(uid) {
            running.abort.abort();
        }
    }

    pub fn abort_all(&self) {
        for (_, running) in self.running.lock().expect("imports lock").drain() {
            running.abort.abort();
        }
    }

    /// Starts an import for the DataVolume `uid` unless one is known.
    pub fn start(&self, uid: &str, reporter: impl Reporter, source: Source, limits: Limits) {
        let mut running = self.running.lock().expect("imports lock");
        if running.contains_key(uid) {
            return;
        }
        self.started.fetch_add(1, Ordering::Relaxed);
        let progress = Arc::new(Mutex::new(Progress::default()));
        let task_progress = progress.clone();
        let handle = tokio::spawn(async move {
            let notify = |percent: f64| reporter.progress(percent);
            let outcome = import(&source, &limits, &task_progress, &notify).await;
            // The outcome is on the PVC before the registry shows it, so a
            // reconcile that sees it ended also sees what it left.
            for _ in 0..50 {
                match reporter.finished(outcome.clone()).await {
                    Ok(()) => break,
                    Err(error) => {
                        tracing::debug!(%error, "recording the import outcome failed; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            task_progress.lock().expect("progress lock").outcome = Some(outcome);
        });
        running.insert(
            uid.to_string(),
            Running {
                abort: handle.abort_handle(),
                progress,
            },
        );
    }
}

/// CDI's wording for a source that cannot be reached.
fn cannot_connect(error: impl std::fmt::Display) -> Outcome {
    Outcome::Failed {
        message: format!("Unable to connect to http data source: {error}"),
        reason: "Error",
        fatal: false,
    }
}

fn cannot_process(error: impl std::fmt::Display) -> Outcome {
    Outcome::Failed {
        message: format!("Unable to process data: {error}"),
        reason: "Error",
        fatal: false,
    }
}

fn http_client() -> anyhow::Result<reqwest::Client> {
    // reqwest is built without a default TLS provider; give it ring. No
    // roots: the simulated cluster has no CA bundle for HTTPS sources.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(10))
        .build()?)
}

/// Runs one import to its outcome.
async fn import(
    source: &Source,
    limits: &Limits,
    progress: &Mutex<Progress>,
    notify: &(dyn Fn(f64) -> BoxFuture<'static, bool> + Send + Sync),
) -> Outcome {
    let started = Instant::now();
    let outcome = match source {
        Source::Http { url, checksum } => {
            fetch(url, checksum.as_deref(), limits, progress, notify).await
        }
        Source::Blank | Source::Clone => {
            if !pace(limits, progress, notify, started).await {
                return target_gone();
            }
            Outcome::Succeeded {
                size: limits.capacity.unwrap_or(0),
                sha256: String::new(),
                compression: "none",
            }
        }
    };
    // Injected faults apply once the source has been read, like an error
    // while writing the target.
    if let Some(message) = &limits.fatal {
        return Outcome::Failed {
            message: message.clone(),
            reason: "Error",
            fatal: true,
        };
    }
    if let Some(message) = &limits.error {
        return Outcome::Failed {
            message: message.clone(),
            reason: "Error",
            fatal: false,
        };
    }
    outcome
}

fn target_gone() -> Outcome {
    cannot_process("the target DataVolume was deleted")
}

/// Progress over `min_duration` for sources with nothing to read; `false`
/// if the target went away meanwhile.
async fn pace(
    limits: &Limits,
    progress: &Mutex<Progress>,
    notify: &(dyn Fn(f64) -> BoxFuture<'static, bool> + Send + Sync),
    started: Instant,
) -> bool {
    let Some(total) = limits.min_duration else {
        return true;
    };
    loop {
        let elapsed = started.elapsed();
        if elapsed >= total {
            return true;
        }
        let percent = 100.0 * elapsed.as_secs_f64() / total.as_secs_f64();
        progress.lock().expect("progress lock").percent = Some(percent);
        if !notify(percent).await {
            return false;
        }
        tokio::time::sleep((total / 10).min(Duration::from_millis(500))).await;
    }
}

enum Checksum {
    Sha256(Sha256),
    Sha512(Sha512),
}

impl Checksum {
    /// CDI's `algorithm:hex` syntax.
    fn parse(spec: &str) -> Result<(Self, String, String), String> {
        let (algorithm, expected) = spec
            .split_once(':')
            .ok_or_else(|| format!("invalid checksum format: {spec}"))?;
        let hasher = match algorithm {
            "sha256" => Checksum::Sha256(Sha256::new()),
            "sha512" => Checksum::Sha512(Sha512::new()),
            other => return Err(format!("unsupported hash algorithm: {other}")),
        };
        Ok((hasher, algorithm.to_string(), expected.to_lowercase()))
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Checksum::Sha256(h) => h.update(bytes),
            Checksum::Sha512(h) => h.update(bytes),
        }
    }

    fn finish(self) -> String {
        match self {
            Checksum::Sha256(h) => hex::encode(h.finalize()),
            Checksum::Sha512(h) => hex::encode(h.finalize()),
        }
    }
}

async fn fetch(
    url: &str,
    checksum: Option<&str>,
    limits: &Limits,
    progress: &Mutex<Progress>,
    notify: &(dyn Fn(f64) -> BoxFuture<'static, bool> + Send + Sync),
) -> Outcome {
    let mut checksum = match checksum.map(Checksum::parse).transpose() {
        Ok(c) => c,
        Err(error) => return cannot_connect(format!("invalid checksum: {error}")),
    };
    let client = match http_client() {
        Ok(client) => client,
        Err(error) => return cannot_connect(format!("Error creating http client: {error}")),
    };
    let mut response = match client.get(url).send().await {
        Ok(response) => response,
        Err(error) => return cannot_connect(format!("HTTP request errored: {error}")),
    };
    let status = response.status();
    if status != reqwest::StatusCode::OK {
        // Go's resp.Status is "<code> <reason>".
        return cannot_connect(format!(
            "expected status code 200, got {}. Status: {}",
            status.as_u16(),
            status
        ));
    }
    let total = response.content_length().filter(|t| *t > 0);
    let (sender, receiver) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let decoder = tokio::task::spawn_blocking(move || decode(ChannelReader::new(receiver)));

    let started = Instant::now();
    let mut read: u64 = 0;
    let mut last_report = Instant::now() - Duration::from_secs(1);
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(error) => return cannot_process(format!("error reading the source: {error}")),
        };
        read += chunk.len() as u64;
        if let Some((hasher, _, _)) = checksum.as_mut() {
            hasher.update(&chunk);
        }
        if sender.send(chunk.to_vec()).await.is_err() {
            // The decoder gave up; its error is reported below.
            break;
        }
        let fraction = total.map(|t| (read as f64 / t as f64).min(1.0));
        if let (Some(min), Some(fraction)) = (limits.min_duration, fraction) {
            let due = min.mul_f64(fraction);
            let elapsed = started.elapsed();
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        }
        if last_report.elapsed() >= Duration::from_millis(250)
            && let Some(fraction) = fraction
        {
            progress.lock().expect("progress lock").percent = Some(fraction * 100.0);
            if !notify(fraction * 100.0).await {
                return target_gone();
            }
            last_report = Instant::now();
        }
    }
    drop(sender);
    if let Some(min) = limits.min_duration {
        let elapsed = started.elapsed();
        if min > elapsed {
            tokio::time::sleep(min - elapsed).await;
        }
    }
    let decoded = match decoder.await {
        Ok(Ok(decoded)) => decoded,
        Ok(Err(error)) => return cannot_process(error),
        Err(error) => return cannot_process(error),
    };
    if let Some((hasher, algorithm, expected)) = checksum {
        let calculated = hasher.finish();
        if calculated != expected {
            // CDI treats a checksum mismatch as fatal (phase Failed).
            return Outcome::Failed {
                message: format!(
                    "Unable to process data: checksum validation failed: checksum mismatch: expected {algorithm}:{expected}, calculated {algorithm}:{calculated}"
                ),
                reason: "ChecksumError",
                fatal: true,
            };
        }
    }
    if decoded.size == 0 {
        return cannot_process("the source image is empty");
    }
    if limits
        .capacity
        .is_some_and(|capacity| decoded.size > capacity)
    {
        // What CDI's simplifyKnownMessage turns "no space left" errors into.
        return Outcome::Failed {
            message: "DataVolume too small to contain image".into(),
            reason: "Error",
            fatal: false,
        };
    }
    progress.lock().expect("progress lock").percent = Some(100.0);
    Outcome::Succeeded {
        size: decoded.size,
        sha256: decoded.sha256,
        compression: decoded.compression,
    }
}

/// Reads the chunks an async task sends, on a blocking thread.
struct ChannelReader {
    receiver: tokio::sync::mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    position: usize,
}

impl ChannelReader {
    fn new(receiver: tokio::sync::mpsc::Receiver<Vec<u8>>) -> Self {
        Self {
            receiver,
            current: Vec::new(),
            position: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.position >= self.current.len() {
            match self.receiver.blocking_recv() {
                Some(chunk) => {
                    self.current = chunk;
                    self.position = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.position);
        buf[..n].copy_from_slice(&self.current[self.position..self.position + n]);
        self.position += n;
        Ok(n)
    }
}

/// Counts and hashes what is written: the target disk.
#[derive(Default)]
struct Disk {
    size: u64,
    hasher: Sha256,
}

impl Write for Disk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.size += buf.len() as u64;
        self.hasher.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, PartialEq)]
pub(super) struct Decoded {
    pub size: u64,
    pub sha256: String,
    pub compression: &'static str,
}

const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0x00];
const GZ_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Decompresses `reader` into a simulated disk. Formats are told apart by
/// their magic bytes, like CDI's `FormatReaders`; anything not compressed is
/// written as it is (CDI would also convert qcow2 and friends to raw).
pub(super) fn decode(reader: impl Read) -> Result<Decoded, String> {
    let mut input = BufReader::with_capacity(256 * 1024, reader);
    let head = input
        .fill_buf()
        .map_err(|e| format!("could not read the source: {e}"))?
        .to_vec();
    let mut disk = Disk::default();
    let compression = if head.starts_with(XZ_MAGIC) {
        lzma_rs::xz_decompress(&mut input, &mut disk)
            .map_err(|e| format!("could not decompress xz data: {e}"))?;
        "xz"
    } else if head.starts_with(GZ_MAGIC) {
        let mut gz = flate2::bufread::MultiGzDecoder::new(input);
        std::io::copy(&mut gz, &mut disk)
            .map_err(|e| format!("could not decompress gzip data: {e}"))?;
        "gz"
    } else if head.starts_with(ZSTD_MAGIC) {
        return Err("zstd-compressed images are not supported by this simulator".into());
    } else {
        std::io::copy(&mut input, &mut disk)
            .map_err(|e| format!("could not read the source: {e}"))?;
        "none"
    };
    Ok(Decoded {
        size: disk.size,
        sha256: hex::encode(disk.hasher.finalize()),
        compression,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_xz_gz_and_raw_alike() {
        let raw: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let sha = hex::encode(Sha256::digest(&raw));
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut &raw[..], &mut xz).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let gz = gz.finish().unwrap();
        for (bytes, compression) in [(&xz, "xz"), (&gz, "gz"), (&raw, "none")] {
            let decoded = decode(&bytes[..]).unwrap();
            assert_eq!(decoded.size, raw.len() as u64);
            assert_eq!(decoded.sha256, sha);
            assert_eq!(decoded.compression, compression);
        }
        assert!(
            decode(&xz[..xz.len() / 2]).is_err(),
            "truncated xz is an error"
        );
        assert!(decode(ZSTD_MAGIC).is_err());
    }

    #[test]
    fn checksum_specs_parse_like_cdi() {
        assert!(Checksum::parse("sha256:abc").is_ok());
        assert!(Checksum::parse("sha512:abc").is_ok());
        assert_eq!(
            Checksum::parse("md4:abc").err().as_deref(),
            Some("unsupported hash algorithm: md4")
        );
        assert!(Checksum::parse("abc").is_err());
    }
}
