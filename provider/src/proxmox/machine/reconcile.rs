//! One reconcile of a ProxmoxMachine: one step of its life per call, each
//! step recorded in status before the next, so a restart picks up exactly
//! where the last manager stopped.
//!
//! Provisioning: gates (pause, owner Machine, Cluster, ProxmoxCluster,
//! bootstrap data, credentials) → IP claims → the task in flight → the VM
//! (find it, or reserve an ID and clone into the pool) → configure →
//! grow the boot disk → upload and attach the NoCloud seed → start → wait
//! for the guest agent to report the static addresses → provisioned →
//! detach and delete the seed.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tenantry_api::contract::{CONTROL_PLANE_LABEL, MachineInitialization, READY_CONDITION};
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine, ProxmoxMachineStatus, provider_id};

use super::act::{self, Addresses, TaskPoll, VmFacts};
use super::cache::Freshness;
use super::controller::MachineContext;
use super::decide::{
    self, DeviceAddress, SeedDrive, VM_PROVISIONED, VmPresence, VmVerdict, VmidSearch, VmidSource,
    reason,
};
use crate::capi::bootstrap::{self, BootstrapData, BootstrapState};
use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::{Cluster, owner, pause};
use crate::proxmox::client::{
    CloneParams, DeleteParams, DiskFormat, DiskSize, ProxmoxClient, ProxmoxError, Upid,
    VmConfigUpdate,
};
use crate::proxmox::nocloud::{self, NoCloudSeed, UserData};
use crate::proxmox::scheduler::{self, PlacementRequest, SchedulerHints};
use crate::reconciler::{self, ReconcileError};

/// How often a provisioned machine is looked at without any event.
const RESYNC: Duration = Duration::from_secs(300);
/// How long the look at a provisioned machine's VM answers for it when the
/// machine is woken by something else (see [`Run::checked_a_moment_ago`]).
const VM_CHECK_HOLDS: Duration = Duration::from_secs(30);
/// How soon a machine looks again while PVE works (tasks, booting guests).
const POLL: Duration = Duration::from_secs(2);
/// How long to wait before retrying what a human has to fix.
const HUMAN_RETRY: Duration = Duration::from_secs(60);
/// How long a refused VM is left alone before looking again.
const REFUSED_RETRY: Duration = Duration::from_secs(300);
/// No new task for a machine this long after one failed (`status.retryAfter`).
const FAILED_TASK_PAUSE: Duration = Duration::from_secs(15);
/// A machine this old that has said nothing yet says that it waits for
/// its turn before its first call to PVE (see [`Run::first_word`]).
const SILENT_AT_MOST: Duration = Duration::from_secs(3);
/// The longest pause between tries while PVE answers a transient error.
const TRANSIENT_BACKOFF_CAP: Duration = Duration::from_secs(30);
/// How many VM IDs are probed for a free one per reconcile.
const VMID_PROBES: usize = 20;
const MIB: u64 = 1 << 20;

/// Reconcile errors. Waits are deliberate; the rest back off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Proxmox VE API: {0}")]
    Proxmox(#[from] ProxmoxError),
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

    /// PVE being unavailable or unreachable passes by itself; once it has,
    /// the machine should go on within half a minute, not after a backoff
    /// that doubled to minutes during the outage.
    fn backoff_cap(&self) -> Option<Duration> {
        match self {
            Error::Proxmox(pve) if pve.is_transient() => Some(TRANSIENT_BACKOFF_CAP),
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.backoff_cap(),
                _ => None,
            },
            _ => None,
        }
    }
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(error: kube::runtime::finalizer::Error<Error>) -> Self {
        Error::Finalizer(Box::new(error))
    }
}

/// Why a reconcile stops early: to report and come back later, or an error.
enum Halt {
    Wait(Wait),
    Error(Box<Error>),
}

/// A state the machine reports while it waits; `delay: None` waits for an
/// event.
struct Wait {
    reason: Cow<'static, str>,
    message: String,
    delay: Option<Duration>,
    /// A task was just started: the reconcile may wait for it a moment and
    /// go on (see [`apply`]).
    task_started: bool,
}

fn wait(
    reason: impl Into<Cow<'static, str>>,
    message: impl Into<String>,
    delay: Option<Duration>,
) -> Halt {
    Halt::Wait(Wait {
        reason: reason.into(),
        message: message.into(),
        delay,
        task_started: false,
    })
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

/// A PVE error as a halt: transient ones back off; the rest become a
/// condition naming what was refused and why (PVE's own text, which for a
/// permission names the path and the privilege).
fn refused(error: ProxmoxError, failed_reason: &'static str, what: impl std::fmt::Display) -> Halt {
    if error.is_transient() {
        return Halt::Error(Box::new(error.into()));
    }
    let shown = match &error {
        ProxmoxError::PermissionDenied { .. }
        | ProxmoxError::Unauthorized { .. }
        | ProxmoxError::Tls { .. } => error.reason(),
        _ => failed_reason,
    };
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
    wait(shown, format!("{what}: {error}{hint}"), Some(HUMAN_RETRY))
}

/// What one reconcile works on: the machine as the apiserver has it now,
/// and the status it is building.
struct Run<'a> {
    ctx: &'a MachineContext,
    api: Api<ProxmoxMachine>,
    machine: ProxmoxMachine,
    written: Option<ProxmoxMachineStatus>,
    status: ProxmoxMachineStatus,
    name: String,
    namespace: String,
    uid: String,
    /// Steps follow each other within this reconcile: a task's wait is
    /// short (see [`act::inline_task_wait`]).
    inline: bool,
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

/// What the gates found: everything a provisioning step needs.
struct Gates {
    cluster_name: String,
    proxmox_cluster: ProxmoxCluster,
    client: ProxmoxClient,
    owner_machine: crate::capi::Machine,
    cluster: Cluster,
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
        })))
    }

    fn pool(&self) -> Option<&str> {
        self.machine.spec.pool.as_deref().filter(|p| !p.is_empty())
    }

    fn is_provisioned(&self) -> bool {
        self.status
            .initialization
            .as_ref()
            .and_then(|i| i.provisioned)
            .unwrap_or(false)
    }

    fn previous_reason(&self) -> Option<String> {
        let conditions = self
            .written
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        conditions::get(conditions, READY_CONDITION).map(|c| c.reason.clone())
    }

    /// Writes the status built so far (with its conditions as they are).
    async fn persist(&mut self) -> Result<(), Error> {
        if let Some(updated) = reconciler::apply_status(
            &self.api,
            &self.machine,
            self.written.as_ref(),
            &self.status,
        )
        .await?
        {
            self.ctx.caches.saw_latest(&updated);
            self.machine.metadata.resource_version = updated.metadata.resource_version;
        }
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Writes the status built so far only if the machine is still as this
    /// reconcile read it: for what comes right before an irreversible step.
    /// A refusal (someone wrote meanwhile, or the copy was stale) has the
    /// machine read afresh and looked at again in a moment.
    async fn persist_at_version(&mut self) -> Result<(), Halt> {
        match reconciler::apply_status_at_version(&self.api, &self.machine, &self.status).await {
            Ok(updated) => {
                self.ctx.caches.saw_latest(&updated);
                self.machine.metadata.resource_version = updated.metadata.resource_version;
                self.written = Some(self.status.clone());
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.ctx.caches.distrust(&self.uid);
                Err(Halt::Error(Box::new(Error::Waiting(
                    "the machine changed since it was read; reading it again".into(),
                    Duration::from_millis(200),
                ))))
            }
            Err(error) => Err(error.into()),
        }
    }

    fn set_conditions(&mut self, desired: &[DesiredCondition]) {
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
        let provisioned = self.is_provisioned();
        let reason: &str = &wait.reason;
        if provisioned {
            // Provisioning happened once and stays recorded; Ready says
            // what is wrong now.
            self.set_conditions(&[DesiredCondition::false_(
                READY_CONDITION,
                reason,
                wait.message.clone(),
            )]);
        } else {
            self.set_conditions(&decide::waiting(reason, wait.message.clone()));
        }
        let previous = self.previous_reason();
        self.persist().await?;
        if previous.as_deref() != Some(reason) && decide::is_failure(reason) {
            self.ctx
                .base
                .event(
                    &self.machine,
                    EventType::Warning,
                    reason,
                    wait.message.clone(),
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
        let Error::Proxmox(pve) = error else { return };
        let shown = decide::backoff_reason(pve);
        if self.is_provisioned() || self.previous_reason().as_deref() == Some(shown) {
            return;
        }
        let wait = Wait {
            reason: shown.into(),
            message: format!("Proxmox VE API: {pve}; retrying with backoff"),
            delay: None,
            task_started: false,
        };
        if let Err(report) = self.report_wait(&wait).await {
            tracing::debug!(error = %report, "could not report the Proxmox backoff");
        }
    }

    /// Drops the reserved VM ID and node. A merge patch, not an apply: the
    /// reservation may have been written by another field manager (an
    /// older manager, a restore), whose fields an apply cannot remove.
    async fn forget_reservation(&mut self) -> Result<(), Error> {
        let patch = json!({
            "metadata": { "resourceVersion": self.machine.metadata.resource_version },
            "status": { "virtualMachineID": null, "proxmoxNode": null },
        });
        let updated = match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => updated,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.ctx.caches.distrust(&self.uid);
                return Err(Error::Waiting(
                    "the machine changed since it was read; reading it again".into(),
                    Duration::from_millis(200),
                ));
            }
            Err(error) => return Err(error.into()),
        };
        self.ctx.caches.saw_latest(&updated);
        self.machine.metadata.resource_version = updated.metadata.resource_version;
        self.ctx.caches.release_vmid(&self.uid);
        self.status.virtual_machine_id = None;
        self.status.proxmox_node = None;
        if let Some(written) = self.written.as_mut() {
            written.virtual_machine_id = None;
            written.proxmox_node = None;
        }
        Ok(())
    }

    async fn patch_spec(&mut self, patch: serde_json::Value) -> Result<(), Error> {
        self.machine = self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        self.ctx.caches.saw_latest(&self.machine);
        Ok(())
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
/// task ends within a moment ([`act::inline_task_wait`]) the next step goes
/// on in the same reconcile (while PVE answers fast: see [`INLINE_BUDGET`]),
/// and the status is written only where the machine waits — a task still
/// running (with its UPID, so a restart finds it), an address, the guest —
/// or is done. What a skipped write would have said lasted under two
/// seconds; a restart between two steps loses nothing, as every step is
/// judged from the VM's own state and the one irreversible step, the clone,
/// is recorded before it is asked for.
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
                    .delay
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
            Err(Error::Waiting(wait.message, wait.delay.unwrap_or(POLL)))
        }
        Err(Halt::Error(error)) => Err(*error),
    }
}

impl Run<'_> {
    /// Pause, as the contract asks: the `Paused` condition and nothing else.
    async fn paused(&mut self, cluster: Option<&Cluster>) -> Result<bool, Error> {
        let paused = pause::paused_by(cluster, &self.machine.metadata);
        if paused.is_some() {
            let mut list = self.status.conditions.take().unwrap_or_default();
            conditions::set(
                &mut list,
                &pause::paused_condition(paused),
                self.machine.metadata.generation,
                &Timestamp::now(),
            );
            self.status.conditions = Some(list);
            self.persist().await?;
        }
        Ok(paused.is_some())
    }

    /// The ProxmoxCluster of a Cluster (its infrastructure), or, without
    /// the Cluster, the one labelled with the cluster's name.
    async fn proxmox_cluster(
        &self,
        cluster: Option<&Cluster>,
        cluster_name: &str,
    ) -> Result<Option<ProxmoxCluster>, Error> {
        let api: Api<ProxmoxCluster> =
            Api::namespaced(self.ctx.base.client.clone(), &self.namespace);
        if let Some(reference) = cluster.and_then(|c| c.spec.infrastructure_ref.as_ref())
            && reference.kind == "ProxmoxCluster"
        {
            return Ok(self
                .ctx
                .caches
                .proxmox_cluster(&self.ctx.base.client, &self.namespace, &reference.name)
                .await?);
        }
        let labelled = api
            .list(&kube::api::ListParams::default().labels(&format!(
                "{}={cluster_name}",
                tenantry_api::contract::CLUSTER_NAME_LABEL
            )))
            .await?;
        Ok(labelled.items.into_iter().next())
    }

    async fn client(&self, proxmox_cluster: &ProxmoxCluster) -> Result<ProxmoxClient, Halt> {
        match self
            .ctx
            .clients
            .client_for(
                &self.ctx.base.client,
                proxmox_cluster,
                &act::reconcile_task_wait(),
            )
            .await
        {
            Ok(client) => Ok(client),
            Err(error) if error.is_transient() => {
                Err(Error::Waiting(error.to_string(), POLL).into())
            }
            Err(error) => Err(wait(
                error.reason(),
                format!(
                    "ProxmoxCluster {}: {error}",
                    proxmox_cluster.metadata.name.as_deref().unwrap_or_default()
                ),
                Some(HUMAN_RETRY),
            )),
        }
    }

    async fn gates(&mut self) -> Result<Option<Gates>, Halt> {
        let client = self.ctx.base.client.clone();
        let labelled_cluster = owner::cluster_name(&self.machine.metadata).map(str::to_string);
        let stores = &self.ctx.caches.capi;
        let mut cluster = match &labelled_cluster {
            Some(name) => stores.cluster(&client, &self.namespace, name).await?,
            None => None,
        };
        if self.paused(cluster.as_ref()).await? {
            return Ok(None);
        }
        let Some(owner_machine) = stores
            .owner_machine(&client, &self.machine.metadata)
            .await?
        else {
            return Err(wait(
                reason::WAITING_FOR_OWNER_MACHINE,
                "no Machine owns this ProxmoxMachine yet",
                None,
            ));
        };
        let cluster_name =
            labelled_cluster.unwrap_or_else(|| owner_machine.spec.cluster_name.clone());
        if cluster.is_none() {
            cluster = stores
                .cluster(&client, &self.namespace, &cluster_name)
                .await?;
            if self.paused(cluster.as_ref()).await? {
                return Ok(None);
            }
        }
        let Some(cluster) = cluster else {
            return Err(wait(
                reason::WAITING_FOR_CLUSTER,
                format!("Cluster {cluster_name} does not exist"),
                Some(RESYNC),
            ));
        };
        if !owner::infrastructure_provisioned(&cluster) {
            return Err(wait(
                reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                format!("Cluster {cluster_name} infrastructure is not provisioned yet"),
                Some(RESYNC),
            ));
        }
        let Some(proxmox_cluster) = self.proxmox_cluster(Some(&cluster), &cluster_name).await?
        else {
            return Err(wait(
                reason::PROXMOX_CLUSTER_NOT_FOUND,
                format!("Cluster {cluster_name} has no ProxmoxCluster"),
                Some(HUMAN_RETRY),
            ));
        };
        // No clone before the bootstrap provider named the data; the Secret
        // itself is read only to build the seed (CAPI sets the name once the
        // Secret exists, and the seed step reports a missing one).
        if owner_machine.spec.bootstrap.data_secret_name.is_none() {
            self.bootstrap_data(&owner_machine, &cluster, &cluster_name)
                .await?;
        }
        let client = self.client(&proxmox_cluster).await?;
        Ok(Some(Gates {
            cluster_name,
            proxmox_cluster,
            client,
            owner_machine,
            cluster,
        }))
    }

    /// The owner Machine's bootstrap data, or a wait saying what it lacks.
    async fn bootstrap_data(
        &self,
        owner_machine: &crate::capi::Machine,
        cluster: &Cluster,
        cluster_name: &str,
    ) -> Result<BootstrapData, Halt> {
        match bootstrap::read(&self.ctx.base.client, owner_machine).await? {
            BootstrapState::Ready(data) => Ok(data),
            BootstrapState::NotReady => {
                let control_plane = [&self.machine.metadata, &owner_machine.metadata]
                    .iter()
                    .any(|m| {
                        m.labels
                            .as_ref()
                            .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
                    });
                Err(
                    if !control_plane && !owner::control_plane_initialized(cluster) {
                        wait(
                            reason::WAITING_FOR_CONTROL_PLANE,
                            format!(
                                "workers wait for Cluster {cluster_name}'s control plane to be initialized"
                            ),
                            Some(RESYNC),
                        )
                    } else {
                        wait(
                            reason::WAITING_FOR_BOOTSTRAP_DATA,
                            format!(
                                "Machine {} has no bootstrap data yet (spec.bootstrap.dataSecretName)",
                                owner_machine.metadata.name.as_deref().unwrap_or_default()
                            ),
                            Some(RESYNC),
                        )
                    },
                )
            }
            BootstrapState::SecretMissing(secret) | BootstrapState::KeyMissing(secret) => {
                Err(wait(
                    reason::BOOTSTRAP_DATA_SECRET_MISSING,
                    format!(
                        "bootstrap data Secret {}/{secret} is missing or has no 'value' key",
                        self.namespace
                    ),
                    Some(Duration::from_secs(30)),
                ))
            }
        }
    }

    async fn provision(&mut self) -> Result<Action, Halt> {
        let Some(gates) = self.gates().await? else {
            return Ok(Action::await_change());
        };
        if let Some(next_look) = self.checked_a_moment_ago() {
            return Ok(Action::requeue(next_look));
        }
        let client = &gates.client;
        let pxc_name = gates
            .proxmox_cluster
            .metadata
            .name
            .clone()
            .unwrap_or_default();
        let plans = decide::address_claims(
            &self.name,
            &self.machine.spec,
            &pxc_name,
            &gates.proxmox_cluster.spec,
        );
        let addresses = act::ensure_addresses(
            &self.ctx.base.client,
            &self.ctx.caches,
            &self.machine,
            &gates.cluster_name,
            &plans,
        )
        .await?;
        self.first_word()?;

        self.settle_task(client).await?;
        let (vm, pool_storages) = self.resolve_vm(client, &gates).await?;
        self.record_vm(&vm).await?;
        if let Some(lock) = &vm.status.lock {
            return Err(wait(
                reason::VM_LOCKED,
                format!(
                    "VM {} is locked ({lock}) by a running Proxmox operation",
                    vm.vmid
                ),
                Some(POLL),
            ));
        }

        let newly_provisioned = !self.is_provisioned();
        if newly_provisioned {
            if !vm.status.is_running() {
                self.configure(client, &vm).await?;
                let allocated = match &addresses {
                    Addresses::Allocated(allocated) => allocated.clone(),
                    Addresses::Pending(message) => {
                        return Err(wait(
                            reason::WAITING_FOR_STATIC_IP,
                            message.clone(),
                            Some(Duration::from_secs(30)),
                        ));
                    }
                    Addresses::Failed(message) => {
                        return Err(wait(
                            reason::IP_ALLOCATION_FAILED,
                            message.clone(),
                            Some(Duration::from_secs(30)),
                        ));
                    }
                };
                self.attach_seed(client, &gates, &vm, &allocated, &plans, &pool_storages)
                    .await?;
                self.start(client, &vm).await?;
            }
            let Addresses::Allocated(allocated) = &addresses else {
                return Err(wait(
                    reason::WAITING_FOR_STATIC_IP,
                    "the VM runs but its addresses are not allocated",
                    Some(POLL),
                ));
            };
            self.check_guest(client, &vm, allocated).await?;
            self.status.initialization = Some(MachineInitialization {
                provisioned: Some(true),
            });
            self.status.ready = true;
            self.status.addresses = Some(decide::machine_addresses(&self.name, allocated));
            self.status.ip_addresses = Some(ip_addresses_status(allocated));
            self.set_conditions(&[
                DesiredCondition::true_(VM_PROVISIONED, reason::PROVISIONED),
                DesiredCondition::true_(READY_CONDITION, reason::PROVISIONED),
            ]);
        }

        // Provisioned: the seed has been read; it holds the machine's keys,
        // so it goes.
        let seed_removed = if self.status.vm_status.as_deref() != Some("ready") {
            let removed = self.remove_seed(client, &vm).await;
            if removed.is_ok() {
                self.status.vm_status = Some("ready".into());
            }
            removed
        } else {
            Ok(())
        };
        if newly_provisioned {
            // One write says both, when the seed went at once; provisioned
            // is recorded even when it did not.
            self.persist().await?;
            tracing::info!(machine = %self.name, namespace = %self.namespace, vmid = vm.vmid, node = %vm.node, "ProxmoxMachine provisioned");
            self.ctx
                .base
                .event(
                    &self.machine,
                    EventType::Normal,
                    reason::PROVISIONED,
                    format!("VM {} on {} is provisioned", vm.vmid, vm.node),
                )
                .await;
        }
        seed_removed?;
        if !vm.status.is_running() || vm.status.is_paused() {
            let state = if vm.status.is_paused() {
                "paused"
            } else {
                "stopped"
            };
            return Err(wait(
                reason::VM_NOT_RUNNING,
                format!("VM {} on {} is {state}", vm.vmid, vm.node),
                Some(Duration::from_secs(30)),
            ));
        }
        if let Addresses::Allocated(allocated) = &addresses {
            self.status.addresses = Some(decide::machine_addresses(&self.name, allocated));
        }
        self.status.ready = true;
        self.set_conditions(&[
            DesiredCondition::true_(VM_PROVISIONED, reason::PROVISIONED),
            DesiredCondition::true_(READY_CONDITION, reason::PROVISIONED),
        ]);
        self.persist().await?;
        self.ctx
            .caches
            .checked_vm(&self.uid, self.machine.metadata.generation);
        Ok(Action::requeue(RESYNC))
    }

    /// When the machine is provisioned and ready, its spec unchanged, and
    /// its VM was looked at less than [`VM_CHECK_HOLDS`] ago: how long until
    /// the next regular look. Cluster API updates a Machine several times
    /// while it deletes it (and its owner's changes wake the machine each
    /// time); the VM's state a few seconds old is as good an answer, and
    /// asking Proxmox VE again each time cost three calls per wake-up. A
    /// pause, or the machine's deletion, is still acted on at once.
    fn checked_a_moment_ago(&self) -> Option<Duration> {
        if !self.is_provisioned()
            || !self.status.ready
            || self.status.vm_status.as_deref() != Some("ready")
            || self.previous_reason().as_deref() != Some(reason::PROVISIONED)
        {
            return None;
        }
        let since = self
            .ctx
            .caches
            .vm_checked_since(&self.uid, self.machine.metadata.generation)?;
        (since < VM_CHECK_HOLDS).then(|| RESYNC.saturating_sub(since))
    }

    /// A machine that has waited for its first reconcile (a wave longer than
    /// the workers, each reconcile slowed by PVE) says so before it asks PVE
    /// anything, and goes to the back of the queue: every machine of a wave
    /// gets a `Ready` within moments, instead of the last ones staying
    /// silent while those ahead of them work through a slow hypervisor. It
    /// costs one write, only to a machine that was not reached within
    /// [`SILENT_AT_MOST`]; its address claims are already made, so the
    /// IPAM provider works meanwhile.
    fn first_word(&self) -> Result<(), Halt> {
        if self.inline || self.previous_reason().is_some() || self.is_provisioned() {
            return Ok(());
        }
        let Some(created) = &self.machine.metadata.creation_timestamp else {
            return Ok(());
        };
        let age = Timestamp::now().duration_since(created.0);
        if age < SignedDuration::try_from(SILENT_AT_MOST).unwrap_or_default() {
            return Ok(());
        }
        let busy = match self.ctx.base.config.reconcile_bound() {
            0 => "the manager is busy with other machines".to_string(),
            workers => format!(
                "the manager works on {workers} machines at a time (--max-concurrent-reconciles)"
            ),
        };
        Err(wait(
            reason::WAITING_FOR_TURN,
            format!("ready to provision, waiting for its turn: {busy}"),
            Some(Duration::ZERO),
        ))
    }

    /// Waits a little for the task recorded in status and records how it
    /// ended. A failed task pauses new ones for a while (`retryAfter`).
    async fn settle_task(&mut self, client: &ProxmoxClient) -> Result<(), Halt> {
        let Some(text) = self.status.task_ref.clone() else {
            return Ok(());
        };
        let Ok(upid) = text.parse::<Upid>() else {
            self.status.task_ref = None;
            return Ok(());
        };
        let (running_reason, failed_reason) = decide::task_reason(upid.task_type());
        let patience = if self.inline {
            // Just started: no task ends at once, so the first look waits.
            let patience = act::inline_task_wait();
            tokio::time::sleep(patience.initial_interval).await;
            patience
        } else {
            act::reconcile_task_wait()
        };
        let poll = act::poll_task(client, &upid, &patience)
            .await
            .map_err(|e| refused(e, failed_reason, format!("task {upid}")))?;
        match poll {
            TaskPoll::Running => Err(wait(
                running_reason,
                format!("Proxmox task {} ({}) is running", upid, upid.task_type()),
                Some(POLL),
            )),
            // Not written now: the next step's write says it (a crash before
            // then only means polling the ended task once more).
            TaskPoll::Done(_) | TaskPoll::Unknown => {
                tracing::debug!(machine = %self.name, upid = %upid, "task ended");
                self.status.task_ref = None;
                Ok(())
            }
            // PVE refuses to start a running VM; the VM runs, which is all
            // that was asked.
            TaskPoll::Failed { exit_status, .. }
                if upid.task_type() == "qmstart" && exit_status.contains("already running") =>
            {
                self.status.task_ref = None;
                Ok(())
            }
            TaskPoll::Failed {
                exit_status,
                log_tail,
            } => {
                self.status.task_ref = None;
                self.status.retry_after = Some(Time(
                    Timestamp::now()
                        + SignedDuration::try_from(FAILED_TASK_PAUSE).unwrap_or_default(),
                ));
                tracing::warn!(machine = %self.name, upid = %upid, exit_status = %exit_status, "Proxmox task failed");
                let log = log_tail
                    .last()
                    .map(|l| format!(" (log: {l})"))
                    .unwrap_or_default();
                Err(wait(
                    failed_reason,
                    format!(
                        "Proxmox task {} ({}) failed: {exit_status}{log}; retrying",
                        upid,
                        upid.task_type()
                    ),
                    Some(FAILED_TASK_PAUSE),
                ))
            }
        }
    }

    /// Refuses to start a new task before `retryAfter`.
    fn may_start_task(&self) -> Result<(), Halt> {
        if let Some(Time(after)) = &self.status.retry_after
            && *after > Timestamp::now()
        {
            let delay = after.duration_since(Timestamp::now()).unsigned_abs();
            // Keep saying what failed until the retry.
            let (last_reason, last_message) = self
                .status
                .conditions
                .as_deref()
                .and_then(|c| conditions::get(c, READY_CONDITION))
                .map(|c| (c.reason.clone(), c.message.clone()))
                .unwrap_or_else(|| {
                    (
                        reason::TASK_FAILED.to_string(),
                        "a Proxmox task failed".to_string(),
                    )
                });
            return Err(wait(last_reason, last_message, Some(delay)));
        }
        Ok(())
    }

    /// Records a task just started; the next reconcile waits for it.
    fn started(&mut self, upid: Upid, running_reason: &'static str, message: String) -> Halt {
        tracing::info!(machine = %self.name, upid = %upid, task = upid.task_type(), "started Proxmox task");
        self.status.task_ref = Some(upid.to_string());
        self.status.retry_after = None;
        Halt::Wait(Wait {
            reason: running_reason.into(),
            message,
            delay: Some(Duration::from_millis(500)),
            task_started: true,
        })
    }

    /// Finds the machine's VM, or clones it. Returns only a VM that is in
    /// the machine's pool and the machine's own; anything else halts.
    async fn resolve_vm(
        &mut self,
        client: &ProxmoxClient,
        gates: &Gates,
    ) -> Result<(VmFacts, Vec<String>), Halt> {
        let pool = self.pool().map(str::to_string);
        let (vmid, source) = match (
            self.status.virtual_machine_id,
            self.machine.spec.virtual_machine_id,
        ) {
            // Once the clone is confirmed the ID is in the spec: a VM gone
            // then is gone, not a clone to make again.
            (_, Some(named)) => (named, VmidSource::Spec),
            (Some(reserved), None) => (reserved, VmidSource::Reserved),
            (None, None) => {
                // Nothing recorded: the status may have been lost (moved
                // objects lose it); a VM of this machine may exist.
                match act::find_own_vm(client, pool.as_deref(), &self.namespace, &self.name).await {
                    Ok(Some(vmid)) => {
                        tracing::info!(machine = %self.name, vmid, "found the machine's VM by name and description");
                        self.status.virtual_machine_id = Some(i64::from(vmid));
                        self.persist().await?;
                        (i64::from(vmid), VmidSource::Reserved)
                    }
                    Ok(None) => return Err(self.clone_vm(client, gates, None).await),
                    Err(error) => {
                        return Err(refused(
                            error,
                            reason::CLONING_FAILED,
                            format!("reading pool {}", pool.as_deref().unwrap_or("-")),
                        ));
                    }
                }
            }
        };
        let Ok(vmid) = u32::try_from(vmid) else {
            return Err(wait(
                reason::INVALID_SPEC,
                format!("{vmid} is not a Proxmox VM ID"),
                None,
            ));
        };
        let (presence, facts, storages) =
            act::lookup_vm_cached(client, &self.ctx.caches, vmid, pool.as_deref())
                .await
                .map_err(|e| {
                    refused(
                        e,
                        reason::CLONING_FAILED,
                        format!(
                            "looking up VM {vmid} in pool {}",
                            pool.as_deref().unwrap_or("-")
                        ),
                    )
                })?;
        let own_clone_running =
            if presence == VmPresence::Elsewhere && source == VmidSource::Reserved {
                let nodes = match self.machine.spec.source_node.clone() {
                    Some(node) => vec![node],
                    None => client
                        .nodes()
                        .await
                        .map_err(Error::from)?
                        .into_iter()
                        .map(|n| n.node)
                        .collect(),
                };
                act::own_clone_running(client, &nodes)
                    .await
                    .map_err(Error::from)?
            } else {
                false
            };
        match decide::judge_vm(
            &self.namespace,
            &self.name,
            pool.as_deref(),
            vmid,
            source,
            &presence,
            own_clone_running,
        ) {
            VmVerdict::Ours => Ok((facts.expect("a VM in the pool was read"), storages)),
            VmVerdict::Clone => Err(self.clone_vm(client, gates, Some(vmid)).await),
            VmVerdict::WaitForClone => Err(wait(
                reason::CLONING,
                format!(
                    "the clone to VM {vmid} is still running (Proxmox adds it to {} when done)",
                    pool.as_deref()
                        .map_or("its pool".to_string(), |p| format!("pool {p}"))
                ),
                Some(POLL),
            )),
            VmVerdict::Repick { message } => {
                tracing::info!(machine = %self.name, vmid, %message, "reserved VM ID lost; reserving another");
                self.forget_reservation().await?;
                Err(wait(
                    reason::CLONING,
                    format!("{message}; reserving another VM ID"),
                    Some(Duration::from_millis(200)),
                ))
            }
            VmVerdict::Refuse { reason, message } => {
                Err(wait(reason, message, Some(REFUSED_RETRY)))
            }
            VmVerdict::Missing { message } => {
                Err(wait(reason::VM_NOT_FOUND, message, Some(HUMAN_RETRY)))
            }
        }
    }

    /// Reserves a VM ID (unless one is), records it with the target node,
    /// then asks for the clone and records its task. Always halts: the next
    /// reconcile goes on from what was recorded.
    async fn clone_vm(
        &mut self,
        client: &ProxmoxClient,
        gates: &Gates,
        reserved: Option<u32>,
    ) -> Halt {
        match self.try_clone_vm(client, gates, reserved).await {
            Ok(never) => match never {},
            Err(halt) => halt,
        }
    }

    async fn try_clone_vm(
        &mut self,
        client: &ProxmoxClient,
        gates: &Gates,
        reserved: Option<u32>,
    ) -> Result<std::convert::Infallible, Halt> {
        self.may_start_task()?;
        let machine = self.machine.clone();
        let spec = &machine.spec;
        let Some(source) = spec.clone_source() else {
            return Err(wait(
                reason::INVALID_SPEC,
                "spec needs a clone source: templateSelector, or templateID with sourceNode",
                None,
            ));
        };
        let resources =
            client.cluster().resources(None).await.map_err(|e| {
                refused(e, reason::CLONING_FAILED, "reading the cluster's resources")
            })?;
        let template = decide::choose_template(source, &resources, None)
            .map_err(|m| wait(reason::TEMPLATE_NOT_FOUND, m, Some(HUMAN_RETRY)))?;
        let nodes = decide::node_capacities(&resources).map_err(|unknown| {
            wait(
                reason::NODE_CAPACITY_UNKNOWN,
                format!(
                    "the credentials cannot read the capacity of node(s) {}: grant Sys.Audit on /nodes/<node> (or /nodes) to the token and its user",
                    unknown.join(", ")
                ),
                Some(HUMAN_RETRY),
            )
        })?;
        let cluster_name = gates.cluster_name.as_str();
        let siblings = self.ctx.machines.state();
        let mut placements = std::collections::BTreeMap::new();
        for sibling in siblings.iter().filter(|m| {
            m.metadata.namespace.as_deref() == Some(self.namespace.as_str())
                && owner::cluster_name(&m.metadata) == Some(cluster_name)
                && m.metadata.uid.as_deref() != Some(self.uid.as_str())
        }) {
            if let Some(node) = sibling.status.as_ref().and_then(|s| s.proxmox_node.clone()) {
                *placements.entry(node).or_insert(0u32) += 1;
            }
        }
        let memory = spec
            .memory_mib
            .map(|m| m as u64 * MIB)
            .or(template.memory)
            .unwrap_or(0);
        let vcpus = match (spec.num_sockets, spec.num_cores) {
            (None, None) => template.vcpus.unwrap_or(1),
            (sockets, cores) => (sockets.unwrap_or(1) * cores.unwrap_or(1)).max(1) as u32,
        };
        let hints = SchedulerHints {
            memory_adjustment: gates
                .proxmox_cluster
                .spec
                .scheduler_hints
                .as_ref()
                .and_then(|h| h.memory_adjustment)
                .map_or(100, |a| u32::try_from(a).unwrap_or(u32::MAX)),
            ..SchedulerHints::default()
        };
        let request = PlacementRequest {
            memory,
            vcpus,
            machine_allowed_nodes: spec.allowed_nodes.clone().unwrap_or_default(),
            cluster_allowed_nodes: gates
                .proxmox_cluster
                .spec
                .allowed_nodes
                .clone()
                .unwrap_or_default(),
            hints,
            placements,
        };
        let node = match scheduler::choose_node(&nodes, &request) {
            Ok(choice) => choice.node,
            Err(none) => {
                let delay = if none.is_transient() {
                    Duration::from_secs(30)
                } else {
                    HUMAN_RETRY
                };
                return Err(wait(none.reason(), none.to_string(), Some(delay)));
            }
        };
        // With tags, prefer the template copy on the chosen node.
        let template = decide::choose_template(source, &resources, Some(&node))
            .map_err(|m| wait(reason::TEMPLATE_NOT_FOUND, m, Some(HUMAN_RETRY)))?;

        let pool = self.pool().map(str::to_string);
        if let (Some(pool), Some(storage)) =
            (&pool, spec.storage.as_deref().filter(|_| spec.full_clone()))
        {
            let members =
                client.pools().get(pool).await.map_err(|e| {
                    refused(e, reason::CLONING_FAILED, format!("reading pool {pool}"))
                })?;
            let storages: Vec<&str> = members
                .members
                .iter()
                .filter_map(|m| m.storage.as_deref())
                .collect();
            if !storages.is_empty() && !storages.contains(&storage) {
                return Err(wait(
                    reason::STORAGE_OUTSIDE_POOL,
                    format!(
                        "storage {storage} (spec.storage) is not in pool {pool}, which holds storages {}: tenantry puts disks only on the pool's storages",
                        storages.join(", ")
                    ),
                    Some(REFUSED_RETRY),
                ));
            }
        }

        let vmid = match reserved {
            Some(vmid) => vmid,
            None => {
                let range = spec.vm_id_range.as_ref().map(|r| (r.start, r.end));
                let taken: BTreeSet<u32> = siblings
                    .iter()
                    .filter(|m| m.metadata.uid.as_deref() != Some(self.uid.as_str()))
                    .flat_map(|m| {
                        [
                            m.status.as_ref().and_then(|s| s.virtual_machine_id),
                            m.spec.virtual_machine_id,
                        ]
                    })
                    .flatten()
                    .filter_map(|id| u32::try_from(id).ok())
                    .collect();
                let next = match range {
                    Some(_) => None,
                    None => Some(client.cluster().next_id().await.map_err(Error::from)?),
                };
                // Reserved in this manager before PVE is asked: its `nextid`
                // names the same ID to concurrent callers until a clone
                // claims it.
                let search = VmidSearch::new(range, next);
                let mut used = BTreeSet::new();
                let mut picked = None;
                for _ in 0..VMID_PROBES {
                    let Some(candidate) = self.ctx.caches.reserve_vmid(&self.uid, |others| {
                        let mut skip = taken.clone();
                        skip.extend(others);
                        skip.extend(&used);
                        search.candidates(&skip, 1).first().copied()
                    }) else {
                        break;
                    };
                    if Some(candidate) == next
                        || client
                            .cluster()
                            .is_vmid_free(candidate)
                            .await
                            .map_err(Error::from)?
                    {
                        picked = Some(candidate);
                        break;
                    }
                    used.insert(candidate);
                }
                match picked {
                    Some(vmid) => vmid,
                    None => {
                        return Err(wait(
                            reason::VMID_RANGE_EXHAUSTED,
                            match range {
                                Some((start, end)) => {
                                    format!("no free VM ID in spec.vmIDRange {start}-{end}")
                                }
                                None => "no free VM ID found".to_string(),
                            },
                            Some(HUMAN_RETRY),
                        ));
                    }
                }
            }
        };
        // Recorded before asking: from here on, a restart finds this clone
        // (or knows it never happened) instead of starting another.
        self.status.virtual_machine_id = Some(i64::from(vmid));
        self.status.proxmox_node = Some(node.clone());
        self.status.vm_status = Some("pending".into());
        self.set_conditions(&decide::waiting(
            reason::CLONING,
            format!(
                "cloning template {} on {} to VM {vmid} on {node}",
                template.vmid, template.node
            ),
        ));
        self.persist_at_version().await?;

        let mut params = CloneParams::new(vmid)
            .name(self.name.clone())
            .description(decide::vm_description(
                spec.description.as_deref(),
                &self.namespace,
                &self.name,
                &self.uid,
            ))
            .full(spec.full_clone());
        if let Some(pool) = &pool {
            params = params.pool(pool.clone());
        }
        if spec.full_clone() {
            if let Some(storage) = &spec.storage {
                params = params.storage(storage.clone());
            }
            if let Some(format) = spec.format {
                params = params.format(match format {
                    tenantry_api::proxmox::TargetFileStorageFormat::Raw => DiskFormat::Raw,
                    tenantry_api::proxmox::TargetFileStorageFormat::Qcow2 => DiskFormat::Qcow2,
                    tenantry_api::proxmox::TargetFileStorageFormat::Vmdk => DiskFormat::Vmdk,
                });
            }
        }
        if node != template.node {
            params = params.target(node.clone());
        }
        if let Some(snapshot) = &spec.snap_name {
            params = params.snapname(snapshot.clone());
        }
        let what = format!(
            "cloning template {} on {} to VM {vmid} on {node}{}",
            template.vmid,
            template.node,
            pool.as_deref()
                .map(|p| format!(" in pool {p}"))
                .unwrap_or_default()
        );
        match client
            .qemu(&template.node, template.vmid)
            .clone_to(&params)
            .await
        {
            Ok(upid) => {
                self.ctx
                    .base
                    .event(&self.machine, EventType::Normal, "Cloning", what.clone())
                    .await;
                Err(self.started(upid, reason::CLONING, what))
            }
            // Taken meanwhile: by this machine's own earlier request that
            // went through unnoticed, or by another. The next reconcile
            // looks at whose it is.
            Err(ProxmoxError::AlreadyExists { message }) => {
                tracing::info!(machine = %self.name, vmid, %message, "VM ID taken while cloning");
                Err(wait(
                    reason::CLONING,
                    format!("VM ID {vmid} was taken meanwhile ({message}); checking whose"),
                    Some(Duration::from_millis(500)),
                ))
            }
            Err(error) => Err(refused(error, reason::CLONING_FAILED, what)),
        }
    }

    /// Records the VM's ID, node and providerID on the machine.
    async fn record_vm(&mut self, vm: &VmFacts) -> Result<(), Halt> {
        let provider = vm
            .config
            .smbios_uuid()
            .and_then(|uuid| provider_id(uuid).ok());
        let mut spec_patch = serde_json::Map::new();
        if self.machine.spec.virtual_machine_id != Some(i64::from(vm.vmid)) {
            spec_patch.insert("virtualMachineID".into(), json!(vm.vmid));
        }
        if let Some(provider) = &provider
            && self.machine.spec.provider_id.as_deref() != Some(provider.as_str())
        {
            spec_patch.insert("providerID".into(), json!(provider));
        }
        if !spec_patch.is_empty() {
            self.patch_spec(json!({ "spec": spec_patch })).await?;
        }
        self.status.virtual_machine_id = Some(i64::from(vm.vmid));
        self.status.proxmox_node = Some(vm.node.clone());
        if self.status.vm_status.is_none() {
            self.status.vm_status = Some("pending".into());
        }
        Ok(())
    }

    /// Sizes the stopped clone: CPU, memory, network (MACs kept), tags, then
    /// the boot disk.
    async fn configure(&mut self, client: &ProxmoxClient, vm: &VmFacts) -> Result<(), Halt> {
        let update = decide::config_update(&self.machine.spec, &vm.config)
            .map_err(|m| wait(reason::INVALID_SPEC, m, None))?;
        if !update.is_empty() {
            self.may_start_task()?;
            let what = format!("configuring VM {} on {}", vm.vmid, vm.node);
            let upid = client
                .qemu(&vm.node, vm.vmid)
                .update_config(&update)
                .await
                .map_err(|e| refused(e, reason::CONFIGURATION_FAILED, &what))?;
            return Err(self.started(upid, reason::CONFIGURING, what));
        }
        if let Some((disk, gib)) = decide::boot_disk_growth(&self.machine.spec, &vm.config)
            .map_err(|m| wait(reason::INVALID_SPEC, m, None))?
        {
            self.may_start_task()?;
            let what = format!("growing disk {disk} of VM {} to {gib} GiB", vm.vmid);
            let resized = client
                .qemu(&vm.node, vm.vmid)
                .resize(&disk, &DiskSize::Gib(gib))
                .await
                .map_err(|e| refused(e, reason::DISK_RESIZE_FAILED, &what))?;
            return match resized {
                Some(upid) => Err(self.started(upid, reason::RESIZING_DISK, what)),
                None => Err(wait(
                    reason::RESIZING_DISK,
                    what,
                    Some(Duration::from_millis(200)),
                )),
            };
        }
        Ok(())
    }

    /// Builds the NoCloud seed, uploads it to the ISO storage and attaches
    /// it as a CD-ROM.
    async fn attach_seed(
        &mut self,
        client: &ProxmoxClient,
        gates: &Gates,
        vm: &VmFacts,
        addresses: &[DeviceAddress],
        plans: &[decide::ClaimPlan],
        pool_storages: &[String],
    ) -> Result<(), Halt> {
        let file = nocloud::iso_file_name(&self.uid)
            .map_err(|e| wait(reason::BOOTSTRAP_DATA_FAILED, e.to_string(), None))?;
        let explicit = self.machine.spec.iso_storage.clone();
        let storage = match &explicit {
            Some(storage) => storage.clone(),
            None => {
                let storages = client
                    .node(&vm.node)
                    .storage_list(Some("iso"))
                    .await
                    .map_err(|e| {
                        refused(
                            e,
                            reason::BOOTSTRAP_DATA_FAILED,
                            format!("listing the ISO storages of {}", vm.node),
                        )
                    })?;
                decide::iso_storage(None, &storages)
                    .map_err(|m| wait(reason::BOOTSTRAP_DATA_FAILED, m, Some(HUMAN_RETRY)))?
            }
        };
        if let Some(pool) = self.pool()
            && !pool_storages.is_empty()
            && !pool_storages.contains(&storage)
        {
            return Err(wait(
                reason::STORAGE_OUTSIDE_POOL,
                format!(
                    "ISO storage {storage} is not in pool {pool}, which holds storages {}: tenantry puts the seed only on the pool's storages (set spec.isoStorage)",
                    pool_storages.join(", ")
                ),
                Some(REFUSED_RETRY),
            ));
        }
        let volid = format!("{storage}:iso/{file}");
        let slot = match decide::seed_drive(&vm.config, &volid) {
            // Recorded with the next write (a restart finds it attached
            // again).
            SeedDrive::Attached(_) => {
                self.status.bootstrap_data_provided = Some(true);
                return Ok(());
            }
            SeedDrive::Attach(slot) => slot,
            SeedDrive::NoFreeSlot => {
                return Err(wait(
                    reason::BOOTSTRAP_DATA_FAILED,
                    format!(
                        "VM {} has no free IDE or SATA slot for the seed CD-ROM",
                        vm.vmid
                    ),
                    None,
                ));
            }
        };
        self.may_start_task()?;
        let uploaded = act::volume_exists(client, &vm.node, &storage, &volid)
            .await
            .map_err(|e| {
                refused(
                    e,
                    reason::BOOTSTRAP_DATA_FAILED,
                    format!("reading storage {storage} on {}", vm.node),
                )
            })?;
        if !uploaded {
            // The seed fixes the addresses the guest takes: none of them may
            // be another machine's.
            let conflicts = act::address_conflicts(
                &self.ctx.base.client,
                &self.ctx.caches,
                &self.machine,
                plans,
            )
            .await?;
            if !conflicts.is_empty() {
                for conflict in &conflicts {
                    act::release_claim(&self.ctx.base.client, &self.namespace, &conflict.claim)
                        .await?;
                }
                let message = conflicts
                    .iter()
                    .map(|c| c.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ");
                self.ctx
                    .base
                    .event(
                        &self.machine,
                        EventType::Warning,
                        reason::IP_ADDRESS_CONFLICT,
                        format!("{message}; released the claim to get another address"),
                    )
                    .await;
                return Err(wait(
                    reason::IP_ADDRESS_CONFLICT,
                    format!("{message}; waiting for another address"),
                    Some(Duration::from_secs(10)),
                ));
            }
            let network = decide::seed_network(
                &self.machine.spec,
                &gates.proxmox_cluster.spec,
                &vm.config,
                addresses,
            )
            .map_err(|m| wait(reason::BOOTSTRAP_DATA_FAILED, m, Some(HUMAN_RETRY)))?;
            let Some(uuid) = vm.config.smbios_uuid() else {
                return Err(wait(
                    reason::BOOTSTRAP_DATA_FAILED,
                    format!("VM {} has no SMBIOS uuid (smbios1)", vm.vmid),
                    Some(HUMAN_RETRY),
                ));
            };
            let data = self
                .bootstrap_data(&gates.owner_machine, &gates.cluster, &gates.cluster_name)
                .await?;
            let inject = self
                .machine
                .spec
                .metadata_settings
                .as_ref()
                .is_some_and(|m| m.provider_id_injection);
            let seed = NoCloudSeed {
                instance_id: uuid.to_string(),
                hostname: self.name.clone(),
                provider_id: inject.then(|| provider_id(uuid).ok()).flatten(),
                network,
                user_data: UserData::new(data.as_bytes().to_vec()),
            };
            let rendered = seed.render().map_err(|e| {
                wait(
                    reason::BOOTSTRAP_DATA_FAILED,
                    e.to_string(),
                    Some(HUMAN_RETRY),
                )
            })?;
            let what = format!("uploading the NoCloud seed {volid}");
            let upid = client
                .storage(&vm.node, &storage)
                .upload_iso(&file, rendered.image.into_bytes())
                .await
                .map_err(|e| refused(e, reason::BOOTSTRAP_DATA_FAILED, &what))?;
            return Err(self.started(upid, reason::UPLOADING_BOOTSTRAP_DATA, what));
        }
        let what = format!(
            "attaching the NoCloud seed {volid} to VM {} as {slot}",
            vm.vmid
        );
        let update = VmConfigUpdate::new().set(slot, decide::cdrom_value(Some(&volid)));
        let upid = client
            .qemu(&vm.node, vm.vmid)
            .update_config(&update)
            .await
            .map_err(|e| refused(e, reason::BOOTSTRAP_DATA_FAILED, &what))?;
        Err(self.started(upid, reason::UPLOADING_BOOTSTRAP_DATA, what))
    }

    async fn start(&mut self, client: &ProxmoxClient, vm: &VmFacts) -> Result<(), Halt> {
        self.may_start_task()?;
        let what = format!("starting VM {} on {}", vm.vmid, vm.node);
        let upid = client
            .qemu(&vm.node, vm.vmid)
            .start()
            .await
            .map_err(|e| refused(e, reason::POWERING_ON_FAILED, &what))?;
        Err(self.started(upid, reason::POWERING_ON, what))
    }

    /// Provisioned when the guest agent reports every static address (or at
    /// once, with `checks.skipQemuGuestAgent`).
    async fn check_guest(
        &mut self,
        client: &ProxmoxClient,
        vm: &VmFacts,
        addresses: &[DeviceAddress],
    ) -> Result<(), Halt> {
        let skip = self
            .machine
            .spec
            .checks
            .as_ref()
            .and_then(|c| c.skip_qemu_guest_agent)
            .unwrap_or(false);
        if skip {
            return Ok(());
        }
        let expected: Vec<IpAddr> = addresses.iter().map(|a| a.address).collect();
        match client
            .qemu(&vm.node, vm.vmid)
            .agent()
            .network_interfaces()
            .await
        {
            Ok(interfaces) if decide::guest_reports_all(&expected, &interfaces) => Ok(()),
            Ok(_) => Err(wait(
                reason::WAITING_FOR_GUEST_ADDRESSES,
                format!(
                    "the guest agent of VM {} does not report {} yet",
                    vm.vmid,
                    expected
                        .iter()
                        .map(IpAddr::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(POLL),
            )),
            Err(ProxmoxError::GuestAgentNotRunning { .. } | ProxmoxError::VmNotRunning { .. }) => {
                Err(wait(
                    reason::WAITING_FOR_GUEST_AGENT,
                    format!(
                        "VM {} is booting: its guest agent does not answer yet",
                        vm.vmid
                    ),
                    Some(POLL),
                ))
            }
            Err(ProxmoxError::GuestAgentNotConfigured { message }) => Err(wait(
                reason::GUEST_AGENT_NOT_CONFIGURED,
                format!(
                    "VM {}: {message}: enable the agent on the template (agent: 1), or set spec.checks.skipQemuGuestAgent",
                    vm.vmid
                ),
                Some(HUMAN_RETRY),
            )),
            Err(error) => Err(refused(
                error,
                reason::WAITING_FOR_GUEST_AGENT,
                format!("asking the guest agent of VM {}", vm.vmid),
            )),
        }
    }

    /// Detaches the seed CD-ROM and deletes the ISO: it holds the machine's
    /// bootstrap secrets and has been read.
    async fn remove_seed(&mut self, client: &ProxmoxClient, vm: &VmFacts) -> Result<(), Halt> {
        let file = nocloud::iso_file_name(&self.uid)
            .map_err(|e| wait(reason::BOOTSTRAP_DATA_FAILED, e.to_string(), None))?;
        let vm_api = client.qemu(&vm.node, vm.vmid);
        for (key, _) in vm.config.extra.iter().filter(|(_, v)| {
            v.as_str()
                .is_some_and(|v| v.contains(&format!(":iso/{file}")))
        }) {
            let update = VmConfigUpdate::new().set(key.clone(), decide::cdrom_value(None));
            vm_api.update_config_sync(&update).await.map_err(|e| {
                refused(
                    e,
                    reason::BOOTSTRAP_DATA_FAILED,
                    format!("detaching the seed from VM {}", vm.vmid),
                )
            })?;
            tracing::info!(machine = %self.name, vmid = vm.vmid, drive = %key, "detached the NoCloud seed");
        }
        self.delete_seed_volumes(client, &vm.node, &file).await
    }

    async fn delete_seed_volumes(
        &mut self,
        client: &ProxmoxClient,
        node: &str,
        file: &str,
    ) -> Result<(), Halt> {
        let volumes = act::find_seed_volumes(client, node, file)
            .await
            .map_err(|e| {
                refused(
                    e,
                    reason::BOOTSTRAP_DATA_FAILED,
                    format!("looking for the seed {file} on {node}"),
                )
            })?;
        for (storage, volid) in volumes {
            let deleted = client
                .storage(node, &storage)
                .delete_volume(&volid)
                .await
                .map_err(|e| {
                    refused(
                        e,
                        reason::BOOTSTRAP_DATA_FAILED,
                        format!("deleting the seed {volid}"),
                    )
                })?;
            if let Some(upid) = deleted {
                match act::poll_task(client, &upid, &act::reconcile_task_wait())
                    .await
                    .map_err(Error::from)?
                {
                    TaskPoll::Running => {
                        return Err(wait(
                            reason::UPLOADING_BOOTSTRAP_DATA,
                            format!("deleting the seed {volid}"),
                            Some(POLL),
                        ));
                    }
                    TaskPoll::Failed { exit_status, .. } => {
                        return Err(wait(
                            reason::BOOTSTRAP_DATA_FAILED,
                            format!("deleting the seed {volid} failed: {exit_status}"),
                            Some(FAILED_TASK_PAUSE),
                        ));
                    }
                    TaskPoll::Done(_) | TaskPoll::Unknown => {}
                }
            }
            tracing::info!(machine = %self.name, %volid, "deleted the NoCloud seed");
        }
        Ok(())
    }

    /// Deletion: stop and destroy the VM (only if it is the machine's own,
    /// in its pool), confirm it is gone, delete the seed, release the
    /// addresses. The finalizer goes only when all of that is done.
    async fn delete(&mut self) -> Result<Action, Halt> {
        let kube = self.ctx.base.client.clone();
        let cluster_name = owner::cluster_name(&self.machine.metadata).map(str::to_string);
        let cluster = match &cluster_name {
            Some(name) => {
                self.ctx
                    .caches
                    .capi
                    .cluster(&kube, &self.namespace, name)
                    .await?
            }
            None => None,
        };
        if pause::paused_by(cluster.as_ref(), &self.machine.metadata).is_some() {
            self.paused(cluster.as_ref()).await?;
            return Err(Error::Waiting(
                "paused: deletion waits for unpause".into(),
                Duration::from_secs(30),
            )
            .into());
        }
        let vmid = self
            .machine
            .spec
            .virtual_machine_id
            .or(self.status.virtual_machine_id);
        let node = self.status.proxmox_node.clone();
        let needs_pve = vmid.is_some() || node.is_some() || self.status.task_ref.is_some();
        if needs_pve {
            let proxmox_cluster = match &cluster_name {
                Some(name) => self.proxmox_cluster(cluster.as_ref(), name).await?,
                None => None,
            };
            let Some(proxmox_cluster) = proxmox_cluster else {
                return Err(wait(
                    reason::PROXMOX_CLUSTER_NOT_FOUND,
                    "cannot delete the VM: the machine's ProxmoxCluster (and with it the credentials) is gone",
                    Some(Duration::from_secs(30)),
                ));
            };
            let client = self.client(&proxmox_cluster).await?;
            self.settle_task(&client).await.or_else(|halt| match halt {
                // A failed task does not stop a deletion.
                Halt::Wait(w) if decide::is_failure(&w.reason) => Ok(()),
                other => Err(other),
            })?;
            if let Some(vmid) = vmid.and_then(|v| u32::try_from(v).ok()) {
                self.destroy_vm(&client, vmid).await?;
            }
            if let Some(node) = &node {
                let file = nocloud::iso_file_name(&self.uid)
                    .map_err(|e| wait(reason::DELETION_FAILED, e.to_string(), None))?;
                self.delete_seed_volumes(&client, node, &file).await?;
            }
        }
        let left = act::release_addresses(&kube, &self.ctx.caches, &self.machine).await?;
        if !left.is_empty() {
            return Err(wait(
                reason::DELETING,
                format!(
                    "waiting for IPAddressClaims {} to be released",
                    left.join(", ")
                ),
                Some(POLL),
            ));
        }
        tracing::info!(machine = %self.name, namespace = %self.namespace, "VM, seed and addresses are gone; releasing the finalizer");
        Ok(Action::await_change())
    }

    /// Stops and destroys the machine's VM; returns once it is gone (its ID
    /// free, or no longer the machine's VM in its pool).
    async fn destroy_vm(&mut self, client: &ProxmoxClient, vmid: u32) -> Result<(), Halt> {
        let pool = self.pool().map(str::to_string);
        let (presence, facts, _) =
            act::lookup_vm_cached(client, &self.ctx.caches, vmid, pool.as_deref())
                .await
                .map_err(|e| {
                    refused(e, reason::DELETION_FAILED, format!("looking up VM {vmid}"))
                })?;
        let source = if self.machine.spec.virtual_machine_id.is_some() {
            VmidSource::Spec
        } else {
            VmidSource::Reserved
        };
        let own_clone_running =
            if presence == VmPresence::Elsewhere && source == VmidSource::Reserved {
                let nodes: Vec<String> = match self.machine.spec.source_node.clone() {
                    Some(node) => vec![node],
                    None => client
                        .nodes()
                        .await
                        .map_err(Error::from)?
                        .into_iter()
                        .map(|n| n.node)
                        .collect(),
                };
                act::own_clone_running(client, &nodes)
                    .await
                    .map_err(Error::from)?
            } else {
                false
            };
        let facts = match decide::judge_vm(
            &self.namespace,
            &self.name,
            pool.as_deref(),
            vmid,
            source,
            &presence,
            own_clone_running,
        ) {
            VmVerdict::Ours => facts.expect("a VM in the pool was read"),
            VmVerdict::WaitForClone => {
                return Err(wait(
                    reason::DELETING,
                    format!("waiting for the clone to VM {vmid} to end before deleting it"),
                    Some(POLL),
                ));
            }
            // Gone, never made, or not the machine's: nothing to delete.
            VmVerdict::Clone
            | VmVerdict::Missing { .. }
            | VmVerdict::Repick { .. }
            | VmVerdict::Refuse { .. } => {
                return Ok(());
            }
        };
        let vm = client.qemu(&facts.node, vmid);
        if let Some(lock) = &facts.status.lock {
            return Err(wait(
                reason::DELETING,
                format!("VM {vmid} is locked ({lock}); deleting it when the operation ends"),
                Some(POLL),
            ));
        }
        if facts.status.is_running() {
            let what = format!("stopping VM {vmid} on {}", facts.node);
            let upid = vm
                .stop()
                .await
                .map_err(|e| refused(e, reason::DELETION_FAILED, &what))?;
            return Err(self.started(upid, reason::DELETING, what));
        }
        let what = format!("deleting VM {vmid} on {} with its disks", facts.node);
        let upid = vm
            .delete(&DeleteParams::thorough())
            .await
            .map_err(|e| refused(e, reason::DELETION_FAILED, &what))?;
        self.ctx
            .base
            .event(&self.machine, EventType::Normal, "Deleting", what.clone())
            .await;
        Err(self.started(upid, reason::DELETING, what))
    }
}

fn ip_addresses_status(addresses: &[DeviceAddress]) -> Vec<tenantry_api::proxmox::IpAddressesSpec> {
    let mut devices: Vec<String> = addresses.iter().map(|a| a.device.clone()).collect();
    devices.sort();
    devices.dedup();
    devices
        .into_iter()
        .map(|device| {
            let of = |v4: bool| {
                let list: Vec<String> = addresses
                    .iter()
                    .filter(|a| a.device == device && a.address.is_ipv4() == v4)
                    .map(|a| a.address.to_string())
                    .collect();
                (!list.is_empty()).then_some(list)
            };
            tenantry_api::proxmox::IpAddressesSpec {
                net: device.clone(),
                ipv4: of(true),
                ipv6: of(false),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_backs_off_at_most_half_a_minute_a_refusal_as_usual() {
        let outage = Error::Proxmox(ProxmoxError::Unavailable {
            status: 503,
            message: "Service Unavailable".into(),
        });
        assert_eq!(outage.backoff_cap(), Some(TRANSIENT_BACKOFF_CAP));
        let during_cleanup = Error::from(kube::runtime::finalizer::Error::CleanupFailed(outage));
        assert_eq!(during_cleanup.backoff_cap(), Some(TRANSIENT_BACKOFF_CAP));
        let refusal = Error::Proxmox(ProxmoxError::PermissionDenied {
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
        let Halt::Wait(wait) = refused(error, reason::CLONING_FAILED, "cloning template 9000")
        else {
            panic!("a permission problem waits for a human");
        };
        assert_eq!(wait.reason, "PermissionDenied");
        assert!(wait.message.starts_with("cloning template 9000: permission denied: Permission check failed (/vms/9000, VM.Clone)"), "{}", wait.message);
        assert!(
            wait.message
                .contains("grant VM.Clone on /vms/9000 to the token and to its user"),
            "{}",
            wait.message
        );
        assert_eq!(wait.delay, Some(HUMAN_RETRY));
    }

    #[test]
    fn other_refusals_keep_the_steps_reason_and_passing_trouble_backs_off() {
        let rejected = ProxmoxError::Rejected {
            status: 500,
            message: "can't clone VM to node 'pve2' (VM uses local storage)".into(),
        };
        let Halt::Wait(wait) = refused(rejected, reason::CLONING_FAILED, "cloning") else {
            panic!("a refusal waits for a human");
        };
        assert_eq!(wait.reason, reason::CLONING_FAILED);
        let unavailable = ProxmoxError::Unavailable {
            status: 503,
            message: "Service Unavailable".into(),
        };
        assert!(matches!(
            refused(unavailable, reason::CLONING_FAILED, "cloning"),
            Halt::Error(_)
        ));
    }

    #[test]
    fn ip_addresses_are_listed_per_device_and_family() {
        let address = |device: &str, ip: &str| DeviceAddress {
            device: device.into(),
            address: ip.parse().unwrap(),
            prefix: 24,
            gateway: None,
        };
        let listed = ip_addresses_status(&[
            address("net1", "192.168.0.5"),
            address("net0", "10.0.0.5"),
            address("net0", "2001:db8::5"),
        ]);
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].net, "net0");
        assert_eq!(
            listed[0].ipv4.as_deref(),
            Some(&["10.0.0.5".to_string()][..])
        );
        assert_eq!(
            listed[0].ipv6.as_deref(),
            Some(&["2001:db8::5".to_string()][..])
        );
        assert_eq!(listed[1].ipv6, None);
    }
}
