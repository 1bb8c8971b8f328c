//! Wiring of the ProxmoxCluster controller.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use tenantry_api::proxmox::{PROXMOX_CLUSTER_FINALIZER, ProxmoxCluster, ProxmoxMachine};

use super::reconcile::{self, ClusterContext, Error, owner_cluster_name};
use crate::capi::Cluster;
use crate::runtime::{self, Context};

/// Runs the controller until shutdown.
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let clusters: Api<ProxmoxCluster> = config.api(&client);
    let controller = Controller::new(clusters, config.watcher_config())
        .trigger_backoff(crate::runtime::trigger_backoff())
        .with_config(config.controller_config());
    let store = controller.store();
    let ctx = Arc::new(ClusterContext::new(base));
    controller
        .watches(
            config.api::<Cluster>(&client),
            config.watcher_config(),
            |cluster| {
                let reference = cluster.spec.infrastructure_ref.as_ref()?;
                (reference.kind == "ProxmoxCluster").then(|| {
                    ObjectRef::new(&reference.name)
                        .within(cluster.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        )
        // The cluster's machines: their node locations and what the
        // preflight checks.
        .watches(
            config.api::<ProxmoxMachine>(&client),
            config.watcher_config(),
            move |machine| {
                let namespace = machine.metadata.namespace.clone().unwrap_or_default();
                let cluster =
                    crate::capi::owner::cluster_name(&machine.metadata).map(str::to_string);
                store
                    .state()
                    .into_iter()
                    .filter(|c| {
                        c.metadata.namespace.as_deref() == Some(namespace.as_str())
                            && cluster.is_some()
                            && owner_cluster_name(c) == cluster
                    })
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .shutdown_on_signal()
        .run(reconcile_cluster, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ProxmoxCluster reconcile ended with an error");
            }
        })
        .await;
}

async fn reconcile_cluster(
    object: Arc<ProxmoxCluster>,
    ctx: Arc<ClusterContext>,
) -> Result<Action, Error> {
    runtime::reconcile_with_finalizer(
        &ctx.base,
        object,
        PROXMOX_CLUSTER_FINALIZER,
        |event| async {
            match event {
                Finalizer::Apply(object) => reconcile::apply(object, &ctx).await,
                Finalizer::Cleanup(object) => reconcile::cleanup(object, &ctx).await,
            }
        },
    )
    .await
}

fn error_policy(object: Arc<ProxmoxCluster>, error: &Error, ctx: Arc<ClusterContext>) -> Action {
    runtime::error_policy(object, error, ctx.base.clone())
}
