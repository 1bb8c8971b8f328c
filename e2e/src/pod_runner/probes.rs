//! Liveness, readiness and startup probes, run as the kubelet runs them:
//! from the node against the pod's address, `httpGet` (2xx and 3xx are
//! success, serving certificates are not verified, headers and host as
//! given) and `tcpSocket`, every `periodSeconds` after
//! `initialDelaySeconds`, with `timeoutSeconds`, `successThreshold` and
//! `failureThreshold` counted the same way. `exec` and `grpc` probes are
//! not supported: they fail with a message saying so.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A probe's settings, with Kubernetes' defaults filled in.
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    pub probe: Probe,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl ProbeSpec {
    pub fn new(probe: &Probe) -> Self {
        let seconds =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Self {
            probe: probe.clone(),
            initial_delay: seconds(probe.initial_delay_seconds, 0),
            period: seconds(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: seconds(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Counts consecutive results against the thresholds.
#[derive(Clone, Debug, Default)]
pub struct ProbeState {
    successes: u32,
    failures: u32,
    /// The verdict once a threshold was crossed.
    pub passing: Option<bool>,
    pub last_message: String,
}

impl ProbeState {
    /// Records one result; returns the verdict if it changed.
    pub fn record(&mut self, spec: &ProbeSpec, result: Result<(), String>) -> Option<bool> {
        let before = self.passing;
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes += 1;
                if self.successes >= spec.success_threshold {
                    self.passing = Some(true);
                }
            }
            Err(message) => {
                self.successes = 0;
                self.failures += 1;
                self.last_message = message;
                if self.failures >= spec.failure_threshold {
                    self.passing = Some(false);
                }
            }
        }
        (self.passing != before).then_some(self.passing).flatten()
    }
}

/// The kubelet's probe client: HTTPS without verifying the serving
/// certificate, no proxy, redirects followed.
pub fn client() -> reqwest::Client {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .build()
        .expect("probe HTTP client")
}

/// Probes do not verify certificates (the kubelet's `InsecureSkipVerify`);
/// signatures are still checked, so the TLS handshake is a real one.
#[derive(Debug)]
struct AcceptAnyCertificate(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Runs one probe once against the pod's address.
pub async fn run(
    client: &reqwest::Client,
    spec: &ProbeSpec,
    container: &Container,
    pod_ip: Ipv4Addr,
) -> Result<(), String> {
    let probe = &spec.probe;
    if let Some(http) = &probe.http_get {
        let port = port_number(&http.port, container)?;
        let scheme = http
            .scheme
            .as_deref()
            .unwrap_or("HTTP")
            .to_ascii_lowercase();
        let host = http.host.clone().unwrap_or_else(|| pod_ip.to_string());
        let path = http.path.as_deref().unwrap_or("/");
        let url = format!("{scheme}://{host}:{port}{path}");
        let mut request = client
            .get(&url)
            .timeout(spec.timeout)
            .header("User-Agent", "kube-probe/1.35");
        for header in http.http_headers.as_deref().unwrap_or_default() {
            request = request.header(&header.name, &header.value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        let status = response.status();
        if status.is_success() || status.is_redirection() {
            Ok(())
        } else {
            Err(format!(
                "HTTP probe failed with statuscode: {}",
                status.as_u16()
            ))
        }
    } else if let Some(tcp) = &probe.tcp_socket {
        let port = port_number(&tcp.port, container)?;
        let host = tcp.host.clone().unwrap_or_else(|| pod_ip.to_string());
        match tokio::time::timeout(
            spec.timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("dial tcp {host}:{port}: {error}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
        }
    } else {
        Err("only httpGet and tcpSocket probes are supported by the pod runner".into())
    }
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_number(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => container
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("port {name} is not a named port of the container")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_count_consecutive_results() {
        let spec = ProbeSpec::new(&Probe {
            failure_threshold: Some(2),
            success_threshold: Some(1),
            ..Default::default()
        });
        let mut state = ProbeState::default();
        assert_eq!(state.record(&spec, Err("no".into())), None);
        assert_eq!(state.record(&spec, Ok(())), Some(true));
        assert_eq!(state.record(&spec, Err("no".into())), None);
        assert_eq!(state.record(&spec, Err("no".into())), Some(false));
        assert_eq!(state.last_message, "no");
        assert_eq!(spec.period, Duration::from_secs(10));
    }
}
