//! What a KubevirtMachine reconcile writes: the machine's spec (the
//! infrastructure cluster's Secret, the providerID), and in the
//! infrastructure cluster its userdata Secret and VM, or their deletion.
//! Each step is idempotent, so a crash between any two is harmless.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::kubevirt::KubevirtMachine;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use serde_json::json;

use super::cache::Caches;
use super::cloud_config;
use super::decide::HUMAN_RETRY;
use super::observe::Gates;
use super::reconcile::{Error, Halt, Run, infra_api};
use super::status::Reason;
use crate::capi::bootstrap::{BootstrapData, BootstrapFormat};
use crate::kubevirt::infra::InfraCluster;
use crate::kubevirt::render::{self, VmPlacement};
use crate::kubevirt::ssh::{self, SshKeyPair};
use crate::reconciler::FIELD_MANAGER;

/// The Secret holding a machine's bootstrap data for the config drive.
pub fn userdata_secret_name(machine_name: &str) -> String {
    format!("{machine_name}-userdata")
}

/// The key KubeVirt reads user data from in `userDataSecretRef`.
pub const USERDATA_KEY: &str = "userdata";

/// Owner reference to the KubevirtMachine, for objects in the same cluster
/// (owner references cannot cross clusters).
fn owner(machine: &KubevirtMachine, infra: &InfraCluster) -> Option<Vec<OwnerReference>> {
    if infra.external {
        return None;
    }
    machine.controller_owner_ref(&()).map(|o| vec![o])
}

/// Creates or updates the userdata Secret.
pub async fn apply_userdata_secret(
    machine: &KubevirtMachine,
    infra: &InfraCluster,
    labels: &BTreeMap<String, String>,
    data: &[u8],
) -> kube::Result<()> {
    let name = userdata_secret_name(machine.metadata.name.as_deref().unwrap_or_default());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(infra.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: owner(machine, infra),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: Some(BTreeMap::from([(
            USERDATA_KEY.to_string(),
            ByteString(data.to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(infra.client.clone(), &infra.namespace)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// Creates the VM unless it exists, returning the created VM (`None` when
/// it existed). An existing VM is never replaced: its disks hold the
/// machine's state, and a changed template rolls machines through CAPI
/// instead.
pub async fn create_virtual_machine(
    machine: &KubevirtMachine,
    infra: &InfraCluster,
    mut vm: VirtualMachine,
) -> kube::Result<Option<VirtualMachine>> {
    vm.metadata.owner_references = owner(machine, infra);
    let api = Api::<VirtualMachine>::namespaced(infra.client.clone(), &infra.namespace);
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &vm,
        )
        .await
    {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(error) => Err(error),
    }
}

/// What is left of a machine in the infrastructure cluster.
#[derive(Debug, Default)]
pub struct Remains {
    pub virtual_machine: bool,
    pub instance: bool,
    pub data_volumes: Vec<String>,
    pub userdata_secret: bool,
}

impl Remains {
    pub fn is_empty(&self) -> bool {
        !self.virtual_machine
            && !self.instance
            && self.data_volumes.is_empty()
            && !self.userdata_secret
    }

    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.virtual_machine {
            parts.push("VirtualMachine".to_string());
        }
        if self.instance {
            parts.push("VirtualMachineInstance".to_string());
        }
        if !self.data_volumes.is_empty() {
            parts.push(format!("DataVolumes {}", self.data_volumes.join(", ")));
        }
        if self.userdata_secret {
            parts.push("userdata Secret".to_string());
        }
        parts.join(", ")
    }
}

/// Asks for everything of the machine to be deleted and reports what is
/// still there. The VM goes first; KubeVirt stops its instance, and the
/// DataVolumes go with the VM. DataVolumes are also deleted directly, for a
/// VM that never got created or an infrastructure cluster without a garbage
/// collector.
pub async fn delete_machine_objects(
    machine: &KubevirtMachine,
    infra: &InfraCluster,
    caches: &Caches,
) -> kube::Result<Remains> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    let machine_namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let client = &infra.client;
    let namespace = &infra.namespace;
    let vms = Api::<VirtualMachine>::namespaced(client.clone(), namespace);
    let dvs = Api::<DataVolume>::namespaced(client.clone(), namespace);
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);

    let mut remains = Remains::default();
    if let Some(vm) = caches.vm(infra, &name).await? {
        remains.virtual_machine = true;
        // Read from the VM, so looked for while it exists.
        if let Some(secret) = render::capk_userdata_secret(&vm) {
            delete_capk_userdata_secret(&vms, &secrets, &secret, &name).await?;
        }
        if vm.metadata.deletion_timestamp.is_none() {
            delete_ignoring_absent(&vms, &name).await?;
        }
    }
    remains.instance = caches.vmi(infra, &name).await?.is_some();
    let mut data_volumes = caches
        .data_volumes(infra, &name, &machine_namespace)
        .await?;
    // A VM CAPK made has DataVolumes without the machine's labels, named
    // as tenantry names them.
    for dv_name in render::data_volume_names(machine) {
        if !data_volumes
            .iter()
            .any(|dv| dv.metadata.name.as_deref() == Some(dv_name.as_str()))
            && let Some(dv) = dvs.get_opt(&dv_name).await?
        {
            data_volumes.push(dv);
        }
    }
    for dv in data_volumes {
        let dv_name = dv.metadata.name.clone().unwrap_or_default();
        if dv.metadata.deletion_timestamp.is_none() && !remains.virtual_machine {
            delete_ignoring_absent(&dvs, &dv_name).await?;
        }
        remains.data_volumes.push(dv_name);
    }
    // Last, once nothing can boot from it any more, and without reading it
    // first: one DELETE, a 404 meaning it is gone already.
    if !remains.virtual_machine && !remains.instance && remains.data_volumes.is_empty() {
        let secret_name = userdata_secret_name(&name);
        match secrets
            .delete(&secret_name, &DeleteParams::background())
            .await
        {
            // Still there only while a finalizer holds it.
            Ok(either) => remains.userdata_secret = either.is_left(),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    Ok(remains)
}

/// Deletes the userdata Secret of a machine CAPK created, as CAPK does
/// with the machine, unless another VM that is not being deleted boots from
/// it: machines of one bootstrap Secret share it, and CAPK wrote it back on
/// its next reconcile of a sibling, which tenantry does not.
async fn delete_capk_userdata_secret(
    vms: &Api<VirtualMachine>,
    secrets: &Api<Secret>,
    secret: &str,
    machine_name: &str,
) -> kube::Result<()> {
    let shared = vms
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|other| {
            other.metadata.name.as_deref() != Some(machine_name)
                && other.metadata.deletion_timestamp.is_none()
                && render::capk_userdata_secret(other).as_deref() == Some(secret)
        });
    if shared {
        return Ok(());
    }
    delete_ignoring_absent(secrets, secret).await
}

async fn delete_ignoring_absent<K>(api: &Api<K>, name: &str) -> kube::Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

impl Run<'_> {
    /// Copies the cluster's infrastructure Secret onto the machine, so that
    /// deletion works even when the KubevirtCluster is gone first.
    pub(super) async fn record_infra_secret_ref(
        &self,
        secret_ref: Option<&ObjectReference>,
    ) -> Result<(), Error> {
        self.api
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "infraClusterSecretRef": secret_ref } })),
            )
            .await?;
        Ok(())
    }

    pub(super) async fn record_provider_id(&self) -> Result<(), Error> {
        self.api
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "spec": { "providerID": format!("kubevirt://{}", self.name) } }),
                ),
            )
            .await?;
        Ok(())
    }

    /// Writes the userdata Secret, then creates the VM. The user data gets
    /// user `capk` for the ssh check (CAPK injects into cloud-config only;
    /// everything else passes untouched).
    pub(super) async fn create_vm(
        &self,
        gates: &Gates,
        format: BootstrapFormat,
        data: &BootstrapData,
        ssh_keys: Option<&SshKeyPair>,
    ) -> Result<VirtualMachine, Halt> {
        let infra = &gates.infra;
        let name = self.name.as_str();
        let userdata = match ssh_keys {
            Some(keys) => cloud_config::with_capk_user(data.as_bytes(), keys.authorized_key())
                .map_err(|error| {
                    Halt::wait(
                        Reason::InvalidBootstrapData,
                        format!(
                            "{error}: user {} cannot be added for the ssh bootstrap check; fix the bootstrap configuration or set spec.virtualMachineBootstrapCheck.checkStrategy to none",
                            ssh::SSH_USER
                        ),
                        Some(HUMAN_RETRY),
                    )
                })?,
            None => data.as_bytes().to_vec(),
        };
        let userdata_secret = userdata_secret_name(name);
        let placement = VmPlacement {
            cluster_name: &gates.cluster_name,
            role: gates.role,
            namespace: &infra.namespace,
            userdata_secret: &userdata_secret,
            bootstrap_format: format,
        };
        let labels = render::machine_labels(name, &self.namespace, &placement);
        apply_userdata_secret(&self.machine, infra, &labels, &userdata)
            .await
            .map_err(infra_api)?;
        let desired = render::desired_virtual_machine(&self.machine, &placement)
            .map_err(|error| Halt::wait(Reason::InvalidSpec, error.to_string(), None))?;
        let created = match create_virtual_machine(&self.machine, infra, desired.clone()).await {
            Ok(created) => created,
            Err(kube::Error::Api(status)) if (400..500).contains(&status.code) => {
                return Err(Halt::wait(
                    Reason::VmCreateFailed,
                    format!(
                        "the infrastructure cluster refused VirtualMachine {}/{name}: {}",
                        infra.namespace, status.message
                    ),
                    Some(HUMAN_RETRY),
                ));
            }
            Err(error) => return Err(infra_api(error).into()),
        };
        match created {
            // The create answer is the VM.
            Some(vm) => {
                tracing::info!(machine = %name, namespace = %infra.namespace, "created VirtualMachine");
                self.ctx
                    .base
                    .event(
                        self.machine.as_ref(),
                        EventType::Normal,
                        "VirtualMachineCreated",
                        format!("created VirtualMachine {}/{name}", infra.namespace),
                    )
                    .await;
                Ok(vm)
            }
            // Made by someone else meanwhile (409): read back.
            None => Ok(
                Api::<VirtualMachine>::namespaced(infra.client.clone(), &infra.namespace)
                    .get_opt(name)
                    .await
                    .map_err(infra_api)?
                    .unwrap_or(desired),
            ),
        }
    }
}
