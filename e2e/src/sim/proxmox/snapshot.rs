//! A read-only copy of the simulated cluster for test assertions.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::guest::{self, GuestState, NoCloud};
use super::state::{Cluster, Power};
use super::tasks::TaskStatus;
use super::vm_config::{NetDevice, is_net_key, smbios_uuid};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub nodes: Vec<NodeSnapshot>,
    pub vms: Vec<VmSnapshot>,
    pub volumes: Vec<VolumeSnapshot>,
    pub pools: Vec<PoolSnapshot>,
    pub tasks: Vec<TaskSnapshot>,
    pub users: Vec<UserSnapshot>,
    pub acl: Vec<AclSnapshot>,
}

impl ClusterSnapshot {
    pub fn vm(&self, vmid: u32) -> Option<&VmSnapshot> {
        self.vms.iter().find(|vm| vm.vmid == vmid)
    }

    pub fn task(&self, upid: &str) -> Option<&TaskSnapshot> {
        self.tasks.iter().find(|t| t.upid == upid)
    }

    pub fn pool(&self, poolid: &str) -> Option<&PoolSnapshot> {
        self.pools.iter().find(|p| p.poolid == poolid)
    }

    pub fn volume(&self, volid: &str) -> Option<&VolumeSnapshot> {
        self.volumes.iter().find(|v| v.volid == volid)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub name: String,
    pub online: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmPower {
    Stopped,
    Running,
    Paused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestPhase {
    Off,
    Booting,
    Up,
    Hung,
}

/// The NoCloud seed of a VM as the guest sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSnapshot {
    pub volid: String,
    pub label: String,
    pub user_data: String,
    pub meta_data: String,
    pub network_config: Option<String>,
    /// Why the network config could not be used, if it could not.
    pub network_error: Option<String>,
}

impl From<&NoCloud> for SeedSnapshot {
    fn from(seed: &NoCloud) -> Self {
        Self {
            volid: seed.volid.clone(),
            label: seed.label.clone(),
            user_data: seed.user_data.clone(),
            meta_data: seed.meta_data.clone(),
            network_config: seed.network_config.clone(),
            network_error: seed.network.as_ref().err().cloned(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSnapshot {
    pub vmid: u32,
    pub node: String,
    pub name: String,
    pub pool: Option<String>,
    pub power: VmPower,
    pub lock: Option<String>,
    pub template: bool,
    /// The current config (pending changes not applied).
    pub config: BTreeMap<String, String>,
    pub pending: BTreeMap<String, Option<String>>,
    pub smbios_uuid: Option<String>,
    /// MAC addresses of `net0`, `net1`… in key order.
    pub macs: Vec<String>,
    pub guest: GuestPhase,
    /// The first CD-ROM ISO, parsed now: a seed, or why it is not one.
    pub attached_iso: Option<Result<SeedSnapshot, String>>,
    /// The seed the guest read at its last boot.
    pub seed_read: Option<SeedSnapshot>,
    /// What the guest agent reports (no loopback, no link-local).
    pub ip_addresses: Vec<IpAddr>,
    pub boots: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSnapshot {
    pub volid: String,
    pub storage: String,
    /// The node for local storages, `None` for shared ones.
    pub node: Option<String>,
    pub content: String,
    pub vmid: Option<u32>,
    pub format: String,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub poolid: String,
    pub comment: Option<String>,
    pub vms: Vec<u32>,
    pub storage: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSnapshot {
    pub upid: String,
    pub node: String,
    pub task_type: String,
    pub id: String,
    pub user: String,
    /// `None` while running, else the exit status (`OK` or the error).
    pub exitstatus: Option<String>,
    pub log: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSnapshot {
    pub userid: String,
    pub enable: bool,
    /// Token name -> privilege separated.
    pub tokens: BTreeMap<String, bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclSnapshot {
    pub path: String,
    /// `user`, `group` or `token`.
    pub kind: String,
    pub ugid: String,
    pub role: String,
    pub propagate: bool,
}

pub(crate) fn take(cluster: &Cluster) -> ClusterSnapshot {
    let vms = cluster
        .vms
        .values()
        .map(|vm| {
            let mut nets: Vec<(u32, String)> = vm
                .config
                .iter()
                .filter(|(k, _)| is_net_key(k))
                .filter_map(|(k, v)| Some((k[3..].parse().ok()?, NetDevice::parse(v).ok()?.mac?)))
                .collect();
            nets.sort();
            VmSnapshot {
                vmid: vm.vmid,
                node: vm.node.clone(),
                name: vm.name(),
                pool: cluster.pool_of(vm.vmid),
                power: match vm.power {
                    Power::Stopped => VmPower::Stopped,
                    Power::Running { paused: true, .. } => VmPower::Paused,
                    Power::Running { .. } => VmPower::Running,
                },
                lock: vm.lock().map(str::to_string),
                template: vm.is_template(),
                config: vm.config.clone(),
                pending: vm.pending.clone(),
                smbios_uuid: vm.config.get("smbios1").and_then(|s| smbios_uuid(s)),
                macs: nets.into_iter().map(|(_, mac)| mac).collect(),
                guest: match vm.guest.state {
                    GuestState::Off => GuestPhase::Off,
                    GuestState::Booting => GuestPhase::Booting,
                    GuestState::Up { .. } => GuestPhase::Up,
                    GuestState::Hung => GuestPhase::Hung,
                },
                attached_iso: guest::inspect_iso(cluster, vm)
                    .map(|r| r.as_ref().map(SeedSnapshot::from).map_err(Clone::clone)),
                seed_read: vm.guest.nocloud.as_ref().map(SeedSnapshot::from),
                ip_addresses: guest::reported_addresses(vm),
                boots: vm.guest.boots,
            }
        })
        .collect();
    let volumes = cluster
        .volumes
        .iter()
        .map(|((scope, _), v)| VolumeSnapshot {
            volid: v.volid.clone(),
            storage: v.storage.clone(),
            node: (!scope.is_empty()).then(|| scope.clone()),
            content: v.content.clone(),
            vmid: v.vmid,
            format: v.format.clone(),
            size: v.size,
        })
        .collect();
    let users = &cluster.users;
    ClusterSnapshot {
        nodes: cluster
            .nodes
            .values()
            .map(|n| NodeSnapshot {
                name: n.spec.name.clone(),
                online: n.online,
            })
            .collect(),
        vms,
        volumes,
        pools: users
            .pools
            .iter()
            .map(|(id, p)| PoolSnapshot {
                poolid: id.clone(),
                comment: p.comment.clone(),
                vms: p.vms.iter().copied().collect(),
                storage: p.storage.iter().cloned().collect(),
            })
            .collect(),
        tasks: cluster
            .tasks
            .iter()
            .map(|(upid, t)| TaskSnapshot {
                upid: upid.clone(),
                node: t.upid.node.clone(),
                task_type: t.upid.task_type.clone(),
                id: t.upid.id.clone(),
                user: t.upid.user.clone(),
                exitstatus: match &t.status {
                    TaskStatus::Running => None,
                    TaskStatus::Stopped { exitstatus, .. } => Some(exitstatus.clone()),
                },
                log: t.log.clone(),
            })
            .collect(),
        users: users
            .users
            .iter()
            .map(|(id, u)| UserSnapshot {
                userid: id.clone(),
                enable: u.enable,
                tokens: u
                    .tokens
                    .iter()
                    .map(|(n, t)| (n.clone(), t.privsep))
                    .collect(),
            })
            .collect(),
        acl: users
            .acl
            .iter()
            .flat_map(|(path, node)| {
                [
                    ("user", &node.users),
                    ("group", &node.groups),
                    ("token", &node.tokens),
                ]
                .into_iter()
                .flat_map(move |(kind, entries)| {
                    entries.iter().flat_map(move |(ugid, roles)| {
                        roles.iter().map(move |(role, propagate)| AclSnapshot {
                            path: path.clone(),
                            kind: kind.to_string(),
                            ugid: ugid.clone(),
                            role: role.clone(),
                            propagate: *propagate,
                        })
                    })
                })
            })
            .collect(),
    }
}
