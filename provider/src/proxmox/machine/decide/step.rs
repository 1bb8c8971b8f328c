//! The provisioning's next step, from the machine's VM as observed: no
//! client, no clock of its own. The reconcile observes what
//! [`next_step`] asks for, acts on the step, and asks again.

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tenantry_api::proxmox::ProxmoxMachineSpec;

use super::addresses::{Addresses, DeviceAddress, guest_reports_all};
use super::seed::SeedDrive;
use super::vm_config::{boot_disk_growth, config_update};
use crate::proxmox::client::{GuestInterface, VmConfig, VmConfigUpdate, VmStatus};
use crate::proxmox::machine::status::Reason;

/// How often a provisioned machine is looked at without any event.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How soon a machine looks again while PVE works (tasks, booting guests).
pub const POLL: Duration = Duration::from_secs(2);
/// How long to wait before retrying what a human has to fix.
pub const HUMAN_RETRY: Duration = Duration::from_secs(60);
/// How long a refused VM is left alone before looking again.
pub const REFUSED_RETRY: Duration = Duration::from_secs(300);
/// How long to wait for the IPAM provider.
pub const ADDRESS_RETRY: Duration = Duration::from_secs(30);
/// How long a stopped or paused VM of a provisioned machine waits for
/// someone to start it.
pub const STOPPED_RETRY: Duration = Duration::from_secs(30);

/// A VM in the machine's pool, as read before acting on it.
#[derive(Clone, Debug)]
pub struct VmFacts {
    pub vmid: u32,
    pub node: String,
    pub status: VmStatus,
    pub config: VmConfig,
}

/// A state the machine reports while it waits; `retry: None` waits for an
/// event.
#[derive(Clone, Debug, PartialEq)]
pub struct Wait {
    pub reason: Reason,
    pub message: Cow<'static, str>,
    pub retry: Option<Duration>,
    /// A task was just started: the reconcile may wait for it a moment and
    /// go on.
    pub task_started: bool,
}

impl Wait {
    pub fn new(
        reason: Reason,
        message: impl Into<Cow<'static, str>>,
        retry: Option<Duration>,
    ) -> Self {
        Wait {
            reason,
            message: message.into(),
            retry,
            task_started: false,
        }
    }
}

/// The NoCloud seed as observed on the VM's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedState {
    pub storage: String,
    pub volid: String,
    /// Where the seed is (or would go) on the VM.
    pub drive: SeedDrive,
    /// Whether the ISO is on the storage; read (`Need::SeedUpload`) only
    /// when the seed is to be attached.
    pub uploaded: Option<bool>,
}

/// What the guest agent answered.
#[derive(Clone, Debug, PartialEq)]
pub enum GuestReport {
    Interfaces(Vec<GuestInterface>),
    /// The guest boots: its agent does not answer yet.
    NotAnswering,
    /// The VM has no agent configured; PVE's message.
    NotConfigured(String),
}

/// What [`next_step`] needs observed before it can decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Seed,
    /// Whether the seed's ISO is on its storage.
    SeedUpload,
    Guest,
}

/// The machine, its VM and what the provisioning recorded, as plain data.
pub struct Observed<'a> {
    pub spec: &'a ProxmoxMachineSpec,
    /// The storages of the machine's pool (empty without pool, or when the
    /// pool holds none).
    pub pool_storages: &'a [String],
    pub vm: &'a VmFacts,
    pub provisioned: bool,
    /// The seed has been read and removed (`status.vmStatus: ready`).
    pub seed_removed: bool,
    pub addresses: &'a Addresses,
    /// No new task before this (`status.retryAfter`), and what `Ready` said
    /// when it was set.
    pub retry_after: Option<(Timestamp, Reason, &'a str)>,
    pub seed: Option<&'a SeedState>,
    pub guest: Option<&'a GuestReport>,
}

/// One step of the provisioning.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Wait(Wait),
    Observe(Need),
    Configure(VmConfigUpdate),
    GrowDisk {
        disk: String,
        gib: u64,
    },
    UploadSeed,
    AttachSeed {
        slot: String,
    },
    Start,
    /// The guest took its addresses: record the machine as provisioned.
    MarkProvisioned,
    /// The seed holds the machine's keys and has been read: detach and
    /// delete it.
    RemoveSeed,
    /// Provisioned, running, nothing left to do.
    Ready,
}

/// The next step of a machine whose VM exists and is its own.
pub fn next_step(observed: &Observed, now: Timestamp) -> Step {
    let vm = observed.vm;
    if let Some(lock) = &vm.status.lock {
        return Step::Wait(Wait::new(
            Reason::VmLocked,
            format!(
                "VM {} is locked ({lock}) by a running Proxmox operation",
                vm.vmid
            ),
            Some(POLL),
        ));
    }
    if !observed.provisioned {
        if !vm.status.is_running() {
            return stopped_clone_step(observed, now);
        }
        let Addresses::Allocated(allocated) = observed.addresses else {
            return Step::Wait(Wait::new(
                Reason::WaitingForStaticIp,
                "the VM runs but its addresses are not allocated",
                Some(POLL),
            ));
        };
        if let Some(step) = guest_step(observed, allocated) {
            return step;
        }
        return Step::MarkProvisioned;
    }
    if !observed.seed_removed {
        return Step::RemoveSeed;
    }
    if !vm.status.is_running() || vm.status.is_paused() {
        let state = if vm.status.is_paused() {
            "paused"
        } else {
            "stopped"
        };
        return Step::Wait(Wait::new(
            Reason::VmNotRunning,
            format!("VM {} on {} is {state}", vm.vmid, vm.node),
            Some(STOPPED_RETRY),
        ));
    }
    Step::Ready
}

/// A clone not yet started: configure it, grow its disk, attach its seed,
/// start it.
fn stopped_clone_step(observed: &Observed, now: Timestamp) -> Step {
    let vm = observed.vm;
    let invalid = |message: String| Step::Wait(Wait::new(Reason::InvalidSpec, message, None));
    let update = match config_update(observed.spec, &vm.config) {
        Ok(update) => update,
        Err(message) => return invalid(message),
    };
    if !update.is_empty() {
        return task_gate(observed, now).unwrap_or(Step::Configure(update));
    }
    match boot_disk_growth(observed.spec, &vm.config) {
        Err(message) => return invalid(message),
        Ok(Some((disk, gib))) => {
            return task_gate(observed, now).unwrap_or(Step::GrowDisk { disk, gib });
        }
        Ok(None) => {}
    }
    match observed.addresses {
        Addresses::Allocated(_) => {}
        Addresses::Pending(message) => {
            return Step::Wait(Wait::new(
                Reason::WaitingForStaticIp,
                message.clone(),
                Some(ADDRESS_RETRY),
            ));
        }
        Addresses::Failed(message) => {
            return Step::Wait(Wait::new(
                Reason::IpAllocationFailed,
                message.clone(),
                Some(ADDRESS_RETRY),
            ));
        }
    }
    let Some(seed) = observed.seed else {
        return Step::Observe(Need::Seed);
    };
    if !observed.pool_storages.is_empty()
        && !observed.pool_storages.contains(&seed.storage)
        && let Some(pool) = observed.spec.pool.as_deref().filter(|p| !p.is_empty())
    {
        return Step::Wait(Wait::new(
            Reason::StorageOutsidePool,
            format!(
                "ISO storage {} is not in pool {pool}, which holds storages {}: tenantry puts the seed only on the pool's storages (set spec.isoStorage)",
                seed.storage,
                observed.pool_storages.join(", ")
            ),
            Some(REFUSED_RETRY),
        ));
    }
    let slot = match &seed.drive {
        SeedDrive::Attached(_) => return task_gate(observed, now).unwrap_or(Step::Start),
        SeedDrive::NoFreeSlot => {
            return Step::Wait(Wait::new(
                Reason::BootstrapDataFailed,
                format!(
                    "VM {} has no free IDE or SATA slot for the seed CD-ROM",
                    vm.vmid
                ),
                None,
            ));
        }
        SeedDrive::Attach(slot) => slot,
    };
    if let Some(gate) = task_gate(observed, now) {
        return gate;
    }
    match seed.uploaded {
        None => Step::Observe(Need::SeedUpload),
        Some(false) => Step::UploadSeed,
        Some(true) => Step::AttachSeed { slot: slot.clone() },
    }
}

/// A running VM not yet provisioned: provisioned when the guest agent
/// reports every static address (or at once, with
/// `checks.skipQemuGuestAgent`).
fn guest_step(observed: &Observed, allocated: &[DeviceAddress]) -> Option<Step> {
    let skip = observed
        .spec
        .checks
        .as_ref()
        .and_then(|c| c.skip_qemu_guest_agent)
        .unwrap_or(false);
    if skip {
        return None;
    }
    let vmid = observed.vm.vmid;
    let expected: Vec<IpAddr> = allocated.iter().map(|a| a.address).collect();
    let Some(report) = observed.guest else {
        return Some(Step::Observe(Need::Guest));
    };
    let wait = match report {
        GuestReport::Interfaces(interfaces) if guest_reports_all(&expected, interfaces) => {
            return None;
        }
        GuestReport::Interfaces(_) => Wait::new(
            Reason::WaitingForGuestAddresses,
            format!(
                "the guest agent of VM {vmid} does not report {} yet",
                expected
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some(POLL),
        ),
        GuestReport::NotAnswering => Wait::new(
            Reason::WaitingForGuestAgent,
            format!("VM {vmid} is booting: its guest agent does not answer yet"),
            Some(POLL),
        ),
        GuestReport::NotConfigured(message) => Wait::new(
            Reason::GuestAgentNotConfigured,
            format!(
                "VM {vmid}: {message}: enable the agent on the template (agent: 1), or set spec.checks.skipQemuGuestAgent"
            ),
            Some(HUMAN_RETRY),
        ),
    };
    Some(Step::Wait(wait))
}

/// No new task before `retryAfter`: keep saying what failed until then.
pub fn task_gate(observed: &Observed, now: Timestamp) -> Option<Step> {
    let (after, reason, message) = observed.retry_after?;
    task_gate_until(after, reason, message, now).map(Step::Wait)
}

/// The wait until `after`, if it is still ahead.
pub fn task_gate_until(
    after: Timestamp,
    reason: Reason,
    message: &str,
    now: Timestamp,
) -> Option<Wait> {
    (after > now).then(|| {
        Wait::new(
            reason,
            message.to_string(),
            Some(after.duration_since(now).unsigned_abs()),
        )
    })
}

#[cfg(test)]
mod tests;
