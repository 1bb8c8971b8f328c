//! What a remediation reads from and does to the substrate and the
//! management cluster: find the Machine's VM, restart it in place, delete
//! the Machine. Each write is idempotent, or guarded so that repeating it
//! after a crash does no harm (a UID precondition).
//!
//! A restart keeps the VM, its disks and their contents:
//! - KubeVirt: the VirtualMachineInstance is deleted and the
//!   VirtualMachine (run strategy `Always`) starts a new one on the same
//!   DataVolumes, which is what `virtctl restart` ends up doing through
//!   virt-api's restart subresource. The VirtualMachine, DataVolumes and
//!   PVCs are never touched.
//! - Proxmox VE: `POST /nodes/{node}/qemu/{vmid}/status/reset` (a `qmreset`
//!   task; a stopped VM is started instead), only on a VM in the machine's
//!   pool that is the machine's own, with the cluster's pool-scoped token.

use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{KubevirtCluster, KubevirtMachine};
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine};

use super::controller::RemediationContext;
use crate::capi::{CapiGeneration, CapiKind, Cluster, Machine};
use crate::kubevirt::infra::{InfraCluster, InfraClusterError};
use crate::proxmox::client::{ProxmoxClient, ProxmoxError, Upid};
use crate::proxmox::credentials::CredentialsError;
use crate::proxmox::machine::decide::{Ownership, VmPresence, ownership};
use crate::proxmox::machine::observe::pve::{TaskPoll, lookup_vm, poll_task, reconcile_task_wait};

/// Why a step failed: transient trouble (retried with backoff) or a refusal
/// a human has to look at (reported in the `Remediated` condition).
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Proxmox VE API: {0}")]
    Proxmox(Box<ProxmoxError>),
    #[error("{0}")]
    Refused(String),
}

impl ActError {
    fn proxmox(error: ProxmoxError, what: impl std::fmt::Display) -> Self {
        if error.is_transient() {
            ActError::Proxmox(Box::new(error))
        } else {
            ActError::Refused(format!("{what}: {error}"))
        }
    }

    /// A Kubernetes API refusal (4xx other than conflicts, which a retry
    /// resolves) needs a human; the rest passes by itself.
    fn kube(error: kube::Error, what: impl std::fmt::Display) -> Self {
        match &error {
            kube::Error::Api(status)
                if (400..500).contains(&status.code)
                    && status.code != 409
                    && status.code != 429 =>
            {
                ActError::Refused(format!("{what}: {}", status.message))
            }
            _ => ActError::Kube(error),
        }
    }
}

/// The Cluster a Machine belongs to, if it exists.
pub async fn cluster_of(
    client: &kube::Client,
    generation: CapiGeneration,
    machine: &Machine,
) -> kube::Result<Option<Cluster>> {
    let namespace = machine.metadata.namespace.as_deref().unwrap_or_default();
    crate::capi::owner::get_cluster(client, generation, namespace, &machine.spec.cluster_name).await
}

fn refuse_kind(machine: &Machine, expected: &str, template: &str) -> ActError {
    let reference = &machine.spec.infrastructure_ref;
    ActError::Refused(format!(
        "Machine {} runs on a {} ({}), not a {expected}: remediate it with a {template}",
        machine.metadata.name.as_deref().unwrap_or_default(),
        reference.kind,
        reference.name
    ))
}

// ------------------------------------------------------------------ KubeVirt

/// The VM of a KubeVirt machine and its instance right now.
pub struct KubevirtTarget {
    pub infra: InfraCluster,
    /// The VirtualMachine's (and its instance's) name.
    pub name: String,
    /// The UID of the running instance, if there is one.
    pub instance_uid: Option<String>,
}

impl KubevirtTarget {
    /// `namespace/name` of the instance, for messages.
    pub fn instance(&self) -> String {
        format!("{}/{}", self.infra.namespace, self.name)
    }
}

/// Finds the VirtualMachine of a Machine through its KubevirtMachine, in
/// the management cluster or in the infrastructure cluster the
/// KubevirtMachine (or its KubevirtCluster) names.
pub async fn locate_kubevirt(
    ctx: &RemediationContext,
    machine: &Machine,
) -> Result<KubevirtTarget, ActError> {
    let client = &ctx.base.client;
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let reference = &machine.spec.infrastructure_ref;
    if reference.kind != "KubevirtMachine" {
        return Err(refuse_kind(
            machine,
            "KubevirtMachine",
            "ProxmoxRemediationTemplate",
        ));
    }
    let Some(kubevirt_machine) = Api::<KubevirtMachine>::namespaced(client.clone(), &namespace)
        .get_opt(&reference.name)
        .await?
    else {
        return Err(ActError::Refused(format!(
            "KubevirtMachine {namespace}/{} does not exist",
            reference.name
        )));
    };
    // The machine reconciler copies the cluster's reference onto the
    // machine; an older machine may not have it yet.
    let secret_ref = match kubevirt_machine.spec.infra_cluster_secret_ref.clone() {
        Some(secret_ref) => Some(secret_ref),
        None => match cluster_of(client, ctx.base.capi, machine)
            .await?
            .and_then(|c| c.spec.infrastructure_ref)
            .filter(|r| r.kind == "KubevirtCluster")
        {
            Some(infra_ref) => Api::<KubevirtCluster>::namespaced(client.clone(), &namespace)
                .get_opt(&infra_ref.name)
                .await?
                .and_then(|c| c.spec.infra_cluster_secret_ref),
            None => None,
        },
    };
    let vm_namespace = kubevirt_machine
        .spec
        .virtual_machine_template
        .metadata
        .as_ref()
        .and_then(|m| m.namespace.clone());
    let infra = match ctx
        .infra
        .resolve(
            client,
            &namespace,
            secret_ref.as_ref(),
            vm_namespace.as_deref(),
        )
        .await
    {
        Ok(infra) => infra,
        Err(InfraClusterError::Kube(error)) => return Err(error.into()),
        Err(error) => return Err(ActError::Refused(error.to_string())),
    };
    let name = reference.name.clone();
    let vm = Api::<VirtualMachine>::namespaced(infra.client.clone(), &infra.namespace)
        .get_opt(&name)
        .await?
        .ok_or_else(|| {
            ActError::Refused(format!(
                "VirtualMachine {}/{name} does not exist",
                infra.namespace
            ))
        })?;
    // Only `Always` brings a deleted instance back by itself; with
    // RerunOnFailure, Manual or Halted the VM would stay stopped (KubeVirt
    // restarts those through virt-api's restart subresource, which records
    // a start request first).
    let strategy = match (&vm.spec.run_strategy, vm.spec.running) {
        (Some(strategy), _) => strategy.clone(),
        (None, Some(true)) => "Always".to_string(),
        (None, _) => "Halted".to_string(),
    };
    if strategy != "Always" {
        return Err(ActError::Refused(format!(
            "VirtualMachine {}/{name} has runStrategy {strategy}: deleting its instance would leave it stopped; only runStrategy Always (tenantry's default) can be restarted in place",
            infra.namespace
        )));
    }
    let instance_uid =
        Api::<VirtualMachineInstance>::namespaced(infra.client.clone(), &infra.namespace)
            .get_opt(&name)
            .await?
            .and_then(|vmi| vmi.metadata.uid);
    Ok(KubevirtTarget {
        infra,
        name,
        instance_uid,
    })
}

/// Deletes the instance with the given UID; the VirtualMachine starts a new
/// one on the same disks. Deleting it again, or after it was replaced (the
/// UID precondition then fails), is harmless. Returns whether this call
/// deleted it.
pub async fn restart_kubevirt(target: &KubevirtTarget, uid: &str) -> Result<bool, ActError> {
    let api = Api::<VirtualMachineInstance>::namespaced(
        target.infra.client.clone(),
        &target.infra.namespace,
    );
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&target.name, &params).await {
        Ok(_) => Ok(true),
        // Gone, or already replaced by a newer instance: restarted.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(error) => Err(ActError::kube(
            error,
            format!("deleting VirtualMachineInstance {}", target.instance()),
        )),
    }
}

// ------------------------------------------------------------------ Proxmox VE

/// The VM of a Proxmox machine, checked to be in its pool and its own.
pub struct ProxmoxTarget {
    pub client: ProxmoxClient,
    pub node: String,
    pub vmid: u32,
    pub running: bool,
}

/// The ProxmoxCluster of a Machine's Cluster (its infrastructure), or the
/// one labelled with the cluster's name.
async fn proxmox_cluster(
    client: &kube::Client,
    generation: CapiGeneration,
    machine: &Machine,
) -> kube::Result<Option<ProxmoxCluster>> {
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let api: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &namespace);
    if let Some(reference) = cluster_of(client, generation, machine)
        .await?
        .and_then(|c| c.spec.infrastructure_ref)
        && reference.kind == "ProxmoxCluster"
    {
        return api.get_opt(&reference.name).await;
    }
    let labelled = api
        .list(&ListParams::default().labels(&format!(
            "{CLUSTER_NAME_LABEL}={}",
            machine.spec.cluster_name
        )))
        .await?;
    Ok(labelled.items.into_iter().next())
}

/// Finds the VM of a Machine through its ProxmoxMachine, with the client of
/// its ProxmoxCluster's credentials, and refuses a VM outside the machine's
/// pool or not made for the machine, as the ProxmoxMachine reconciler does.
pub async fn locate_proxmox(
    ctx: &RemediationContext,
    machine: &Machine,
) -> Result<ProxmoxTarget, ActError> {
    let client = &ctx.base.client;
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let reference = &machine.spec.infrastructure_ref;
    if reference.kind != "ProxmoxMachine" {
        return Err(refuse_kind(
            machine,
            "ProxmoxMachine",
            "KubevirtRemediationTemplate",
        ));
    }
    let name = reference.name.clone();
    let Some(proxmox_machine) = Api::<ProxmoxMachine>::namespaced(client.clone(), &namespace)
        .get_opt(&name)
        .await?
    else {
        return Err(ActError::Refused(format!(
            "ProxmoxMachine {namespace}/{name} does not exist"
        )));
    };
    let vmid = proxmox_machine.spec.virtual_machine_id.or(proxmox_machine
        .status
        .as_ref()
        .and_then(|s| s.virtual_machine_id));
    let Some(vmid) = vmid.and_then(|v| u32::try_from(v).ok()) else {
        return Err(ActError::Refused(format!(
            "ProxmoxMachine {namespace}/{name} has no VM (spec.virtualMachineID is not set)"
        )));
    };
    let Some(proxmox_cluster) = proxmox_cluster(client, ctx.base.capi, machine).await? else {
        return Err(ActError::Refused(format!(
            "Cluster {} has no ProxmoxCluster",
            machine.spec.cluster_name
        )));
    };
    let pve = match ctx
        .pve
        .client_for(client, &proxmox_cluster, &reconcile_task_wait())
        .await
    {
        Ok(pve) => pve,
        Err(CredentialsError::Kube(error)) => return Err(error.into()),
        Err(error) => {
            return Err(ActError::Refused(format!(
                "ProxmoxCluster {}: {error}",
                proxmox_cluster.metadata.name.as_deref().unwrap_or_default()
            )));
        }
    };
    let pool = proxmox_machine
        .spec
        .pool
        .as_deref()
        .filter(|p| !p.is_empty());
    let pool_text = pool.unwrap_or("-");
    let (presence, facts, _) = lookup_vm(&pve, vmid, pool)
        .await
        .map_err(|e| ActError::proxmox(e, format!("looking up VM {vmid} in pool {pool_text}")))?;
    let (
        VmPresence::InPool {
            name: vm_name,
            description,
        },
        Some(facts),
    ) = (presence, facts)
    else {
        return Err(ActError::Refused(format!(
            "VM {vmid} is not in pool {pool_text}: tenantry acts only on VMs in the machine's pool"
        )));
    };
    if let Ownership::Other { name: other, .. } = ownership(
        &namespace,
        &name,
        vm_name.as_deref(),
        description.as_deref(),
    ) {
        return Err(ActError::Refused(format!(
            "VM {vmid} in pool {pool_text} is {other:?}, not ProxmoxMachine {namespace}/{name}'s: not restarting it"
        )));
    }
    Ok(ProxmoxTarget {
        client: pve,
        node: facts.node,
        vmid,
        running: facts.status.is_running(),
    })
}

/// Resets the VM (starts it when it is stopped) and returns the task.
pub async fn restart_proxmox(target: &ProxmoxTarget) -> Result<Upid, ActError> {
    let qemu = target.client.qemu(&target.node, target.vmid);
    let (result, what) = if target.running {
        (qemu.reset().await, "reset")
    } else {
        (qemu.start().await, "start")
    };
    result.map_err(|e| {
        ActError::proxmox(
            e,
            format!("{what} of VM {} on {}", target.vmid, target.node),
        )
    })
}

/// Waits a little for a restart task: `Ok(true)` once done (or unknown to
/// PVE), `Ok(false)` while it runs, a refusal when it failed.
pub async fn restart_task_done(client: &ProxmoxClient, upid: &Upid) -> Result<bool, ActError> {
    match poll_task(client, upid, &reconcile_task_wait())
        .await
        .map_err(|e| ActError::proxmox(e, format!("task {upid}")))?
    {
        TaskPoll::Done(_) | TaskPoll::Unknown => Ok(true),
        TaskPoll::Running => Ok(false),
        TaskPoll::Failed {
            exit_status,
            log_tail,
        } => {
            let log = log_tail
                .last()
                .map(|l| format!(" (log: {l})"))
                .unwrap_or_default();
            Err(ActError::Refused(format!(
                "Proxmox task {upid} ({}) failed: {exit_status}{log}",
                upid.task_type()
            )))
        }
    }
}

// ------------------------------------------------------------------ the Machine

/// Deletes the Machine with the given UID (a newer Machine of the same name
/// is left alone). Returns whether this call deleted it.
pub async fn delete_machine(
    client: &kube::Client,
    generation: CapiGeneration,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<bool, ActError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match crate::capi::access::delete(
        client,
        generation,
        CapiKind::Machine,
        namespace,
        name,
        &params,
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(error) => Err(ActError::kube(
            error,
            format!("deleting Machine {namespace}/{name}"),
        )),
    }
}

/// What replaces a deleted Machine, by the kind of its controller owner.
pub fn replaced_by(machine: &Machine) -> Option<&'static str> {
    let owner = machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    Some(match owner.kind.as_str() {
        "MachineSet" => "MachineSet",
        "MachinePool" => "MachinePool",
        _ => "control plane",
    })
}
