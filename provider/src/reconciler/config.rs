//! The settings every controller of one manager shares.

use std::fmt::Debug;

use kube::Resource;
use kube::api::Api;
use serde::de::DeserializeOwned;

use super::turns::Turns;
use super::watch::watch_config;

/// Settings that apply to all controllers of one manager.
#[derive(Clone, Debug, Default)]
pub struct ManagerConfig {
    /// Watch only this namespace (CAPI's `--namespace`); all when unset.
    pub namespace: Option<String>,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`
    /// (CAPI's `--watch-filter`), for sharding tenants across managers.
    pub watch_filter: Option<String>,
    /// Identity reported on Kubernetes Events (the pod name in a cluster).
    pub instance: Option<String>,
    /// Serve the admission webhooks, when set.
    pub webhook: Option<crate::webhook::WebhookConfig>,
    /// The key of Kamaji's `<cluster>-admin-kubeconfig` Secret tenantry
    /// reaches tenant clusters with; `super-admin.svc` (the control plane's
    /// Service, resolvable inside the management cluster) when unset. A
    /// manager running outside the cluster uses `super-admin.conf`.
    pub tenant_kubeconfig_key: Option<String>,
    /// How many objects one controller reconciles at once;
    /// [`DEFAULT_MAX_CONCURRENT_RECONCILES`] when unset, unbounded at 0.
    pub max_concurrent_reconciles: Option<u16>,
    /// What `/readyz` reports; the controllers add their caches to it.
    pub readiness: crate::health::Readiness,
    /// The Talos image factory a `Kubernetes` object's workers boot from
    /// when its `talos.imageFactoryURL` is unset (the mutating webhook
    /// writes it into new objects); the public factory when unset. A
    /// platform with its own factory or mirror sets it once here instead of
    /// in every object.
    pub talos_image_factory_url: Option<String>,
    /// The IngressClass of the Ingress publishing a tenant apiserver when
    /// its namespace names none (`namespace.cozystack.io/ingress`); the
    /// cluster's default class when unset.
    pub tenant_ingress_class: Option<String>,
    /// Serve metrics, when set (every replica serves its own).
    pub metrics: Option<crate::metrics::MetricsConfig>,
}

/// Reconciles one controller runs at once unless configured. Unbounded, the
/// peak memory grows with a wave of machines, for no gain in time
/// (docs/performance.md).
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 16;

impl ManagerConfig {
    /// The image factory of objects that name none (see
    /// [`Self::talos_image_factory_url`]).
    pub fn default_image_factory_url(&self) -> &str {
        self.talos_image_factory_url
            .as_deref()
            .unwrap_or(tenantry_api::kubevirt::DEFAULT_IMAGE_FACTORY_URL)
    }

    /// The label selector implementing `--watch-filter`, if any.
    pub fn label_selector(&self) -> Option<String> {
        self.watch_filter
            .as_ref()
            .map(|value| format!("cluster.x-k8s.io/watch-filter={value}"))
    }

    /// The settings every controller of this manager runs with: kube's
    /// runner unbounded, since `reconciler::run` bounds reconciles with
    /// fair [`Turns`] instead (kube's runner, while every slot is busy,
    /// parks due objects in a hash set and takes them out in hash order, so
    /// under a steady load some objects starve: docs/performance.md).
    pub fn controller_config(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default()
    }

    /// How many objects one controller reconciles at once; 0: no bound.
    pub fn reconcile_bound(&self) -> u16 {
        self.max_concurrent_reconciles
            .unwrap_or(DEFAULT_MAX_CONCURRENT_RECONCILES)
    }

    /// The turns of one controller, as many at once as its bound allows.
    pub fn turns(&self) -> Turns {
        Turns::new(self.reconcile_bound())
    }

    /// A watcher configuration honouring the watch filter.
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        let config = watch_config().any_semantic();
        match self.label_selector() {
            Some(selector) => config.labels(&selector),
            None => config,
        }
    }

    /// An Api for a namespaced kind, scoped to the watched namespace.
    pub fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + DeserializeOwned
            + Clone
            + Debug,
    {
        match &self.namespace {
            Some(namespace) => Api::namespaced(client.clone(), namespace),
            None => Api::all(client.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn watch_filter_becomes_a_label_selector() {
        let config = ManagerConfig {
            watch_filter: Some("shard-1".into()),
            ..Default::default()
        };
        assert_eq!(
            config.label_selector().as_deref(),
            Some("cluster.x-k8s.io/watch-filter=shard-1")
        );
        assert_eq!(ManagerConfig::default().label_selector(), None);
    }

    #[test]
    fn the_default_image_factory_is_the_public_one_unless_configured() {
        assert_eq!(
            ManagerConfig::default().default_image_factory_url(),
            "https://factory.talos.dev"
        );
        let config = ManagerConfig {
            talos_image_factory_url: Some("http://factory.internal:8080".into()),
            ..Default::default()
        };
        assert_eq!(
            config.default_image_factory_url(),
            "http://factory.internal:8080"
        );
    }
}
