//! Wiring of the ProxmoxMachine controller: what it watches and how errors
//! are retried.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use tenantry_api::generated::capi::ip_address::IpAddress;
use tenantry_api::generated::capi::ip_address_claim::IpAddressClaim;
use tenantry_api::proxmox::{PROXMOX_MACHINE_FINALIZER, ProxmoxCluster, ProxmoxMachine};

use super::act::claims::MACHINE_LABEL;
use super::cache::Caches;
use super::reconcile::{self, Error};
use crate::capi::stores::CapiStores;
use crate::capi::{Cluster, Machine};
use crate::proxmox::credentials::ClientCache;
use crate::reconciler::{self, Context, Turns};

/// What ProxmoxMachine reconciles share.
pub struct MachineContext {
    pub base: Arc<Context>,
    pub clients: ClientCache,
    /// Every ProxmoxMachine the controller sees: the VM IDs other machines
    /// reserved and where a cluster's machines run.
    pub machines: Store<ProxmoxMachine>,
    /// What reconciles read from memory instead of asking again.
    pub caches: Caches,
    /// The bound on reconciles at once, served in order (see [`Turns`]).
    pub turns: Turns,
}

/// How long a machine's triggers are gathered before it is reconciled.
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(500);

/// The machines of a cluster, from the store.
fn machines_of(
    store: &Store<ProxmoxMachine>,
    namespace: &str,
    cluster: &str,
) -> Vec<ObjectRef<ProxmoxMachine>> {
    store
        .state()
        .into_iter()
        .filter(|m| {
            m.metadata.namespace.as_deref() == Some(namespace)
                && crate::capi::owner::cluster_name(&m.metadata) == Some(cluster)
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// Runs the controller until the stream ends (on shutdown).
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let machines: Api<ProxmoxMachine> = config.api(&client);
    let controller = crate::reconciler::slim_controller(machines, config.watcher_config());
    let store = controller.store();
    base.track_cache(store.clone());
    // Each watch feeds a store (read by reconciles, see cache.rs) and
    // triggers reconciles of the machines it concerns.
    let labelled = crate::reconciler::watch_config()
        .labels(MACHINE_LABEL)
        .any_semantic();
    let (owner_machines, machine_writer) = reflector::store();
    let (clusters, cluster_writer) = reflector::store();
    let (proxmox_clusters, proxmox_cluster_writer) = reflector::store();
    let (claims, claim_writer) = reflector::store();
    let (addresses, address_writer) = reflector::store();
    let machine_stream = crate::reconciler::cache_watch(
        config.api::<Machine>(&client),
        config.watcher_config(),
        machine_writer,
    );
    let cluster_stream = crate::reconciler::cache_watch(
        config.api::<Cluster>(&client),
        config.watcher_config(),
        cluster_writer,
    );
    let proxmox_cluster_stream = crate::reconciler::cache_watch(
        config.api::<ProxmoxCluster>(&client),
        config.watcher_config(),
        proxmox_cluster_writer,
    );
    let claim_stream = crate::reconciler::cache_watch(
        config.api::<IpAddressClaim>(&client),
        labelled,
        claim_writer,
    );
    // IPAddresses carry the IPAM provider's labels, not ours: all of the
    // watched namespace(s). Read only; their claims' changes wake machines.
    let address_stream = crate::reconciler::cache_watch(
        config.api::<IpAddress>(&client),
        crate::reconciler::watch_config().any_semantic(),
        address_writer,
    );
    let ctx = Arc::new(MachineContext {
        turns: config.turns(),
        base,
        clients: ClientCache::default(),
        machines: store.clone(),
        caches: Caches::new(
            CapiStores {
                machines: owner_machines,
                clusters,
            },
            proxmox_clusters,
            claims,
            addresses,
        ),
    });
    let by_cluster = store.clone();
    let by_proxmox_cluster = store.clone();
    controller
        // A clone, its configuration and the boot are bursts of status and
        // claim changes; one reconcile after a burst sees what one per
        // change would, for a fraction of the requests.
        .with_config(config.controller_config_taking_turns().debounce(DEBOUNCE))
        .watches_stream(claim_stream, |claim| {
            let labels = claim.metadata.labels.as_ref()?;
            Some(
                ObjectRef::new(labels.get(MACHINE_LABEL)?)
                    .within(claim.metadata.namespace.as_deref()?),
            )
        })
        .watches_stream(address_stream, |_| None)
        .watches_stream(machine_stream, |machine| {
            let reference = &machine.spec.infrastructure_ref;
            (reference.kind == "ProxmoxMachine").then(|| {
                ObjectRef::new(&reference.name)
                    .within(machine.metadata.namespace.as_deref().unwrap_or_default())
            })
        })
        .watches_stream(cluster_stream, move |cluster| {
            // Unpause, infrastructure provisioned, control plane initialized:
            // all of the cluster's machines.
            machines_of(
                &by_cluster,
                cluster.metadata.namespace.as_deref().unwrap_or_default(),
                cluster.metadata.name.as_deref().unwrap_or_default(),
            )
        })
        .watches_stream(proxmox_cluster_stream, move |proxmox_cluster| {
            match crate::capi::owner::cluster_name(&proxmox_cluster.metadata) {
                Some(cluster) => machines_of(
                    &by_proxmox_cluster,
                    proxmox_cluster
                        .metadata
                        .namespace
                        .as_deref()
                        .unwrap_or_default(),
                    cluster,
                ),
                None => Vec::new(),
            }
        })
        .shutdown_on_signal()
        .run(reconcile_machine, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ProxmoxMachine reconcile ended with an error");
            }
        })
        .await;
}

async fn reconcile_machine(
    machine: Arc<ProxmoxMachine>,
    ctx: Arc<MachineContext>,
) -> Result<Action, Error> {
    let _turn = ctx.turns.take().await;
    // The machine as it is now: it may have changed during the wait.
    let Some(machine) = ctx.machines.get(&ObjectRef::from_obj(machine.as_ref())) else {
        return Ok(Action::await_change());
    };
    // Boxed: a reconcile waiting for its turn holds only this much.
    Box::pin(reconcile_in_turn(machine, &ctx)).await
}

async fn reconcile_in_turn(
    machine: Arc<ProxmoxMachine>,
    ctx: &MachineContext,
) -> Result<Action, Error> {
    reconciler::reconcile_with_finalizer(
        &ctx.base,
        machine,
        PROXMOX_MACHINE_FINALIZER,
        |event| async {
            match event {
                Finalizer::Apply(machine) => reconcile::apply(machine, ctx).await,
                Finalizer::Cleanup(machine) => reconcile::cleanup(machine, ctx).await,
            }
        },
    )
    .await
}

fn error_policy(machine: Arc<ProxmoxMachine>, error: &Error, ctx: Arc<MachineContext>) -> Action {
    reconciler::error_policy(machine, error, ctx.base.clone())
}
