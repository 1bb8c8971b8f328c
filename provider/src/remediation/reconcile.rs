//! One reconcile of a remediation: observe (the remediation as the
//! apiserver has it now, its Machine, the Cluster and pause) → decide
//! (`decide::next`) → act (`act.rs`) → report (status, the `Remediated`
//! condition, events). Every attempt is written to status before it is
//! made; see `decide.rs` for why that keeps restarts to one per attempt.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::remediation::{REMEDIATED_CONDITION, RemediationPhase, RemediationStatus};

use super::act::{self, ActError};
use super::controller::{RemediationContext, RemediationObject, Substrate};
use super::decide::{self, MachineState, Next, Observed, event};
use super::observe::Observation;
use super::status::Reason;
use crate::capi::Machine;
use crate::capi::conditions::{self, DesiredCondition};
use crate::reconciler::FIELD_MANAGER;

/// How long to wait before retrying what a human has to fix.
const HUMAN_RETRY: Duration = Duration::from_secs(60);
/// How soon to look again at a Proxmox restart task still running.
const TASK_POLL: Duration = Duration::from_secs(2);
/// Added to timeouts so the next reconcile lands after them, not just before.
const SLACK: Duration = Duration::from_millis(200);

/// Reconcile errors, all transient (retried with backoff; PVE's passing
/// trouble at most half a minute apart). What needs a human is reported in
/// the `Remediated` condition instead.
pub type Error = crate::reconciler::Error<crate::proxmox::client::ProxmoxError>;

/// Whether an act failed transiently (`Err`) or was refused (`Ok(message)`).
fn refusal(error: ActError) -> Result<String, Error> {
    match error {
        ActError::Refused(message) => Ok(message),
        ActError::Kube(error) => Err(error.into()),
        ActError::Proxmox(error) => Err(Error::Own(error)),
    }
}

pub async fn reconcile<K: RemediationObject>(
    object: std::sync::Arc<K>,
    ctx: &RemediationContext,
) -> Result<Action, Error> {
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    let name = object.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.base.client.clone(), &namespace);
    // Read afresh: the controller's cache may lag behind the last status
    // write, and a stale retryCount would mean a second restart.
    let Some(object) = api.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    // Nothing outside the object to clean up: deleting it stops everything.
    if object.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let written = object.remediation_status().cloned();
    let mut run = Run {
        ctx,
        api,
        status: written.clone().unwrap_or_default(),
        written,
        object,
        name,
        namespace,
    };
    run.step().await
}

/// One reconcile's working state: the object as last read or written, and
/// the status being built.
pub(super) struct Run<'a, K> {
    pub(super) ctx: &'a RemediationContext,
    pub(super) api: Api<K>,
    pub(super) object: K,
    pub(super) written: Option<RemediationStatus>,
    pub(super) status: RemediationStatus,
    pub(super) name: String,
    pub(super) namespace: String,
}

/// The Machine under remediation.
struct Target {
    machine: Machine,
    name: String,
    uid: String,
}

impl<K: RemediationObject> Run<'_, K> {
    async fn step(&mut self) -> Result<Action, Error> {
        let Some(Observation {
            machine_name,
            machine,
            state,
        }) = self.observe().await?
        else {
            return Ok(Action::await_change());
        };
        let strategy = self.object.strategy().clone();
        let timeout = match strategy.timeout() {
            Ok(timeout) => timeout,
            Err(message) => {
                self.set_remediated(DesiredCondition::false_(
                    REMEDIATED_CONDITION,
                    Reason::InvalidSpec.as_str(),
                    format!("spec.strategy.timeout: {message}"),
                ));
                self.persist().await?;
                return Ok(Action::await_change());
            }
        };
        let retry_limit = strategy.retry_limit();
        let next = decide::next(&Observed {
            status: &self.status,
            retry_limit,
            timeout,
            machine: state,
            now: Timestamp::now(),
        });
        tracing::debug!(machine = %machine_name, ?next, "remediation step");
        let target = machine.map(|machine| Target {
            uid: machine.metadata.uid.clone().unwrap_or_default(),
            name: machine_name.clone(),
            machine,
        });
        let settings = Settings {
            retry_limit,
            timeout,
        };
        match (next, target) {
            (Next::Idle, _) | (_, None) => self.idle(&machine_name, state).await,
            (Next::Healthy, Some(target)) => {
                self.set_remediated(DesiredCondition::true_(REMEDIATED_CONDITION, Reason::MachineHealthy.as_str()).with_message(format!(
                    "Machine {} passes its health check again; its MachineHealthCheck deletes this remediation",
                    target.name
                )));
                self.persist().await?;
                Ok(Action::await_change())
            }
            (Next::Wait { remaining }, _) => {
                // Only the Paused condition can have changed (unpaused).
                self.persist().await?;
                Ok(Action::requeue(remaining + SLACK))
            }
            (Next::Restart { attempt }, Some(target)) => {
                self.restart(&target, attempt, &settings).await
            }
            (Next::FinishRestart, Some(target)) => self.finish_restart(&target, &settings).await,
            (Next::Replace, Some(target)) => self.replace(&target, &settings).await,
        }
    }

    /// The Machine is gone or going. A remediation that deleted it keeps
    /// saying so; any other says there is nothing to do.
    async fn idle(&mut self, machine: &str, state: MachineState) -> Result<Action, Error> {
        if self.status.phase != Some(RemediationPhase::Replacing) {
            let (reason, message) = match state {
                MachineState::Deleting => (
                    Reason::MachineDeleting.as_str(),
                    format!("Machine {machine} is being deleted; nothing to remediate"),
                ),
                _ => (
                    Reason::MachineNotFound.as_str(),
                    format!("Machine {machine} does not exist; nothing to remediate"),
                ),
            };
            self.set_remediated(DesiredCondition::false_(
                REMEDIATED_CONDITION,
                reason,
                message,
            ));
        }
        self.persist().await?;
        Ok(Action::await_change())
    }

    /// A new attempt: find the VM, record the attempt, then restart.
    async fn restart(
        &mut self,
        target: &Target,
        attempt: u32,
        settings: &Settings,
    ) -> Result<Action, Error> {
        let attempt_text = decide::attempt_text(attempt, settings.retry_limit);
        match K::SUBSTRATE {
            Substrate::Kubevirt => {
                let vm = match act::locate_kubevirt(self.ctx, &target.machine).await {
                    Ok(vm) => vm,
                    Err(error) => {
                        let message = refusal(error)?;
                        self.record_attempt(attempt, None, &message);
                        return self.failed(target, message, settings).await;
                    }
                };
                self.record_attempt(
                    attempt,
                    vm.instance_uid.clone(),
                    &format!(
                        "restarting VirtualMachineInstance {} ({attempt_text})",
                        vm.instance()
                    ),
                );
                self.persist().await?;
                self.finish_kubevirt(target, settings, Some(vm)).await
            }
            Substrate::Proxmox => {
                let vm = match act::locate_proxmox(self.ctx, &target.machine).await {
                    Ok(vm) => vm,
                    Err(error) => {
                        let message = refusal(error)?;
                        self.record_attempt(attempt, None, &message);
                        return self.failed(target, message, settings).await;
                    }
                };
                let verb = if vm.running { "resetting" } else { "starting" };
                self.record_attempt(
                    attempt,
                    None,
                    &format!("{verb} VM {} on {} ({attempt_text})", vm.vmid, vm.node),
                );
                self.persist().await?;
                let upid = match act::restart_proxmox(&vm).await {
                    Ok(upid) => upid,
                    Err(error) => {
                        let message = refusal(error)?;
                        return self.failed(target, message, settings).await;
                    }
                };
                tracing::info!(machine = %target.name, vmid = vm.vmid, node = %vm.node, upid = %upid, "restarting the machine's VM");
                self.status.task_ref = Some(upid.to_string());
                self.persist().await?;
                self.finish_proxmox_task(target, settings, &vm.client, &upid)
                    .await
            }
        }
    }

    /// Sees through an attempt recorded by an earlier reconcile.
    async fn finish_restart(
        &mut self,
        target: &Target,
        settings: &Settings,
    ) -> Result<Action, Error> {
        match K::SUBSTRATE {
            Substrate::Kubevirt => self.finish_kubevirt(target, settings, None).await,
            Substrate::Proxmox => {
                let Some(upid) = self
                    .status
                    .task_ref
                    .as_deref()
                    .and_then(|t| t.parse::<crate::proxmox::client::Upid>().ok())
                else {
                    // Recorded, but no task came back: whether PVE got the
                    // request is unknown. Resetting now could reset a VM
                    // that is already rebooting, so the attempt counts as
                    // made (at most one reset per attempt).
                    tracing::warn!(machine = %target.name, "a recorded reset has no task; not repeating it");
                    let what =
                        "the VM, maybe (the reset request got no answer; it is not repeated)"
                            .to_string();
                    return self.waiting(target, settings, what).await;
                };
                let vm = match act::locate_proxmox(self.ctx, &target.machine).await {
                    Ok(vm) => vm,
                    Err(error) => {
                        let message = refusal(error)?;
                        return self.failed(target, message, settings).await;
                    }
                };
                self.finish_proxmox_task(target, settings, &vm.client, &upid)
                    .await
            }
        }
    }

    /// Deletes the instance recorded with the attempt (a no-op when it is
    /// already gone or replaced), then waits.
    async fn finish_kubevirt(
        &mut self,
        target: &Target,
        settings: &Settings,
        located: Option<act::KubevirtTarget>,
    ) -> Result<Action, Error> {
        let vm = match located {
            Some(vm) => vm,
            None => match act::locate_kubevirt(self.ctx, &target.machine).await {
                Ok(vm) => vm,
                Err(error) => {
                    let message = refusal(error)?;
                    return self.failed(target, message, settings).await;
                }
            },
        };
        let what = match self.status.virtual_machine_instance_uid.clone() {
            Some(uid) => match act::restart_kubevirt(&vm, &uid).await {
                Ok(deleted) => {
                    if deleted {
                        tracing::info!(machine = %target.name, instance = %vm.instance(), %uid, "deleted the VirtualMachineInstance; its VirtualMachine starts a new one");
                    }
                    format!("VirtualMachineInstance {}", vm.instance())
                }
                Err(error) => {
                    let message = refusal(error)?;
                    return self.failed(target, message, settings).await;
                }
            },
            None => format!(
                "VirtualMachine {} (no instance was running; the VirtualMachine starts one)",
                vm.instance()
            ),
        };
        self.waiting(target, settings, what).await
    }

    async fn finish_proxmox_task(
        &mut self,
        target: &Target,
        settings: &Settings,
        client: &crate::proxmox::client::ProxmoxClient,
        upid: &crate::proxmox::client::Upid,
    ) -> Result<Action, Error> {
        match act::restart_task_done(client, upid).await {
            Ok(true) => {
                let what = format!(
                    "VM {} on {} ({} task {upid})",
                    upid.id(),
                    upid.node(),
                    upid.task_type()
                );
                self.waiting(target, settings, what).await
            }
            Ok(false) => Ok(Action::requeue(TASK_POLL)),
            Err(error) => {
                let message = refusal(error)?;
                self.failed(target, message, settings).await
            }
        }
    }

    /// Writes a new attempt: counted, timed, and what it will restart.
    fn record_attempt(&mut self, attempt: u32, instance_uid: Option<String>, message: &str) {
        self.status.phase = Some(RemediationPhase::Rebooting);
        self.status.retry_count = Some(i32::try_from(attempt).unwrap_or(i32::MAX));
        self.status.last_remediated = Some(Time(Timestamp::now()));
        self.status.virtual_machine_instance_uid = instance_uid;
        self.status.task_ref = None;
        self.set_remediated(DesiredCondition::false_(
            REMEDIATED_CONDITION,
            Reason::Rebooting.as_str(),
            message.to_string(),
        ));
    }

    /// The attempt's restart was issued: wait for the Machine.
    async fn waiting(
        &mut self,
        target: &Target,
        settings: &Settings,
        restarted: String,
    ) -> Result<Action, Error> {
        let attempt = self.status.retries();
        let message = format!(
            "restarted {restarted} ({}); waiting up to {} for Machine {} to pass its health check",
            decide::attempt_text(attempt, settings.retry_limit),
            decide::human_duration(settings.timeout),
            target.name
        );
        self.status.phase = Some(RemediationPhase::Waiting);
        self.set_remediated(DesiredCondition::false_(
            REMEDIATED_CONDITION,
            Reason::WaitingForNodeHealthy.as_str(),
            message.clone(),
        ));
        self.persist().await?;
        self.ctx
            .base
            .event(&self.object, EventType::Normal, event::REBOOTED, message)
            .await;
        Ok(Action::requeue(self.remaining(settings)))
    }

    /// The attempt's restart could not be issued: say why; the timeout then
    /// leads to the next attempt or to the replacement.
    async fn failed(
        &mut self,
        target: &Target,
        message: String,
        settings: &Settings,
    ) -> Result<Action, Error> {
        let attempt = self.status.retries();
        let then = if attempt < settings.retry_limit {
            "the next restart"
        } else {
            "the Machine's replacement"
        };
        let message = format!(
            "{message} ({}, Machine {}); {then} follows in {}",
            decide::attempt_text(attempt, settings.retry_limit),
            target.name,
            decide::human_duration(settings.timeout)
        );
        tracing::warn!(machine = %target.name, %message, "restart failed");
        self.status.phase = Some(RemediationPhase::Failed);
        self.set_remediated(DesiredCondition::false_(
            REMEDIATED_CONDITION,
            Reason::RebootFailed.as_str(),
            message.clone(),
        ));
        self.persist().await?;
        self.ctx
            .base
            .event(
                &self.object,
                EventType::Warning,
                event::REBOOT_FAILED,
                message,
            )
            .await;
        Ok(Action::requeue(self.remaining(settings)))
    }

    /// Retries are exhausted: record the decision, then delete the Machine
    /// (CAPI's external remediation contract) so that its owner replaces it.
    async fn replace(&mut self, target: &Target, settings: &Settings) -> Result<Action, Error> {
        let message = decide::replacement_message(
            &target.name,
            self.status.retries(),
            settings.retry_limit,
            settings.timeout,
            act::replaced_by(&target.machine),
        );
        if self.status.phase != Some(RemediationPhase::Replacing) {
            self.status.phase = Some(RemediationPhase::Replacing);
            self.set_remediated(DesiredCondition::false_(
                REMEDIATED_CONDITION,
                Reason::RetriesExhausted.as_str(),
                message.clone(),
            ));
            self.persist().await?;
        }
        match act::delete_machine(
            &self.ctx.base.client,
            self.ctx.base.capi,
            &self.namespace,
            &target.name,
            &target.uid,
        )
        .await
        {
            Ok(deleted) => {
                if deleted {
                    tracing::info!(machine = %target.name, "deleted the Machine to have it replaced");
                    self.ctx
                        .base
                        .event(
                            &self.object,
                            EventType::Warning,
                            event::MACHINE_DELETED,
                            message.clone(),
                        )
                        .await;
                }
                self.set_remediated(DesiredCondition::false_(
                    REMEDIATED_CONDITION,
                    Reason::RetriesExhausted.as_str(),
                    message,
                ));
                self.persist().await?;
                Ok(Action::await_change())
            }
            Err(error) => {
                let refused = refusal(error)?;
                let message =
                    format!("{refused}; retries are exhausted and the Machine has to be replaced");
                let previous = self.remediated_reason();
                self.set_remediated(DesiredCondition::false_(
                    REMEDIATED_CONDITION,
                    Reason::MachineDeleteFailed.as_str(),
                    message.clone(),
                ));
                self.persist().await?;
                if previous.as_deref() != Some(Reason::MachineDeleteFailed.as_str()) {
                    self.ctx
                        .base
                        .event(
                            &self.object,
                            EventType::Warning,
                            Reason::MachineDeleteFailed.as_str(),
                            message,
                        )
                        .await;
                }
                Ok(Action::requeue(HUMAN_RETRY))
            }
        }
    }

    /// Time left until the timeout of the latest attempt.
    fn remaining(&self, settings: &Settings) -> Duration {
        let elapsed = self
            .status
            .last_remediated
            .as_ref()
            .map(|t| decide::elapsed_since(&t.0, &Timestamp::now()))
            .unwrap_or_default();
        settings.timeout.saturating_sub(elapsed) + SLACK
    }

    fn remediated_reason(&self) -> Option<String> {
        conditions::get(
            self.status.conditions.as_deref().unwrap_or_default(),
            REMEDIATED_CONDITION,
        )
        .map(|c| c.reason.clone())
    }

    fn set_remediated(&mut self, desired: DesiredCondition) {
        self.set_condition(desired);
    }

    pub(super) fn set_condition(&mut self, desired: DesiredCondition) {
        let mut list = self.status.conditions.take().unwrap_or_default();
        conditions::set(
            &mut list,
            &desired,
            self.object.meta().generation,
            &Timestamp::now(),
        );
        self.status.conditions = Some(list);
    }

    /// Writes the status built so far with server-side apply, guarded by the
    /// resourceVersion this reconcile read: if anything else wrote the
    /// object in between, the write fails and the reconcile starts over
    /// from what is stored, instead of acting on a stale attempt count.
    pub(super) async fn persist(&mut self) -> Result<(), Error> {
        if self.written.as_ref() == Some(&self.status) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": { "resourceVersion": self.object.meta().resource_version },
            "status": self.status,
        });
        self.object = self
            .api
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        self.written = Some(self.status.clone());
        Ok(())
    }
}

/// The strategy a reconcile acts on.
struct Settings {
    retry_limit: u32,
    timeout: Duration,
}
