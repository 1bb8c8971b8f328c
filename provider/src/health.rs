//! The health endpoints the Deployment's probes poll: `/healthz` (the
//! process answers) and `/readyz`, which answers 200 only once the webhook
//! server serves and, on the replica running the controllers, every
//! controller's own watch has listed once. Until then the kubelet keeps the
//! pod out of the webhook Service's endpoints and a rollout waits for it.
//!
//! A standby replica (leader election, not leading) runs no controllers and
//! is ready on its webhooks alone, as controller-runtime's managers are: a
//! rollout's new pod must become ready while the old one still leads.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use axum::http::StatusCode;
use futures::FutureExt as _;
use kube::runtime::reflector::Store;

type Check = Box<dyn Fn() -> bool + Send + Sync>;

/// What `/readyz` reports; cloned into everything that reports to it.
#[derive(Clone, Default)]
pub struct Readiness {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// `None` while no webhook server is configured.
    webhook: Option<bool>,
    caches: Vec<(String, Check)>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.report().1)
    }
}

impl Readiness {
    /// The webhook server is configured: not ready until it serves.
    pub fn expect_webhooks(&self) {
        self.lock().webhook.get_or_insert(false);
    }

    /// The webhook server listens with its certificate loaded.
    pub fn webhooks_serving(&self) {
        self.lock().webhook = Some(true);
    }

    /// A controller's store: not ready until it has listed once.
    pub fn track_cache<K>(&self, controller: &str, store: Store<K>)
    where
        K: kube::Resource + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let check: Check = Box::new(move || {
            store
                .wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok())
        });
        self.lock().caches.push((controller.to_string(), check));
    }

    /// Whether every check passes, and a line per check in the style of
    /// Kubernetes' `/readyz?verbose` (`[+]name ok`, `[-]name …`).
    pub fn report(&self) -> (bool, String) {
        let state = self.lock();
        let mut ready = true;
        let mut text = String::new();
        if let Some(serving) = state.webhook {
            ready &= serving;
            text.push_str(if serving {
                "[+]webhook ok\n"
            } else {
                "[-]webhook not serving yet\n"
            });
        }
        for (controller, synced) in &state.caches {
            let synced = synced();
            ready &= synced;
            text.push_str(&if synced {
                format!("[+]cache {controller} ok\n")
            } else {
                format!("[-]cache {controller} not synced yet\n")
            });
        }
        text.push_str(if ready {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        (ready, text)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking check cannot leave the list half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The `/healthz` and `/readyz` routes.
pub fn router(readiness: Readiness) -> axum::Router {
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let readiness = readiness.clone();
                async move {
                    let (ready, text) = readiness.report();
                    let status = if ready {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (status, text)
                }
            }),
        )
}

/// Serves the health endpoints on `address` until the task is dropped.
pub async fn serve(address: SocketAddr, readiness: Readiness) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("listen on {address}"))?;
    axum::serve(listener, router(readiness))
        .await
        .context("health endpoints stopped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

    #[test]
    fn nothing_to_wait_for_is_ready() {
        assert!(Readiness::default().report().0);
    }

    #[test]
    fn ready_only_once_webhooks_serve_and_caches_have_listed() {
        let readiness = Readiness::default();
        readiness.expect_webhooks();
        let (reader, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        readiness.track_cache("configmaps", reader);
        let (ready, text) = readiness.report();
        assert!(!ready);
        assert!(text.contains("[-]webhook not serving yet"), "{text}");
        assert!(
            text.contains("[-]cache configmaps not synced yet"),
            "{text}"
        );

        readiness.webhooks_serving();
        assert!(!readiness.report().0);
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let (ready, text) = readiness.report();
        assert!(ready, "{text}");
        assert!(text.contains("[+]cache configmaps ok"), "{text}");
    }
}
