//! Response types: only the fields tenantry reads, plus `extra` for the rest.
//!
//! Every field PVE may omit is optional or defaulted, and numbers and
//! booleans go through the lenient helpers in `serde_helpers`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::serde_helpers::{
    bool_lenient, number, opt_bool_lenient, opt_memory_mib, opt_number, opt_string_lenient,
    split_list,
};

/// `GET /version`.
#[derive(Debug, Clone, Deserialize)]
pub struct Version {
    /// e.g. `8.2.4`.
    pub version: String,
    /// e.g. `8.2`.
    #[serde(default)]
    pub release: Option<String>,
    #[serde(default)]
    pub repoid: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Version {
    /// The major version (`8` for `8.2.4`), to pick privilege names that
    /// changed between releases (PVE 9 split VM.Monitor into VM.GuestAgent.*).
    pub fn major(&self) -> Option<u32> {
        self.version.split('.').next()?.parse().ok()
    }
}

/// A node in `GET /nodes`.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeSummary {
    pub node: String,
    /// `online`, `offline` or `unknown`.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default, deserialize_with = "opt_number")]
    pub cpu: Option<f64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxcpu: Option<u32>,
    #[serde(default, deserialize_with = "opt_number")]
    pub mem: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxmem: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub uptime: Option<u64>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl NodeSummary {
    pub fn is_online(&self) -> bool {
        self.status.as_deref() == Some("online")
    }
}

/// `GET /nodes/{node}/status` (the parts the scheduler reads).
#[derive(Debug, Clone, Deserialize)]
pub struct NodeStatus {
    pub memory: MemoryUsage,
    #[serde(default, deserialize_with = "opt_number")]
    pub cpu: Option<f64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub uptime: Option<u64>,
    #[serde(default)]
    pub cpuinfo: Option<Value>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Bytes.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct MemoryUsage {
    #[serde(deserialize_with = "number")]
    pub total: u64,
    #[serde(default, deserialize_with = "number")]
    pub used: u64,
    #[serde(default, deserialize_with = "number")]
    pub free: u64,
}

/// The `type` filter of `GET /cluster/resources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceFilter {
    Vm,
    Storage,
    Node,
    Sdn,
}

/// A row's `type` in `GET /cluster/resources`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceType {
    Qemu,
    Lxc,
    Node,
    Storage,
    Pool,
    Sdn,
    #[serde(other)]
    Other,
}

/// A row of `GET /cluster/resources`. Name and status come from pvestatd's
/// RRD data, which lags by seconds and says `unknown` for fresh VMs and
/// offline nodes: do not treat them as authoritative.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterResource {
    /// `qemu/105`, `node/pve1`, `storage/pve1/local`.
    pub id: String,
    #[serde(rename = "type")]
    pub resource_type: ResourceType,
    #[serde(default, deserialize_with = "opt_number")]
    pub vmid: Option<u32>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default, deserialize_with = "bool_lenient")]
    pub template: bool,
    /// `;`-separated; see [`ClusterResource::tag_list`].
    #[serde(default)]
    pub tags: Option<String>,
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub lock: Option<String>,
    /// For storage rows.
    #[serde(default)]
    pub storage: Option<String>,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxmem: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub mem: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxcpu: Option<f64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub cpu: Option<f64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxdisk: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub disk: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub uptime: Option<u64>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl ClusterResource {
    pub fn tag_list(&self) -> Vec<String> {
        self.tags.as_deref().map(split_list).unwrap_or_default()
    }

    pub fn is_vm(&self) -> bool {
        self.resource_type == ResourceType::Qemu
    }
}

/// A storage in `GET /nodes/{node}/storage`.
#[derive(Debug, Clone, Deserialize)]
pub struct StorageSummary {
    pub storage: String,
    #[serde(default, rename = "type")]
    pub storage_type: Option<String>,
    /// `iso,vztmpl,backup`; see [`StorageSummary::content_types`].
    #[serde(default)]
    pub content: Option<String>,
    /// Absent means enabled.
    #[serde(default, deserialize_with = "opt_bool_lenient")]
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "opt_bool_lenient")]
    pub active: Option<bool>,
    #[serde(default, deserialize_with = "bool_lenient")]
    pub shared: bool,
    #[serde(default, deserialize_with = "opt_number")]
    pub total: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub used: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub avail: Option<u64>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl StorageSummary {
    pub fn content_types(&self) -> Vec<String> {
        self.content.as_deref().map(split_list).unwrap_or_default()
    }

    pub fn holds(&self, content: &str) -> bool {
        self.content_types().iter().any(|c| c == content)
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

/// A volume in `GET /nodes/{node}/storage/{storage}/content`.
#[derive(Debug, Clone, Deserialize)]
pub struct StorageContent {
    /// `local:iso/user-data-105.iso`.
    pub volid: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default, deserialize_with = "opt_number")]
    pub size: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub vmid: Option<u32>,
    #[serde(default, deserialize_with = "opt_number")]
    pub ctime: Option<i64>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A pool, from `GET /pools` (no members) or `GET /pools?poolid=` (members).
#[derive(Debug, Clone, Deserialize)]
pub struct Pool {
    pub poolid: String,
    #[serde(default)]
    pub comment: Option<String>,
    #[serde(default)]
    pub members: Vec<PoolMember>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Pool {
    /// The vmids of the pool's VMs and containers.
    pub fn vmids(&self) -> Vec<u32> {
        self.members.iter().filter_map(|m| m.vmid).collect()
    }

    pub fn contains_vm(&self, vmid: u32) -> bool {
        self.members.iter().any(|m| m.vmid == Some(vmid))
    }
}

/// A pool member: a VM, container or storage.
#[derive(Debug, Clone, Deserialize)]
pub struct PoolMember {
    /// `qemu/105`, `storage/pve1/local`.
    pub id: String,
    #[serde(rename = "type")]
    pub member_type: ResourceType,
    #[serde(default, deserialize_with = "opt_number")]
    pub vmid: Option<u32>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub name: Option<String>,
    #[serde(default)]
    pub storage: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `GET /access/permissions`: path → privilege → propagates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions(pub BTreeMap<String, BTreeMap<String, bool>>);

impl<'de> Deserialize<'de> for Permissions {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::deserialize(deserializer)?;
        let parsed = raw
            .into_iter()
            .map(|(path, privileges)| {
                let privileges = privileges
                    .into_iter()
                    .map(|(name, value)| {
                        (
                            name,
                            super::serde_helpers::parse_bool(&value).unwrap_or(false),
                        )
                    })
                    .collect();
                (path, privileges)
            })
            .collect();
        Ok(Self(parsed))
    }
}

impl Permissions {
    /// The privileges held exactly at `path`.
    pub fn at(&self, path: &str) -> Option<&BTreeMap<String, bool>> {
        self.0.get(path)
    }

    /// Whether `privilege` is held at `path` (as PVE computed it for that path).
    pub fn has(&self, path: &str, privilege: &str) -> bool {
        self.at(path).is_some_and(|p| p.contains_key(privilege))
    }
}

/// Who an ACL entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AclSubject {
    User,
    Group,
    Token,
    #[serde(other)]
    Other,
}

/// A row of `GET /access/acl`.
#[derive(Debug, Clone, Deserialize)]
pub struct AclEntry {
    pub path: String,
    pub roleid: String,
    #[serde(rename = "type")]
    pub subject: AclSubject,
    /// The user, group or token id.
    pub ugid: String,
    #[serde(default, deserialize_with = "bool_lenient")]
    pub propagate: bool,
}

/// A guest interface from the agent's `network-get-interfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestInterface {
    pub name: String,
    /// As the guest reports it (lowercase on Linux).
    pub mac: Option<String>,
    pub addresses: Vec<GuestIpAddress>,
}

/// An address on a guest interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestIpAddress {
    pub ip: IpAddr,
    pub prefix: u8,
}

impl GuestInterface {
    /// Loopback is never a node address.
    pub fn is_loopback(&self) -> bool {
        self.name == "lo"
            || (!self.addresses.is_empty() && self.addresses.iter().all(|a| a.ip.is_loopback()))
    }
}

/// The agent's raw JSON shape (QEMU guest agent QAPI names).
#[derive(Debug, Deserialize)]
pub(crate) struct RawGuestInterface {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "hardware-address")]
    hardware_address: Option<String>,
    #[serde(default, rename = "ip-addresses")]
    ip_addresses: Vec<RawGuestIp>,
}

#[derive(Debug, Deserialize)]
struct RawGuestIp {
    #[serde(default, rename = "ip-address")]
    ip_address: String,
    #[serde(default, deserialize_with = "opt_number")]
    prefix: Option<u8>,
}

impl From<RawGuestInterface> for GuestInterface {
    fn from(raw: RawGuestInterface) -> Self {
        let addresses = raw
            .ip_addresses
            .into_iter()
            .filter_map(|ip| {
                // Link-local IPv6 may carry a zone (`fe80::1%eth0`).
                let text = ip.ip_address.split('%').next().unwrap_or_default();
                let addr: IpAddr = text.parse().ok()?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                Some(GuestIpAddress {
                    ip: addr,
                    prefix: ip.prefix.unwrap_or(max).min(max),
                })
            })
            .collect();
        Self {
            name: raw.name,
            mac: raw.hardware_address.filter(|m| !m.is_empty()),
            addresses,
        }
    }
}

/// The agent's `get-osinfo`.
#[derive(Debug, Clone, Deserialize)]
pub struct GuestOsInfo {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, rename = "pretty-name")]
    pub pretty_name: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default, rename = "version-id")]
    pub version_id: Option<String>,
    #[serde(default, rename = "kernel-release")]
    pub kernel_release: Option<String>,
    #[serde(default)]
    pub machine: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Agent answers are wrapped: `{"data": {"result": …}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct AgentResult<T> {
    pub result: T,
}

mod vm;
pub use vm::*;

#[cfg(test)]
mod tests;
