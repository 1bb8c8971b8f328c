//! Wiring of the ProxmoxMachine controller: what it watches and how errors
//! are retried.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tenantry_api::generated::capi::ip_address_claim::IpAddressClaim;
use tenantry_api::proxmox::{PROXMOX_MACHINE_FINALIZER, ProxmoxCluster, ProxmoxMachine};

use super::act::MACHINE_LABEL;
use super::reconcile::{self, Error};
use crate::capi::{Cluster, Machine};
use crate::proxmox::credentials::ClientCache;
use crate::runtime::{self, Context};

/// What ProxmoxMachine reconciles share.
pub struct MachineContext {
    pub base: Arc<Context>,
    pub clients: ClientCache,
    /// Every ProxmoxMachine the controller sees: the VM IDs other machines
    /// reserved and where a cluster's machines run.
    pub machines: Store<ProxmoxMachine>,
}

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
    let controller = Controller::new(machines, config.watcher_config());
    let store = controller.store();
    let ctx = Arc::new(MachineContext {
        base,
        clients: ClientCache::default(),
        machines: store.clone(),
    });
    let by_cluster = store.clone();
    let by_proxmox_cluster = store.clone();
    let labelled = watcher::Config::default()
        .labels(MACHINE_LABEL)
        .any_semantic();
    controller
        .owns(config.api::<IpAddressClaim>(&client), labelled)
        .watches(
            config.api::<Machine>(&client),
            config.watcher_config(),
            |machine| {
                let reference = &machine.spec.infrastructure_ref;
                (reference.kind == "ProxmoxMachine").then(|| {
                    ObjectRef::new(&reference.name)
                        .within(machine.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        )
        .watches(
            config.api::<Cluster>(&client),
            config.watcher_config(),
            move |cluster| {
                // Unpause, infrastructure provisioned, control plane initialized:
                // all of the cluster's machines.
                machines_of(
                    &by_cluster,
                    cluster.metadata.namespace.as_deref().unwrap_or_default(),
                    cluster.metadata.name.as_deref().unwrap_or_default(),
                )
            },
        )
        .watches(
            config.api::<ProxmoxCluster>(&client),
            config.watcher_config(),
            move |proxmox_cluster| match crate::capi::owner::cluster_name(&proxmox_cluster.metadata)
            {
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
            },
        )
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
    runtime::reconcile_with_finalizer(
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

fn error_policy(machine: Arc<ProxmoxMachine>, error: &Error, ctx: Arc<MachineContext>) -> Action {
    runtime::error_policy(machine, error, ctx.base.clone())
}
