//! The tenant side of a workload cluster: its control plane, its etcd and
//! its nodes.
//!
//! In production a tenant's control plane runs as pods (Kamaji) on an etcd
//! the platform runs per tenant namespace (etcd-operator, registered with
//! Kamaji as a DataStore), and its workers are VMs whose kubelets register
//! Nodes with that control plane, booting Talos machine configs that CABPT
//! puts into bootstrap data Secrets. Neither pods nor guests run here, and
//! CABPT cannot be built here, so four simulators stand in:
//!
//! - [`KamajiControlPlaneSimulator`] plays Kamaji and its Cluster API
//!   control plane provider for `KamajiControlPlane` objects: each one gets a
//!   real kube-apiserver of the Kubernetes minor it asks for (a harness
//!   [`ControlPlane`](crate::ControlPlane)), upgraded in place when
//!   `spec.version` moves to the next minor; Kamaji's
//!   `<kcp>-admin-kubeconfig` Secret, the `<cluster>-kubeconfig` and
//!   `<cluster>-ca` Secrets CAPI reads, the `<kcp>` Service in front of it,
//!   its endpoint and the control plane contract status: v1beta2 for
//!   `v1alpha2`, or v1beta1 for `v1alpha1` ([`KamajiApi`], the provider
//!   release Cozystack deploys).
//! - [`EtcdSimulator`] plays etcd-operator for `EtcdCluster` objects and
//!   Kamaji's DataStore controller for `DataStore` objects: available and
//!   ready once the Secrets they reference exist, unavailable on demand.
//! - CABPT is not simulated: the real one runs
//!   ([`crate::UpstreamManager::start_cabpt`]).
//! - [`NodeSimulator`] plays the kubelet of every worker VM the substrate
//!   simulators run: when a guest is up and its bootstrap data is a Talos
//!   config naming a tenant's endpoint, a Node registers there with the
//!   providerID the infrastructure provider reports, and its heartbeat
//!   (Node status and Lease) stays fresh while the guest runs. On demand it
//!   first checks the config's cluster CA and bootstrap token against the
//!   tenant, as a kubelet's TLS bootstrap would.
//!
//! [`TenantClusters`] connects the control planes and the kubelets: the
//! endpoints of running tenant control planes, which is what a kubelet
//! looks up in its bootstrap data. A tenant is registered under its real
//! loopback endpoint and under the cluster DNS names of its control plane
//! Service (`https://<kcp>.<ns>.svc:6443`), which nothing resolves on this
//! machine: the registry plays the part of the hosts entry a Talos worker
//! gets for that name. Each simulator's module documentation lists what it
//! copies from upstream and what it leaves out.
//!
//! A test starts them against its management cluster's client:
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> anyhow::Result<()> {
//! use tenantry_e2e::sim::tenant::*;
//! let tenants = TenantClusters::new();
//! let etcd = EtcdSimulator::start(client.clone()).await?;
//! let kamaji = KamajiControlPlaneSimulator::start(
//!     client.clone(),
//!     tenants.clone(),
//!     TenantControlPlaneOptions::default(),
//! )
//! .await?;
//! kamaji.wait_for_data_stores(true); // optional: Kamaji waits for DataStores
//! let nodes = NodeSimulator::start(tenants, NodeSimConfig::default());
//! # Ok(()) }
//! ```

mod control_plane;
mod etcd;
mod exposure;
mod kubelet;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub use control_plane::{
    ExtraArgs, KAMAJI_CONTROL_PLANE_KIND, KAMAJI_OWNED_APISERVER_FLAGS, KamajiApi,
    KamajiControlPlaneSimulator, TenantApiServer, TenantControlPlaneOptions, VersionChange,
    apiserver_for_version, install_crds as install_kamaji_crds,
    install_crds_for as install_kamaji_crds_for, split_extra_args, version_change,
};
pub use etcd::{
    DATA_STORE_FINALIZER, ETCD_FAULT_ANNOTATION, EtcdFault, EtcdSimulator,
    install_crds as install_etcd_crds, referenced_secrets as etcd_cluster_secrets,
};
pub use kubelet::{
    BOOTSTRAP_TOKEN_SECRET_TYPE, NODE_BOOTSTRAP_GROUP, NodeFault, NodeSimConfig, NodeSimulator,
    SimulatedNode, TalosJoin, check_bootstrap_token, check_cluster_ca,
};

/// A running tenant control plane, as kubelets and tests reach it.
#[derive(Clone)]
pub struct TenantCluster {
    /// Namespace of the CAPI Cluster in the management cluster.
    pub namespace: String,
    /// Name of the CAPI Cluster.
    pub name: String,
    /// `https://host:port` of its kube-apiserver.
    pub endpoint: String,
    /// The tenant's Kubernetes CA certificate (PEM), which signs the
    /// apiserver's serving certificate: what a joining kubelet must trust.
    pub ca_pem: String,
    /// An admin client of its kube-apiserver.
    pub client: kube::Client,
}

impl std::fmt::Debug for TenantCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCluster")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// The tenant control planes that run now, by endpoint.
///
/// A tenant is found by its real endpoint (the harness apiserver on
/// loopback) and by aliases: the names of its control plane Service in the
/// management cluster (`<kcp>.<ns>.svc:<port>`), which a Talos worker's
/// config names and reaches through a hosts entry
/// (`machine.network.extraHostEntries`) pointing at the Service's
/// ClusterIP. Nothing resolves those names or routes ClusterIPs on this
/// machine; the alias plays the role of the hosts entry and the Service
/// together.
#[derive(Clone, Default)]
pub struct TenantClusters(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    /// By `host:port` of the real endpoint.
    tenants: BTreeMap<String, TenantCluster>,
    /// Alias `host:port` to the real endpoint's `host:port`.
    aliases: BTreeMap<String, String>,
}

impl TenantClusters {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().expect("tenant registry lock")
    }

    pub(crate) fn insert(&self, cluster: TenantCluster) {
        self.lock()
            .tenants
            .insert(endpoint_key(&cluster.endpoint), cluster);
    }

    /// Makes the tenant at `endpoint` answer at `alias` too, until it is
    /// removed.
    pub(crate) fn alias(&self, endpoint: &str, alias: &str) {
        self.lock()
            .aliases
            .insert(endpoint_key(alias), endpoint_key(endpoint));
    }

    /// Forgets the tenant at `endpoint` and its aliases.
    pub(crate) fn remove(&self, endpoint: &str) {
        let key = endpoint_key(endpoint);
        let mut registry = self.lock();
        registry.tenants.remove(&key);
        registry.aliases.retain(|_, target| *target != key);
    }

    /// The tenant whose kube-apiserver answers at `endpoint` (any of
    /// `https://host:port`, `host:port`; a trailing slash is ignored),
    /// directly or through one of its Service names.
    pub fn by_endpoint(&self, endpoint: &str) -> Option<TenantCluster> {
        let key = endpoint_key(endpoint);
        let registry = self.lock();
        let key = registry.aliases.get(&key).unwrap_or(&key);
        registry.tenants.get(key).cloned()
    }

    /// The tenant control plane of the CAPI Cluster `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<TenantCluster> {
        self.lock()
            .tenants
            .values()
            .find(|c| c.namespace == namespace && c.name == name)
            .cloned()
    }

    /// Every running tenant control plane.
    pub fn all(&self) -> Vec<TenantCluster> {
        self.lock().tenants.values().cloned().collect()
    }

    /// The endpoints (`host:port`) the tenant at `endpoint` also answers
    /// at.
    pub fn aliases_of(&self, endpoint: &str) -> Vec<String> {
        let key = endpoint_key(endpoint);
        self.lock()
            .aliases
            .iter()
            .filter(|(_, target)| **target == key)
            .map(|(alias, _)| alias.clone())
            .collect()
    }
}

/// `host:port` of an endpoint URL, the key kubelets and control planes agree
/// on (Talos writes `https://host:port`, CAPI `{host, port}`).
fn endpoint_key(endpoint: &str) -> String {
    let rest = endpoint
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:443")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(endpoint: &str) -> TenantCluster {
        let config = kube::Config::new(endpoint.parse().unwrap());
        TenantCluster {
            namespace: "tenant-a".into(),
            name: "kubernetes-demo".into(),
            endpoint: endpoint.into(),
            ca_pem: String::new(),
            client: kube::Client::try_from(config).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_tenant_answers_at_its_aliases_until_removed() {
        let tenants = TenantClusters::new();
        tenants.insert(tenant("https://127.0.0.1:40001"));
        tenants.alias(
            "https://127.0.0.1:40001",
            "kubernetes-demo.tenant-a.svc:6443",
        );
        let found = tenants
            .by_endpoint("https://kubernetes-demo.tenant-a.svc:6443/")
            .expect("found by its Service name");
        assert_eq!(found.endpoint, "https://127.0.0.1:40001");
        assert!(
            tenants
                .by_endpoint("https://kubernetes-demo.tenant-a.svc:443")
                .is_none()
        );
        assert_eq!(
            tenants.aliases_of("https://127.0.0.1:40001"),
            ["kubernetes-demo.tenant-a.svc:6443"]
        );
        assert_eq!(tenants.all().len(), 1, "aliases are not more tenants");

        tenants.remove("https://127.0.0.1:40001");
        assert!(
            tenants
                .by_endpoint("https://kubernetes-demo.tenant-a.svc:6443")
                .is_none()
        );
        assert!(tenants.aliases_of("https://127.0.0.1:40001").is_empty());
    }

    #[test]
    fn endpoints_compare_by_host_and_port() {
        assert_eq!(endpoint_key("https://127.0.0.1:6443"), "127.0.0.1:6443");
        assert_eq!(endpoint_key("https://127.0.0.1:6443/"), "127.0.0.1:6443");
        assert_eq!(endpoint_key("127.0.0.1:6443"), "127.0.0.1:6443");
        assert_eq!(endpoint_key("https://tenant.example"), "tenant.example:443");
    }
}
