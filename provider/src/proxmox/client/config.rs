//! Client configuration: where PVE is, how to trust it, how long to wait.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use url::Url;

use super::auth::{Credentials, CredentialsError};
use super::task::TaskWaitConfig;

/// The API root, always `<scheme>://<host>[:port][/prefix]/api2/json`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiUrl(Url);

impl ApiUrl {
    /// Accepts the forms found in the wild and normalises them:
    /// `https://pve:8006` (capmox secrets: the client appends the API root),
    /// `https://pve:8006/api2/json` (Proxmox CSI/CCM configs), with or without
    /// a trailing slash, optionally below a reverse-proxy path prefix.
    ///
    /// Only `https`: PVE serves nothing else, and a token must not travel in
    /// clear text.
    pub fn parse(input: &str) -> Result<Self, ConfigError> {
        let input = input.trim();
        let fail = |reason: &str| ConfigError::InvalidUrl {
            url: input.to_owned(),
            reason: reason.to_owned(),
        };
        if !input.contains("://") {
            return Err(fail("missing scheme; expected https://host:8006"));
        }
        let mut url = Url::parse(input).map_err(|e| fail(&e.to_string()))?;
        if url.scheme() != "https" {
            return Err(fail("the scheme must be https"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(fail("missing host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(fail(
                "credentials do not belong in the URL; use the API token",
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(fail("a query or fragment is not allowed"));
        }
        let path = url.path().trim_end_matches('/');
        let path = if path.ends_with("/api2/json") {
            path.to_owned()
        } else {
            format!("{path}/api2/json")
        };
        url.set_path(&path);
        Ok(Self(url))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn host(&self) -> &str {
        self.0.host_str().unwrap_or_default()
    }

    /// The full URL of an API path such as `/nodes/pve1/status` (already
    /// percent-encoded by `api_path`).
    pub(crate) fn join(&self, api_path: &str) -> Url {
        let mut url = self.0.clone();
        url.set_path(&format!("{}{}", self.0.path(), api_path));
        url
    }
}

impl fmt::Display for ApiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ApiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiUrl({})", self.as_str())
    }
}

impl std::str::FromStr for ApiUrl {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// How the server certificate is checked.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum TlsVerification {
    /// Against the system's root certificates (or, where the image has none,
    /// Mozilla's bundle): for PVE behind a publicly trusted certificate.
    #[default]
    SystemRoots,
    /// Against only this CA, PEM-encoded: usually the cluster's own
    /// `/etc/pve/pve-root-ca.pem`, which signs every node's certificate.
    HypervisorCa { pem: String },
    /// No verification at all. An explicit opt-in for labs: anyone on the path
    /// can read the API token.
    Insecure,
}

impl fmt::Debug for TlsVerification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SystemRoots => f.write_str("SystemRoots"),
            Self::HypervisorCa { pem } => write!(f, "HypervisorCa({} bytes of PEM)", pem.len()),
            Self::Insecure => f.write_str("Insecure"),
        }
    }
}

/// Everything needed to build a [`super::ProxmoxClient`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub url: ApiUrl,
    pub credentials: Credentials,
    pub tls: TlsVerification,
    pub connect_timeout: Duration,
    /// Per request. PVE answers synchronous calls within seconds; long work
    /// runs as a task, which has its own deadline in `tasks`.
    pub request_timeout: Duration,
    pub tasks: TaskWaitConfig,
}

impl ClientConfig {
    pub fn new(url: ApiUrl, credentials: Credentials) -> Self {
        Self {
            url,
            credentials,
            tls: TlsVerification::default(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            tasks: TaskWaitConfig::default(),
        }
    }

    pub fn with_tls(mut self, tls: TlsVerification) -> Self {
        self.tls = tls;
        self
    }

    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn with_task_wait(mut self, tasks: TaskWaitConfig) -> Self {
        self.tasks = tasks;
        self
    }
}

/// Why a client could not be built. All of these need a human.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid Proxmox VE URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error("invalid hypervisor CA: {reason}")]
    InvalidCa { reason: String },
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
    #[error("HTTP client setup: {0}")]
    HttpClient(#[source] reqwest::Error),
}

impl ConfigError {
    /// CamelCase name for condition reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidUrl { .. } => "InvalidURL",
            Self::Credentials(_) => "InvalidCredentials",
            Self::InvalidCa { .. } => "InvalidCertificateAuthority",
            Self::Tls(_) | Self::HttpClient(_) => "ClientSetupFailed",
        }
    }
}

fn ring() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// System roots are read once per process: loading them walks the whole CA
/// directory, and clients are built per ProxmoxCluster.
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let native = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                roots.add_parsable_certificates(
                    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
                );
            }
            Arc::new(roots)
        })
        .clone()
}

fn hypervisor_roots(pem: &str) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| ConfigError::InvalidCa {
            reason: e.to_string(),
        })?;
        roots.add(cert).map_err(|e| ConfigError::InvalidCa {
            reason: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(ConfigError::InvalidCa {
            reason: "no PEM certificate found".into(),
        });
    }
    Ok(roots)
}

/// The rustls configuration: ring only, TLS 1.2 and 1.3, HTTP/1.1 only.
///
/// HTTP/1.1 because PVE puts its error text in the status line's reason
/// phrase, which HTTP/2 does not have (and pveproxy does not speak h2).
pub(crate) fn rustls_config(tls: &TlsVerification) -> Result<rustls::ClientConfig, ConfigError> {
    let provider = ring();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut config = match tls {
        TlsVerification::SystemRoots => builder.with_root_certificates(system_roots()),
        TlsVerification::HypervisorCa { pem } => {
            builder.with_root_certificates(hypervisor_roots(pem)?)
        }
        TlsVerification::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert(provider))),
    }
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// `insecure: true`: accepts any certificate for any name. Handshake
/// signatures are still checked, so the session is at least bound to the
/// certificate the server presented.
#[derive(Debug)]
struct AcceptAnyServerCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_normalised_to_the_api_root() {
        for (input, expected) in [
            (
                "https://pve.example:8006",
                "https://pve.example:8006/api2/json",
            ),
            (
                "https://pve.example:8006/",
                "https://pve.example:8006/api2/json",
            ),
            (
                "https://pve.example:8006/api2/json",
                "https://pve.example:8006/api2/json",
            ),
            (
                "https://pve.example:8006/api2/json/",
                "https://pve.example:8006/api2/json",
            ),
            (
                "  https://10.0.0.5:8006\n",
                "https://10.0.0.5:8006/api2/json",
            ),
            ("https://[fd00::5]:8006", "https://[fd00::5]:8006/api2/json"),
            (
                "https://proxy.example/pve",
                "https://proxy.example/pve/api2/json",
            ),
            (
                "https://proxy.example/pve/api2/json",
                "https://proxy.example/pve/api2/json",
            ),
            ("https://pve.example", "https://pve.example/api2/json"),
        ] {
            assert_eq!(ApiUrl::parse(input).unwrap().as_str(), expected, "{input}");
        }
    }

    #[test]
    fn unusable_urls_are_refused() {
        for bad in [
            "pve.example:8006",
            "http://pve.example:8006",
            "ftp://pve.example",
            "https://",
            "https://root:pw@pve.example:8006",
            "https://pve.example:8006/?x=1",
            "https://pve.example:8006/#frag",
            "",
        ] {
            assert!(ApiUrl::parse(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn api_paths_join_below_the_root() {
        let url = ApiUrl::parse("https://pve.example:8006").unwrap();
        assert_eq!(
            url.join("/nodes/pve1/status").as_str(),
            "https://pve.example:8006/api2/json/nodes/pve1/status"
        );
        assert_eq!(url.host(), "pve.example");
    }

    #[test]
    fn every_tls_mode_builds_with_ring_and_http1() {
        let ca = bundled_root_pem();
        for tls in [
            TlsVerification::SystemRoots,
            TlsVerification::Insecure,
            TlsVerification::HypervisorCa { pem: ca },
        ] {
            let config = rustls_config(&tls).unwrap();
            assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        }
    }

    #[test]
    fn a_ca_without_certificates_is_refused() {
        let error = rustls_config(&TlsVerification::HypervisorCa {
            pem: "not a pem".into(),
        })
        .unwrap_err();
        assert!(matches!(error, ConfigError::InvalidCa { .. }), "{error:?}");
        assert_eq!(error.reason(), "InvalidCertificateAuthority");
    }

    #[test]
    fn tls_debug_does_not_dump_the_pem() {
        let debug = format!(
            "{:?}",
            TlsVerification::HypervisorCa {
                pem: bundled_root_pem()
            }
        );
        assert!(!debug.contains("BEGIN CERTIFICATE"), "{debug}");
    }

    /// A real self-signed CA certificate (the first root of Mozilla's
    /// bundle) as PEM, so the tests need no certificate generator.
    fn bundled_root_pem() -> String {
        use base64::Engine;
        let der = webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].as_ref();
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).unwrap());
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
        pem
    }
}
