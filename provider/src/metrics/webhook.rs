//! Admission webhook series: controller-runtime's (per path and HTTP
//! code) and tenantry's decision counts (per path and result).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Histograms, Labels, histogram};

/// controller-runtime's webhook latency buckets (prometheus.DefBuckets).
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn latency_histogram() -> Histogram {
    histogram(LATENCY_BUCKETS)
}

/// What an admission request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Allowed,
    /// Allowed with a patch (mutating webhooks).
    Patched,
    Denied,
    /// The request could not be read or answered.
    Error,
}

impl Admission {
    fn label(self) -> &'static str {
        match self {
            Admission::Allowed => "allowed",
            Admission::Patched => "patched",
            Admission::Denied => "denied",
            Admission::Error => "error",
        }
    }
}

pub struct WebhookSeries {
    requests: Family<Labels, Counter>,
    in_flight: Family<Labels, Gauge>,
    latency: Histograms,
    decisions: Family<Labels, Counter>,
}

impl WebhookSeries {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let series = Self {
            requests: Family::default(),
            in_flight: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            decisions: Family::default(),
        };
        registry.register(
            "controller_runtime_webhook_requests",
            "Admission requests served, per webhook path and HTTP status code",
            series.requests.clone(),
        );
        registry.register(
            "controller_runtime_webhook_requests_in_flight",
            "Admission requests being served, per webhook path",
            series.in_flight.clone(),
        );
        registry.register(
            "controller_runtime_webhook_latency_seconds",
            "Time to answer an admission request, per webhook path",
            series.latency.clone(),
        );
        registry.register(
            "tenantry_admission_requests",
            "Admission decisions, per webhook path and result (allowed, patched, denied, error)",
            series.decisions.clone(),
        );
        series
    }

    /// An admission request to `webhook` came to `result`.
    pub fn decided(&self, webhook: &str, result: Admission) {
        self.decisions
            .get_or_create(&vec![
                ("webhook", webhook.to_string()),
                ("result", result.label().to_string()),
            ])
            .inc();
    }
}

/// axum middleware: counts, times and tracks every request to a webhook
/// route by its route path (unmatched paths are not counted: any client
/// could invent them).
pub async fn measure(path: Option<MatchedPath>, request: Request, next: Next) -> Response {
    let Some(path) = path else {
        return next.run(request).await;
    };
    let series = &super::global().webhooks;
    let webhook = vec![("webhook", path.as_str().to_string())];
    let in_flight = series.in_flight.get_or_create_owned(&webhook);
    in_flight.inc();
    let started = Instant::now();
    let response = next.run(request).await;
    in_flight.dec();
    series
        .latency
        .get_or_create(&webhook)
        .observe(started.elapsed().as_secs_f64());
    series
        .requests
        .get_or_create(&vec![
            ("webhook", path.as_str().to_string()),
            ("code", response.status().as_u16().to_string()),
        ])
        .inc();
    response
}
