//! The KubevirtCluster reconciler: the control-plane endpoint Service
//! `<cluster>-lb` (ClusterIP, NodePort or LoadBalancer), the endpoint taken
//! from it, the cluster's SSH key pair for the ssh bootstrap check, and the
//! v1beta2 contract status.
//!
//! Externally managed KubevirtClusters (annotation `cluster.x-k8s.io/managed-by`,
//! e.g. by the Kamaji control plane provider) are never reconciled as ours:
//! no finalizer, no Service, no spec change. Their manager writes
//! `spec.controlPlaneEndpoint` and `status.ready` (the v1beta1 contract); since
//! our CRD carries the v1beta2 contract label, CAPI reads
//! `status.initialization.provisioned` instead. So tenantry mirrors exactly
//! that one field from `status.ready`, under its own field manager, and
//! writes nothing else.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use tenantry_api::kubevirt::KubevirtCluster;

use self::reconcile::reconcile;
use crate::capi::Cluster;
use crate::kubevirt::infra::InfraClients;
use crate::kubevirt::ssh::KeyError;
use crate::reconciler::{self, Context};

/// Condition: the control-plane Service has an address (CAPK's name).
pub const LOAD_BALANCER_AVAILABLE: &str = "LoadBalancerAvailable";
/// Label on the Service naming its KubevirtCluster.
pub const KUBEVIRT_CLUSTER_LABEL: &str = "infrastructure.tenantry.dev/kubevirtcluster";
/// The API server port the Service exposes.
pub const API_SERVER_PORT: i32 = 6443;
/// Field manager for the one status field mirrored on externally managed clusters.
const CONTRACT_BRIDGE_MANAGER: &str = "tenantry-contract-bridge";

/// The Service fronting a cluster's control plane.
pub fn service_name(cluster_name: &str) -> String {
    format!("{cluster_name}-lb")
}

/// The Secret holding a KubevirtCluster's SSH key pair (CAPK's name).
pub fn ssh_keys_secret_name(kubevirt_cluster: &str) -> String {
    format!("{kubevirt_cluster}-ssh-keys")
}

/// The Secret type Cluster API gives the secrets it and its providers make.
const CLUSTER_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error<KeyError>;

impl reconciler::OwnError for KeyError {}

impl From<KeyError> for Error {
    fn from(error: KeyError) -> Self {
        Error::Own(Box::new(error))
    }
}

struct ClusterContext {
    base: Arc<Context>,
    infra: InfraClients,
}

impl AsRef<Context> for ClusterContext {
    fn as_ref(&self) -> &Context {
        &self.base
    }
}

/// Runs the controller until shutdown.
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let clusters: Api<KubevirtCluster> = config.api(&client);
    let ctx = Arc::new(ClusterContext {
        base,
        infra: InfraClients::default(),
    });
    let service_config = crate::reconciler::watch_config().labels(KUBEVIRT_CLUSTER_LABEL);
    let controller = Controller::new(clusters, config.watcher_config())
        .trigger_backoff(crate::reconciler::trigger_backoff())
        .with_config(config.controller_config());
    ctx.base.track_cache(controller.store());
    let controller = controller
        .owns(config.api::<Service>(&client), service_config)
        .watches_stream(
            crate::capi::access::watch::<Cluster>(&ctx.base),
            |cluster| {
                let reference = cluster.spec.infrastructure_ref.as_ref()?;
                (reference.kind == "KubevirtCluster").then(|| {
                    ObjectRef::new(&reference.name)
                        .within(cluster.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        );
    reconciler::run(controller, reconcile, ctx).await;
}

mod act;
mod decide;
mod reconcile;
mod status;
#[cfg(test)]
mod tests;

pub use decide::endpoint_from;
