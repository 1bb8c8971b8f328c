//! What a ProxmoxMachine reconcile reads before it decides: the gates
//! (pause, owner Machine, Cluster, ProxmoxCluster, bootstrap data,
//! credentials), the task in flight, the machine's VM, its seed and its
//! guest. Reads only, apart from the status fields that record what was
//! read (the task's end, a VM found by name).

pub mod pve;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use tenantry_api::contract::{CONTROL_PLANE_LABEL, READY_CONDITION};
use tenantry_api::proxmox::ProxmoxCluster;

use self::pve::TaskPoll;
use super::decide::{
    self, GuestReport, HUMAN_RETRY, POLL, REFUSED_RETRY, RESYNC, SeedState, VmFacts, VmPresence,
    VmVerdict, VmidSource,
};
use super::reconcile::{Halt, Run, refused};
use super::status::Reason;
use crate::capi::bootstrap::{self, BootstrapData, BootstrapState};
use crate::capi::conditions;
use crate::capi::stores::{NotYet, Owners};
use crate::capi::{Cluster, owner, pause};
use crate::proxmox::client::{ProxmoxClient, ProxmoxError, Upid};
use crate::proxmox::nocloud;

/// How long the look at a provisioned machine's VM answers for it when the
/// machine is woken by something else (see [`Run::checked_a_moment_ago`]).
const VM_CHECK_HOLDS: Duration = Duration::from_secs(30);
/// A machine this old that has said nothing yet says that it waits for
/// its turn before its first call to PVE (see [`Run::first_word`]).
const SILENT_AT_MOST: Duration = Duration::from_secs(3);
/// No new task for a machine this long after one failed (`status.retryAfter`).
pub(super) const FAILED_TASK_PAUSE: Duration = Duration::from_secs(15);

/// What the gates found: everything a provisioning step needs.
pub(super) struct Gates {
    pub cluster_name: String,
    pub proxmox_cluster: ProxmoxCluster,
    pub client: ProxmoxClient,
    pub owner_machine: crate::capi::Machine,
    pub cluster: Cluster,
}

impl Run<'_> {
    /// Pause, as the contract asks: the `Paused` condition and nothing else.
    pub(super) async fn report_paused(
        &mut self,
        paused: pause::PausedBy,
    ) -> Result<(), super::reconcile::Error> {
        let mut list = self.status.conditions.take().unwrap_or_default();
        conditions::set(
            &mut list,
            &pause::paused_condition(Some(paused)),
            self.machine.metadata.generation,
            &Timestamp::now(),
        );
        self.status.conditions = Some(list);
        self.persist().await?;
        Ok(())
    }

    /// The ProxmoxCluster of a Cluster (its infrastructure), or, without
    /// the Cluster, the one labelled with the cluster's name.
    pub(super) async fn proxmox_cluster(
        &self,
        cluster: Option<&Cluster>,
        cluster_name: &str,
    ) -> Result<Option<ProxmoxCluster>, kube::Error> {
        let api: Api<ProxmoxCluster> =
            Api::namespaced(self.ctx.base.client.clone(), &self.namespace);
        if let Some(reference) = cluster.and_then(|c| c.spec.infrastructure_ref.as_ref())
            && reference.kind == "ProxmoxCluster"
        {
            return self
                .ctx
                .caches
                .proxmox_cluster(&self.ctx.base.client, &self.namespace, &reference.name)
                .await;
        }
        let labelled = api
            .list(&kube::api::ListParams::default().labels(&format!(
                "{}={cluster_name}",
                tenantry_api::contract::CLUSTER_NAME_LABEL
            )))
            .await?;
        Ok(labelled.items.into_iter().next())
    }

    pub(super) async fn client(
        &self,
        proxmox_cluster: &ProxmoxCluster,
    ) -> Result<ProxmoxClient, Halt> {
        match self
            .ctx
            .clients
            .client_for(
                &self.ctx.base.client,
                proxmox_cluster,
                &pve::reconcile_task_wait(),
            )
            .await
        {
            Ok(client) => Ok(client),
            Err(error) if error.is_transient() => {
                Err(super::reconcile::Error::Waiting(error.to_string(), POLL).into())
            }
            Err(error) => Err(Halt::wait(
                Reason::named(error.reason(), Reason::CredentialsInvalid),
                format!(
                    "ProxmoxCluster {}: {error}",
                    proxmox_cluster.metadata.name.as_deref().unwrap_or_default()
                ),
                Some(HUMAN_RETRY),
            )),
        }
    }

    pub(super) async fn gates(&mut self) -> Result<Option<Gates>, Halt> {
        let client = self.ctx.base.client.clone();
        let owners = self
            .ctx
            .caches
            .capi
            .owners(&client, &self.namespace, &self.machine.metadata)
            .await?;
        let Owners {
            cluster_name,
            cluster,
            owner_machine,
        } = match owners {
            Ok(owners) => owners,
            Err(NotYet::Paused(by)) => {
                self.report_paused(by).await?;
                return Ok(None);
            }
            Err(not_yet) => {
                return Err(Halt::wait(
                    not_yet.reason(),
                    not_yet.message("ProxmoxMachine"),
                    not_yet.retry(RESYNC),
                ));
            }
        };
        let Some(proxmox_cluster) = self.proxmox_cluster(Some(&cluster), &cluster_name).await?
        else {
            return Err(Halt::wait(
                Reason::ProxmoxClusterNotFound,
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
    pub(super) async fn bootstrap_data(
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
                        Halt::wait(
                            Reason::WaitingForControlPlane,
                            format!(
                                "workers wait for Cluster {cluster_name}'s control plane to be initialized"
                            ),
                            Some(RESYNC),
                        )
                    } else {
                        Halt::wait(
                            Reason::WaitingForBootstrapData,
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
                Err(Halt::wait(
                    Reason::BootstrapDataSecretMissing,
                    format!(
                        "bootstrap data Secret {}/{secret} is missing or has no 'value' key",
                        self.namespace
                    ),
                    Some(Duration::from_secs(30)),
                ))
            }
        }
    }

    /// When the machine is provisioned and ready, its spec unchanged, and
    /// its VM was looked at less than [`VM_CHECK_HOLDS`] ago: how long until
    /// the next regular look. Cluster API updates a Machine several times
    /// while it deletes it (and its owner's changes wake the machine each
    /// time); the VM's state a few seconds old is as good an answer. A
    /// pause, or the machine's deletion, is still acted on at once.
    pub(super) fn checked_a_moment_ago(&self) -> Option<Duration> {
        if !self.is_provisioned()
            || !self.status.ready
            || self.status.vm_status.as_deref() != Some("ready")
            || self.previous_reason().as_deref() != Some(Reason::Provisioned.as_str())
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
    pub(super) fn first_word(&self) -> Result<(), Halt> {
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
        Err(Halt::wait(
            Reason::WaitingForTurn,
            format!("ready to provision, waiting for its turn: {busy}"),
            Some(Duration::ZERO),
        ))
    }

    /// `status.retryAfter` with what `Ready` said when it was set: no new
    /// task before then.
    pub(super) fn retry_after(&self) -> Option<(Timestamp, Reason, &str)> {
        let Time(after) = self.status.retry_after.as_ref()?;
        let ready = self
            .status
            .conditions
            .as_deref()
            .and_then(|c| conditions::get(c, READY_CONDITION));
        Some(match ready {
            Some(c) => (
                *after,
                Reason::named(&c.reason, Reason::TaskFailed),
                c.message.as_str(),
            ),
            None => (*after, Reason::TaskFailed, "a Proxmox task failed"),
        })
    }

    /// Waits a little for the task recorded in status and records how it
    /// ended. A failed task pauses new ones for a while (`retryAfter`).
    pub(super) async fn settle_task(&mut self, client: &ProxmoxClient) -> Result<(), Halt> {
        let Some(text) = self.status.task_ref.clone() else {
            return Ok(());
        };
        let Ok(upid) = text.parse::<Upid>() else {
            self.status.task_ref = None;
            return Ok(());
        };
        let (running_reason, failed_reason) = Reason::of_task(upid.task_type());
        let patience = if self.inline {
            // Just started: no task ends at once, so the first look waits.
            let patience = pve::inline_task_wait();
            tokio::time::sleep(patience.initial_interval).await;
            patience
        } else {
            pve::reconcile_task_wait()
        };
        let poll = pve::poll_task(client, &upid, &patience)
            .await
            .map_err(|e| refused(e, failed_reason, format!("task {upid}")))?;
        match poll {
            TaskPoll::Running => Err(Halt::wait(
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
                Err(Halt::wait(
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

    /// Finds the machine's VM, or clones it. Returns only a VM that is in
    /// the machine's pool and the machine's own (with the pool's storages);
    /// anything else halts.
    pub(super) async fn resolve_vm(
        &mut self,
        gates: &Gates,
    ) -> Result<(VmFacts, Vec<String>), Halt> {
        let client = &gates.client;
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
                match pve::find_own_vm(client, pool.as_deref(), &self.namespace, &self.name).await {
                    Ok(Some(vmid)) => {
                        tracing::info!(machine = %self.name, vmid, "found the machine's VM by name and description");
                        self.status.virtual_machine_id = Some(i64::from(vmid));
                        self.persist().await?;
                        (i64::from(vmid), VmidSource::Reserved)
                    }
                    Ok(None) => return Err(self.clone_vm(gates, None).await),
                    Err(error) => {
                        return Err(refused(
                            error,
                            Reason::CloningFailed,
                            format!("reading pool {}", pool.as_deref().unwrap_or("-")),
                        ));
                    }
                }
            }
        };
        let Ok(vmid) = u32::try_from(vmid) else {
            return Err(Halt::wait(
                Reason::InvalidSpec,
                format!("{vmid} is not a Proxmox VM ID"),
                None,
            ));
        };
        let (verdict, facts, storages) = self
            .judge_vm(client, vmid, source, Reason::CloningFailed)
            .await?;
        match verdict {
            VmVerdict::Ours => Ok((facts.expect("a VM in the pool was read"), storages)),
            VmVerdict::Clone => Err(self.clone_vm(gates, Some(vmid)).await),
            VmVerdict::WaitForClone => Err(Halt::wait(
                Reason::Cloning,
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
                Err(Halt::wait(
                    Reason::Cloning,
                    format!("{message}; reserving another VM ID"),
                    Some(Duration::from_millis(200)),
                ))
            }
            VmVerdict::Refuse { reason, message } => {
                Err(Halt::wait(reason, message, Some(REFUSED_RETRY)))
            }
            VmVerdict::Missing { message } => {
                Err(Halt::wait(Reason::VmNotFound, message, Some(HUMAN_RETRY)))
            }
        }
    }

    /// Looks the VM ID up from the machine's point of view and judges whose
    /// it is ([`decide::judge_vm`]); for a reserved ID taken outside the
    /// pool, whether this token's clone to it may still be running.
    pub(super) async fn judge_vm(
        &self,
        client: &ProxmoxClient,
        vmid: u32,
        source: VmidSource,
        failed: Reason,
    ) -> Result<(VmVerdict, Option<VmFacts>, Vec<String>), Halt> {
        let pool = self.pool().map(str::to_string);
        let (presence, facts, storages) =
            pve::lookup_vm_cached(client, &self.ctx.caches, vmid, pool.as_deref())
                .await
                .map_err(|e| {
                    refused(
                        e,
                        failed,
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
                        .map_err(super::reconcile::Error::from)?
                        .into_iter()
                        .map(|n| n.node)
                        .collect(),
                };
                pve::own_clone_running(client, &nodes)
                    .await
                    .map_err(super::reconcile::Error::from)?
            } else {
                false
            };
        let verdict = decide::judge_vm(
            &self.namespace,
            &self.name,
            pool.as_deref(),
            vmid,
            source,
            &presence,
            own_clone_running,
        );
        Ok((verdict, facts, storages))
    }

    /// The seed's storage and file, and whether it is attached.
    pub(super) async fn observe_seed(
        &self,
        client: &ProxmoxClient,
        vm: &VmFacts,
    ) -> Result<SeedState, Halt> {
        let file = nocloud::iso_file_name(&self.uid)
            .map_err(|e| Halt::wait(Reason::BootstrapDataFailed, e.to_string(), None))?;
        let storage = match &self.machine.spec.iso_storage {
            Some(storage) => storage.clone(),
            None => {
                let storages = client
                    .node(&vm.node)
                    .storage_list(Some("iso"))
                    .await
                    .map_err(|e| {
                        refused(
                            e,
                            Reason::BootstrapDataFailed,
                            format!("listing the ISO storages of {}", vm.node),
                        )
                    })?;
                decide::iso_storage(None, &storages)
                    .map_err(|m| Halt::wait(Reason::BootstrapDataFailed, m, Some(HUMAN_RETRY)))?
            }
        };
        let volid = format!("{storage}:iso/{file}");
        let drive = decide::seed_drive(&vm.config, &volid);
        Ok(SeedState {
            storage,
            volid,
            drive,
            uploaded: None,
        })
    }

    /// Whether the seed's ISO is on its storage.
    pub(super) async fn seed_uploaded(
        &self,
        client: &ProxmoxClient,
        vm: &VmFacts,
        seed: &SeedState,
    ) -> Result<bool, Halt> {
        pve::volume_exists(client, &vm.node, &seed.storage, &seed.volid)
            .await
            .map_err(|e| {
                refused(
                    e,
                    Reason::BootstrapDataFailed,
                    format!("reading storage {} on {}", seed.storage, vm.node),
                )
            })
    }

    /// What the guest agent reports of the VM's interfaces.
    pub(super) async fn observe_guest(
        &self,
        client: &ProxmoxClient,
        vm: &VmFacts,
    ) -> Result<GuestReport, Halt> {
        match client
            .qemu(&vm.node, vm.vmid)
            .agent()
            .network_interfaces()
            .await
        {
            Ok(interfaces) => Ok(GuestReport::Interfaces(interfaces)),
            Err(ProxmoxError::GuestAgentNotRunning { .. } | ProxmoxError::VmNotRunning { .. }) => {
                Ok(GuestReport::NotAnswering)
            }
            Err(ProxmoxError::GuestAgentNotConfigured { message }) => {
                Ok(GuestReport::NotConfigured(message))
            }
            Err(error) => Err(refused(
                error,
                Reason::WaitingForGuestAgent,
                format!("asking the guest agent of VM {}", vm.vmid),
            )),
        }
    }
}
