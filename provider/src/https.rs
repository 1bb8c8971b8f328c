//! The HTTPS servers' shared parts (admission webhooks, metrics): serving
//! certificates read from a folder (`tls.crt`, `tls.key`, as cert-manager
//! mounts them) and re-read when the files change, so rotation needs no
//! restart; a self-signed one when no folder is given; and the accept loop.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A TLS acceptor (HTTP/2 and HTTP/1.1) presenting what `resolver` gives.
pub fn acceptor(resolver: Arc<dyn ResolvesServerCert>) -> anyhow::Result<TlsAcceptor> {
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

/// Serves `app` on every connection `listener` accepts, over TLS when
/// `acceptor` is given; runs until dropped. `what` names the server in logs.
pub async fn serve(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    app: Router,
    what: &'static str,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "{what} accept failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let service = TowerToHyperService::new(app);
            let served = match acceptor {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => {
                        Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(error) => {
                        tracing::debug!(%error, %peer, "{what} TLS handshake failed");
                        return;
                    }
                },
                None => {
                    Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(error) = served {
                tracing::debug!(%error, %peer, "{what} connection ended with an error");
            }
        });
    }
}

/// A self-signed certificate for `names`, made at start-up: what a server
/// presents when no certificate folder is configured (controller-runtime's
/// metrics server does the same). Scrapers then skip verification or pin it.
#[derive(Debug)]
pub struct SelfSigned(Arc<CertifiedKey>);

impl SelfSigned {
    pub fn new(names: Vec<String>) -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate().context("generate a key")?;
        let certificate = rcgen::CertificateParams::new(names)
            .context("certificate names")?
            .self_signed(&key)
            .context("self-sign")?;
        let private = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| anyhow::anyhow!("key encoding: {e}"))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&private)
            .context("unsupported key type")?;
        Ok(Self(Arc::new(CertifiedKey::new(
            vec![certificate.der().clone()],
            signing_key,
        ))))
    }
}

impl ResolvesServerCert for SelfSigned {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// A certificate re-read from disk when its files change.
#[derive(Debug)]
pub struct ReloadingCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: Mutex<(SystemTime, Arc<CertifiedKey>)>,
}

impl ReloadingCertificate {
    /// Loads `tls.crt` and `tls.key` from `dir`.
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        let cert_path = dir.join("tls.crt");
        let key_path = dir.join("tls.key");
        let loaded = load(&cert_path, &key_path)?;
        Ok(Self {
            current: Mutex::new((modified(&cert_path, &key_path), Arc::new(loaded))),
            cert_path,
            key_path,
        })
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().expect("certificate lock");
        let stamp = modified(&self.cert_path, &self.key_path);
        if stamp != current.0 {
            match load(&self.cert_path, &self.key_path) {
                Ok(loaded) => *current = (stamp, Arc::new(loaded)),
                // A half-written rotation: keep serving the previous one.
                Err(error) => tracing::warn!(%error, "could not reload a serving certificate"),
            }
        }
        Some(current.1.clone())
    }
}

fn modified(cert: &Path, key: &Path) -> SystemTime {
    let time = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    time(cert).max(time(key))
}

fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .with_context(|| format!("read {}", cert_path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parse {}", cert_path.display()))?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .with_context(|| format!("read {}", key_path.display()))?;
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(&key).context("unsupported key type")?;
    Ok(CertifiedKey::new(chain, signing_key))
}
