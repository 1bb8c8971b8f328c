//! Prometheus metrics: one registry per process, as controller-runtime
//! keeps one, served by [`server`] on `--metrics-bind-address`.
//!
//! The controller-runtime series ([`controller`], [`webhook`]) carry the
//! names and labels Go providers serve, so dashboards and alerts written
//! for them work unchanged; tenantry's own series ([`proxmox`], [`machines`],
//! [`stores`]) label by substrate, endpoint template or condition reason,
//! never by object name. docs/observability.md lists every series.

pub mod controller;
pub mod machines;
mod process;
pub mod proxmox;
pub mod server;
pub mod stores;
pub mod webhook;

use std::sync::LazyLock;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use server::{MetricsConfig, serve};

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// A family of histograms sharing one bucket layout.
pub type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Every series of this process, registered once.
pub struct Metrics {
    registry: Registry,
    pub controllers: controller::ControllerSeries,
    pub webhooks: webhook::WebhookSeries,
    pub proxmox: proxmox::ProxmoxSeries,
    pub machines: machines::MachineSeries,
    pub stores: std::sync::Arc<stores::Stores>,
    leader: Family<Labels, Gauge>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let controllers = controller::ControllerSeries::register(&mut registry);
        let webhooks = webhook::WebhookSeries::register(&mut registry);
        let proxmox = proxmox::ProxmoxSeries::register(&mut registry);
        let machines = machines::MachineSeries::register(&mut registry);
        let stores = std::sync::Arc::new(stores::Stores::default());
        registry.register_collector(Box::new(stores.clone()));
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        let leader = Family::<Labels, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the leader Lease named by `name`, 0 otherwise",
            leader.clone(),
        );
        let build = Family::<Labels, Gauge>::default();
        build
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())])
            .set(1);
        registry.register(
            "tenantry_build_info",
            "The running release (always 1)",
            build,
        );
        Self {
            registry,
            controllers,
            webhooks,
            proxmox,
            machines,
            stores,
            leader,
        }
    }

    /// Whether this replica leads, for `leader_election_master_status`.
    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&vec![("name", lease.to_string())])
            .set(i64::from(leading));
    }

    /// The exposition: OpenMetrics text when `openmetrics`, else the
    /// Prometheus text format 0.0.4 (what a scraper gets that asks for
    /// neither).
    pub fn encode(&self, openmetrics: bool) -> String {
        let mut text = String::new();
        let written = if openmetrics {
            prometheus_client::encoding::text::encode(&mut text, &self.registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        };
        // Writing into a String fails only if an encoder refuses a value.
        if let Err(error) = written {
            tracing::warn!(%error, "metrics could not be encoded");
        }
        text
    }
}

/// Histogram buckets, as upper bounds in seconds.
pub(crate) fn histogram(buckets: &[f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}
