//! The webhook HTTPS server. The serving certificate is read from a folder
//! (`tls.crt`, `tls.key`, as cert-manager mounts it) and re-read when the
//! files change, so rotation needs no restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Json;
use axum::Router;
use axum::extract::{MatchedPath, State};
use axum::routing::{get, post};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tokio::net::TcpListener;

use super::configuration::{MUTATING_ENDPOINTS, VALIDATING_ENDPOINTS};
use super::kubernetes::{self, Decision, Defaults};
use super::kubernetes_nodes;
use super::templates::{IMMUTABLE_TEMPLATE_KINDS, validate_template_update};
use crate::https::{self, ReloadingCertificate};
use crate::metrics::webhook::Admission;

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
    let acceptor = https::acceptor(Arc::new(ReloadingCertificate::new(&config.cert_dir)?))?;
    let listener = TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("listen on {}", config.bind))?;
    tracing::info!(address = %config.bind, "serving admission webhooks");
    readiness.webhooks_serving();
    https::serve(
        listener,
        Some(acceptor),
        router(client, defaults),
        "webhook",
    )
    .await;
    Ok(())
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
    router
        .route_layer(axum::middleware::from_fn(crate::metrics::webhook::measure))
        .with_state(Shared {
            client,
            defaults: Arc::new(defaults),
        })
}

async fn validate(
    State(Shared { client, .. }): State<Shared>,
    path: MatchedPath,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let webhooks = &crate::metrics::global().webhooks;
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            webhooks.decided(path.as_str(), Admission::Error);
            return Json(AdmissionResponse::invalid(error.to_string()).into_review());
        }
    };
    let decision = if request.kind.kind == "KubernetesNodes" {
        kubernetes_nodes::validate(&request, client.as_ref()).await
    } else {
        decide(&request)
    };
    let mut response = AdmissionResponse::from(&request);
    let result = if decision.denied.is_some() {
        Admission::Denied
    } else {
        Admission::Allowed
    };
    webhooks.decided(path.as_str(), result);
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
    path: MatchedPath,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let webhooks = &crate::metrics::global().webhooks;
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            webhooks.decided(path.as_str(), Admission::Error);
            return Json(AdmissionResponse::invalid(error.to_string()).into_review());
        }
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
    let result = if !response.allowed {
        Admission::Denied
    } else if response.patch.is_some() {
        Admission::Patched
    } else {
        Admission::Allowed
    };
    webhooks.decided(path.as_str(), result);
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
