//! The webhook HTTPS server. The serving certificate is read from a folder
//! (`tls.crt`, `tls.key`, as cert-manager mounts it) and re-read when the
//! files change, so rotation needs no restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context as _;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::configuration::{MUTATING_ENDPOINTS, VALIDATING_ENDPOINTS};
use super::kubernetes::{self, Decision, Defaults};
use super::kubernetes_nodes;
use super::templates::{IMMUTABLE_TEMPLATE_KINDS, validate_template_update};

/// Where and with which certificate the webhooks are served.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Folder holding `tls.crt` and `tls.key`.
    pub cert_dir: PathBuf,
}

/// Serves the webhooks until the task is dropped. `client` looks up what
/// a decision depends on (a pool's parent cluster); `defaults` is what new
/// objects take from the manager's configuration; `readiness` learns when
/// the listener serves with its certificate loaded.
pub async fn serve(
    config: WebhookConfig,
    client: Option<kube::Client>,
    defaults: Defaults,
    readiness: crate::health::Readiness,
) -> anyhow::Result<()> {
    let resolver = Arc::new(ReloadingCertificate::new(&config.cert_dir)?);
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("listen on {}", config.bind))?;
    tracing::info!(address = %config.bind, "serving admission webhooks");
    readiness.webhooks_serving();
    let app = router(client, defaults);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "webhook accept failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%error, %peer, "webhook TLS handshake failed");
                    return;
                }
            };
            let service = TowerToHyperService::new(app);
            if let Err(error) = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, %peer, "webhook connection ended with an error");
            }
        });
    }
}

/// What every request handler may read.
#[derive(Clone)]
struct Shared {
    client: Option<kube::Client>,
    defaults: Arc<Defaults>,
}

/// The HTTP routes: one per validating and mutating endpoint, plus a
/// health check.
pub fn router(client: Option<kube::Client>, defaults: Defaults) -> Router {
    let mut router = Router::new().route("/healthz", get(|| async { "ok" }));
    for endpoint in VALIDATING_ENDPOINTS {
        router = router.route(endpoint.path, post(validate));
    }
    for endpoint in MUTATING_ENDPOINTS {
        router = router.route(endpoint.path, post(mutate));
    }
    router.with_state(Shared {
        client,
        defaults: Arc::new(defaults),
    })
}

async fn validate(
    State(Shared { client, .. }): State<Shared>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => return Json(AdmissionResponse::invalid(error.to_string()).into_review()),
    };
    let decision = if request.kind.kind == "KubernetesNodes" {
        kubernetes_nodes::validate(&request, client.as_ref()).await
    } else {
        decide(&request)
    };
    let mut response = AdmissionResponse::from(&request);
    if let Some(message) = decision.denied {
        response = response.deny(message);
        response.result.code = 422;
        response.result.reason = "Invalid".into();
    }
    if !decision.warnings.is_empty() {
        response.warnings = Some(decision.warnings);
    }
    Json(response.into_review())
}

async fn mutate(
    State(Shared { defaults, .. }): State<Shared>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => return Json(AdmissionResponse::invalid(error.to_string()).into_review()),
    };
    let response = AdmissionResponse::from(&request);
    let response = match request.kind.kind.as_str() {
        // The moves and the defaults touch disjoint fields of the object
        // as sent, so their patches apply one after the other.
        "Kubernetes" => match kubernetes::mutate(&request) {
            Ok((mut patch, notes)) => {
                patch.0.extend(kubernetes::default(&request, &defaults).0);
                if patch.0.is_empty() {
                    response
                } else {
                    match response.clone().with_patch(patch) {
                        Ok(mut patched) => {
                            patched.warnings = (!notes.is_empty()).then_some(notes);
                            patched
                        }
                        Err(error) => response.deny(format!("cannot encode the patch: {error}")),
                    }
                }
            }
            // Mutating webhooks run before the schema is checked: an
            // object the types cannot read gets the schema's own error
            // next, which names the field better than a decoding error.
            Err(message) => {
                tracing::debug!(%message, "Kubernetes object left unmutated");
                response
            }
        },
        _ => response,
    };
    Json(response.into_review())
}

/// The decision for one request.
fn decide(request: &AdmissionRequest<DynamicObject>) -> Decision {
    let kind = request.kind.kind.as_str();
    match (kind, &request.operation) {
        ("Kubernetes", _) => kubernetes::validate(request),
        (kind, Operation::Update) if IMMUTABLE_TEMPLATE_KINDS.contains(&kind) => {
            let to_json =
                |object: &Option<DynamicObject>| serde_json::to_value(object).unwrap_or_default();
            Decision {
                denied: validate_template_update(
                    kind,
                    &to_json(&request.old_object),
                    &to_json(&request.object),
                    request.dry_run,
                )
                .err(),
                warnings: Vec::new(),
            }
        }
        _ => Decision::default(),
    }
}

/// A certificate re-read from disk when its files change.
#[derive(Debug)]
struct ReloadingCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: Mutex<(SystemTime, Arc<CertifiedKey>)>,
}

impl ReloadingCertificate {
    fn new(dir: &Path) -> anyhow::Result<Self> {
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
                Err(error) => tracing::warn!(%error, "could not reload the webhook certificate"),
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
    let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
        .context("unsupported webhook key type")?;
    Ok(CertifiedKey::new(chain, signing_key))
}
