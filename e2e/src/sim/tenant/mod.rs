//! The tenant side of a workload cluster: its control plane, its etcd and
//! its nodes.
//!
//! In production a tenant's control plane runs as pods (Kamaji) on an etcd
//! the platform runs per tenant namespace (etcd-operator, registered with
//! Kamaji as a DataStore), and its workers are VMs whose kubelets register
//! Nodes with that control plane. Neither pods nor guests run here, so three
//! simulators stand in:
//!
//! - [`KamajiControlPlaneSimulator`] plays Kamaji and its Cluster API
//!   control plane provider for `KamajiControlPlane` objects: each one gets a
//!   real kube-apiserver of the Kubernetes minor it asks for (a harness
//!   [`ControlPlane`](crate::ControlPlane)), upgraded in place when
//!   `spec.version` moves to the next minor; Kamaji's
//!   `<kcp>-admin-kubeconfig` Secret, the `<cluster>-kubeconfig` and
//!   `<cluster>-ca` Secrets CAPI reads, its endpoint and the v1beta2 control
//!   plane contract status.
//! - [`EtcdSimulator`] plays etcd-operator for `EtcdCluster` objects and
//!   Kamaji's DataStore controller for `DataStore` objects: available and
//!   ready once the Secrets they reference exist, unavailable on demand.
//! - [`NodeSimulator`] plays the kubelet of every worker VM the substrate
//!   simulators run: when a guest is up and its bootstrap data is a Talos
//!   config naming a tenant's endpoint, a Node registers there with the
//!   providerID the infrastructure provider reports, and its heartbeat
//!   (Node status and Lease) stays fresh while the guest runs.
//!
//! [`TenantClusters`] connects the first and the last: the endpoints of
//! running tenant control planes, which is what a kubelet looks up in its
//! bootstrap data. Each simulator's module documentation lists what it
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
mod kubelet;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub use control_plane::{
    ExtraArgs, KAMAJI_CONTROL_PLANE_KIND, KAMAJI_OWNED_APISERVER_FLAGS,
    KamajiControlPlaneSimulator, TenantApiServer, TenantControlPlaneOptions, VersionChange,
    apiserver_for_version, install_crds as install_kamaji_crds, split_extra_args, version_change,
};
pub use etcd::{
    DATA_STORE_FINALIZER, ETCD_FAULT_ANNOTATION, EtcdFault, EtcdSimulator,
    install_crds as install_etcd_crds, referenced_secrets as etcd_cluster_secrets,
};
pub use kubelet::{NodeFault, NodeSimConfig, NodeSimulator, SimulatedNode, TalosJoin};

/// A running tenant control plane, as kubelets and tests reach it.
#[derive(Clone)]
pub struct TenantCluster {
    /// Namespace of the CAPI Cluster in the management cluster.
    pub namespace: String,
    /// Name of the CAPI Cluster.
    pub name: String,
    /// `https://host:port` of its kube-apiserver.
    pub endpoint: String,
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
#[derive(Clone, Default)]
pub struct TenantClusters(Arc<Mutex<BTreeMap<String, TenantCluster>>>);

impl TenantClusters {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, TenantCluster>> {
        self.0.lock().expect("tenant registry lock")
    }

    pub(crate) fn insert(&self, cluster: TenantCluster) {
        self.lock().insert(endpoint_key(&cluster.endpoint), cluster);
    }

    pub(crate) fn remove(&self, endpoint: &str) {
        self.lock().remove(&endpoint_key(endpoint));
    }

    /// The tenant whose kube-apiserver answers at `endpoint` (any of
    /// `https://host:port`, `host:port`; a trailing slash is ignored).
    pub fn by_endpoint(&self, endpoint: &str) -> Option<TenantCluster> {
        self.lock().get(&endpoint_key(endpoint)).cloned()
    }

    /// The tenant control plane of the CAPI Cluster `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<TenantCluster> {
        self.lock()
            .values()
            .find(|c| c.namespace == namespace && c.name == name)
            .cloned()
    }

    /// Every running tenant control plane.
    pub fn all(&self) -> Vec<TenantCluster> {
        self.lock().values().cloned().collect()
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
    use super::endpoint_key;

    #[test]
    fn endpoints_compare_by_host_and_port() {
        assert_eq!(endpoint_key("https://127.0.0.1:6443"), "127.0.0.1:6443");
        assert_eq!(endpoint_key("https://127.0.0.1:6443/"), "127.0.0.1:6443");
        assert_eq!(endpoint_key("127.0.0.1:6443"), "127.0.0.1:6443");
        assert_eq!(endpoint_key("https://tenant.example"), "tenant.example:443");
    }
}
