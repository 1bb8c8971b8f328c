//! One reconcile of a KubevirtMachine.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tenantry_api::contract::{
    CONTROL_PLANE_LABEL, MachineAddress, MachineInitialization, READY_CONDITION,
};
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{
    BootstrapCheckStrategy, KubevirtCluster, KubevirtMachine, KubevirtMachineStatus,
};

use super::act::{self, userdata_secret_name};
use super::cloud_config;
use super::controller::MachineContext;
use super::decide::{
    self, BOOTSTRAP_EXEC_SUCCEEDED, BootstrapCheck, VM_PROVISIONED, VmState, reason,
};
use crate::capi::bootstrap::{self, BootstrapData, BootstrapFormat, BootstrapState};
use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::owner;
use crate::capi::pause;
use crate::capi::{Cluster, Machine};
use crate::kubevirt::infra::{InfraCluster, InfraClusterError};
use crate::kubevirt::render::{self, MachineRole, VmPlacement};
use crate::kubevirt::ssh::{self, SshKeyPair};
use crate::reconciler::{self, ReconcileError};

/// How often a provisioned machine is looked at without any event.
const RESYNC: Duration = Duration::from_secs(300);
/// How often a machine whose VM lives in an external infrastructure cluster
/// (no watches there) is polled while provisioning.
const EXTERNAL_POLL: Duration = Duration::from_secs(10);
/// How often deletion checks whether the VM is gone when nothing would
/// say so: the VM lives where no watch of ours looks, or a finalizer holds
/// the (unwatched) userdata Secret.
const DELETION_POLL: Duration = Duration::from_secs(2);
/// The safety net while deletion waits for objects our watches cover: their
/// removal wakes the machine, so polling every 2 s only repeated the same
/// reads (at 5,000 machines, about 100 reconciles per waiting machine).
const DELETION_RESYNC: Duration = Duration::from_secs(30);
/// How often a machine waits for its cluster's SSH keys (CAPK: 10 s).
const SSH_KEYS_POLL: Duration = Duration::from_secs(10);
/// How often the ssh bootstrap check reads the sentinel until it says
/// `success` (CAPK: 10 s).
const BOOTSTRAP_CHECK_POLL: Duration = Duration::from_secs(10);
/// The longest one ssh bootstrap check may take, connecting included, so an
/// unreachable guest holds a reconcile for seconds, not minutes.
const BOOTSTRAP_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Reconcile errors. Waits are deliberate; the rest back off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("infrastructure cluster: {0}")]
    InfraCluster(#[from] InfraClusterError),
    /// A request to the infrastructure cluster's API failed (it may be
    /// another cluster than the one the machine lives in).
    #[error("infrastructure cluster API: {0}")]
    InfraApi(#[source] kube::Error),
    #[error("waiting: {0}")]
    Waiting(String, Duration),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl ReconcileError for Error {
    fn wait(&self) -> Option<Duration> {
        match self {
            Error::Waiting(_, delay) => Some(*delay),
            Error::Finalizer(inner) => reconciler::finalizer_wait(inner),
            _ => None,
        }
    }
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(error: kube::runtime::finalizer::Error<Error>) -> Self {
        Error::Finalizer(Box::new(error))
    }
}

/// The outcome a reconcile reports.
struct Report {
    conditions: Vec<DesiredCondition>,
    provisioned: bool,
    addresses: Option<Vec<MachineAddress>>,
    failure: Option<(String, String)>,
}

impl Report {
    /// Not provisioned yet, for a reason before any VM exists.
    fn waiting(reason: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            conditions: vec![
                DesiredCondition::false_(VM_PROVISIONED, reason, message.clone()),
                DesiredCondition::false_(READY_CONDITION, reason, message),
            ],
            provisioned: false,
            addresses: None,
            failure: None,
        }
    }
}

pub async fn apply(machine: Arc<KubevirtMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let result = provision(machine.clone(), ctx).await;
    if let Err(error) = &result
        && !is_provisioned(&machine)
    {
        report_infra_backoff(ctx, &machine, error).await;
    }
    result
}

async fn provision(machine: Arc<KubevirtMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let name = machine.metadata.name.clone().unwrap_or_default();
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let api: Api<KubevirtMachine> = Api::namespaced(client.clone(), &namespace);

    // Observe: the Cluster (from CAPI's label, which MachineSets set at
    // creation) and pause, then the owner Machine. Pause is checked first so
    // a paused cluster's new machines say so even before CAPI adopts them.
    let labelled_cluster = owner::cluster_name(&machine.metadata).map(str::to_string);
    let mut cluster = match &labelled_cluster {
        Some(cluster_name) => {
            ctx.caches
                .capi
                .cluster(client, &namespace, cluster_name)
                .await?
        }
        None => None,
    };
    let paused = pause::paused_by(cluster.as_ref(), &machine.metadata);
    if paused.is_some() {
        report_paused(&api, &machine, paused).await?;
        return Ok(Action::await_change());
    }
    let Some(owner_machine) = ctx
        .caches
        .capi
        .owner_machine(client, &machine.metadata)
        .await?
    else {
        report(
            &api,
            &machine,
            Report::waiting(
                reason::WAITING_FOR_OWNER_MACHINE,
                "no Machine owns this KubevirtMachine yet",
            ),
        )
        .await?;
        return Ok(Action::await_change());
    };
    let cluster_name = labelled_cluster.unwrap_or_else(|| owner_machine.spec.cluster_name.clone());
    if cluster.is_none() {
        cluster = ctx
            .caches
            .capi
            .cluster(client, &namespace, &cluster_name)
            .await?;
        let paused = pause::paused_by(cluster.as_ref(), &machine.metadata);
        if paused.is_some() {
            report_paused(&api, &machine, paused).await?;
            return Ok(Action::await_change());
        }
    }
    let Some(cluster) = cluster else {
        report(
            &api,
            &machine,
            Report::waiting(
                reason::WAITING_FOR_CLUSTER,
                format!("Cluster {cluster_name} does not exist"),
            ),
        )
        .await?;
        return Ok(Action::requeue(RESYNC));
    };
    if !owner::infrastructure_provisioned(&cluster) {
        report(
            &api,
            &machine,
            Report::waiting(
                reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                format!("Cluster {cluster_name} infrastructure is not provisioned yet"),
            ),
        )
        .await?;
        return Ok(Action::requeue(RESYNC));
    }

    // Observe: whether the Machine names its bootstrap data yet. The data
    // itself is read below, only when the VM needs it.
    let role = if machine
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
        || owner_machine
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
    {
        MachineRole::ControlPlane
    } else {
        MachineRole::Worker
    };
    if owner_machine.spec.bootstrap.data_secret_name.is_none() {
        let waiting = waiting_for_bootstrap_data(role, &cluster, &owner_machine);
        report(&api, &machine, waiting).await?;
        return Ok(Action::requeue(RESYNC));
    }

    // Observe: the infrastructure cluster. The machine's own reference wins;
    // the cluster's is copied onto the machine so deletion works later even
    // if the KubevirtCluster is gone first.
    let kubevirt_cluster = match cluster.spec.infrastructure_ref.as_ref() {
        Some(infra_ref) if infra_ref.kind == "KubevirtCluster" => {
            ctx.caches
                .kubevirt_cluster(client, &namespace, &infra_ref.name)
                .await?
        }
        _ => None,
    };
    let secret_ref = machine.spec.infra_cluster_secret_ref.clone().or_else(|| {
        kubevirt_cluster
            .as_ref()
            .and_then(|c| c.spec.infra_cluster_secret_ref.clone())
    });
    let vm_namespace = machine
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
        Err(error) => {
            report(
                &api,
                &machine,
                Report::waiting(reason::INFRA_CLUSTER_UNAVAILABLE, error.to_string()),
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    if machine.spec.infra_cluster_secret_ref.is_none() && secret_ref.is_some() {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "infraClusterSecretRef": secret_ref } })),
        )
        .await?;
    }

    // Observe: the VM.
    let vms = Api::<VirtualMachine>::namespaced(infra.client.clone(), &infra.namespace);
    let existing_vm = ctx
        .caches
        .vm(&infra, &name)
        .await
        .map_err(Error::InfraApi)?;

    // Observe: the bootstrap data. The guest reads its userdata at first
    // boot and CAPI's bootstrap data does not change once set, so once the
    // VM exists only the data's format matters (it picks the bootstrap
    // check), and the VM records it: the Secret is read only before the VM
    // is created, or for a VM without the record when the check needs it.
    let strategy = machine
        .spec
        .virtual_machine_bootstrap_check
        .as_ref()
        .and_then(|c| c.check_strategy)
        .unwrap_or_default();
    let (format, vm_or_data) = match existing_vm {
        Some(vm) => {
            let format = match render::bootstrap_format_of(&vm) {
                Some(format) => format,
                // `none` does not look at the format.
                None if strategy == BootstrapCheckStrategy::None => BootstrapFormat::Other,
                None => match read_bootstrap_data(
                    client,
                    &api,
                    &machine,
                    &owner_machine,
                    role,
                    &cluster,
                )
                .await?
                {
                    Ok(data) => data.format(),
                    Err(action) => return Ok(action),
                },
            };
            (format, VmOrData::Exists(Box::new(vm)))
        }
        None => match read_bootstrap_data(client, &api, &machine, &owner_machine, role, &cluster)
            .await?
        {
            Ok(data) => (data.format(), VmOrData::ToCreate(data)),
            Err(action) => return Ok(action),
        },
    };

    // Observe: the cluster's SSH keys, when the bootstrap check logs in.
    let check = decide::bootstrap_check(strategy, format, kubevirt_cluster.as_ref());
    let ssh_keys = match (&check, &kubevirt_cluster) {
        (BootstrapCheck::Ssh, Some(kubevirt_cluster)) => {
            match read_ssh_keys(client, kubevirt_cluster).await? {
                Ok(keys) => Some(keys),
                Err(waiting) => {
                    report(&api, &machine, waiting).await?;
                    return Ok(Action::requeue(SSH_KEYS_POLL));
                }
            }
        }
        _ => None,
    };

    // Act: userdata Secret, then the VM.
    let placement_userdata = userdata_secret_name(&name);
    let placement = VmPlacement {
        cluster_name: &cluster_name,
        role,
        namespace: &infra.namespace,
        userdata_secret: &placement_userdata,
        bootstrap_format: format,
    };
    let vm = match vm_or_data {
        VmOrData::Exists(vm) => *vm,
        VmOrData::ToCreate(data) => {
            // Decide: the user data, with user `capk` for the ssh check (CAPK
            // injects into cloud-config only; everything else passes untouched).
            let userdata = match &ssh_keys {
                Some(keys) => {
                    match cloud_config::with_capk_user(data.as_bytes(), keys.authorized_key()) {
                        Ok(userdata) => userdata,
                        Err(error) => {
                            let message = format!(
                                "{error}: user {} cannot be added for the ssh bootstrap check; fix the bootstrap configuration or set spec.virtualMachineBootstrapCheck.checkStrategy to none",
                                ssh::SSH_USER
                            );
                            let previous =
                                conditions::get(current_conditions(&machine), READY_CONDITION)
                                    .map(|c| c.reason.clone());
                            if previous.as_deref() != Some(reason::INVALID_BOOTSTRAP_DATA) {
                                ctx.base
                                    .event(
                                        machine.as_ref(),
                                        EventType::Warning,
                                        reason::INVALID_BOOTSTRAP_DATA,
                                        message.clone(),
                                    )
                                    .await;
                            }
                            report(
                                &api,
                                &machine,
                                Report::waiting(reason::INVALID_BOOTSTRAP_DATA, message),
                            )
                            .await?;
                            return Ok(Action::requeue(Duration::from_secs(60)));
                        }
                    }
                }
                None => data.as_bytes().to_vec(),
            };
            let labels = render::machine_labels(&name, &namespace, &placement);
            act::apply_userdata_secret(&machine, &infra, &labels, &userdata)
                .await
                .map_err(Error::InfraApi)?;
            let desired = match render::desired_virtual_machine(&machine, &placement) {
                Ok(desired) => desired,
                Err(error) => {
                    let message = error.to_string();
                    ctx.base
                        .event(
                            machine.as_ref(),
                            EventType::Warning,
                            reason::INVALID_SPEC,
                            message.clone(),
                        )
                        .await;
                    report(
                        &api,
                        &machine,
                        Report::waiting(reason::INVALID_SPEC, message),
                    )
                    .await?;
                    return Ok(Action::await_change());
                }
            };
            let created_vm = match act::create_virtual_machine(&machine, &infra, desired.clone())
                .await
            {
                Ok(created) => {
                    if created.is_some() {
                        tracing::info!(machine = %name, namespace = %infra.namespace, "created VirtualMachine");
                        ctx.base
                            .event(
                                machine.as_ref(),
                                EventType::Normal,
                                "VirtualMachineCreated",
                                format!("created VirtualMachine {}/{name}", infra.namespace),
                            )
                            .await;
                    }
                    created
                }
                Err(kube::Error::Api(status)) if (400..500).contains(&status.code) => {
                    let message = format!(
                        "the infrastructure cluster refused VirtualMachine {}/{name}: {}",
                        infra.namespace, status.message
                    );
                    ctx.base
                        .event(
                            machine.as_ref(),
                            EventType::Warning,
                            reason::VM_CREATE_FAILED,
                            message.clone(),
                        )
                        .await;
                    report(
                        &api,
                        &machine,
                        Report::waiting(reason::VM_CREATE_FAILED, message),
                    )
                    .await?;
                    return Ok(Action::requeue(Duration::from_secs(60)));
                }
                Err(error) => return Err(Error::InfraApi(error)),
            };
            // The create answer is the VM; only one made by someone else
            // (409) is read back.
            match created_vm {
                Some(vm) => vm,
                None => vms
                    .get_opt(&name)
                    .await
                    .map_err(Error::InfraApi)?
                    .unwrap_or(desired),
            }
        }
    };

    // Observe the VM's instance and disks, decide what they mean.
    let vmi = ctx
        .caches
        .vmi(&infra, &name)
        .await
        .map_err(Error::InfraApi)?;
    let data_volumes = ctx
        .caches
        .data_volumes(&infra, &name, &namespace)
        .await
        .map_err(Error::InfraApi)?;
    let VmState {
        condition: vm_condition,
        ready,
        terminal,
    } = decide::virtual_machine_state(&vm, vmi.as_ref(), &data_volumes);
    // The ssh check has keys here (it returned above while waiting for them).
    let bootstrap_condition = match (&ssh_keys, check.condition()) {
        (Some(keys), _) => ssh_bootstrap_check(&machine, vmi.as_ref(), ready, keys).await,
        (None, Some(condition)) => condition,
        (None, None) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::WAITING_FOR_SSH_KEYS,
            "no SSH keys",
        ),
    };
    let checking_guest = ready && !bootstrap_condition.is_true();
    let ready_condition = decide::ready_condition(&vm_condition, &bootstrap_condition);
    let provisioned = ready_condition.is_true();
    let addresses = vmi
        .as_ref()
        .filter(|_| ready)
        .map(|vmi| decide::machine_addresses(&name, vmi));

    if provisioned && machine.spec.provider_id.is_none() {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "providerID": format!("kubevirt://{name}") } })),
        )
        .await?;
    }
    let failure = terminal.then(|| {
        (
            "UpdateMachineError".to_string(),
            vm_condition.message.clone(),
        )
    });
    let was_provisioned = is_provisioned(&machine);
    let previous_reason =
        conditions::get(current_conditions(&machine), READY_CONDITION).map(|c| c.reason.clone());
    report(
        &api,
        &machine,
        Report {
            conditions: vec![vm_condition, bootstrap_condition, ready_condition.clone()],
            provisioned,
            addresses,
            failure,
        },
    )
    .await?;

    // Tell humans about transitions worth their attention.
    if provisioned && !was_provisioned {
        ctx.base
            .event(
                machine.as_ref(),
                EventType::Normal,
                "Provisioned",
                format!("VirtualMachine {}/{name} is ready", infra.namespace),
            )
            .await;
    } else if !ready_condition.is_true()
        && previous_reason.as_deref() != Some(ready_condition.reason.as_str())
        && is_failure(&ready_condition.reason)
    {
        ctx.base
            .event(
                machine.as_ref(),
                EventType::Warning,
                &ready_condition.reason,
                ready_condition.message.clone(),
            )
            .await;
    }

    Ok(match (provisioned, infra.external) {
        (true, _) => Action::requeue(RESYNC),
        // A Ready guest changes nothing in the API while it bootstraps, so
        // no event would wake the check up: poll.
        (false, _) if checking_guest => Action::requeue(BOOTSTRAP_CHECK_POLL),
        (false, true) => Action::requeue(EXTERNAL_POLL),
        (false, false) => Action::requeue(Duration::from_secs(60)),
    })
}

/// Deletion: delete the VM (its instance and disks go with it) and the
/// userdata Secret, and let the finalizer go only when all are gone. Works
/// without the Cluster or KubevirtCluster. A paused machine is left alone
/// (clusterctl move pauses, then removes finalizers itself).
pub async fn cleanup(machine: Arc<KubevirtMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let result = delete(machine.clone(), ctx).await;
    if let Err(error) = &result {
        report_infra_backoff(ctx, &machine, error).await;
    }
    result
}

async fn delete(machine: Arc<KubevirtMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let name = machine.metadata.name.clone().unwrap_or_default();
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let api: Api<KubevirtMachine> = Api::namespaced(client.clone(), &namespace);
    let cluster_name = owner::cluster_name(&machine.metadata).map(str::to_string);
    let cluster = match &cluster_name {
        Some(cluster_name) => {
            ctx.caches
                .capi
                .cluster(client, &namespace, cluster_name)
                .await?
        }
        None => None,
    };
    let paused = pause::paused_by(cluster.as_ref(), &machine.metadata);
    if paused.is_some() {
        report_paused(&api, &machine, paused).await?;
        return Err(Error::Waiting(
            "paused: deletion waits for unpause".into(),
            Duration::from_secs(30),
        ));
    }
    let vm_namespace = machine
        .spec
        .virtual_machine_template
        .metadata
        .as_ref()
        .and_then(|m| m.namespace.clone());
    let infra: InfraCluster = match ctx
        .infra
        .resolve(
            client,
            &namespace,
            machine.spec.infra_cluster_secret_ref.as_ref(),
            vm_namespace.as_deref(),
        )
        .await
    {
        Ok(infra) => infra,
        Err(InfraClusterError::Kube(error)) => return Err(error.into()),
        Err(error) => {
            // Without the infrastructure cluster nothing can be verified
            // gone: keep the finalizer and say why.
            let message = format!("cannot delete the VirtualMachine: {error}");
            report(
                &api,
                &machine,
                Report::waiting(reason::INFRA_CLUSTER_UNAVAILABLE, message.clone()),
            )
            .await?;
            return Err(Error::Waiting(message, Duration::from_secs(30)));
        }
    };
    let remains = act::delete_machine_objects(&machine, &infra, &ctx.caches)
        .await
        .map_err(Error::InfraApi)?;
    if remains.is_empty() {
        tracing::info!(machine = %name, "VirtualMachine and its objects are gone; releasing the finalizer");
        return Ok(Action::await_change());
    }
    let message = format!("waiting for {} to be gone", remains.describe());
    let mut deleting = Report::waiting(reason::DELETING, message.clone());
    deleting.provisioned = is_provisioned(&machine);
    report(&api, &machine, deleting).await?;
    let poll = if ctx.caches.covers(&infra) && !remains.userdata_secret {
        DELETION_RESYNC
    } else {
        DELETION_POLL
    };
    Err(Error::Waiting(message, poll))
}

/// The VM a reconcile works on: the one that exists, or the bootstrap data
/// to create it with.
enum VmOrData {
    Exists(Box<VirtualMachine>),
    ToCreate(BootstrapData),
}

/// What a machine waits for while its Machine names no bootstrap data:
/// a worker first waits for its control plane, as CAPI's bootstrap
/// providers do.
fn waiting_for_bootstrap_data(
    role: MachineRole,
    cluster: &Cluster,
    owner_machine: &Machine,
) -> Report {
    let cluster_name = cluster.metadata.name.as_deref().unwrap_or_default();
    if role == MachineRole::Worker && !owner::control_plane_initialized(cluster) {
        Report::waiting(
            reason::WAITING_FOR_CONTROL_PLANE,
            format!("workers wait for Cluster {cluster_name}'s control plane to be initialized"),
        )
    } else {
        Report::waiting(
            reason::WAITING_FOR_BOOTSTRAP_DATA,
            format!(
                "Machine {} has no bootstrap data yet (spec.bootstrap.dataSecretName)",
                owner_machine.metadata.name.as_deref().unwrap_or_default()
            ),
        )
    }
}

/// Reads the owner Machine's bootstrap data; `Err` is what to do after
/// reporting why there is none.
async fn read_bootstrap_data(
    client: &kube::Client,
    api: &Api<KubevirtMachine>,
    machine: &KubevirtMachine,
    owner_machine: &Machine,
    role: MachineRole,
    cluster: &Cluster,
) -> Result<Result<BootstrapData, Action>, Error> {
    match bootstrap::read(client, owner_machine).await? {
        BootstrapState::Ready(data) => Ok(Ok(data)),
        BootstrapState::NotReady => {
            let waiting = waiting_for_bootstrap_data(role, cluster, owner_machine);
            report(api, machine, waiting).await?;
            Ok(Err(Action::requeue(RESYNC)))
        }
        BootstrapState::SecretMissing(secret) | BootstrapState::KeyMissing(secret) => {
            let namespace = owner_machine
                .metadata
                .namespace
                .as_deref()
                .unwrap_or_default();
            report(
                api,
                machine,
                Report::waiting(
                    reason::BOOTSTRAP_DATA_SECRET_MISSING,
                    format!(
                        "bootstrap data Secret {namespace}/{secret} is missing or has no 'value' key"
                    ),
                ),
            )
            .await?;
            Ok(Err(Action::requeue(Duration::from_secs(30))))
        }
    }
}

/// Reads the cluster's SSH key pair from the Secret its KubevirtCluster
/// names; `Err` is what the machine reports while it waits for one.
async fn read_ssh_keys(
    client: &kube::Client,
    kubevirt_cluster: &KubevirtCluster,
) -> Result<Result<SshKeyPair, Report>, Error> {
    let cluster = kubevirt_cluster
        .metadata
        .name
        .as_deref()
        .unwrap_or_default();
    let namespace = kubevirt_cluster
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default();
    let Some(secret_name) = kubevirt_cluster
        .spec
        .ssh_keys
        .as_ref()
        .and_then(|k| k.data_secret_name.as_deref())
    else {
        return Ok(Err(Report::waiting(
            reason::WAITING_FOR_SSH_KEYS,
            format!("KubevirtCluster {cluster} has no SSH keys yet (spec.sshKeys.dataSecretName)"),
        )));
    };
    let Some(secret) = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(secret_name)
        .await?
    else {
        return Ok(Err(Report::waiting(
            reason::WAITING_FOR_SSH_KEYS,
            format!(
                "the SSH keys Secret {namespace}/{secret_name} of KubevirtCluster {cluster} does not exist yet"
            ),
        )));
    };
    let data = secret.data.unwrap_or_default();
    let Some(private) = data.get(ssh::PRIVATE_KEY_KEY) else {
        return Ok(Err(Report::waiting(
            reason::SSH_KEYS_INVALID,
            format!(
                "the SSH keys Secret {namespace}/{secret_name} has no '{}' key",
                ssh::PRIVATE_KEY_KEY
            ),
        )));
    };
    Ok(SshKeyPair::from_secret(
        &private.0,
        data.get(ssh::PUBLIC_KEY_KEY).map(|p| p.0.as_slice()),
    )
    .map_err(|error| {
        Report::waiting(
            reason::SSH_KEYS_INVALID,
            format!("the SSH keys Secret {namespace}/{secret_name}: {error}"),
        )
    }))
}

/// CAPK's ssh bootstrap check: once the VMI is Ready, log in to its first IP
/// as `capk` and read CAPI's bootstrap sentinel. Bounded by
/// [`BOOTSTRAP_CHECK_TIMEOUT`]; a sentinel found once counts for good.
async fn ssh_bootstrap_check(
    machine: &KubevirtMachine,
    vmi: Option<&VirtualMachineInstance>,
    vm_ready: bool,
    keys: &SshKeyPair,
) -> DesiredCondition {
    if decide::bootstrap_confirmed(current_conditions(machine)) {
        return DesiredCondition::true_(BOOTSTRAP_EXEC_SUCCEEDED, reason::BOOTSTRAP_SENTINEL_FOUND);
    }
    if !vm_ready {
        return DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::WAITING_FOR_VM,
            "the ssh bootstrap check starts once the VirtualMachineInstance is Ready",
        );
    }
    let Some(ip) = vmi.and_then(decide::first_ip_address) else {
        return DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::WAITING_FOR_IP_ADDRESS,
            "the VirtualMachineInstance reports no IP address in status.interfaces yet",
        );
    };
    let result =
        ssh::read_bootstrap_sentinel(ip, ssh::SSH_PORT, keys, BOOTSTRAP_CHECK_TIMEOUT).await;
    let machine_name = machine.metadata.name.as_deref().unwrap_or_default();
    match &result {
        Ok(ssh::SentinelReading::Success) => {
            tracing::info!(machine = machine_name, %ip, "bootstrap sentinel says success")
        }
        Ok(reading) => {
            tracing::debug!(machine = machine_name, %ip, ?reading, "bootstrap sentinel read")
        }
        Err(error) => {
            tracing::debug!(machine = machine_name, %ip, %error, "bootstrap sentinel not readable")
        }
    }
    decide::sentinel_condition(ip, &result)
}

fn is_failure(reason: &str) -> bool {
    matches!(
        reason,
        reason::DATA_VOLUME_IMPORT_FAILED
            | reason::UNSCHEDULABLE
            | reason::IMAGE_PULL_FAILED
            | reason::VMI_FAILED
            | reason::VMI_EVICTED
            | reason::VM_TERMINAL
            | reason::VM_START_FAILING
            | reason::INFRA_CLUSTER_UNAVAILABLE
            | reason::BOOTSTRAP_DATA_SECRET_MISSING
            | reason::SSH_KEYS_INVALID
            | reason::BOOTSTRAP_SENTINEL_UNEXPECTED
    )
}

fn current_conditions(machine: &KubevirtMachine) -> &[Condition] {
    machine
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

fn is_provisioned(machine: &KubevirtMachine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        .unwrap_or(false)
}

/// Writes the status a reconcile decided. `initialization.provisioned` never
/// goes back to false: it records initial provisioning (v1beta2 contract);
/// later trouble shows in the conditions, which MachineHealthChecks read.
async fn report(
    api: &Api<KubevirtMachine>,
    machine: &KubevirtMachine,
    outcome: Report,
) -> Result<(), Error> {
    let current = machine.status.clone();
    let mut status = current.clone().unwrap_or_default();
    let now = Timestamp::now();
    let generation = machine.metadata.generation;
    let mut list = status.conditions.take().unwrap_or_default();
    for condition in &outcome.conditions {
        conditions::set(&mut list, condition, generation, &now);
    }
    conditions::set(&mut list, &pause::paused_condition(None), generation, &now);
    status.conditions = Some(list);
    let provisioned = outcome.provisioned || is_provisioned(machine);
    status.initialization = Some(MachineInitialization {
        provisioned: Some(provisioned),
    });
    status.ready = provisioned;
    if outcome.addresses.is_some() {
        status.addresses = outcome.addresses;
    }
    (status.failure_reason, status.failure_message) = match outcome.failure {
        Some((reason, message)) => (Some(reason), Some(message)),
        None => (None, None),
    };
    reconciler::apply_status(api, machine, current.as_ref(), &status).await?;
    Ok(())
}

/// A failed request to the infrastructure cluster backs off silently in the
/// controller; say so on the machine, once per outage (the reason is
/// written only when it changes), so an operator sees why it does not
/// progress. A provisioned machine keeps its Ready: a blip in the API says
/// nothing about the VM, and a False Ready could start remediation.
async fn report_infra_backoff(ctx: &MachineContext, machine: &KubevirtMachine, error: &Error) {
    let Error::InfraApi(api_error) = error else {
        return;
    };
    let previous =
        conditions::get(current_conditions(machine), READY_CONDITION).map(|c| c.reason.as_str());
    if previous == Some(reason::INFRA_CLUSTER_API_ERROR) {
        return;
    }
    let mut outcome = Report::waiting(
        reason::INFRA_CLUSTER_API_ERROR,
        format!("infrastructure cluster API: {api_error}; retrying with backoff"),
    );
    outcome.provisioned = is_provisioned(machine);
    let api: Api<KubevirtMachine> = Api::namespaced(
        ctx.base.client.clone(),
        machine.metadata.namespace.as_deref().unwrap_or_default(),
    );
    if let Err(report_error) = report(&api, machine, outcome).await {
        tracing::debug!(error = %report_error, "could not report the infrastructure cluster backoff");
    }
}

async fn report_paused(
    api: &Api<KubevirtMachine>,
    machine: &KubevirtMachine,
    paused: Option<pause::PausedBy>,
) -> Result<(), Error> {
    let current = machine.status.clone();
    let mut status: KubevirtMachineStatus = current.clone().unwrap_or_default();
    let mut list = status.conditions.take().unwrap_or_default();
    conditions::set(
        &mut list,
        &pause::paused_condition(paused),
        machine.metadata.generation,
        &Timestamp::now(),
    );
    status.conditions = Some(list);
    reconciler::apply_status(api, machine, current.as_ref(), &status).await?;
    Ok(())
}
