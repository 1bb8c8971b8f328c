//! Wiring of the KubevirtMachine controller: what it watches and how errors
//! are retried.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::{self, ObjectRef};
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{KUBEVIRT_MACHINE_FINALIZER, KubevirtCluster, KubevirtMachine};

use super::cache::Caches;
use super::reconcile::{self, Error};
use crate::capi::{Cluster, Machine};
use crate::kubevirt::infra::InfraClients;
use crate::kubevirt::render::{MACHINE_NAME_LABEL, MACHINE_NAMESPACE_LABEL};
use crate::reconciler::{self, Context};

/// What KubevirtMachine reconciles share.
pub struct MachineContext {
    pub base: Arc<Context>,
    pub infra: InfraClients,
    pub caches: Caches,
}

/// Maps an object labelled with its machine's name and namespace (VM, VMI,
/// DataVolume) to that KubevirtMachine.
fn labelled_machine<K: kube::Resource>(object: &K) -> Option<ObjectRef<KubevirtMachine>> {
    let labels = object.meta().labels.as_ref()?;
    Some(
        ObjectRef::new(labels.get(MACHINE_NAME_LABEL)?)
            .within(labels.get(MACHINE_NAMESPACE_LABEL)?),
    )
}

/// How long a machine's triggers are gathered before it is reconciled.
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs the controller until the stream ends (on shutdown).
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let machines: Api<KubevirtMachine> = config.api(&client);
    // Only objects tenantry labelled are watched in the infrastructure
    // (management) cluster.
    let labelled = crate::reconciler::watch_config()
        .labels(MACHINE_NAME_LABEL)
        .any_semantic();
    // Each watch feeds a store (read by reconciles, see cache.rs) and
    // triggers reconciles of the machines it concerns.
    let (vms, vm_writer) = reflector::store();
    let (vmis, vmi_writer) = reflector::store();
    let (data_volumes, dv_writer) = reflector::store();
    let (owner_machines, machine_writer) = reflector::store();
    let (clusters, cluster_writer) = reflector::store();
    let (kubevirt_clusters, kubevirt_cluster_writer) = reflector::store();
    let vm_stream = crate::reconciler::cache_watch(
        config.api::<VirtualMachine>(&client),
        labelled.clone(),
        vm_writer,
    );
    let vmi_stream = crate::reconciler::cache_watch(
        config.api::<VirtualMachineInstance>(&client),
        labelled.clone(),
        vmi_writer,
    );
    let dv_stream =
        crate::reconciler::cache_watch(config.api::<DataVolume>(&client), labelled, dv_writer);
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
    let kubevirt_cluster_stream = crate::reconciler::cache_watch(
        config.api::<KubevirtCluster>(&client),
        config.watcher_config(),
        kubevirt_cluster_writer,
    );
    let ctx = Arc::new(MachineContext {
        base,
        infra: InfraClients::default(),
        caches: Caches {
            capi: crate::capi::stores::CapiStores {
                machines: owner_machines,
                clusters,
            },
            kubevirt_clusters,
            vms,
            vmis,
            data_volumes,
            watched_namespace: config.namespace.clone(),
        },
    });
    let controller = crate::reconciler::slim_controller(machines, config.watcher_config());
    let store = controller.store();
    ctx.base.track_cache(store.clone());
    controller
        // A VM's start is a burst of VMI and VM status changes; one
        // reconcile after the burst sees the same end state as one per
        // change, for a fraction of the requests.
        .with_config(config.controller_config().debounce(DEBOUNCE))
        .watches_stream(vm_stream, |vm| labelled_machine(&vm))
        .watches_stream(vmi_stream, |vmi| labelled_machine(&vmi))
        .watches_stream(dv_stream, |dv| labelled_machine(&dv))
        .watches_stream(machine_stream, |machine| {
            let reference = &machine.spec.infrastructure_ref;
            (reference.kind == "KubevirtMachine").then(|| {
                ObjectRef::new(&reference.name)
                    .within(machine.metadata.namespace.as_deref().unwrap_or_default())
            })
        })
        .watches_stream(cluster_stream, move |cluster| {
            // A Cluster change (unpause, infrastructure provisioned, control
            // plane initialized) concerns all of its machines.
            let name = cluster.metadata.name.clone().unwrap_or_default();
            let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
            store
                .state()
                .into_iter()
                .filter(|m| {
                    m.metadata.namespace.as_deref() == Some(namespace.as_str())
                        && crate::capi::owner::cluster_name(&m.metadata) == Some(name.as_str())
                })
                .map(|m| ObjectRef::from_obj(m.as_ref()))
                .collect::<Vec<_>>()
        })
        // Read only (infraClusterSecretRef, SSH keys); the Cluster watch
        // wakes the machines when the KubevirtCluster gets ready.
        .watches_stream(kubevirt_cluster_stream, |_| None)
        .shutdown_on_signal()
        .run(reconcile_machine, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "KubevirtMachine reconcile ended with an error");
            }
        })
        .await;
}

async fn reconcile_machine(
    machine: Arc<KubevirtMachine>,
    ctx: Arc<MachineContext>,
) -> Result<Action, Error> {
    reconciler::reconcile_with_finalizer(
        &ctx.base,
        machine,
        KUBEVIRT_MACHINE_FINALIZER,
        |event| async {
            match event {
                Finalizer::Apply(machine) => reconcile::apply(machine, &ctx).await,
                Finalizer::Cleanup(machine) => reconcile::cleanup(machine, &ctx).await,
            }
        },
    )
    .await
}

fn error_policy(machine: Arc<KubevirtMachine>, error: &Error, ctx: Arc<MachineContext>) -> Action {
    reconciler::error_policy(machine, error, ctx.base.clone())
}
