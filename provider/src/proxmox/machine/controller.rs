//! Wiring of the ProxmoxMachine controller: what it watches and how errors
//! are retried.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::{ObjectRef, Store};
use tenantry_api::generated::capi::ip_address::IpAddress;
use tenantry_api::generated::capi::ip_address_claim::IpAddressClaim;
use tenantry_api::proxmox::{PROXMOX_MACHINE_FINALIZER, ProxmoxCluster, ProxmoxMachine};

use super::act::claims::MACHINE_LABEL;
use super::cache::Caches;
use super::reconcile::{self, Error};
use crate::capi::owner;
use crate::capi::stores::CapiStores;
use crate::proxmox::credentials::ClientCache;
use crate::reconciler::{self, Context};

/// What ProxmoxMachine reconciles share.
pub struct MachineContext {
    pub base: Arc<Context>,
    pub clients: ClientCache,
    /// Every ProxmoxMachine the controller sees: the VM IDs other machines
    /// reserved and where a cluster's machines run.
    pub machines: Store<ProxmoxMachine>,
    /// What reconciles read from memory instead of asking again.
    pub caches: Caches,
}

impl AsRef<Context> for MachineContext {
    fn as_ref(&self) -> &Context {
        &self.base
    }
}

/// How long a machine's triggers are gathered before it is reconciled.
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs the controller until the stream ends (on shutdown).
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let machines: Api<ProxmoxMachine> = config.api(&client);
    let controller = reconciler::slim_controller(machines, config.watcher_config());
    let store = controller.store();
    base.track_cache(store.clone());
    crate::metrics::global()
        .stores
        .proxmox_machines(store.clone());
    // Each watch feeds a store (read by reconciles, see cache.rs) and
    // triggers reconciles of the machines it concerns.
    let labelled = reconciler::watch_config()
        .labels(MACHINE_LABEL)
        .any_semantic();
    let (capi, machine_watch, cluster_watch) = CapiStores::watch(&client, &config, base.capi);
    let (proxmox_clusters, proxmox_cluster_watch) = reconciler::cache_watch(
        config.api::<ProxmoxCluster>(&client),
        config.watcher_config(),
    );
    let (claims, claim_watch) =
        reconciler::cache_watch(config.api::<IpAddressClaim>(&client), labelled);
    // IPAddresses carry the IPAM provider's labels, not ours: all of the
    // watched namespace(s). Read only; their claims' changes wake machines.
    let (addresses, address_watch) = reconciler::cache_watch(
        config.api::<IpAddress>(&client),
        reconciler::watch_config().any_semantic(),
    );
    let ctx = Arc::new(MachineContext {
        base,
        clients: ClientCache::default(),
        machines: store.clone(),
        caches: Caches::new(capi, proxmox_clusters, claims, addresses),
    });
    let by_cluster = store.clone();
    let by_proxmox_cluster = store.clone();
    let controller = controller
        // A clone, its configuration and the boot are bursts of status and
        // claim changes; one reconcile after a burst sees what one per
        // change would, for a fraction of the requests.
        .with_config(config.controller_config().debounce(DEBOUNCE))
        .watches_stream(claim_watch, |claim| {
            let labels = claim.metadata.labels.as_ref()?;
            Some(
                ObjectRef::new(labels.get(MACHINE_LABEL)?)
                    .within(claim.metadata.namespace.as_deref()?),
            )
        })
        .watches_stream(address_watch, |_| None)
        .watches_stream(machine_watch, |machine| {
            owner::infrastructure_machine(&machine)
        })
        // Unpause, infrastructure provisioned, control plane initialized:
        // all of the cluster's machines.
        .watches_stream(cluster_watch, move |cluster| {
            owner::members_of_cluster(&by_cluster, &cluster)
        })
        .watches_stream(proxmox_cluster_watch, move |proxmox_cluster| {
            let namespace = proxmox_cluster.metadata.namespace.as_deref();
            match owner::cluster_name(&proxmox_cluster.metadata) {
                Some(cluster) => {
                    owner::members_of(&by_proxmox_cluster, namespace.unwrap_or_default(), cluster)
                }
                None => Vec::new(),
            }
        });
    reconciler::run(controller, reconcile_machine, ctx).await;
}

async fn reconcile_machine(
    machine: Arc<ProxmoxMachine>,
    ctx: Arc<MachineContext>,
) -> Result<Action, Error> {
    reconciler::reconcile_with_finalizer(
        &ctx.base,
        machine,
        PROXMOX_MACHINE_FINALIZER,
        |event| async {
            match event {
                Finalizer::Apply(machine) => reconcile::apply(machine, &ctx).await,
                Finalizer::Cleanup(machine) => reconcile::cleanup(machine, &ctx).await,
            }
        },
    )
    .await
}
