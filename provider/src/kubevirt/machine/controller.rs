//! Wiring of the KubevirtMachine controller: what it watches and how errors
//! are retried.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{KUBEVIRT_MACHINE_FINALIZER, KubevirtMachine};

use super::reconcile::{self, Error};
use crate::capi::{Cluster, Machine};
use crate::kubevirt::infra::InfraClients;
use crate::kubevirt::render::{MACHINE_NAME_LABEL, MACHINE_NAMESPACE_LABEL};
use crate::runtime::{self, Context};

/// What KubevirtMachine reconciles share.
pub struct MachineContext {
    pub base: Arc<Context>,
    pub infra: InfraClients,
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

/// Runs the controller until the stream ends (on shutdown).
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let machines: Api<KubevirtMachine> = config.api(&client);
    let ctx = Arc::new(MachineContext {
        base,
        infra: InfraClients::default(),
    });
    let controller = Controller::new(machines, config.watcher_config());
    let store = controller.store();
    // Only objects tenantry labelled are watched in the infrastructure
    // (management) cluster.
    let labelled = watcher::Config::default()
        .labels(MACHINE_NAME_LABEL)
        .any_semantic();
    controller
        .watches(
            config.api::<VirtualMachine>(&client),
            labelled.clone(),
            |vm| labelled_machine(&vm),
        )
        .watches(
            config.api::<VirtualMachineInstance>(&client),
            labelled.clone(),
            |vmi| labelled_machine(&vmi),
        )
        .watches(config.api::<DataVolume>(&client), labelled, |dv| {
            labelled_machine(&dv)
        })
        .watches(
            config.api::<Machine>(&client),
            config.watcher_config(),
            |machine| {
                let reference = &machine.spec.infrastructure_ref;
                (reference.kind == "KubevirtMachine").then(|| {
                    ObjectRef::new(&reference.name)
                        .within(machine.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        )
        .watches(
            config.api::<Cluster>(&client),
            config.watcher_config(),
            move |cluster| {
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
            },
        )
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
    runtime::reconcile_with_finalizer(
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
    runtime::error_policy(machine, error, ctx.base.clone())
}
