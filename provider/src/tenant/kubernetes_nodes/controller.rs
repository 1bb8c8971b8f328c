//! Wiring of the `KubernetesNodes` controller: the pools, and the
//! MachineDeployments they own (so status follows CAPI's counts), and the
//! parent `Kubernetes` objects (a change there re-renders every pool of the
//! cluster).

use std::sync::Arc;

use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use tenantry_api::tenant::Kubernetes;
use tenantry_api::tenant_nodes::{KUBERNETES_NODES_FINALIZER, KubernetesNodes};

use super::reconcile::{self, Error};
use crate::capi::CapiKind;
use crate::reconciler::{self, Context};

/// Runs the controller until shutdown.
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let pools: Api<KubernetesNodes> = config.api(&client);
    let deployment_resource = base.capi.resource(CapiKind::MachineDeployment);
    let deployments: Api<DynamicObject> = Api::all_with(client.clone(), &deployment_resource);
    let controller = Controller::new(pools, config.watcher_config())
        .trigger_backoff(crate::reconciler::trigger_backoff())
        .with_config(config.controller_config());
    let store = controller.store();
    base.track_cache(store.clone());
    crate::metrics::global()
        .stores
        .kubernetes_nodes(store.clone());
    // A change of the parent (talos.*, version) changes what its pools
    // render: every pool naming it is reconciled.
    let parents: Api<Kubernetes> = config.api(&client);
    let controller = controller
        .watches(parents, crate::reconciler::watch_config(), move |parent| {
            let name = parent.metadata.name.clone().unwrap_or_default();
            let namespace = parent.metadata.namespace.clone();
            store
                .state()
                .into_iter()
                .filter(|pool| pool.spec.cluster == name && pool.metadata.namespace == namespace)
                .map(|pool| ObjectRef::from_obj(pool.as_ref()))
                .collect::<Vec<_>>()
        })
        .owns_with(
            deployments,
            deployment_resource,
            crate::reconciler::watch_config().labels(super::render::POOL_LABEL),
        );
    reconciler::run(controller, reconcile, base).await;
}

async fn reconcile(object: Arc<KubernetesNodes>, ctx: Arc<Context>) -> Result<Action, Error> {
    reconciler::reconcile_with_finalizer(&ctx, object, KUBERNETES_NODES_FINALIZER, |event| async {
        match event {
            Finalizer::Apply(pool) => reconcile::apply_pool(pool, &ctx).await,
            Finalizer::Cleanup(pool) => reconcile::cleanup_pool(pool, &ctx).await,
        }
    })
    .await
}
