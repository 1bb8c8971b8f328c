//! SSH for CAPK's ssh bootstrap check: the cluster's key pair, and reading
//! Cluster API's bootstrap sentinel file in a guest as user `capk`. The one
//! place that speaks SSH.
//!
//! The key pair is ed25519 (CAPK generates ECDSA P-384): it is generated
//! instantly, every cloud-init and OpenSSH of the last ten years accepts it,
//! and it needs no RSA code (the `rsa` crate has an unfixed timing advisory,
//! RUSTSEC-2023-0071). Keys written by CAPK (`EC PRIVATE KEY` PEM) are read
//! too, so clusters moved from CAPK keep working.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use russh::keys::ssh_key::LineEnding;
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect, client};

/// The user CAPK adds to cloud-config and logs in as.
pub const SSH_USER: &str = "capk";
/// The file Cluster API's kubeadm bootstrap writes `success` into when the
/// node has joined (CAPI's bootstrap sentinel).
pub const BOOTSTRAP_SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";
/// What the sentinel says once bootstrap succeeded.
pub const SENTINEL_SUCCESS: &str = "success";
/// The port the check connects to in production (CAPK's, not configurable).
pub const SSH_PORT: u16 = 22;
/// Key of the private key (OpenSSH format) in the keys Secret (CAPK's name).
pub const PRIVATE_KEY_KEY: &str = "key";
/// Key of the public key (an authorized_keys line) in the keys Secret (CAPK's name).
pub const PUBLIC_KEY_KEY: &str = "pub";
/// The longest sentinel content kept for a message; the file holds one word.
const SENTINEL_MAX: usize = 64;

/// Why a key pair cannot be made or read. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the private key is not an OpenSSH or PEM private key: {0}")]
    Unreadable(String),
    #[error("the key cannot be encoded: {0}")]
    Encoding(String),
}

/// A cluster's SSH key pair. `Debug` shows the public half only.
#[derive(Clone)]
pub struct SshKeyPair {
    private: Arc<PrivateKey>,
    authorized_key: String,
}

impl std::fmt::Debug for SshKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshKeyPair")
            .field("authorized_key", &self.authorized_key)
            .field("private", &"<redacted>")
            .finish()
    }
}

impl SshKeyPair {
    /// A fresh ed25519 key pair; `comment` ends the public key line, so a
    /// guest's `authorized_keys` says where the key comes from.
    pub fn generate(comment: &str) -> Result<Self, KeyError> {
        let mut seed = [0u8; 32];
        // ThreadRng is a CSPRNG seeded from the operating system.
        rand::rng().fill_bytes(&mut seed);
        let mut private = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
        seed.fill(0);
        std::hint::black_box(&seed);
        private.set_comment(comment);
        Self::from_private(private)
    }

    /// The pair as stored in a keys Secret: the private key (OpenSSH, or
    /// PEM as CAPK writes it) and, if present, the authorized_keys line that
    /// was injected into guests (it wins, so a stored comment stays).
    pub fn from_secret(private: &[u8], public: Option<&[u8]>) -> Result<Self, KeyError> {
        let text =
            std::str::from_utf8(private).map_err(|_| KeyError::Unreadable("not UTF-8".into()))?;
        let key = russh::keys::decode_secret_key(text, None)
            .map_err(|e| KeyError::Unreadable(e.to_string()))?;
        let mut pair = Self::from_private(key)?;
        if let Some(line) = public
            .and_then(|p| std::str::from_utf8(p).ok())
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            pair.authorized_key = line.to_string();
        }
        Ok(pair)
    }

    fn from_private(private: PrivateKey) -> Result<Self, KeyError> {
        let authorized_key = private
            .public_key()
            .to_openssh()
            .map_err(|e| KeyError::Encoding(e.to_string()))?;
        Ok(Self {
            private: Arc::new(private),
            authorized_key,
        })
    }

    /// The public key as an authorized_keys line (`ssh-ed25519 AAAA… comment`).
    pub fn authorized_key(&self) -> &str {
        &self.authorized_key
    }

    /// The private key in OpenSSH format, for the keys Secret only.
    pub fn private_key_openssh(&self) -> Result<Vec<u8>, KeyError> {
        let pem = self
            .private
            .to_openssh(LineEnding::LF)
            .map_err(|e| KeyError::Encoding(e.to_string()))?;
        Ok(pem.as_bytes().to_vec())
    }
}

/// What the sentinel file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentinelReading {
    /// `success`: the node bootstrapped.
    Success,
    /// The file is not there (yet): `cat` failed.
    Absent,
    /// Something else (shortened), e.g. a bootstrap that wrote a failure.
    Unexpected(String),
}

/// Why the sentinel could not be read. Messages name the address and the
/// cause; none carries key material.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: SocketAddr, reason: String },
    #[error("{address} refused user {SSH_USER} with the cluster's key")]
    AuthenticationRejected { address: SocketAddr },
    #[error("SSH session with {address} failed: {reason}")]
    Session { address: SocketAddr, reason: String },
    #[error("no answer from {address} within {timeout:?}")]
    Timeout {
        address: SocketAddr,
        timeout: Duration,
    },
}

/// Logs in to `ip:port` as `capk` with `keys` and reads the bootstrap
/// sentinel. Everything, connecting included, ends within `timeout`, so a
/// reconcile never hangs on an unreachable guest.
pub async fn read_bootstrap_sentinel(
    ip: IpAddr,
    port: u16,
    keys: &SshKeyPair,
    timeout: Duration,
) -> Result<SentinelReading, ProbeError> {
    let address = SocketAddr::new(ip, port);
    tokio::time::timeout(timeout, probe(address, keys, timeout))
        .await
        .unwrap_or(Err(ProbeError::Timeout { address, timeout }))
}

async fn probe(
    address: SocketAddr,
    keys: &SshKeyPair,
    timeout: Duration,
) -> Result<SentinelReading, ProbeError> {
    let session_error = |error: russh::Error| ProbeError::Session {
        address,
        reason: error.to_string(),
    };
    let stream =
        tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| ProbeError::Connect {
                address,
                reason: e.to_string(),
            })?;
    let config = Arc::new(client::Config {
        inactivity_timeout: Some(timeout),
        nodelay: true,
        ..Default::default()
    });
    let mut session = client::connect_stream(config, stream, AnyHostKey)
        .await
        .map_err(session_error)?;
    let auth = session
        .authenticate_publickey(
            SSH_USER,
            PrivateKeyWithHashAlg::new(keys.private.clone(), None),
        )
        .await
        .map_err(session_error)?;
    if !auth.success() {
        return Err(ProbeError::AuthenticationRejected { address });
    }
    let mut channel = session
        .channel_open_session()
        .await
        .map_err(session_error)?;
    channel
        .exec(true, format!("cat {BOOTSTRAP_SENTINEL}"))
        .await
        .map_err(session_error)?;
    let mut stdout = Vec::new();
    let mut exit_status = None;
    while let Some(message) = channel.wait().await {
        match message {
            ChannelMsg::Data { data } if stdout.len() < 4096 => stdout.extend_from_slice(&data),
            ChannelMsg::ExitStatus {
                exit_status: status,
            } => exit_status = Some(status),
            _ => {}
        }
    }
    // Best effort: the answer is in, a failed goodbye changes nothing.
    let _ = session
        .disconnect(Disconnect::ByApplication, "", "en")
        .await;
    Ok(interpret(exit_status, &stdout))
}

/// What `cat <sentinel>` answered means: exit 0 with `success` is success,
/// a failed `cat` means the file is not there yet.
pub fn interpret(exit_status: Option<u32>, stdout: &[u8]) -> SentinelReading {
    let text = String::from_utf8_lossy(stdout);
    let content = text.trim();
    match exit_status {
        Some(0) | None if content == SENTINEL_SUCCESS => SentinelReading::Success,
        Some(0) => SentinelReading::Unexpected(content.chars().take(SENTINEL_MAX).collect()),
        _ => SentinelReading::Absent,
    }
}

/// Accepts whatever host key the guest presents, as CAPK does: the key is
/// made at the guest's first boot and known to nobody beforehand. What this
/// risks is small: public-key authentication signs the session, so an
/// impostor learns nothing it could reuse, and all the check reads is a
/// word that is not secret.
struct AnyHostKey;

impl client::Handler for AnyHostKey {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_round_trip_through_the_secret_format() {
        let pair = SshKeyPair::generate("tenantry:ns/demo").unwrap();
        assert!(
            pair.authorized_key().starts_with("ssh-ed25519 AAAA"),
            "{}",
            pair.authorized_key()
        );
        assert!(pair.authorized_key().ends_with(" tenantry:ns/demo"));
        let private = pair.private_key_openssh().unwrap();
        assert!(
            String::from_utf8_lossy(&private).starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
        );
        let read =
            SshKeyPair::from_secret(&private, Some(pair.authorized_key().as_bytes())).unwrap();
        assert_eq!(read.authorized_key(), pair.authorized_key());
        // Without the stored line, the public key is derived.
        let derived = SshKeyPair::from_secret(&private, None).unwrap();
        assert_eq!(derived.authorized_key(), pair.authorized_key());
        assert_ne!(
            SshKeyPair::generate("x").unwrap().authorized_key(),
            SshKeyPair::generate("x").unwrap().authorized_key()
        );
    }

    #[test]
    fn debug_never_shows_the_private_key() {
        let pair = SshKeyPair::generate("c").unwrap();
        let private = String::from_utf8(pair.private_key_openssh().unwrap()).unwrap();
        let body = private.lines().nth(1).unwrap();
        let debug = format!("{pair:?}");
        assert!(!debug.contains(body), "{debug}");
        assert!(debug.contains("redacted"));
    }

    #[test]
    fn keys_written_by_capk_are_read() {
        // An ECDSA P-384 key in SEC1 PEM, the format CAPK stores.
        let capk = "-----BEGIN EC PRIVATE KEY-----\nMIGkAgEBBDA1X414+bA95vhU9BZeHBaUuDvh6emzamuuEYwkXm8IS1/Qj8OrLh/a\nwAE0HX6GqPWgBwYFK4EEACKhZANiAATL40U1rtsckIAVvAPGjH5HrqjTZ4qNOgo3\nRWNtADIN7xaY8RRVG40guMjieC5oxFl6ciX1EiLnhJ62oVtfM7/mqYq6ifqh3uWT\n/2wJs0VbHupuDFd07iIXkKN5jm80HwM=\n-----END EC PRIVATE KEY-----\n";
        let pair = SshKeyPair::from_secret(capk.as_bytes(), None).unwrap();
        assert!(
            pair.authorized_key().starts_with("ecdsa-sha2-nistp384 "),
            "{}",
            pair.authorized_key()
        );
        assert!(matches!(
            SshKeyPair::from_secret(b"not a key", None),
            Err(KeyError::Unreadable(_))
        ));
    }

    #[test]
    fn sentinel_answers_are_interpreted() {
        assert_eq!(interpret(Some(0), b"success\n"), SentinelReading::Success);
        assert_eq!(interpret(None, b"success"), SentinelReading::Success);
        assert_eq!(interpret(Some(1), b""), SentinelReading::Absent);
        assert_eq!(interpret(None, b""), SentinelReading::Absent);
        assert_eq!(
            interpret(Some(0), b"failed\n"),
            SentinelReading::Unexpected("failed".into())
        );
        let long = vec![b'x'; 500];
        assert_eq!(
            interpret(Some(0), &long),
            SentinelReading::Unexpected("x".repeat(SENTINEL_MAX))
        );
    }

    #[tokio::test]
    async fn unreachable_guests_fail_fast() {
        let pair = SshKeyPair::generate("c").unwrap();
        // Nothing listens on port 1 of loopback: refused at once.
        let refused = read_bootstrap_sentinel(
            "127.0.0.1".parse().unwrap(),
            1,
            &pair,
            Duration::from_secs(3),
        )
        .await;
        assert!(
            matches!(refused, Err(ProbeError::Connect { .. })),
            "{refused:?}"
        );
        // A listener that never speaks SSH: the timeout ends it.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let started = std::time::Instant::now();
        let hung = read_bootstrap_sentinel(
            "127.0.0.1".parse().unwrap(),
            port,
            &pair,
            Duration::from_millis(500),
        )
        .await;
        assert!(matches!(hung, Err(ProbeError::Timeout { .. })), "{hung:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
