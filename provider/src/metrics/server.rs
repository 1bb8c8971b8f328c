//! The metrics endpoint, as Cluster API serves its own: HTTPS on `:8443`,
//! every scrape authenticated with a bearer token (TokenReview) and
//! authorised for `get` on the non-resource URL `/metrics`
//! (SubjectAccessReview), so reconcile detail is not open to whatever runs
//! in the cluster network. `--metrics-secure=false` serves plain HTTP
//! without checks, for a scraper beside the manager (the pod's network).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::https::{self, ReloadingCertificate, SelfSigned};

/// The content type of the OpenMetrics text a Prometheus asks for first.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format 0.0.4, for every other scraper.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long an allowed scraper is not asked about again.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
/// How long a refused one is not asked about again.
const REFUSED_FOR: Duration = Duration::from_secs(10);

/// Where and how the metrics are served.
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    pub bind: SocketAddr,
    /// HTTPS with authentication and authorisation; plain HTTP without.
    pub secure: bool,
    /// `tls.crt` and `tls.key`; a self-signed certificate when unset.
    pub cert_dir: Option<PathBuf>,
}

/// Serves `/metrics` until dropped.
pub async fn serve(config: MetricsConfig, client: kube::Client) -> anyhow::Result<()> {
    let acceptor = if config.secure {
        Some(match &config.cert_dir {
            Some(dir) => https::acceptor(Arc::new(ReloadingCertificate::new(dir)?))?,
            None => https::acceptor(Arc::new(SelfSigned::new(vec![
                "localhost".into(),
                "tenantry-metrics".into(),
            ])?))?,
        })
    } else {
        None
    };
    let listener = TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("listen on {}", config.bind))?;
    tracing::info!(address = %config.bind, secure = config.secure, "serving metrics");
    let state = Arc::new(Access {
        client: config.secure.then_some(client),
        decided: Mutex::default(),
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(state);
    https::serve(listener, acceptor, app, "metrics").await;
    Ok(())
}

/// Who may scrape: `client` asks the apiserver (none: everyone may).
struct Access {
    client: Option<kube::Client>,
    /// Recent answers per (token digest, verb, path).
    decided: Mutex<HashMap<[u8; 32], (Instant, Decision)>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Allowed,
    /// No token, or one the apiserver does not know.
    Unauthenticated,
    /// A known user without the permission.
    Forbidden,
}

async fn metrics(
    State(access): State<Arc<Access>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    match access.decide(&method, uri.path(), &headers).await {
        Ok(Decision::Allowed) => {}
        Ok(Decision::Unauthenticated) => {
            return (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
        }
        Ok(Decision::Forbidden) => {
            return (StatusCode::FORBIDDEN, "Forbidden\n").into_response();
        }
        Err(error) => {
            tracing::warn!(
                error = format!("{error:#}"),
                "could not check a metrics scrape"
            );
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not check the scraper's access\n",
            )
                .into_response();
        }
    }
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let body = super::global().encode(openmetrics);
    let content_type = if openmetrics {
        OPENMETRICS
    } else {
        PROMETHEUS_TEXT
    };
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Access {
    async fn decide(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> anyhow::Result<Decision> {
        let Some(client) = &self.client else {
            return Ok(Decision::Allowed);
        };
        let Some(token) = bearer_token(headers) else {
            return Ok(Decision::Unauthenticated);
        };
        let verb = method.as_str().to_ascii_lowercase();
        let key: [u8; 32] = Sha256::new()
            .chain_update(token)
            .chain_update([0])
            .chain_update(&verb)
            .chain_update([0])
            .chain_update(path)
            .finalize()
            .into();
        if let Some((at, decision)) = self.lock().get(&key).copied() {
            let fresh_for = if decision == Decision::Allowed {
                ALLOWED_FOR
            } else {
                REFUSED_FOR
            };
            if at.elapsed() < fresh_for {
                return Ok(decision);
            }
        }
        let decision = ask(client, token, &verb, path).await?;
        let mut decided = self.lock();
        decided.retain(|_, (at, _)| at.elapsed() < ALLOWED_FOR);
        decided.insert(key, (Instant::now(), decision));
        Ok(decision)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (Instant, Decision)>> {
        self.decided.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The apiserver's answers: who holds `token`, and whether they may `verb`
/// `path`.
async fn ask(
    client: &kube::Client,
    token: &str,
    verb: &str,
    path: &str,
) -> anyhow::Result<Decision> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .context("TokenReview")?;
    let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
        return Ok(Decision::Unauthenticated);
    };
    let user = status.user.unwrap_or_default();
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_string()),
                verb: Some(verb.to_string()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access)
        .await
        .context("SubjectAccessReview")?;
    let allowed = reviewed.status.is_some_and(|s| s.allowed);
    if !allowed {
        tracing::debug!(
            user = user.username.as_deref().unwrap_or_default(),
            path,
            "metrics scrape forbidden"
        );
    }
    Ok(if allowed {
        Decision::Allowed
    } else {
        Decision::Forbidden
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bearer_tokens_are_read() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert_eq!(bearer_token(&with("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(&with("bearer  abc")), Some("abc"));
        assert_eq!(bearer_token(&with("Basic dXNlcjpwdw==")), None);
        assert_eq!(bearer_token(&with("Bearer ")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }
}
