//! One reconcile of a ProxmoxMachine: observe (`observe/`), decide
//! (`decide/`, pure), act (`act/`), report (here). One step of the
//! machine's life per call, each recorded in status before the next, so a
//! restart picks up exactly where the last manager stopped.
//!
//! Provisioning: gates (pause, owner Machine, Cluster, ProxmoxCluster,
//! bootstrap data, credentials) → IP claims → the task in flight → the VM
//! (find it, or reserve an ID and clone into the pool) → then
//! [`decide::next_step`] until it waits: configure, grow the boot disk,
//! upload and attach the NoCloud seed, start, wait for the guest agent to
//! report the static addresses, provisioned, detach and delete the seed.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::contract::READY_CONDITION;
use tenantry_api::proxmox::{ProxmoxMachine, ProxmoxMachineStatus};

use super::act::claims;
use super::cache::Freshness;
use super::controller::MachineContext;
use super::decide::{self, Need, POLL, Step, Wait};
use super::status::{self, Reason};
use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::pause;
use crate::proxmox::client::ProxmoxError;
use crate::reconciler;

/// Reconcile errors: waits are deliberate, the rest back off (PVE's
/// passing trouble at most [`crate::proxmox::TRANSIENT_BACKOFF_CAP`]).
pub type Error = reconciler::Error<ProxmoxError>;

/// Why a reconcile stops early: to report and come back later, or an error.
pub(super) enum Halt {
    Wait(Wait),
    Error(Box<Error>),
}

impl Halt {
    pub(super) fn wait(
        reason: Reason,
        message: impl Into<Cow<'static, str>>,
        retry: Option<Duration>,
    ) -> Halt {
        Halt::Wait(Wait::new(reason, message, retry))
    }
}

impl From<kube::Error> for Halt {
    fn from(error: kube::Error) -> Self {
        Halt::Error(Box::new(error.into()))
    }
}

impl From<Error> for Halt {
    fn from(error: Error) -> Self {
        Halt::Error(Box::new(error))
    }
}

impl From<Wait> for Halt {
    fn from(wait: Wait) -> Self {
        Halt::Wait(wait)
    }
}

/// A PVE error as a halt: transient ones back off; the rest become a
/// condition naming what was refused and why (PVE's own text, which for a
/// permission names the path and the privilege).
pub(super) fn refused(
    error: ProxmoxError,
    step_failed: Reason,
    what: impl std::fmt::Display,
) -> Halt {
    if error.is_transient() {
        return Halt::Error(Box::new(error.into()));
    }
    let hint = match &error {
        ProxmoxError::PermissionDenied {
            path: Some(path),
            privilege: Some(privilege),
            ..
        } => format!(
            "; grant {privilege} on {path} to the token and to its user (a privilege-separated token is capped by its user)"
        ),
        _ => String::new(),
    };
    Halt::wait(
        Reason::of_refusal(&error, step_failed),
        format!("{what}: {error}{hint}"),
        Some(decide::HUMAN_RETRY),
    )
}

/// What one reconcile works on: the machine as the apiserver has it now,
/// and the status it is building.
pub(super) struct Run<'a> {
    pub(super) ctx: &'a MachineContext,
    pub(super) api: Api<ProxmoxMachine>,
    pub(super) machine: ProxmoxMachine,
    pub(super) written: Option<ProxmoxMachineStatus>,
    pub(super) status: ProxmoxMachineStatus,
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) uid: String,
    /// Steps follow each other within this reconcile: a task's wait is
    /// short (see [`super::observe::pve::inline_task_wait`]).
    pub(super) inline: bool,
    /// Provisioned in this reconcile: said by the next write, with an
    /// event.
    pub(super) newly_provisioned: bool,
}

/// What [`Run::load`] found.
enum Loaded<'a> {
    Run(Box<Run<'a>>),
    /// The machine is gone.
    Gone,
    /// The controller's copy predates this manager's last write; the watch
    /// brings it within this long (and wakes the machine then).
    Behind(Duration),
}

/// What a reconcile does with the controller's copy of a machine that this
/// manager has not written since it started.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unwritten {
    /// Work from it: it comes from a list made after this manager started
    /// leading, and the one write that precedes something irreversible
    /// (the VM ID reserved before a clone) is conditional on its version.
    Trust,
    /// Read the machine afresh (deletion: a VM the copy does not show
    /// would be left behind).
    Read,
}

impl<'a> Run<'a> {
    /// The machine as last written: the controller's copy when it shows
    /// this manager's last write (or, per `unwritten`, when this manager
    /// has not written it yet); nothing yet when the copy predates that
    /// write and the watch is about to bring it; else read afresh — a stale
    /// status could mean a second clone.
    async fn load(
        ctx: &'a MachineContext,
        object: &ProxmoxMachine,
        unwritten: Unwritten,
    ) -> Result<Loaded<'a>, Error> {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let api: Api<ProxmoxMachine> = Api::namespaced(ctx.base.client.clone(), &namespace);
        let machine = match ctx.caches.freshness(object) {
            Freshness::Current => object.clone(),
            Freshness::Unwritten if unwritten == Unwritten::Trust => object.clone(),
            Freshness::BehindOwnWrite(left) => return Ok(Loaded::Behind(left)),
            Freshness::Unwritten | Freshness::Stale => {
                let Some(machine) = api.get_opt(&name).await? else {
                    return Ok(Loaded::Gone);
                };
                ctx.caches.saw_latest(&machine);
                machine
            }
        };
        let written = machine.status.clone();
        Ok(Loaded::Run(Box::new(Run {
            ctx,
            api,
            status: written.clone().unwrap_or_default(),
            written,
            uid: machine.metadata.uid.clone().unwrap_or_default(),
            machine,
            name,
            namespace,
            inline: false,
            newly_provisioned: false,
        })))
    }

    pub(super) fn pool(&self) -> Option<&str> {
        self.machine.spec.pool.as_deref().filter(|p| !p.is_empty())
    }

    pub(super) fn is_provisioned(&self) -> bool {
        self.status
            .initialization
            .as_ref()
            .and_then(|i| i.provisioned)
            .unwrap_or(false)
    }

    pub(super) fn previous_reason(&self) -> Option<String> {
        let conditions = self
            .written
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        conditions::get(conditions, READY_CONDITION).map(|c| c.reason.clone())
    }

    pub(super) fn set_conditions(&mut self, desired: &[DesiredCondition]) {
        let now = Timestamp::now();
        let generation = self.machine.metadata.generation;
        let mut list = self.status.conditions.take().unwrap_or_default();
        for condition in desired {
            conditions::set(&mut list, condition, generation, &now);
        }
        conditions::set(&mut list, &pause::paused_condition(None), generation, &now);
        self.status.conditions = Some(list);
    }

    /// Reports a wait (and a Warning event when it newly is a failure).
    async fn report_wait(&mut self, wait: &Wait) -> Result<(), Error> {
        let reason = wait.reason.as_str();
        if self.is_provisioned() {
            // Provisioning happened once and stays recorded; Ready says
            // what is wrong now.
            self.set_conditions(&[DesiredCondition::false_(
                READY_CONDITION,
                reason,
                wait.message.to_string(),
            )]);
        } else {
            self.set_conditions(&status::waiting(wait.reason, wait.message.to_string()));
        }
        let previous = self.previous_reason();
        self.persist().await?;
        self.announce_provisioned().await;
        if previous.as_deref() != Some(reason) && wait.reason.is_failure() {
            self.ctx
                .base
                .event(
                    &self.machine,
                    EventType::Warning,
                    reason,
                    wait.message.to_string(),
                )
                .await;
        }
        Ok(())
    }

    /// A Proxmox error that is not a step's own refusal (a transient one,
    /// or a bare 5xx while reading what a step needs) backs off without a
    /// condition of its own step; until the machine is provisioned, `Ready`
    /// says what the PVE API answered, so the backoff is not only in the
    /// logs. A provisioned machine keeps its `Ready`: its VM runs whatever
    /// the API answers for a moment. Written once per outage, not per
    /// failed try: a status write triggers the next reconcile at once,
    /// which would undo the backoff.
    async fn report_backoff(&mut self, error: &Error) {
        if self.newly_provisioned {
            // Provisioned is recorded even when what followed failed.
            if let Err(report) = self.persist().await {
                tracing::debug!(error = %report, "could not record the provisioning");
            }
            self.announce_provisioned().await;
        }
        let Error::Own(pve) = error else { return };
        let shown = Reason::of_backoff(pve);
        if self.is_provisioned() || self.previous_reason().as_deref() == Some(shown.as_str()) {
            return;
        }
        let wait = Wait::new(
            shown,
            format!("Proxmox VE API: {pve}; retrying with backoff"),
            None,
        );
        if let Err(report) = self.report_wait(&wait).await {
            tracing::debug!(error = %report, "could not report the Proxmox backoff");
        }
    }
}

/// How many tasks one reconcile starts and sees through at most before it
/// leaves the rest to the next (a provisioning has six or so).
const INLINE_STEPS: usize = 8;
/// How long a reconcile goes on from step to step, and how long one step
/// may have taken for the next to follow: past either, the state is
/// written and the machine queued again, so that with a slow hypervisor a
/// wave's machines take turns (each gets its first status early) instead of
/// the first few holding every worker for their whole provisioning.
const INLINE_BUDGET: Duration = Duration::from_secs(2);
const INLINE_STEP_LIMIT: Duration = Duration::from_millis(500);

/// Provisions step by step. A step that started a task halts; when the
/// task ends within a moment ([`super::observe::pve::inline_task_wait`])
/// the next step goes on in the same reconcile (while PVE answers fast: see
/// [`INLINE_BUDGET`]), and the status is written only where the machine
/// waits — a task still running (with its UPID, so a restart finds it), an
/// address, the guest — or is done. What a skipped write would have said
/// lasted under two seconds; a restart between two steps loses nothing, as
/// every step is judged from the VM's own state and the one irreversible
/// step, the clone, is recorded before it is asked for.
pub async fn apply(object: Arc<ProxmoxMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let mut run = match Run::load(ctx, &object, Unwritten::Trust).await? {
        Loaded::Run(run) => run,
        Loaded::Gone => return Ok(Action::await_change()),
        Loaded::Behind(left) => return Ok(Action::requeue(left)),
    };
    let started = std::time::Instant::now();
    let mut steps = 0;
    loop {
        let step_started = std::time::Instant::now();
        match run.provision().await {
            Ok(action) => return Ok(action),
            Err(Halt::Wait(wait))
                if wait.task_started
                    && steps < INLINE_STEPS
                    && started.elapsed() < INLINE_BUDGET
                    && step_started.elapsed() < INLINE_STEP_LIMIT =>
            {
                steps += 1;
                run.inline = true;
            }
            Err(Halt::Wait(wait)) => {
                run.report_wait(&wait).await?;
                return Ok(wait
                    .retry
                    .map_or_else(Action::await_change, Action::requeue));
            }
            Err(Halt::Error(error)) => {
                run.report_backoff(&error).await;
                return Err(*error);
            }
        }
    }
}

pub async fn cleanup(object: Arc<ProxmoxMachine>, ctx: &MachineContext) -> Result<Action, Error> {
    let mut run = match Run::load(ctx, &object, Unwritten::Read).await? {
        Loaded::Run(run) => run,
        Loaded::Gone => return Ok(Action::await_change()),
        // The finalizer stays: waiting is an error to the finalizer helper.
        Loaded::Behind(left) => {
            return Err(Error::Waiting(
                "waiting for the watch to bring this manager's last write".into(),
                left,
            ));
        }
    };
    match run.delete().await {
        Ok(action) => {
            ctx.caches.forget(&run.uid);
            Ok(action)
        }
        Err(Halt::Wait(wait)) => {
            run.report_wait(&wait).await?;
            // The finalizer stays until deletion reports success.
            Err(Error::Waiting(
                wait.message.into_owned(),
                wait.retry.unwrap_or(POLL),
            ))
        }
        Err(Halt::Error(error)) => Err(*error),
    }
}

impl Run<'_> {
    /// One pass: observe what the decision needs, act on the step it
    /// names, until a step halts or the machine is ready.
    async fn provision(&mut self) -> Result<Action, Halt> {
        let Some(gates) = self.gates().await? else {
            return Ok(Action::await_change());
        };
        if let Some(next_look) = self.checked_a_moment_ago() {
            return Ok(Action::requeue(next_look));
        }
        let client = &gates.client;
        let plans = decide::address_claims(
            &self.name,
            &self.machine.spec,
            gates
                .proxmox_cluster
                .metadata
                .name
                .as_deref()
                .unwrap_or_default(),
            &gates.proxmox_cluster.spec,
        );
        let addresses = claims::ensure_addresses(
            &self.ctx.base.client,
            &self.ctx.caches,
            &self.machine,
            &gates.cluster_name,
            &plans,
        )
        .await?;
        self.first_word()?;
        self.settle_task(client).await?;
        let (vm, pool_storages) = self.resolve_vm(&gates).await?;
        self.record_vm(&vm).await?;

        let mut seed = None;
        let mut guest = None;
        loop {
            let observed = decide::Observed {
                spec: &self.machine.spec,
                pool_storages: &pool_storages,
                vm: &vm,
                provisioned: self.is_provisioned(),
                seed_removed: self.status.vm_status.as_deref() == Some("ready"),
                addresses: &addresses,
                retry_after: self.retry_after(),
                seed: seed.as_ref(),
                guest: guest.as_ref(),
            };
            match decide::next_step(&observed, Timestamp::now()) {
                Step::Observe(Need::Seed) => seed = Some(self.observe_seed(client, &vm).await?),
                Step::Observe(Need::SeedUpload) => {
                    let state = seed.as_mut().expect("the seed was observed");
                    state.uploaded = Some(self.seed_uploaded(client, &vm, state).await?);
                }
                Step::Observe(Need::Guest) => guest = Some(self.observe_guest(client, &vm).await?),
                Step::Wait(wait) => return Err(wait.into()),
                Step::Configure(update) => return Err(self.configure(client, &vm, &update).await),
                Step::GrowDisk { disk, gib } => {
                    return Err(self.grow_disk(client, &vm, &disk, gib).await);
                }
                Step::UploadSeed => {
                    let seed = seed.as_ref().expect("the seed was observed");
                    return Err(self
                        .upload_seed(client, &gates, &vm, seed, &addresses, &plans)
                        .await);
                }
                Step::AttachSeed { slot } => {
                    let seed = seed.as_ref().expect("the seed was observed");
                    return Err(self.attach_seed(client, &vm, seed, slot).await);
                }
                Step::Start => return Err(self.start(client, &vm).await),
                Step::MarkProvisioned => self.mark_provisioned(&addresses),
                Step::RemoveSeed => self.remove_seed(client, &vm).await?,
                Step::Ready => return self.ready(&addresses).await.map_err(Halt::from),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::ReconcileError;

    #[test]
    fn an_outage_backs_off_at_most_half_a_minute_a_refusal_as_usual() {
        let outage = Error::from(ProxmoxError::Unavailable {
            status: 503,
            message: "Service Unavailable".into(),
        });
        assert_eq!(
            outage.backoff_cap(),
            Some(crate::proxmox::TRANSIENT_BACKOFF_CAP)
        );
        let during_cleanup = Error::from(kube::runtime::finalizer::Error::CleanupFailed(outage));
        assert_eq!(
            during_cleanup.backoff_cap(),
            Some(crate::proxmox::TRANSIENT_BACKOFF_CAP)
        );
        let refusal = Error::from(ProxmoxError::PermissionDenied {
            path: None,
            privilege: Some("VM.Clone".into()),
            message: "Permission check failed".into(),
        });
        assert_eq!(refusal.backoff_cap(), None);
    }

    #[test]
    fn a_refused_privilege_says_what_to_grant() {
        let error = ProxmoxError::PermissionDenied {
            path: Some("/vms/9000".into()),
            privilege: Some("VM.Clone".into()),
            message: "Permission check failed (/vms/9000, VM.Clone)".into(),
        };
        let Halt::Wait(wait) = refused(error, Reason::CloningFailed, "cloning template 9000")
        else {
            panic!("a permission problem waits for a human");
        };
        assert_eq!(wait.reason, Reason::PermissionDenied);
        assert!(wait.message.starts_with("cloning template 9000: permission denied: Permission check failed (/vms/9000, VM.Clone)"), "{}", wait.message);
        assert!(
            wait.message
                .contains("grant VM.Clone on /vms/9000 to the token and to its user"),
            "{}",
            wait.message
        );
        assert_eq!(wait.retry, Some(decide::HUMAN_RETRY));
    }

    #[test]
    fn other_refusals_keep_the_steps_reason_and_passing_trouble_backs_off() {
        let rejected = ProxmoxError::Rejected {
            status: 500,
            message: "can't clone VM to node 'pve2' (VM uses local storage)".into(),
        };
        let Halt::Wait(wait) = refused(rejected, Reason::CloningFailed, "cloning") else {
            panic!("a refusal waits for a human");
        };
        assert_eq!(wait.reason, Reason::CloningFailed);
        let unavailable = ProxmoxError::Unavailable {
            status: 503,
            message: "Service Unavailable".into(),
        };
        assert!(matches!(
            refused(unavailable, Reason::CloningFailed, "cloning"),
            Halt::Error(_)
        ));
    }
}
