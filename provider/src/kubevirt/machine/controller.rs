//! Wiring of the KubevirtMachine controller: what it watches and how errors
//! are retried.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{KUBEVIRT_MACHINE_FINALIZER, KubevirtCluster, KubevirtMachine};

use super::cache::Caches;
use super::reconcile::{self, Error};
use crate::capi::owner;
use crate::capi::stores::CapiStores;
use crate::kubevirt::infra::InfraClients;
use crate::kubevirt::render::{MACHINE_NAME_LABEL, MACHINE_NAMESPACE_LABEL};
use crate::reconciler::{self, Context};

/// What KubevirtMachine reconciles share.
pub struct MachineContext {
    pub base: Arc<Context>,
    pub infra: InfraClients,
    pub caches: Caches,
}

impl AsRef<Context> for MachineContext {
    fn as_ref(&self) -> &Context {
        &self.base
    }
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
    let labelled = reconciler::watch_config()
        .labels(MACHINE_NAME_LABEL)
        .any_semantic();
    // Each watch feeds a store (read by reconciles, see cache.rs) and
    // triggers reconciles of the machines it concerns.
    let (vms, vm_watch) =
        reconciler::cache_watch(config.api::<VirtualMachine>(&client), labelled.clone());
    let (vmis, vmi_watch) = reconciler::cache_watch(
        config.api::<VirtualMachineInstance>(&client),
        labelled.clone(),
    );
    let (data_volumes, dv_watch) =
        reconciler::cache_watch(config.api::<DataVolume>(&client), labelled);
    let (capi, machine_watch, cluster_watch) = CapiStores::watch(&client, &config, base.capi);
    let (kubevirt_clusters, kubevirt_cluster_watch) = reconciler::cache_watch(
        config.api::<KubevirtCluster>(&client),
        config.watcher_config(),
    );
    let ctx = Arc::new(MachineContext {
        base,
        infra: InfraClients::default(),
        caches: Caches {
            capi,
            kubevirt_clusters,
            vms,
            vmis,
            data_volumes,
            watched_namespace: config.namespace.clone(),
        },
    });
    let controller = reconciler::slim_controller(machines, config.watcher_config());
    let store = controller.store();
    ctx.base.track_cache(store.clone());
    crate::metrics::global()
        .stores
        .kubevirt_machines(store.clone());
    let controller = controller
        // A VM's start is a burst of VMI and VM status changes; one
        // reconcile after the burst sees the same end state as one per
        // change, for a fraction of the requests.
        .with_config(config.controller_config().debounce(DEBOUNCE))
        .watches_stream(vm_watch, |vm| labelled_machine(&vm))
        .watches_stream(vmi_watch, |vmi| labelled_machine(&vmi))
        .watches_stream(dv_watch, |dv| labelled_machine(&dv))
        .watches_stream(machine_watch, |machine| {
            owner::infrastructure_machine(&machine)
        })
        // A Cluster change (unpause, infrastructure provisioned, control
        // plane initialized) concerns all of its machines.
        .watches_stream(cluster_watch, move |cluster| {
            owner::members_of_cluster(&store, &cluster)
        })
        // Read only (infraClusterSecretRef, SSH keys); the Cluster watch
        // wakes the machines when the KubevirtCluster gets ready.
        .watches_stream(kubevirt_cluster_watch, |_| None);
    reconciler::run(controller, reconcile_machine, ctx).await;
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
