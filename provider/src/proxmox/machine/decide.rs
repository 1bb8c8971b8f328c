//! Pure decisions for a ProxmoxMachine: whose VM a VM is, what its config
//! must become, which addresses it claims, what its NoCloud seed says, where
//! the seed goes, and which template and VM ID a clone uses. Nothing here
//! holds a client; `reconcile.rs` observes, calls these, and acts.

use std::collections::BTreeSet;
use std::net::IpAddr;

use tenantry_api::contract::{MachineAddress, MachineAddressType};
use tenantry_api::proxmox::{
    CloneSource, IpFamily, NetworkDevice as DeviceSpec, ProxmoxClusterSpec, ProxmoxMachineSpec,
    TemplateMatchPolicy, in_cluster_ip_pool_name,
};

use crate::capi::conditions::DesiredCondition;
use crate::proxmox::client::{
    ClusterResource, GuestInterface, NetDevice, StorageSummary, VmConfig, VmConfigUpdate,
};
use crate::proxmox::nocloud::{self, Ipv4Static, Ipv6Static, MacAddress, Route};
use crate::proxmox::scheduler::{Guest, NodeCapacity};

/// Condition: the VM exists, is configured, runs and reported its address
/// (capmox's name).
pub const VM_PROVISIONED: &str = "VirtualMachineProvisioned";

/// The line of a VM's description that names the ProxmoxMachine it belongs
/// to. PVE shows descriptions as the VM's notes, so an operator sees it too.
pub const IDENTITY_PREFIX: &str = "tenantry.dev/proxmoxmachine:";

/// The API group of IPAM pools.
pub const IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// The kind of the pools a ProxmoxCluster makes.
pub const IN_CLUSTER_IP_POOL: &str = "InClusterIPPool";

/// Reasons on `VirtualMachineProvisioned` and `Ready`, in the order a
/// machine meets them. capmox's names where capmox has one.
pub mod reason {
    pub const WAITING_FOR_OWNER_MACHINE: &str = "WaitingForOwnerMachine";
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructure";
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlaneInitialized";
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    pub const BOOTSTRAP_DATA_SECRET_MISSING: &str = "BootstrapDataSecretNotFound";
    pub const PROXMOX_CLUSTER_NOT_FOUND: &str = "ProxmoxClusterNotFound";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";
    pub const NODE_CAPACITY_UNKNOWN: &str = "NodeCapacityUnknown";
    pub const VMID_RANGE_EXHAUSTED: &str = "VMIDRangeExhausted";
    pub const STORAGE_OUTSIDE_POOL: &str = "StorageOutsidePool";
    /// The PVE API did not answer, or answered "busy": retried with backoff.
    pub const PROXMOX_UNAVAILABLE: &str = "ProxmoxUnavailable";
    /// PVE refused a request no step names a reason for: retried with backoff.
    pub const PROXMOX_REQUEST_FAILED: &str = "ProxmoxRequestFailed";
    /// Ready to provision; waiting for one of the manager's reconciles.
    pub const WAITING_FOR_TURN: &str = "WaitingForProvisioningTurn";
    pub const CLONING: &str = "Cloning";
    pub const CLONING_FAILED: &str = "CloningFailed";
    pub const VM_OUTSIDE_POOL: &str = "VMOutsidePool";
    pub const VM_NOT_OWNED: &str = "VMNotOwned";
    pub const VM_NOT_FOUND: &str = "VMNotFound";
    pub const VM_LOCKED: &str = "VMLocked";
    pub const CONFIGURING: &str = "WaitingForVMConfiguration";
    pub const CONFIGURATION_FAILED: &str = "VMConfigurationFailed";
    pub const RESIZING_DISK: &str = "WaitingForDiskReconciliation";
    pub const DISK_RESIZE_FAILED: &str = "DiskResizeFailed";
    pub const WAITING_FOR_STATIC_IP: &str = "WaitingForStaticIPAllocation";
    pub const IP_ALLOCATION_FAILED: &str = "IPAddressClaimFailed";
    pub const IP_ADDRESS_CONFLICT: &str = "IPAddressConflict";
    pub const UPLOADING_BOOTSTRAP_DATA: &str = "WaitingForBootstrapDataReconciliation";
    pub const BOOTSTRAP_DATA_FAILED: &str = "BootstrapDataReconciliationFailed";
    pub const POWERING_ON: &str = "WaitingForVMPowerUp";
    pub const POWERING_ON_FAILED: &str = "PoweringOnFailed";
    pub const WAITING_FOR_GUEST_AGENT: &str = "WaitingForGuestAgent";
    pub const WAITING_FOR_GUEST_ADDRESSES: &str = "WaitingForGuestAddresses";
    pub const GUEST_AGENT_NOT_CONFIGURED: &str = "GuestAgentNotConfigured";
    pub const VM_NOT_RUNNING: &str = "VMNotRunning";
    pub const PROVISIONED: &str = "Provisioned";
    pub const DELETING: &str = "Deleting";
    pub const DELETION_FAILED: &str = "DeletionFailed";
    pub const TASK_FAILED: &str = "TaskFailed";
}

// ---------------------------------------------------------------- identity

/// The description a clone gets: the user's, then the identity line.
pub fn vm_description(user: Option<&str>, namespace: &str, name: &str, uid: &str) -> String {
    let identity = format!("{IDENTITY_PREFIX} {namespace}/{name} uid={uid}");
    match user.map(str::trim).filter(|d| !d.is_empty()) {
        Some(user) => format!("{user}\n\n{identity}"),
        None => identity,
    }
}

/// The `namespace/name` a description's identity line names, if it has one.
pub fn described_owner(description: &str) -> Option<&str> {
    description.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(IDENTITY_PREFIX)?;
        rest.split_whitespace().next()
    })
}

/// Whose a VM in the machine's pool is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Named after the machine and (if it says so) made for it.
    Ours,
    /// Another machine's (or nobody's).
    Other { name: String, owner: Option<String> },
}

/// Judges a VM in the machine's pool by its name and description. A VM
/// without identity line but with the machine's name is adopted: capmox
/// names clones after their machine and writes no such line.
pub fn ownership(
    namespace: &str,
    name: &str,
    vm_name: Option<&str>,
    description: Option<&str>,
) -> Ownership {
    let owner = description.and_then(described_owner);
    let expected = format!("{namespace}/{name}");
    let name_matches = vm_name == Some(name);
    match owner {
        Some(owner) if owner == expected && name_matches => Ownership::Ours,
        None if name_matches => Ownership::Ours,
        owner => Ownership::Other {
            name: vm_name.unwrap_or_default().to_string(),
            owner: owner.map(str::to_string),
        },
    }
}

/// Where the VM ID a machine works with came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmidSource {
    /// Reserved by tenantry for its own clone (`status.virtualMachineID`).
    Reserved,
    /// Named in `spec.virtualMachineID` (by tenantry after a clone, by
    /// capmox, or by a user).
    Spec,
}

/// What PVE says about a VM ID, from the machine's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmPresence {
    /// No VM has the ID.
    Free,
    /// A VM has it, but it is not in the machine's pool (or the token cannot
    /// see it, which for a pool-scoped token is the same).
    Elsewhere,
    /// A member of the machine's pool, with this name and description.
    InPool {
        name: Option<String>,
        description: Option<String>,
    },
}

/// The next move for a machine's VM ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmVerdict {
    /// The VM is the machine's: go on with it.
    Ours,
    /// No VM: clone one, keeping a reserved ID (a retry must use the same
    /// ID, so a clone that went through unnoticed can never be doubled).
    Clone,
    /// A clone of this machine's token may still be running: PVE adds the
    /// VM to the pool only when the clone ends, so until then it is hidden.
    WaitForClone,
    /// The reserved ID went to someone else (two machines drew the same
    /// free ID): forget it and reserve another.
    Repick { message: String },
    /// The VM named by the spec is not the machine's: never act on it.
    Refuse {
        reason: &'static str,
        message: String,
    },
    /// The VM named by the spec is gone.
    Missing { message: String },
}

/// Decides about a machine's VM ID.
#[allow(clippy::too_many_arguments)]
pub fn judge_vm(
    namespace: &str,
    name: &str,
    pool: Option<&str>,
    vmid: u32,
    source: VmidSource,
    presence: &VmPresence,
    own_clone_running: bool,
) -> VmVerdict {
    let pool_text = pool.map_or("no pool".to_string(), |p| format!("pool {p}"));
    match presence {
        VmPresence::Free => match source {
            VmidSource::Reserved => VmVerdict::Clone,
            VmidSource::Spec => VmVerdict::Missing {
                message: format!("VM {vmid} (spec.virtualMachineID) does not exist"),
            },
        },
        VmPresence::Elsewhere => match source {
            VmidSource::Reserved if own_clone_running => VmVerdict::WaitForClone,
            VmidSource::Reserved => VmVerdict::Repick {
                message: format!("VM ID {vmid} was taken by a VM outside {pool_text}"),
            },
            VmidSource::Spec => VmVerdict::Refuse {
                reason: reason::VM_OUTSIDE_POOL,
                message: match pool {
                    Some(pool) => format!(
                        "VM {vmid} is not in pool {pool} (or not visible to the credentials): tenantry acts only on VMs in the machine's pool"
                    ),
                    None => format!(
                        "VM {vmid} is in a resource pool (or not visible to the credentials), and the machine has none: tenantry does not act on it"
                    ),
                },
            },
        },
        VmPresence::InPool {
            name: vm_name,
            description,
        } => match ownership(namespace, name, vm_name.as_deref(), description.as_deref()) {
            Ownership::Ours => VmVerdict::Ours,
            Ownership::Other { name: other, owner } => {
                let whose = match owner {
                    Some(owner) => format!(
                        "VM {vmid} ({other}) in {pool_text} belongs to ProxmoxMachine {owner}"
                    ),
                    None => format!("VM {vmid} in {pool_text} is named {other:?}, not {name:?}"),
                };
                match source {
                    VmidSource::Reserved => VmVerdict::Repick { message: whose },
                    VmidSource::Spec => VmVerdict::Refuse {
                        reason: reason::VM_NOT_OWNED,
                        message: format!("{whose}: tenantry does not act on another machine's VM"),
                    },
                }
            }
        },
    }
}

// ------------------------------------------------------------- VM ID choice

/// Where to start looking for a free VM ID and where to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmidSearch {
    pub first: u32,
    pub last: u32,
}

impl VmidSearch {
    /// From `vmIDRange`, or from PVE's next free ID up to the largest ID.
    pub fn new(range: Option<(i64, i64)>, next_free: Option<u32>) -> Self {
        match range {
            Some((start, end)) => Self {
                first: u32::try_from(start.max(100)).unwrap_or(u32::MAX),
                last: u32::try_from(end.max(100)).unwrap_or(u32::MAX),
            },
            None => Self {
                first: next_free.unwrap_or(100).max(100),
                last: 999_999_999,
            },
        }
    }

    /// The IDs to probe, lowest first, skipping those other machines have
    /// reserved (PVE does not know them yet: their clones may be a request
    /// away). At most `limit` of them.
    pub fn candidates(&self, reserved: &BTreeSet<u32>, limit: usize) -> Vec<u32> {
        (self.first..=self.last)
            .filter(|id| !reserved.contains(id))
            .take(limit)
            .collect()
    }
}

// ------------------------------------------------------------ the template

/// The template a clone starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateChoice {
    pub node: String,
    pub vmid: u32,
    /// The template's memory in bytes and vCPUs, when the token can see it.
    pub memory: Option<u64>,
    pub vcpus: Option<u32>,
}

/// Finds the template: by ID and node, or by tags. With tags, several
/// templates may match when each node holds its own copy (local storage);
/// the one on `preferred_node` wins then, so the clone needs no cross-node
/// copy (capmox demands exactly one template cluster-wide, #451).
pub fn choose_template(
    source: CloneSource<'_>,
    resources: &[ClusterResource],
    preferred_node: Option<&str>,
) -> Result<TemplateChoice, String> {
    let sizes = |row: &ClusterResource| (row.maxmem, row.maxcpu.map(|c| c.ceil() as u32));
    match source {
        CloneSource::Template {
            source_node,
            template_id,
        } => {
            let vmid = u32::try_from(template_id)
                .map_err(|_| format!("templateID {template_id} is not a VM ID"))?;
            let row = resources.iter().find(|r| r.is_vm() && r.vmid == Some(vmid));
            let (memory, vcpus) = row.map(sizes).unwrap_or((None, None));
            Ok(TemplateChoice {
                node: source_node.to_string(),
                vmid,
                memory,
                vcpus,
            })
        }
        CloneSource::Selector {
            match_tags,
            match_policy,
        } => {
            let wanted: BTreeSet<String> =
                match_tags.iter().map(|t| t.to_ascii_lowercase()).collect();
            let mut matching: Vec<(&ClusterResource, usize)> = resources
                .iter()
                .filter(|r| r.is_vm() && r.template)
                .filter_map(|r| {
                    let tags: BTreeSet<String> = r
                        .tag_list()
                        .iter()
                        .map(|t| t.to_ascii_lowercase())
                        .collect();
                    let fits = match match_policy {
                        TemplateMatchPolicy::Exact => tags == wanted,
                        TemplateMatchPolicy::UniqueSubset | TemplateMatchPolicy::BestSubset => {
                            tags.is_superset(&wanted)
                        }
                    };
                    fits.then(|| (r, tags.len() - wanted.len()))
                })
                .collect();
            let tags = match_tags.join(", ");
            if matching.is_empty() {
                return Err(format!(
                    "no template the credentials can see has the tags [{tags}] ({match_policy:?} match)"
                ));
            }
            if match_policy == TemplateMatchPolicy::BestSubset {
                let fewest = matching.iter().map(|(_, extra)| *extra).min().unwrap_or(0);
                matching.retain(|(_, extra)| *extra == fewest);
            }
            matching.sort_by_key(|(r, _)| (r.node.clone(), r.vmid));
            let per_node: BTreeSet<&str> = matching
                .iter()
                .filter_map(|(r, _)| r.node.as_deref())
                .collect();
            if per_node.len() < matching.len() {
                let ids: Vec<String> = matching
                    .iter()
                    .filter_map(|(r, _)| r.vmid)
                    .map(|v| v.to_string())
                    .collect();
                return Err(format!(
                    "templates {} all match the tags [{tags}] on one node: tag them apart",
                    ids.join(", ")
                ));
            }
            let chosen = matching
                .iter()
                .find(|(r, _)| preferred_node.is_some() && r.node.as_deref() == preferred_node)
                .or(matching.first())
                .map(|(r, _)| *r)
                .expect("not empty");
            let (memory, vcpus) = sizes(chosen);
            Ok(TemplateChoice {
                node: chosen.node.clone().unwrap_or_default(),
                vmid: chosen.vmid.unwrap_or_default(),
                memory,
                vcpus,
            })
        }
    }
}

/// The nodes and their guests, for the scheduler, from `/cluster/resources`.
/// `Err` names the nodes whose capacity the credentials cannot read.
pub fn node_capacities(resources: &[ClusterResource]) -> Result<Vec<NodeCapacity>, Vec<String>> {
    let mut nodes = Vec::new();
    let mut unknown = Vec::new();
    for row in resources
        .iter()
        .filter(|r| r.resource_type == crate::proxmox::client::ResourceType::Node)
    {
        let name = row.node.clone().unwrap_or_default();
        let online = row.status.as_deref() == Some("online");
        let (Some(maxcpu), Some(maxmem)) = (row.maxcpu, row.maxmem) else {
            if online {
                unknown.push(name);
            }
            continue;
        };
        let guests = resources
            .iter()
            .filter(|r| r.is_vm() && r.node.as_deref() == Some(name.as_str()))
            .map(|r| Guest {
                vmid: r.vmid.unwrap_or_default(),
                maxmem: r.maxmem.unwrap_or_default(),
                cpus: r.maxcpu.map(|c| c.ceil() as u32).unwrap_or_default(),
                template: r.template,
            })
            .collect();
        nodes.push(NodeCapacity {
            name,
            online,
            maxcpu: maxcpu.ceil() as u32,
            maxmem,
            guests,
        });
    }
    if nodes.is_empty() && !unknown.is_empty() {
        return Err(unknown);
    }
    Ok(nodes)
}

// ------------------------------------------------------------ configuration

/// The network devices of a machine: its own list, else `net0` alone (which
/// then keeps the template's bridge and model).
pub fn network_devices(spec: &ProxmoxMachineSpec) -> Vec<DeviceSpec> {
    if spec.network.network_devices.is_empty() {
        vec![DeviceSpec::default()]
    } else {
        spec.network.network_devices.clone()
    }
}

fn model_name(model: tenantry_api::proxmox::NetworkModel) -> &'static str {
    use tenantry_api::proxmox::NetworkModel::*;
    match model {
        E1000 => "e1000",
        Virtio => "virtio",
        Rtl8139 => "rtl8139",
        Vmxnet3 => "vmxnet3",
    }
}

/// The `netN` value a device must have, keeping the MAC PVE gave it (a new
/// MAC would make the guest a stranger to its DHCP leases and the seed's
/// network-config), or `None` when the current value already says it.
pub fn net_value(
    device: &DeviceSpec,
    current: Option<&NetDevice>,
) -> Result<Option<String>, String> {
    let model = device
        .model
        .map(model_name)
        .map(str::to_string)
        .or_else(|| current.map(|c| c.model.clone()))
        .unwrap_or_else(|| "virtio".to_string());
    let bridge = device
        .bridge
        .clone()
        .or_else(|| current.and_then(|c| c.bridge.clone()))
        .ok_or_else(|| {
            format!(
                "network device {} has no bridge, and the template has no such device",
                device.name
            )
        })?;
    let vlan = device
        .vlan
        .map(|v| v.to_string())
        .or_else(|| current.and_then(|c| c.vlan.map(|v| v.to_string())));
    let mtu = device
        .mtu
        .map(|v| v.to_string())
        .or_else(|| current.and_then(|c| c.mtu.map(|v| v.to_string())));
    let queues = device
        .queues
        .map(|v| v.to_string())
        .or_else(|| current.and_then(|c| c.properties.get("queues").cloned()));
    if let Some(current) = current {
        let same = current.model == model
            && current.bridge.as_deref() == Some(bridge.as_str())
            && current.vlan.map(|v| v.to_string()) == vlan
            && current.mtu.map(|v| v.to_string()) == mtu
            && current.properties.get("queues").cloned() == queues;
        if same {
            return Ok(None);
        }
    }
    let mut parts = vec![match current.and_then(|c| c.mac.as_deref()) {
        Some(mac) => format!("{model}={mac}"),
        None => model.clone(),
    }];
    parts.push(format!("bridge={bridge}"));
    // Keep what the template set that the spec does not speak about
    // (firewall, rate, link_down…).
    if let Some(current) = current {
        for (key, value) in &current.properties {
            let ours = [
                "bridge",
                "tag",
                "mtu",
                "queues",
                "macaddr",
                "model",
                current.model.as_str(),
            ];
            if !ours.contains(&key.as_str()) {
                parts.push(if value.is_empty() {
                    key.clone()
                } else {
                    format!("{key}={value}")
                });
            }
        }
    }
    for (key, value) in [("mtu", mtu), ("queues", queues), ("tag", vlan)] {
        if let Some(value) = value {
            parts.push(format!("{key}={value}"));
        }
    }
    Ok(Some(parts.join(",")))
}

/// The config changes a stopped clone needs: CPU, memory, network devices
/// (MACs kept) and tags. Empty when it already matches.
pub fn config_update(
    spec: &ProxmoxMachineSpec,
    config: &VmConfig,
) -> Result<VmConfigUpdate, String> {
    let mut update = VmConfigUpdate::new();
    if let Some(cores) = spec.num_cores
        && Some(cores as u32) != config.cores.or(Some(1))
    {
        update = update.cores(cores as u32);
    }
    if let Some(sockets) = spec.num_sockets
        && Some(sockets as u32) != config.sockets.or(Some(1))
    {
        update = update.sockets(sockets as u32);
    }
    if let Some(memory) = spec.memory_mib
        && Some(memory as u64) != config.memory
    {
        update = update.memory_mib(memory as u64);
    }
    let current = config.network_devices();
    for device in network_devices(spec) {
        let existing = current
            .iter()
            .find(|(key, _)| *key == device.name)
            .map(|(_, d)| d);
        if let Some(value) = net_value(&device, existing)? {
            update = update.set(device.name.clone(), value);
        }
    }
    if let Some(tags) = spec.tags.as_ref().filter(|t| !t.is_empty()) {
        let mut present = config.tag_list();
        let lower: BTreeSet<String> = present.iter().map(|t| t.to_ascii_lowercase()).collect();
        let missing: Vec<&String> = tags
            .iter()
            .filter(|t| !lower.contains(&t.to_ascii_lowercase()))
            .collect();
        if !missing.is_empty() {
            present.extend(missing.into_iter().cloned());
            update = update.tags(&present);
        }
    }
    Ok(update)
}

/// The size in bytes of a disk from its config value (`…,size=20G`).
pub fn disk_size(value: &str) -> Option<u64> {
    let size = value
        .split(',')
        .find_map(|part| part.trim().strip_prefix("size="))?;
    let (number, unit) = size.split_at(
        size.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(size.len()),
    );
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match unit {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((number * factor) as u64)
}

/// The boot disk and the size (GiB) it must be grown to, if it is smaller.
/// PVE cannot shrink a disk, so a larger disk is left alone.
pub fn boot_disk_growth(
    spec: &ProxmoxMachineSpec,
    config: &VmConfig,
) -> Result<Option<(String, u64)>, String> {
    let Some(volume) = spec.disks.as_ref().and_then(|d| d.boot_volume.as_ref()) else {
        return Ok(None);
    };
    let value = config.get(&volume.disk).ok_or_else(|| {
        format!(
            "the VM has no disk {} (spec.disks.bootVolume.disk)",
            volume.disk
        )
    })?;
    let wanted = u64::try_from(volume.size_gb).unwrap_or_default();
    let current = disk_size(&value)
        .ok_or_else(|| format!("disk {} has no readable size: {value}", volume.disk))?;
    Ok((current < wanted << 30).then(|| (volume.disk.clone(), wanted)))
}

// -------------------------------------------------------------- addresses

/// One IPAddressClaim a machine makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPlan {
    pub name: String,
    pub device: String,
    pub pool_group: String,
    pub pool_kind: String,
    pub pool_name: String,
}

/// An address of this machine that an older IPAddress of the same pool
/// holds too: this machine's claim must go, so that it gets another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressConflict {
    /// This machine's claim to release.
    pub claim: String,
    pub message: String,
}

/// Which of `ours` (claim name, its IPAddress) another IPAddress of `all`
/// in the same pool holds too, where ours is the newer (created later, or
/// at the same second with a later name): the older keeps the address.
pub fn address_conflicts(
    ours: &[(String, tenantry_api::generated::capi::ip_address::IpAddress)],
    all: &[tenantry_api::generated::capi::ip_address::IpAddress],
) -> Vec<AddressConflict> {
    let age = |a: &tenantry_api::generated::capi::ip_address::IpAddress| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            a.metadata.name.clone().unwrap_or_default(),
        )
    };
    let mut conflicts = Vec::new();
    for (claim, mine) in ours {
        let same_ip = |other: &tenantry_api::generated::capi::ip_address::IpAddress| {
            let (a, b) = (&mine.spec, &other.spec);
            other.metadata.name != mine.metadata.name
                && a.pool_ref.name == b.pool_ref.name
                && a.pool_ref.kind == b.pool_ref.kind
                && a.pool_ref.api_group == b.pool_ref.api_group
                && match (a.address.parse::<IpAddr>(), b.address.parse::<IpAddr>()) {
                    (Ok(x), Ok(y)) => x == y,
                    _ => a.address == b.address,
                }
        };
        if let Some(older) = all
            .iter()
            .filter(|other| same_ip(other))
            .filter(|other| age(other) < age(mine))
            .min_by_key(|other| age(other))
        {
            conflicts.push(AddressConflict {
                claim: claim.clone(),
                message: format!(
                    "{} {} gave address {} to IPAddress {} of claim {claim}, but IPAddress {} of claim {} already holds it",
                    mine.spec.pool_ref.kind,
                    mine.spec.pool_ref.name,
                    mine.spec.address,
                    mine.metadata.name.as_deref().unwrap_or_default(),
                    older.metadata.name.as_deref().unwrap_or_default(),
                    older.spec.claim_ref.name,
                ),
            });
        }
    }
    conflicts
}

/// The claims of a machine: one per device and pool. `net0` takes the
/// cluster's pools (its zone's, if the machine names a zone the cluster
/// configures) unless it names its own; other devices take theirs.
pub fn address_claims(
    machine: &str,
    spec: &ProxmoxMachineSpec,
    proxmox_cluster: &str,
    cluster: &ProxmoxClusterSpec,
) -> Vec<ClaimPlan> {
    let zone = spec
        .network
        .zone
        .as_deref()
        .filter(|z| cluster.zone_config.iter().flatten().any(|c| c.zone == *z));
    let (v4, v6) = match zone {
        Some(zone) => {
            let config = cluster
                .zone_config
                .iter()
                .flatten()
                .find(|c| c.zone == zone)
                .expect("filtered");
            (config.ipv4_config.is_some(), config.ipv6_config.is_some())
        }
        None => (cluster.ipv4_config.is_some(), cluster.ipv6_config.is_some()),
    };
    let mut claims = Vec::new();
    for device in network_devices(spec) {
        let pools: Vec<(String, String, String)> =
            match device.ip_pool_ref.as_ref().filter(|p| !p.is_empty()) {
                Some(refs) => refs
                    .iter()
                    .map(|r| {
                        (
                            r.api_group
                                .clone()
                                .unwrap_or_else(|| IPAM_GROUP.to_string()),
                            r.kind.clone(),
                            r.name.clone(),
                        )
                    })
                    .collect(),
                None if device.name == "net0" => [(v4, IpFamily::V4), (v6, IpFamily::V6)]
                    .into_iter()
                    .filter(|(configured, _)| *configured)
                    .map(|(_, family)| {
                        (
                            IPAM_GROUP.to_string(),
                            IN_CLUSTER_IP_POOL.to_string(),
                            in_cluster_ip_pool_name(proxmox_cluster, zone, family),
                        )
                    })
                    .collect(),
                None => Vec::new(),
            };
        for (index, (group, kind, pool)) in pools.into_iter().enumerate() {
            claims.push(ClaimPlan {
                name: format!("{machine}-{}-{index:02}-inet", device.name),
                device: device.name.clone(),
                pool_group: group,
                pool_kind: kind,
                pool_name: pool,
            });
        }
    }
    claims
}

/// An address the IPAM provider gave a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAddress {
    pub device: String,
    pub address: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
}

/// The nameservers of a device: its own, else (for `net0`) its zone's or the
/// cluster's.
fn dns_servers(
    device: &DeviceSpec,
    spec: &ProxmoxMachineSpec,
    cluster: &ProxmoxClusterSpec,
) -> Vec<String> {
    if let Some(servers) = device.dns_servers.as_ref().filter(|s| !s.is_empty()) {
        return servers.clone();
    }
    if device.name != "net0" {
        return Vec::new();
    }
    spec.network
        .zone
        .as_deref()
        .and_then(|zone| {
            cluster
                .zone_config
                .iter()
                .flatten()
                .find(|c| c.zone == zone)
        })
        .map(|c| c.dns_servers.clone())
        .unwrap_or_else(|| cluster.dns_servers.clone())
}

/// The seed's network devices: each `netN` of the spec as guest `ethN`,
/// matched by the MAC PVE gave it, with its static addresses, default
/// gateways (on `net0` unless a device says otherwise), routes and
/// nameservers.
pub fn seed_network(
    spec: &ProxmoxMachineSpec,
    cluster: &ProxmoxClusterSpec,
    config: &VmConfig,
    addresses: &[DeviceAddress],
) -> Result<Vec<nocloud::NetworkDevice>, String> {
    let macs = config.network_devices();
    let mut devices = Vec::new();
    for device in network_devices(spec) {
        let index = device.name.strip_prefix("net").unwrap_or("0");
        let mac = macs
            .iter()
            .find(|(key, _)| *key == device.name)
            .and_then(|(_, d)| d.mac.clone())
            .ok_or_else(|| format!("network device {} has no MAC address yet", device.name))?;
        let mac: MacAddress = mac
            .parse()
            .map_err(|e: nocloud::NoCloudError| e.to_string())?;
        let mut seed = nocloud::NetworkDevice::new(format!("eth{index}"), mac);
        let default_v4 = device.default_ipv4.unwrap_or(device.name == "net0");
        let default_v6 = device.default_ipv6.unwrap_or(device.name == "net0");
        let metric_of = |family: IpFamily| {
            let config = match family {
                IpFamily::V4 => cluster.ipv4_config.as_ref(),
                IpFamily::V6 => cluster.ipv6_config.as_ref(),
            };
            config.and_then(|c| c.metric).map(|m| m.max(0) as u32)
        };
        for address in addresses.iter().filter(|a| a.device == device.name) {
            match (address.address, address.gateway) {
                (IpAddr::V4(ip), gateway) if seed.ipv4.is_none() => {
                    seed.ipv4 = Some(Ipv4Static {
                        address: ip,
                        prefix: address.prefix,
                        gateway: match gateway {
                            Some(IpAddr::V4(g)) if default_v4 => Some(g),
                            _ => None,
                        },
                        metric: metric_of(IpFamily::V4).filter(|_| default_v4),
                    });
                }
                (IpAddr::V6(ip), gateway) if seed.ipv6.is_none() => {
                    seed.ipv6 = Some(Ipv6Static {
                        address: ip,
                        prefix: address.prefix,
                        gateway: match gateway {
                            Some(IpAddr::V6(g)) if default_v6 => Some(g),
                            _ => None,
                        },
                        metric: metric_of(IpFamily::V6).filter(|_| default_v6),
                    });
                }
                _ => {}
            }
        }
        for server in dns_servers(&device, spec, cluster) {
            let server: IpAddr = server
                .parse()
                .map_err(|_| format!("nameserver {server:?} is not an IP address"))?;
            seed.dns_servers.push(server);
        }
        for route in device.routes.iter().flatten() {
            let (Some(to), Some(via)) = (route.to.as_deref(), route.via.as_deref()) else {
                continue;
            };
            let (destination, prefix) = to.split_once('/').unwrap_or((to, ""));
            let destination: IpAddr = destination
                .parse()
                .map_err(|_| format!("route to {to:?} is not a CIDR"))?;
            let prefix: u8 = if prefix.is_empty() {
                if destination.is_ipv4() { 32 } else { 128 }
            } else {
                prefix
                    .parse()
                    .map_err(|_| format!("route to {to:?} is not a CIDR"))?
            };
            seed.routes.push(Route {
                destination,
                prefix,
                via: via
                    .parse()
                    .map_err(|_| format!("route via {via:?} is not an IP address"))?,
                metric: route.metric.map(|m| m.max(0) as u32),
            });
        }
        seed.mtu = device.link_mtu.filter(|m| *m > 1).map(|m| m as u32);
        devices.push(seed);
    }
    Ok(devices)
}

/// The machine's addresses: its name as Hostname, then every static IP
/// (`net0` first) as InternalIP.
pub fn machine_addresses(name: &str, addresses: &[DeviceAddress]) -> Vec<MachineAddress> {
    let mut list = vec![MachineAddress {
        type_: MachineAddressType::Hostname,
        address: name.to_string(),
    }];
    let mut sorted: Vec<&DeviceAddress> = addresses.iter().collect();
    sorted.sort_by_key(|a| (a.device != "net0", a.device.clone()));
    for address in sorted {
        list.push(MachineAddress {
            type_: MachineAddressType::InternalIP,
            address: address.address.to_string(),
        });
    }
    list
}

/// Whether the guest agent reports every static address.
pub fn guest_reports_all(expected: &[IpAddr], interfaces: &[GuestInterface]) -> bool {
    expected.iter().all(|ip| {
        interfaces
            .iter()
            .any(|i| i.addresses.iter().any(|a| a.ip == *ip))
    })
}

// ------------------------------------------------------------------- seed

/// The storage the seed ISO goes to: the spec's, else the first enabled
/// ISO storage of the node in name order (capmox takes PVE's first, whose
/// order changes between calls, #569).
pub fn iso_storage(explicit: Option<&str>, storages: &[StorageSummary]) -> Result<String, String> {
    if let Some(explicit) = explicit {
        return Ok(explicit.to_string());
    }
    let mut candidates: Vec<&str> = storages
        .iter()
        .filter(|s| s.is_enabled() && s.holds("iso"))
        .map(|s| s.storage.as_str())
        .collect();
    candidates.sort();
    candidates
        .first()
        .map(|s| s.to_string())
        .ok_or_else(|| "no enabled storage on the node accepts ISO images that the credentials can see: set spec.isoStorage".to_string())
}

/// Where the seed CD-ROM is, or goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedDrive {
    /// Attached as this drive.
    Attached(String),
    /// To be attached as this drive.
    Attach(String),
    /// Every IDE and SATA slot is taken.
    NoFreeSlot,
}

/// Drive slots a CD-ROM can take, in the order tried.
const CDROM_SLOTS: [&str; 10] = [
    "ide0", "ide1", "ide2", "ide3", "sata0", "sata1", "sata2", "sata3", "sata4", "sata5",
];

/// Finds the seed's drive: the drive holding `volid`, else an empty CD-ROM
/// drive, else a free slot. The boot order is left alone: the seed is read,
/// not booted (capmox rewrote `boot` and broke legacy orders, #225).
pub fn seed_drive(config: &VmConfig, volid: &str) -> SeedDrive {
    let value = |slot: &str| config.get(slot);
    if let Some(slot) = CDROM_SLOTS
        .iter()
        .find(|slot| value(slot).is_some_and(|v| v.split(',').next() == Some(volid)))
    {
        return SeedDrive::Attached(slot.to_string());
    }
    if let Some(slot) = CDROM_SLOTS.iter().find(|slot| {
        value(slot).is_some_and(|v| {
            let mut parts = v.split(',');
            matches!(parts.next(), Some("none" | "cdrom")) && v.contains("media=cdrom")
        })
    }) {
        return SeedDrive::Attach(slot.to_string());
    }
    match CDROM_SLOTS.iter().find(|slot| value(slot).is_none()) {
        Some(slot) => SeedDrive::Attach(slot.to_string()),
        None => SeedDrive::NoFreeSlot,
    }
}

/// The value of an attached seed drive, and of an emptied one.
pub fn cdrom_value(volid: Option<&str>) -> String {
    format!("{},media=cdrom", volid.unwrap_or("none"))
}

// -------------------------------------------------------------- conditions

/// What a task of a type is doing, for the reason while it runs.
pub fn task_reason(task_type: &str) -> (&'static str, &'static str) {
    match task_type {
        "qmclone" => (reason::CLONING, reason::CLONING_FAILED),
        "qmconfig" => (reason::CONFIGURING, reason::CONFIGURATION_FAILED),
        "resize" => (reason::RESIZING_DISK, reason::DISK_RESIZE_FAILED),
        "imgcopy" | "imgdel" => (
            reason::UPLOADING_BOOTSTRAP_DATA,
            reason::BOOTSTRAP_DATA_FAILED,
        ),
        "qmstart" => (reason::POWERING_ON, reason::POWERING_ON_FAILED),
        "qmstop" | "qmdestroy" => (reason::DELETING, reason::DELETION_FAILED),
        _ => (reason::CONFIGURING, reason::TASK_FAILED),
    }
}

/// The pair of conditions a machine reports while not provisioned.
pub fn waiting(reason: &str, message: impl Into<String>) -> [DesiredCondition; 2] {
    let message = message.into();
    [
        DesiredCondition::false_(VM_PROVISIONED, reason, message.clone()),
        DesiredCondition::false_(tenantry_api::contract::READY_CONDITION, reason, message),
    ]
}

/// The `Ready` reason of a machine backing off after a PVE error that no
/// step turned into a reason of its own: the API being unavailable (what
/// settles by itself, and a bare 5xx), or a request it refused.
pub fn backoff_reason(error: &crate::proxmox::client::ProxmoxError) -> &'static str {
    use crate::proxmox::client::ProxmoxError;
    match error {
        ProxmoxError::Rejected { status, .. } if *status >= 500 => reason::PROXMOX_UNAVAILABLE,
        error if error.is_transient() => reason::PROXMOX_UNAVAILABLE,
        _ => reason::PROXMOX_REQUEST_FAILED,
    }
}

/// Reasons that deserve a Warning event when a machine first reports them.
pub fn is_failure(reason: &str) -> bool {
    matches!(
        reason,
        reason::INVALID_SPEC
            | reason::TEMPLATE_NOT_FOUND
            | reason::NODE_CAPACITY_UNKNOWN
            | reason::VMID_RANGE_EXHAUSTED
            | reason::STORAGE_OUTSIDE_POOL
            | reason::CLONING_FAILED
            | reason::VM_OUTSIDE_POOL
            | reason::VM_NOT_OWNED
            | reason::VM_NOT_FOUND
            | reason::CONFIGURATION_FAILED
            | reason::DISK_RESIZE_FAILED
            | reason::IP_ALLOCATION_FAILED
            | reason::IP_ADDRESS_CONFLICT
            | reason::BOOTSTRAP_DATA_FAILED
            | reason::POWERING_ON_FAILED
            | reason::GUEST_AGENT_NOT_CONFIGURED
            | reason::VM_NOT_RUNNING
            | reason::DELETION_FAILED
            | reason::TASK_FAILED
            | reason::PROXMOX_REQUEST_FAILED
            | reason::BOOTSTRAP_DATA_SECRET_MISSING
            | reason::PROXMOX_CLUSTER_NOT_FOUND
    ) || reason.starts_with("Credentials")
        || matches!(
            reason,
            "Unauthorized"
                | "PermissionDenied"
                | "TLSHandshakeFailed"
                | "InsufficientResources"
                | "NoNodeAvailable"
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tenantry_api::proxmox::{
        DiskSize, IpConfigSpec, IpPoolReference, NetworkModel, Storage, TemplateSelector,
        ZoneConfigSpec,
    };

    fn config(value: serde_json::Value) -> VmConfig {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_backoff_names_an_unavailable_api_or_the_refused_request() {
        use crate::proxmox::client::ProxmoxError;
        let bare_500 = ProxmoxError::Rejected {
            status: 500,
            message: "Internal Server Error".into(),
        };
        let unavailable = ProxmoxError::Unavailable {
            status: 503,
            message: "Service Unavailable".into(),
        };
        let refused = ProxmoxError::Rejected {
            status: 400,
            message: "shrinking disks is not supported".into(),
        };
        let missing = ProxmoxError::NotFound {
            message: "no such pool".into(),
        };
        assert_eq!(backoff_reason(&bare_500), reason::PROXMOX_UNAVAILABLE);
        assert_eq!(backoff_reason(&unavailable), reason::PROXMOX_UNAVAILABLE);
        assert_eq!(backoff_reason(&refused), reason::PROXMOX_REQUEST_FAILED);
        assert_eq!(backoff_reason(&missing), reason::PROXMOX_REQUEST_FAILED);
        assert!(is_failure(reason::PROXMOX_REQUEST_FAILED));
        assert!(!is_failure(reason::PROXMOX_UNAVAILABLE));
        assert!(!is_failure(reason::WAITING_FOR_TURN));
    }

    fn resources(value: serde_json::Value) -> Vec<ClusterResource> {
        serde_json::from_value(value).unwrap()
    }

    fn ip_address(
        name: &str,
        pool: &str,
        address: &str,
        created: &str,
    ) -> tenantry_api::generated::capi::ip_address::IpAddress {
        serde_json::from_value(json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddress",
            "metadata": { "name": name, "namespace": "default", "creationTimestamp": created },
            "spec": {
                "address": address,
                "prefix": 24,
                "claimRef": { "name": name },
                "poolRef": { "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": pool },
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_newer_of_two_ipaddresses_with_one_address_gives_it_up() {
        let older = ip_address("a-net0", "workers", "10.0.0.10", "2026-12-04T07:00:00Z");
        let newer = ip_address("b-net0", "workers", "10.0.0.10", "2026-12-04T07:00:05Z");
        let elsewhere = ip_address("c-net0", "other", "10.0.0.10", "2026-12-04T06:00:00Z");
        let all = vec![older.clone(), newer.clone(), elsewhere];
        let conflicts = address_conflicts(&[("b-net0".into(), newer)], &all);
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].claim, "b-net0");
        assert!(
            conflicts[0].message.contains("10.0.0.10") && conflicts[0].message.contains("a-net0"),
            "{}",
            conflicts[0].message
        );
        // The older keeps it; a pool of its own is no conflict.
        assert!(address_conflicts(&[("a-net0".into(), older)], &all).is_empty());
        // Same second: the later name gives it up.
        let twin = ip_address("a-net1", "workers", "10.0.0.11", "2026-12-04T07:00:00Z");
        let twin2 = ip_address("b-net1", "workers", "10.0.0.11", "2026-12-04T07:00:00Z");
        let all = vec![twin.clone(), twin2.clone()];
        assert!(address_conflicts(&[("a-net1".into(), twin)], &all).is_empty());
        assert_eq!(
            address_conflicts(&[("b-net1".into(), twin2)], &all).len(),
            1
        );
    }

    #[test]
    fn descriptions_carry_the_identity_and_keep_the_users_text() {
        let description = vm_description(Some("tenant A worker"), "tenant-a", "w-1", "1234");
        assert_eq!(
            description,
            "tenant A worker\n\ntenantry.dev/proxmoxmachine: tenant-a/w-1 uid=1234"
        );
        assert_eq!(described_owner(&description), Some("tenant-a/w-1"));
        assert_eq!(
            described_owner(&vm_description(None, "a", "b", "c")),
            Some("a/b")
        );
        assert_eq!(described_owner("just notes"), None);
    }

    #[test]
    fn a_vm_is_ours_by_name_and_identity() {
        let ours = vm_description(None, "ns", "w-1", "u");
        assert_eq!(
            ownership("ns", "w-1", Some("w-1"), Some(&ours)),
            Ownership::Ours
        );
        // capmox's clones: the name only.
        assert_eq!(ownership("ns", "w-1", Some("w-1"), None), Ownership::Ours);
        // Same name, other machine (another namespace).
        let theirs = vm_description(None, "other", "w-1", "u");
        assert!(matches!(
            ownership("ns", "w-1", Some("w-1"), Some(&theirs)),
            Ownership::Other { owner: Some(_), .. }
        ));
        assert!(matches!(
            ownership("ns", "w-1", Some("w-2"), None),
            Ownership::Other { owner: None, .. }
        ));
    }

    #[test]
    fn a_reserved_id_is_cloned_into_waited_for_or_given_up() {
        let judge = |presence: &VmPresence, running: bool| {
            judge_vm(
                "ns",
                "w-1",
                Some("pool-a"),
                105,
                VmidSource::Reserved,
                presence,
                running,
            )
        };
        assert_eq!(judge(&VmPresence::Free, false), VmVerdict::Clone);
        assert_eq!(judge(&VmPresence::Elsewhere, true), VmVerdict::WaitForClone);
        assert!(matches!(
            judge(&VmPresence::Elsewhere, false),
            VmVerdict::Repick { .. }
        ));
        let other = VmPresence::InPool {
            name: Some("w-2".into()),
            description: Some(vm_description(None, "ns", "w-2", "u")),
        };
        match judge(&other, true) {
            VmVerdict::Repick { message } => assert!(
                message.contains("belongs to ProxmoxMachine ns/w-2"),
                "{message}"
            ),
            verdict => panic!("{verdict:?}"),
        }
        let ours = VmPresence::InPool {
            name: Some("w-1".into()),
            description: Some(vm_description(None, "ns", "w-1", "u")),
        };
        assert_eq!(judge(&ours, false), VmVerdict::Ours);
    }

    #[test]
    fn a_vm_named_in_the_spec_outside_the_pool_is_refused() {
        let verdict = judge_vm(
            "ns",
            "w-1",
            Some("tenant-a"),
            201,
            VmidSource::Spec,
            &VmPresence::Elsewhere,
            true,
        );
        match verdict {
            VmVerdict::Refuse { reason, message } => {
                assert_eq!(reason, reason::VM_OUTSIDE_POOL);
                assert!(
                    message.contains("VM 201 is not in pool tenant-a"),
                    "{message}"
                );
            }
            verdict => panic!("{verdict:?}"),
        }
        let other = VmPresence::InPool {
            name: Some("x".into()),
            description: None,
        };
        assert!(matches!(
            judge_vm(
                "ns",
                "w-1",
                Some("tenant-a"),
                201,
                VmidSource::Spec,
                &other,
                false
            ),
            VmVerdict::Refuse {
                reason: reason::VM_NOT_OWNED,
                ..
            }
        ));
        assert!(matches!(
            judge_vm(
                "ns",
                "w-1",
                None,
                201,
                VmidSource::Spec,
                &VmPresence::Free,
                false
            ),
            VmVerdict::Missing { .. }
        ));
    }

    #[test]
    fn vmid_candidates_skip_reserved_ids_and_stay_in_range() {
        let reserved = BTreeSet::from([105, 106]);
        assert_eq!(
            VmidSearch::new(None, Some(104)).candidates(&reserved, 3),
            [104, 107, 108]
        );
        assert_eq!(
            VmidSearch::new(Some((105, 107)), Some(100)).candidates(&reserved, 10),
            [107]
        );
        assert!(
            VmidSearch::new(Some((105, 106)), None)
                .candidates(&reserved, 10)
                .is_empty()
        );
    }

    fn template_rows() -> Vec<ClusterResource> {
        resources(json!([
            { "id": "qemu/9000", "type": "qemu", "vmid": 9000, "node": "pve1", "template": 1, "tags": "talos;v1.13", "maxmem": 2147483648u64, "maxcpu": 2 },
            { "id": "qemu/9001", "type": "qemu", "vmid": 9001, "node": "pve2", "template": 1, "tags": "talos;v1.13", "maxmem": 2147483648u64, "maxcpu": 2 },
            { "id": "qemu/9002", "type": "qemu", "vmid": 9002, "node": "pve1", "template": 1, "tags": "talos;v1.13;gpu" },
            { "id": "qemu/105", "type": "qemu", "vmid": 105, "node": "pve1", "template": 0, "tags": "talos;v1.13" },
        ]))
    }

    #[test]
    fn a_tagged_template_on_the_chosen_node_wins() {
        let tags = vec!["Talos".to_string(), "v1.13".to_string()];
        let selector = CloneSource::Selector {
            match_tags: &tags,
            match_policy: TemplateMatchPolicy::Exact,
        };
        let on_pve2 = choose_template(selector, &template_rows(), Some("pve2")).unwrap();
        assert_eq!((on_pve2.node.as_str(), on_pve2.vmid), ("pve2", 9001));
        assert_eq!(on_pve2.memory, Some(2 << 30));
        assert_eq!(
            choose_template(selector, &template_rows(), None)
                .unwrap()
                .vmid,
            9000
        );
        // uniqueSubset also matches the gpu template: two on pve1.
        let unique = CloneSource::Selector {
            match_tags: &tags,
            match_policy: TemplateMatchPolicy::UniqueSubset,
        };
        assert!(
            choose_template(unique, &template_rows(), None)
                .unwrap_err()
                .contains("tag them apart")
        );
        let best = CloneSource::Selector {
            match_tags: &tags,
            match_policy: TemplateMatchPolicy::BestSubset,
        };
        assert_eq!(
            choose_template(best, &template_rows(), Some("pve1"))
                .unwrap()
                .vmid,
            9000
        );
        let none = vec!["ubuntu".to_string()];
        let missing = CloneSource::Selector {
            match_tags: &none,
            match_policy: TemplateMatchPolicy::Exact,
        };
        assert!(
            choose_template(missing, &template_rows(), None)
                .unwrap_err()
                .contains("[ubuntu]")
        );
    }

    #[test]
    fn a_template_by_id_is_taken_as_named() {
        let source = CloneSource::Template {
            source_node: "pve1",
            template_id: 9000,
        };
        let choice = choose_template(source, &template_rows(), Some("pve2")).unwrap();
        assert_eq!(
            (choice.node.as_str(), choice.vmid, choice.vcpus),
            ("pve1", 9000, Some(2))
        );
        let _ = TemplateSelector::default();
    }

    #[test]
    fn node_capacities_need_node_statistics() {
        let rows = resources(json!([
            { "id": "node/pve1", "type": "node", "node": "pve1", "status": "online", "maxcpu": 16, "maxmem": 68719476736u64 },
            { "id": "qemu/105", "type": "qemu", "vmid": 105, "node": "pve1", "maxmem": 4294967296u64, "maxcpu": 2 },
        ]));
        let nodes = node_capacities(&rows).unwrap();
        assert_eq!(nodes[0].maxcpu, 16);
        assert_eq!(nodes[0].guests.len(), 1);
        let blind = resources(
            json!([{ "id": "node/pve1", "type": "node", "node": "pve1", "status": "online" }]),
        );
        assert_eq!(node_capacities(&blind).unwrap_err(), ["pve1"]);
    }

    #[test]
    fn config_update_sizes_the_clone_and_keeps_the_mac() {
        let current = config(json!({
            "cores": 2, "sockets": 1, "memory": "2048",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1",
        }));
        let spec = ProxmoxMachineSpec {
            num_cores: Some(4),
            num_sockets: Some(1),
            memory_mib: Some(4096),
            network: tenantry_api::proxmox::NetworkSpec {
                network_devices: vec![DeviceSpec {
                    vlan: Some(20),
                    ..DeviceSpec::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let update = config_update(&spec, &current).unwrap();
        let body = serde_json::to_value(&update).unwrap();
        assert_eq!(body["cores"], "4");
        assert_eq!(body["memory"], "4096");
        assert!(body.get("sockets").is_none(), "already 1");
        assert_eq!(
            body["net0"],
            "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20"
        );
        let done = config(json!({
            "cores": 4, "memory": "4096",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20",
        }));
        assert!(
            config_update(&spec, &done).unwrap().is_empty(),
            "nothing left to change"
        );
    }

    #[test]
    fn a_new_device_needs_a_bridge() {
        let spec = ProxmoxMachineSpec {
            network: tenantry_api::proxmox::NetworkSpec {
                network_devices: vec![
                    DeviceSpec::default(),
                    DeviceSpec {
                        name: "net1".into(),
                        model: Some(NetworkModel::E1000),
                        ..DeviceSpec::default()
                    },
                ],
                ..Default::default()
            },
            ..Default::default()
        };
        let current = config(json!({ "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0" }));
        assert!(
            config_update(&spec, &current)
                .unwrap_err()
                .contains("net1 has no bridge")
        );
        let mut with_bridge = spec.clone();
        with_bridge.network.network_devices[1].bridge = Some("vmbr1".into());
        let body = serde_json::to_value(config_update(&with_bridge, &current).unwrap()).unwrap();
        assert_eq!(body["net1"], "e1000,bridge=vmbr1");
        assert!(body.get("net0").is_none());
    }

    #[test]
    fn the_boot_disk_only_grows() {
        let spec = ProxmoxMachineSpec {
            disks: Some(Storage {
                boot_volume: Some(DiskSize {
                    disk: "scsi0".into(),
                    size_gb: 20,
                }),
            }),
            ..Default::default()
        };
        let small = config(json!({ "scsi0": "local-lvm:vm-105-disk-0,iothread=1,size=8G" }));
        assert_eq!(
            boot_disk_growth(&spec, &small).unwrap(),
            Some(("scsi0".into(), 20))
        );
        let big = config(json!({ "scsi0": "local-lvm:vm-105-disk-0,size=20480M" }));
        assert_eq!(boot_disk_growth(&spec, &big).unwrap(), None);
        assert!(
            boot_disk_growth(&spec, &config(json!({})))
                .unwrap_err()
                .contains("no disk scsi0")
        );
        assert_eq!(disk_size("x,size=1.5G"), Some(1_610_612_736));
    }

    fn cluster_spec() -> ProxmoxClusterSpec {
        ProxmoxClusterSpec {
            ipv4_config: Some(IpConfigSpec {
                addresses: vec!["10.0.0.10-10.0.0.20".into()],
                prefix: 24,
                gateway: "10.0.0.1".into(),
                metric: Some(50),
            }),
            dns_servers: vec!["10.0.0.53".into()],
            zone_config: Some(vec![ZoneConfigSpec {
                zone: "zone-a".into(),
                ipv4_config: None,
                ipv6_config: Some(IpConfigSpec {
                    addresses: vec!["2001:db8::10-2001:db8::20".into()],
                    prefix: 64,
                    gateway: "2001:db8::1".into(),
                    metric: None,
                }),
                dns_servers: vec!["2001:db8::53".into()],
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn net0_claims_from_the_clusters_pools_others_from_their_own() {
        let spec = ProxmoxMachineSpec {
            network: tenantry_api::proxmox::NetworkSpec {
                network_devices: vec![
                    DeviceSpec::default(),
                    DeviceSpec {
                        name: "net1".into(),
                        bridge: Some("vmbr1".into()),
                        ip_pool_ref: Some(vec![IpPoolReference {
                            api_group: Some(IPAM_GROUP.into()),
                            kind: "GlobalInClusterIPPool".into(),
                            name: "storage-net".into(),
                        }]),
                        ..DeviceSpec::default()
                    },
                    DeviceSpec {
                        name: "net2".into(),
                        bridge: Some("vmbr2".into()),
                        ..DeviceSpec::default()
                    },
                ],
                ..Default::default()
            },
            ..Default::default()
        };
        let claims = address_claims("w-1", &spec, "demo", &cluster_spec());
        let summary: Vec<(&str, &str, &str)> = claims
            .iter()
            .map(|c| (c.name.as_str(), c.pool_kind.as_str(), c.pool_name.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("w-1-net0-00-inet", "InClusterIPPool", "demo-v4-icip"),
                ("w-1-net1-00-inet", "GlobalInClusterIPPool", "storage-net"),
            ]
        );
        let mut zoned = spec.clone();
        zoned.network.zone = Some("zone-a".into());
        assert_eq!(
            address_claims("w-1", &zoned, "demo", &cluster_spec())[0].pool_name,
            "demo-zone-a-v6-icip"
        );
    }

    #[test]
    fn the_seed_network_matches_devices_by_mac_with_gateway_on_net0() {
        let spec = ProxmoxMachineSpec::default();
        let current = config(json!({ "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0" }));
        let addresses = [DeviceAddress {
            device: "net0".into(),
            address: "10.0.0.12".parse().unwrap(),
            prefix: 24,
            gateway: Some("10.0.0.1".parse().unwrap()),
        }];
        let network = seed_network(&spec, &cluster_spec(), &current, &addresses).unwrap();
        assert_eq!(network.len(), 1);
        assert_eq!(network[0].name, "eth0");
        assert_eq!(network[0].mac.to_string(), "bc:24:11:00:00:01");
        let v4 = network[0].ipv4.unwrap();
        assert_eq!(
            (
                v4.address.to_string(),
                v4.prefix,
                v4.gateway.map(|g| g.to_string()),
                v4.metric
            ),
            ("10.0.0.12".into(), 24, Some("10.0.0.1".into()), Some(50))
        );
        assert_eq!(
            network[0].dns_servers,
            ["10.0.0.53".parse::<IpAddr>().unwrap()]
        );
        let no_mac = config(json!({ "net0": "virtio,bridge=vmbr0" }));
        assert!(
            seed_network(&spec, &cluster_spec(), &no_mac, &addresses)
                .unwrap_err()
                .contains("no MAC")
        );
    }

    #[test]
    fn addresses_list_the_hostname_then_net0() {
        let addresses = [
            DeviceAddress {
                device: "net1".into(),
                address: "192.168.0.5".parse().unwrap(),
                prefix: 24,
                gateway: None,
            },
            DeviceAddress {
                device: "net0".into(),
                address: "10.0.0.12".parse().unwrap(),
                prefix: 24,
                gateway: None,
            },
        ];
        let list = machine_addresses("w-1", &addresses);
        let text: Vec<String> = list
            .iter()
            .map(|a| format!("{:?}={}", a.type_, a.address))
            .collect();
        assert_eq!(
            text,
            [
                "Hostname=w-1",
                "InternalIP=10.0.0.12",
                "InternalIP=192.168.0.5"
            ]
        );
    }

    #[test]
    fn iso_storage_is_explicit_or_the_first_by_name() {
        let storages: Vec<StorageSummary> = serde_json::from_value(json!([
            { "storage": "zeta", "content": "iso", "enabled": 1 },
            { "storage": "local-lvm", "content": "images" },
            { "storage": "local", "content": "iso,vztmpl" },
            { "storage": "alpha", "content": "iso", "enabled": 0 },
        ]))
        .unwrap();
        assert_eq!(iso_storage(None, &storages).unwrap(), "local");
        assert_eq!(
            iso_storage(Some("tenant-iso"), &storages).unwrap(),
            "tenant-iso"
        );
        assert!(
            iso_storage(None, &[])
                .unwrap_err()
                .contains("spec.isoStorage")
        );
    }

    #[test]
    fn the_seed_takes_an_empty_cdrom_else_a_free_slot() {
        let volid = "local:iso/tenantry-u.iso";
        let attached = config(json!({ "ide2": "local:iso/tenantry-u.iso,media=cdrom" }));
        assert_eq!(
            seed_drive(&attached, volid),
            SeedDrive::Attached("ide2".into())
        );
        let empty = config(
            json!({ "ide0": "local-lvm:vm-1-cloudinit,media=cdrom", "ide2": "none,media=cdrom" }),
        );
        assert_eq!(seed_drive(&empty, volid), SeedDrive::Attach("ide2".into()));
        let busy = config(json!({ "ide0": "local-lvm:vm-1-disk-1", "ide1": "x" }));
        assert_eq!(seed_drive(&busy, volid), SeedDrive::Attach("ide2".into()));
        assert_eq!(
            cdrom_value(Some(volid)),
            "local:iso/tenantry-u.iso,media=cdrom"
        );
        assert_eq!(cdrom_value(None), "none,media=cdrom");
    }

    #[test]
    fn the_guest_must_report_every_static_address() {
        let interfaces: Vec<GuestInterface> = vec![GuestInterface {
            name: "eth0".into(),
            mac: None,
            addresses: vec![crate::proxmox::client::GuestIpAddress {
                ip: "10.0.0.12".parse().unwrap(),
                prefix: 24,
            }],
        }];
        assert!(guest_reports_all(
            &["10.0.0.12".parse().unwrap()],
            &interfaces
        ));
        assert!(!guest_reports_all(
            &["10.0.0.12".parse().unwrap(), "10.0.0.13".parse().unwrap()],
            &interfaces
        ));
    }
}
