//! Wiring of the ProxmoxCluster controller.

use std::sync::Arc;

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tenantry_api::proxmox::{PROXMOX_CLUSTER_FINALIZER, ProxmoxCluster, ProxmoxMachine};

use super::reconcile::{self, ClusterContext, Error, owner_cluster_name};
use crate::capi::Cluster;
use crate::reconciler::{self, Context, ManagerConfig};

/// How often a cluster is reconciled at most for changes of its machines.
const MACHINE_TRIGGER_INTERVAL: Duration = Duration::from_secs(5);

/// The clusters whose machines change: metadata is enough to tell a
/// machine's cluster, and a watch of it sends less than the whole machine.
fn machine_triggers(
    client: &kube::Client,
    config: &ManagerConfig,
    clusters: Store<ProxmoxCluster>,
) -> impl Stream<Item = ObjectRef<ProxmoxCluster>> + Send + 'static {
    watcher(
        config.api::<PartialObjectMeta<ProxmoxMachine>>(client),
        config.watcher_config(),
    )
    .backoff(reconciler::watch_backoff())
    .touched_objects()
    .filter_map(|event| async move {
        event
            .inspect_err(|error| tracing::debug!(%error, "ProxmoxMachine watch failed; retrying"))
            .ok()
    })
    .flat_map(move |machine| {
        let namespace = machine.metadata.namespace.clone().unwrap_or_default();
        let cluster = crate::capi::owner::cluster_name(&machine.metadata).map(str::to_string);
        let owners: Vec<ObjectRef<ProxmoxCluster>> = match cluster {
            None => Vec::new(),
            Some(cluster) => clusters
                .state()
                .into_iter()
                .filter(|c| {
                    c.metadata.namespace.as_deref() == Some(namespace.as_str())
                        && owner_cluster_name(c).as_deref() == Some(cluster.as_str())
                })
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect(),
        };
        futures::stream::iter(owners)
    })
}

/// Runs the controller until shutdown.
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let clusters: Api<ProxmoxCluster> = config.api(&client);
    let controller = Controller::new(clusters, config.watcher_config())
        .trigger_backoff(crate::reconciler::trigger_backoff())
        .with_config(config.controller_config());
    let store = controller.store();
    base.track_cache(store.clone());
    let ctx = Arc::new(ClusterContext::new(base));
    let controller = controller
        .watches_stream(
            crate::capi::access::watch::<Cluster>(&ctx.base),
            |cluster| {
                let reference = cluster.spec.infrastructure_ref.as_ref()?;
                (reference.kind == "ProxmoxCluster").then(|| {
                    ObjectRef::new(&reference.name)
                        .within(cluster.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        )
        // The cluster's machines: their node locations and what the
        // preflight checks. Throttled: a wave of machines changes dozens of
        // times a second, and each reconcile is a full pass (pools, machine
        // list, preflight inputs) that ends with the same status.
        .reconcile_on(reconciler::throttle_triggers(
            machine_triggers(&client, &config, store),
            MACHINE_TRIGGER_INTERVAL,
        ));
    reconciler::run(controller, reconcile_cluster, ctx).await;
}

async fn reconcile_cluster(
    object: Arc<ProxmoxCluster>,
    ctx: Arc<ClusterContext>,
) -> Result<Action, Error> {
    reconciler::reconcile_with_finalizer(
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
