//! One reconcile of a KubevirtMachine: observe (`observe.rs`), decide
//! (`decide/`, pure), act (`act.rs`), report (here).
//!
//! Provisioning: gates (pause, owner Machine, Cluster, bootstrap data
//! named, infrastructure cluster) → the VM (created with its userdata
//! Secret when missing, from the bootstrap data and, for the ssh check, the
//! cluster's SSH keys) → what its instance and disks say → the bootstrap
//! check → status and events.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::contract::{MachineAddress, MachineInitialization, READY_CONDITION};
use tenantry_api::kubevirt::{BootstrapCheckStrategy, KubevirtMachine, KubevirtMachineStatus};

use super::controller::MachineContext;
use super::decide::{self, BootstrapCheck, VmState, Wait};
use super::status::{self, BOOTSTRAP_EXEC_SUCCEEDED, Reason};
use crate::capi::bootstrap::BootstrapFormat;
use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::pause;
use crate::kubevirt::infra::InfraClusterError;
use crate::kubevirt::render;
use crate::metrics::machines::Substrate;
use crate::reconciler;

/// How often deletion checks whether the VM is gone when nothing would
/// say so: the VM lives where no watch of ours looks, or a finalizer holds
/// the (unwatched) userdata Secret.
const DELETION_POLL: Duration = Duration::from_secs(2);
/// The safety net while deletion waits for objects our watches cover:
/// their removal wakes the machine.
const DELETION_RESYNC: Duration = Duration::from_secs(30);

/// What the infrastructure cluster adds to a reconcile's errors.
#[derive(Debug, thiserror::Error)]
pub enum InfraError {
    #[error("infrastructure cluster: {0}")]
    Cluster(#[from] InfraClusterError),
    /// A request to the infrastructure cluster's API failed (it may be
    /// another cluster than the one the machine lives in).
    #[error("infrastructure cluster API: {0}")]
    Api(#[source] kube::Error),
}

impl reconciler::OwnError for InfraError {}

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error<InfraError>;

/// A failed request to the infrastructure cluster's API.
pub(super) fn infra_api(error: kube::Error) -> Error {
    Error::Own(Box::new(InfraError::Api(error)))
}

/// Why a reconcile stops early: to report and come back later, or an error.
pub(super) enum Halt {
    Wait(Wait),
    Error(Box<Error>),
}

impl Halt {
    pub(super) fn wait(
        reason: Reason,
        message: impl Into<String>,
        retry: Option<Duration>,
    ) -> Halt {
        Halt::Wait(Wait::new(reason, message, retry))
    }
}

impl From<Wait> for Halt {
    fn from(wait: Wait) -> Self {
        Halt::Wait(wait)
    }
}

impl From<Error> for Halt {
    fn from(error: Error) -> Self {
        Halt::Error(Box::new(error))
    }
}

impl From<kube::Error> for Halt {
    fn from(error: kube::Error) -> Self {
        Halt::Error(Box::new(error.into()))
    }
}

/// What one reconcile works on.
pub(super) struct Run<'a> {
    pub(super) ctx: &'a MachineContext,
    pub(super) api: Api<KubevirtMachine>,
    pub(super) machine: Arc<KubevirtMachine>,
    pub(super) name: String,
    pub(super) namespace: String,
}

/// The status a reconcile decided, for [`Run::report`].
pub(super) struct Report {
    pub conditions: Vec<DesiredCondition>,
    pub provisioned: bool,
    pub addresses: Option<Vec<MachineAddress>>,
    pub failure: Option<(String, String)>,
}

impl Report {
    fn waiting(wait: &Wait) -> Self {
        Self {
            conditions: status::waiting(wait.reason, wait.message.clone()).to_vec(),
            provisioned: false,
            addresses: None,
            failure: None,
        }
    }
}

impl<'a> Run<'a> {
    fn new(machine: Arc<KubevirtMachine>, ctx: &'a MachineContext) -> Self {
        let name = machine.metadata.name.clone().unwrap_or_default();
        let namespace = machine.metadata.namespace.clone().unwrap_or_default();
        Run {
            ctx,
            api: Api::namespaced(ctx.base.client.clone(), &namespace),
            machine,
            name,
            namespace,
        }
    }

    pub(super) fn conditions(&self) -> &[Condition] {
        self.machine
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }

    fn previous_reason(&self) -> Option<&str> {
        conditions::get(self.conditions(), READY_CONDITION).map(|c| c.reason.as_str())
    }

    fn is_provisioned(&self) -> bool {
        decide::initially_provisioned(
            self.machine.status.as_ref(),
            self.machine.spec.provider_id.as_deref(),
        )
    }

    /// Writes the status a reconcile decided. `initialization.provisioned`
    /// never goes back to false: it records initial provisioning (v1beta2
    /// contract); later trouble shows in the conditions, which
    /// MachineHealthChecks read.
    pub(super) async fn report(&self, outcome: Report) -> Result<(), Error> {
        let current = self.machine.status.clone();
        let mut status = current.clone().unwrap_or_default();
        let now = Timestamp::now();
        let generation = self.machine.metadata.generation;
        let mut list = status.conditions.take().unwrap_or_default();
        for condition in &outcome.conditions {
            conditions::set(&mut list, condition, generation, &now);
        }
        conditions::set(&mut list, &pause::paused_condition(None), generation, &now);
        status.conditions = Some(list);
        let provisioned = outcome.provisioned || self.is_provisioned();
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
        reconciler::apply_status(&self.api, &self.machine, current.as_ref(), &status).await?;
        Ok(())
    }

    /// Reports a wait, and a Warning event when it newly is a failure.
    async fn report_wait(&self, wait: &Wait) -> Result<(), Error> {
        self.report(Report::waiting(wait)).await?;
        self.warn_if_new(wait.reason, &wait.message).await;
        Ok(())
    }

    async fn warn_if_new(&self, reason: Reason, message: &str) {
        if reason.is_failure() && self.previous_reason() != Some(reason.as_str()) {
            self.ctx
                .base
                .event(
                    self.machine.as_ref(),
                    EventType::Warning,
                    reason.as_str(),
                    message.to_string(),
                )
                .await;
        }
    }

    pub(super) async fn report_paused(&self, paused: pause::PausedBy) -> Result<(), Error> {
        let current = self.machine.status.clone();
        let mut status: KubevirtMachineStatus = current.clone().unwrap_or_default();
        let mut list = status.conditions.take().unwrap_or_default();
        conditions::set(
            &mut list,
            &pause::paused_condition(Some(paused)),
            self.machine.metadata.generation,
            &Timestamp::now(),
        );
        status.conditions = Some(list);
        reconciler::apply_status(&self.api, &self.machine, current.as_ref(), &status).await?;
        Ok(())
    }

    /// A failed request to the infrastructure cluster backs off silently in
    /// the controller; say so on the machine, once per outage (the reason
    /// is written only when it changes), so an operator sees why it does
    /// not progress. A provisioned machine keeps its Ready: a blip in the
    /// API says nothing about the VM, and a False Ready could start
    /// remediation.
    async fn report_infra_backoff(&self, error: &Error) {
        let Error::Own(own) = error else {
            return;
        };
        let InfraError::Api(api_error) = own.as_ref() else {
            return;
        };
        if self.previous_reason() == Some(Reason::InfraClusterApiError.as_str()) {
            return;
        }
        let wait = Wait::new(
            Reason::InfraClusterApiError,
            format!("infrastructure cluster API: {api_error}; retrying with backoff"),
            None,
        );
        let mut outcome = Report::waiting(&wait);
        outcome.provisioned = self.is_provisioned();
        if let Err(report_error) = self.report(outcome).await {
            tracing::debug!(error = %report_error, "could not report the infrastructure cluster backoff");
        }
    }
}

pub async fn apply(machine: Arc<KubevirtMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let run = Run::new(machine, ctx);
    match run.provision().await {
        Ok(action) => Ok(action),
        Err(Halt::Wait(wait)) => {
            run.report_wait(&wait).await?;
            Ok(wait
                .retry
                .map_or_else(Action::await_change, Action::requeue))
        }
        Err(Halt::Error(error)) => {
            if !run.is_provisioned() {
                run.report_infra_backoff(&error).await;
            }
            Err(*error)
        }
    }
}

/// Deletion: delete the VM (its instance and disks go with it) and the
/// userdata Secret, and let the finalizer go only when all are gone. Works
/// without the Cluster or KubevirtCluster. A paused machine is left alone
/// (clusterctl move pauses, then removes finalizers itself).
pub async fn cleanup(machine: Arc<KubevirtMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let run = Run::new(machine, ctx);
    match run.delete().await {
        Ok(action) => Ok(action),
        Err(Halt::Wait(wait)) => {
            // Deletion says it is deleting while it waits; `Ready` keeps
            // what provisioning recorded.
            let mut outcome = Report::waiting(&wait);
            outcome.provisioned = run.is_provisioned();
            run.report(outcome).await?;
            run.warn_if_new(wait.reason, &wait.message).await;
            // The finalizer stays until deletion reports success.
            Err(Error::Waiting(
                wait.message,
                wait.retry.unwrap_or(DELETION_POLL),
            ))
        }
        Err(Halt::Error(error)) => {
            run.report_infra_backoff(&error).await;
            Err(*error)
        }
    }
}

impl Run<'_> {
    async fn provision(&self) -> Result<Action, Halt> {
        let Some(gates) = self.gates().await? else {
            return Ok(Action::await_change());
        };
        if self.machine.spec.infra_cluster_secret_ref.is_none() && gates.secret_ref.is_some() {
            self.record_infra_secret_ref(gates.secret_ref.as_ref())
                .await?;
        }
        let infra = &gates.infra;
        let existing_vm = self
            .ctx
            .caches
            .vm(infra, &self.name)
            .await
            .map_err(infra_api)?;

        // The guest reads its userdata at first boot and CAPI's bootstrap
        // data does not change once set, so once the VM exists only the
        // data's format matters (it picks the bootstrap check), and the VM
        // records it: the Secret is read only before the VM is created, or
        // for a VM without the record when the check needs it.
        let strategy = self
            .machine
            .spec
            .virtual_machine_bootstrap_check
            .as_ref()
            .and_then(|c| c.check_strategy)
            .unwrap_or_default();
        let (format, data) = match &existing_vm {
            Some(vm) => match render::bootstrap_format_of(vm) {
                Some(format) => (format, None),
                // `none` does not look at the format.
                None if strategy == BootstrapCheckStrategy::None => (BootstrapFormat::Other, None),
                None => (self.bootstrap_data(&gates).await?.format(), None),
            },
            None => {
                let data = self.bootstrap_data(&gates).await?;
                (data.format(), Some(data))
            }
        };
        let check = decide::bootstrap_check(strategy, format, gates.kubevirt_cluster.as_ref());
        let ssh_keys = match (&check, &gates.kubevirt_cluster) {
            (BootstrapCheck::Ssh, Some(kubevirt_cluster)) => {
                Some(self.ssh_keys(kubevirt_cluster).await?)
            }
            _ => None,
        };
        let vm = match (existing_vm, data) {
            (Some(vm), _) => vm,
            (None, Some(data)) => {
                self.create_vm(&gates, format, &data, ssh_keys.as_ref())
                    .await?
            }
            (None, None) => unreachable!("the data is read when no VM exists"),
        };

        let vmi = self
            .ctx
            .caches
            .vmi(infra, &self.name)
            .await
            .map_err(infra_api)?;
        let data_volumes = self
            .ctx
            .caches
            .data_volumes(infra, &self.name, &self.namespace)
            .await
            .map_err(infra_api)?;
        let VmState {
            condition: vm_condition,
            ready,
            terminal,
        } = decide::virtual_machine_state(&vm, vmi.as_ref(), &data_volumes);
        // The ssh check has keys here (it waited for them above).
        let bootstrap_condition = match (&ssh_keys, check.condition()) {
            (Some(keys), _) => self.ssh_bootstrap_check(vmi.as_ref(), ready, keys).await,
            (None, Some(condition)) => condition,
            (None, None) => DesiredCondition::false_(
                BOOTSTRAP_EXEC_SUCCEEDED,
                Reason::WaitingForSshKeys.as_str(),
                "no SSH keys",
            ),
        };
        let checking_guest = ready && !bootstrap_condition.is_true();
        let ready_condition = decide::ready_condition(&vm_condition, &bootstrap_condition);
        let provisioned = ready_condition.is_true();
        let addresses = vmi
            .as_ref()
            .filter(|_| ready)
            .map(|vmi| decide::machine_addresses(&self.name, vmi));

        if provisioned && self.machine.spec.provider_id.is_none() {
            self.record_provider_id().await?;
        }
        let failure = terminal.then(|| {
            (
                "UpdateMachineError".to_string(),
                vm_condition.message.clone(),
            )
        });
        let was_provisioned = self.is_provisioned();
        self.report(Report {
            conditions: vec![vm_condition, bootstrap_condition, ready_condition.clone()],
            provisioned,
            addresses,
            failure,
        })
        .await?;
        if provisioned && !was_provisioned {
            crate::metrics::global().machines.provisioned(
                Substrate::Kubevirt,
                self.machine.metadata.creation_timestamp.as_ref(),
            );
            self.ctx
                .base
                .event(
                    self.machine.as_ref(),
                    EventType::Normal,
                    Reason::Provisioned.as_str(),
                    format!("VirtualMachine {}/{} is ready", infra.namespace, self.name),
                )
                .await;
        } else if !provisioned && let Some(reason) = Reason::parse(&ready_condition.reason) {
            self.warn_if_new(reason, &ready_condition.message).await;
        }
        Ok(Action::requeue(decide::next_look(
            provisioned,
            checking_guest,
            infra.external,
        )))
    }

    async fn delete(&self) -> Result<Action, Halt> {
        let (_, cluster) = self
            .ctx
            .caches
            .capi
            .labelled_cluster(
                &self.ctx.base.client,
                &self.namespace,
                &self.machine.metadata,
            )
            .await?;
        if self.paused(cluster.as_ref()).await? {
            return Err(Error::Waiting(
                "paused: deletion waits for unpause".into(),
                Duration::from_secs(30),
            )
            .into());
        }
        // Without the infrastructure cluster nothing can be verified gone:
        // the finalizer stays and the machine says why.
        let infra = self
            .infra_cluster(
                self.machine.spec.infra_cluster_secret_ref.as_ref(),
                "cannot delete the VirtualMachine: ",
            )
            .await?;
        let remains = super::act::delete_machine_objects(&self.machine, &infra, &self.ctx.caches)
            .await
            .map_err(infra_api)?;
        if remains.is_empty() {
            tracing::info!(machine = %self.name, "VirtualMachine and its objects are gone; releasing the finalizer");
            return Ok(Action::await_change());
        }
        let poll = if self.ctx.caches.covers(&infra) && !remains.userdata_secret {
            DELETION_RESYNC
        } else {
            DELETION_POLL
        };
        Err(Halt::wait(
            Reason::Deleting,
            format!("waiting for {} to be gone", remains.describe()),
            Some(poll),
        ))
    }
}
