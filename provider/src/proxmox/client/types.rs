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

/// A VM in `GET /nodes/{node}/qemu`.
#[derive(Debug, Clone, Deserialize)]
pub struct VmSummary {
    #[serde(deserialize_with = "number")]
    pub vmid: u32,
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default, deserialize_with = "bool_lenient")]
    pub template: bool,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxmem: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub tags: Option<String>,
    #[serde(default)]
    pub lock: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `running` / `stopped` from `status/current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VmPowerState {
    Running,
    Stopped,
    #[serde(other)]
    Unknown,
}

/// `GET /nodes/{node}/qemu/{vmid}/status/current`.
#[derive(Debug, Clone, Deserialize)]
pub struct VmStatus {
    #[serde(default, deserialize_with = "opt_number")]
    pub vmid: Option<u32>,
    /// PVE reports `VM <vmid>` while the config has no name (mid-clone).
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub name: Option<String>,
    pub status: VmPowerState,
    /// QEMU's own view: `running`, `paused`, `prelaunch`, `suspended`, …
    #[serde(default)]
    pub qmpstatus: Option<String>,
    /// Set while an operation holds the VM (`clone`, `migrate`, `backup`, …).
    #[serde(default)]
    pub lock: Option<String>,
    /// The config enables the guest agent.
    #[serde(default, deserialize_with = "bool_lenient")]
    pub agent: bool,
    #[serde(default, deserialize_with = "bool_lenient")]
    pub template: bool,
    #[serde(default, deserialize_with = "opt_number")]
    pub cpus: Option<f64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub maxmem: Option<u64>,
    #[serde(default, deserialize_with = "opt_number")]
    pub uptime: Option<u64>,
    #[serde(default)]
    pub tags: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl VmStatus {
    pub fn is_running(&self) -> bool {
        self.status == VmPowerState::Running
    }

    /// Running but paused by QEMU (needs `resume`, not `start`).
    pub fn is_paused(&self) -> bool {
        self.qmpstatus.as_deref() == Some("paused")
    }
}

/// `GET /nodes/{node}/qemu/{vmid}/config`: a flat key/value map. The keys
/// tenantry reads are fields; disks, NICs and everything else stay in
/// `extra` and are reached through the helper methods.
#[derive(Debug, Clone, Deserialize)]
pub struct VmConfig {
    /// Changes with every config write; send it back to update optimistically.
    #[serde(default)]
    pub digest: Option<String>,
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub description: Option<String>,
    #[serde(default, deserialize_with = "opt_number")]
    pub cores: Option<u32>,
    #[serde(default, deserialize_with = "opt_number")]
    pub sockets: Option<u32>,
    /// MiB.
    #[serde(default, deserialize_with = "opt_memory_mib")]
    pub memory: Option<u64>,
    /// `uuid=…,manufacturer=…`; see [`VmConfig::smbios_uuid`].
    #[serde(default)]
    pub smbios1: Option<String>,
    #[serde(default)]
    pub tags: Option<String>,
    #[serde(default, deserialize_with = "bool_lenient")]
    pub template: bool,
    /// `1`, or a property string such as `enabled=1,fstrim_cloned_disks=1`.
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub agent: Option<String>,
    #[serde(default)]
    pub lock: Option<String>,
    /// `order=scsi0;net0` (legacy forms like `c` are rejected on write).
    #[serde(default)]
    pub boot: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl VmConfig {
    /// The SMBIOS UUID, which is what `proxmox://<uuid>` provider IDs carry.
    pub fn smbios_uuid(&self) -> Option<&str> {
        property(self.smbios1.as_deref()?, "uuid")
    }

    pub fn tag_list(&self) -> Vec<String> {
        self.tags.as_deref().map(split_list).unwrap_or_default()
    }

    /// Whether the guest agent is enabled (`agent: 1` or `enabled=1,…`).
    pub fn agent_enabled(&self) -> bool {
        self.agent.as_deref().is_some_and(|agent| {
            let first = agent.split(',').next().unwrap_or_default();
            let flag = first.strip_prefix("enabled=").unwrap_or(first);
            matches!(flag.trim(), "1" | "on" | "yes" | "true")
        })
    }

    /// A raw config value by key (`scsi0`, `ide2`, `net0`, `cpu`, …).
    pub fn get(&self, key: &str) -> Option<String> {
        self.extra
            .get(key)
            .and_then(super::serde_helpers::value_to_string)
    }

    /// The `netN` devices, ordered by index.
    pub fn network_devices(&self) -> Vec<(String, NetDevice)> {
        let mut devices: Vec<(u32, String, NetDevice)> = self
            .extra
            .iter()
            .filter_map(|(key, value)| {
                let index: u32 = key.strip_prefix("net")?.parse().ok()?;
                Some((index, key.clone(), NetDevice::parse(value.as_str()?)?))
            })
            .collect();
        devices.sort_by_key(|(index, ..)| *index);
        devices
            .into_iter()
            .map(|(_, key, device)| (key, device))
            .collect()
    }
}

/// The value of `key` in a PVE property string (`a=1,b=2`).
fn property<'a>(properties: &'a str, key: &str) -> Option<&'a str> {
    properties.split(',').find_map(|part| {
        let (k, v) = part.split_once('=')?;
        (k.trim() == key).then_some(v.trim())
    })
}

/// A parsed `netN` value: `virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=10`.
/// The model key carries the MAC; `macaddr=` is the alternative spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDevice {
    pub model: String,
    pub mac: Option<String>,
    pub bridge: Option<String>,
    pub vlan: Option<u16>,
    pub mtu: Option<u16>,
    /// Every `key=value` pair, as PVE wrote them.
    pub properties: BTreeMap<String, String>,
}

const NIC_MODELS: &[&str] = &[
    "virtio",
    "e1000",
    "e1000e",
    "rtl8139",
    "vmxnet3",
    "e1000-82540em",
    "e1000-82544gc",
    "e1000-82545em",
    "i82551",
    "i82557b",
    "i82559er",
    "ne2k_isa",
    "ne2k_pci",
    "pcnet",
];

impl NetDevice {
    pub fn parse(value: &str) -> Option<Self> {
        let mut model = None;
        let mut mac = None;
        let mut properties = BTreeMap::new();
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, val) = match part.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (part, None),
            };
            if model.is_none() && (NIC_MODELS.contains(&key) || key == "model") {
                model = Some(
                    if key == "model" {
                        val.unwrap_or_default()
                    } else {
                        key
                    }
                    .to_owned(),
                );
                if key != "model" {
                    mac = val.filter(|v| !v.is_empty()).map(str::to_owned);
                }
            }
            if key == "macaddr" {
                mac = val.map(str::to_owned);
            }
            properties.insert(key.to_owned(), val.unwrap_or_default().to_owned());
        }
        let get = |key: &str| properties.get(key).cloned();
        Some(Self {
            model: model?,
            mac,
            bridge: get("bridge"),
            vlan: get("tag").and_then(|v| v.parse().ok()),
            mtu: get("mtu").and_then(|v| v.parse().ok()),
            properties,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_and_major() {
        let v: Version = serde_json::from_str(
            r#"{"version":"8.2.4","release":"8.2","repoid":"faa83925c9641325"}"#,
        )
        .unwrap();
        assert_eq!(v.major(), Some(8));
        assert_eq!(v.release.as_deref(), Some("8.2"));
    }

    #[test]
    fn nodes_list() {
        let nodes: Vec<NodeSummary> = serde_json::from_str(
            r#"[{"node":"pve1","status":"online","cpu":0.0123,"maxcpu":16,"mem":8123456789,
                 "maxmem":67345678336,"uptime":123456,"level":"","id":"node/pve1","type":"node",
                 "ssl_fingerprint":"AB:CD"},
                {"node":"pve2","status":"offline","id":"node/pve2","type":"node"}]"#,
        )
        .unwrap();
        assert!(nodes[0].is_online());
        assert_eq!(nodes[0].maxmem, Some(67_345_678_336));
        assert!(!nodes[1].is_online());
        assert_eq!(nodes[1].maxcpu, None);
    }

    #[test]
    fn node_status_memory() {
        let status: NodeStatus = serde_json::from_str(
            r#"{"memory":{"total":67345678336,"used":8123456789,"free":59222221547},
                "cpu":0.02,"uptime":99,"cpuinfo":{"cpus":16,"sockets":1,"model":"AMD EPYC"},
                "loadavg":["0.10","0.20","0.30"],"kversion":"Linux 6.8.12-1-pve"}"#,
        )
        .unwrap();
        assert_eq!(status.memory.total, 67_345_678_336);
        assert!(status.extra.contains_key("kversion"));
    }

    #[test]
    fn cluster_resources_mixed_rows() {
        let rows: Vec<ClusterResource> = serde_json::from_str(
            r#"[{"id":"qemu/9000","type":"qemu","vmid":9000,"node":"pve1","name":"talos-1.8",
                 "status":"stopped","template":1,"tags":"talos;v1.8","maxmem":2147483648,
                 "maxcpu":2,"maxdisk":10737418240,"cpu":0,"mem":0,"uptime":0,"pool":"templates"},
                {"id":"qemu/105","type":"qemu","vmid":"105","node":"pve2","name":"worker-a",
                 "status":"running","template":0,"cpu":0.031,"mem":1073741824,"lock":"clone"},
                {"id":"qemu/106","type":"qemu","vmid":106,"node":"pve2","status":"unknown"},
                {"id":"storage/pve1/local","type":"storage","node":"pve1","storage":"local",
                 "status":"available","content":"iso,vztmpl,backup","shared":0,"plugintype":"dir"},
                {"id":"node/pve1","type":"node","node":"pve1","status":"online"},
                {"id":"sdn/pve1/localnetwork","type":"sdn","node":"pve1","sdn":"localnetwork"},
                {"id":"lxc/200","type":"lxc","vmid":200,"node":"pve1"},
                {"id":"network/pve1/vmbr0","type":"network","node":"pve1"}]"#,
        )
        .unwrap();
        assert!(rows[0].template);
        assert_eq!(rows[0].tag_list(), ["talos", "v1.8"]);
        assert_eq!(rows[1].vmid, Some(105));
        assert!(!rows[1].template);
        assert_eq!(rows[1].lock.as_deref(), Some("clone"));
        assert_eq!(rows[2].name, None);
        assert_eq!(rows[3].resource_type, ResourceType::Storage);
        assert_eq!(rows[3].storage.as_deref(), Some("local"));
        assert_eq!(rows[5].resource_type, ResourceType::Sdn);
        assert_eq!(rows[6].resource_type, ResourceType::Lxc);
        assert_eq!(rows[7].resource_type, ResourceType::Other);
        assert_eq!(rows.iter().filter(|r| r.is_vm()).count(), 3);
    }

    #[test]
    fn qemu_list_per_node() {
        let vms: Vec<VmSummary> = serde_json::from_str(
            r#"[{"vmid":105,"name":"worker-a","status":"running","maxmem":4294967296,"cpus":2,
                 "uptime":100,"pid":12345,"netin":1,"netout":2,"tags":"tenant-a"},
                {"vmid":"9000","name":"talos","status":"stopped","template":1,"maxmem":2147483648}]"#,
        )
        .unwrap();
        assert_eq!(vms[0].vmid, 105);
        assert!(!vms[0].template);
        assert_eq!(vms[1].vmid, 9000);
        assert!(vms[1].template);
    }

    #[test]
    fn vm_status_current() {
        let status: VmStatus = serde_json::from_str(
            r#"{"vmid":105,"name":"VM 105","status":"stopped","qmpstatus":"stopped",
                "lock":"clone","cpus":2,"maxmem":4294967296,"uptime":0,
                "ha":{"managed":0},"diskread":0}"#,
        )
        .unwrap();
        assert!(!status.is_running());
        assert_eq!(status.lock.as_deref(), Some("clone"));
        assert!(!status.agent);
        assert_eq!(status.name.as_deref(), Some("VM 105"));

        let status: VmStatus = serde_json::from_str(
            r#"{"vmid":"105","name":"worker-a","status":"running","qmpstatus":"paused","agent":1,
                "running-qemu":"9.0.2","running-machine":"pc-i440fx-9.0+pve0"}"#,
        )
        .unwrap();
        assert!(status.is_running());
        assert!(status.is_paused());
        assert!(status.agent);
    }

    #[test]
    fn vm_config_fields_and_helpers() {
        let config: VmConfig = serde_json::from_str(
            r#"{"digest":"3f2a…","name":"worker-a","cores":2,"sockets":"1","memory":"4096",
                "smbios1":"uuid=8a8a2f3c-5d3c-4b8e-9e5e-0c2f1f0a9b11,manufacturer=UHJveG1veA==,base64=1",
                "net0":"virtio=BC:24:11:2A:3B:4C,bridge=vmbr0,firewall=1,tag=20,mtu=1450",
                "net1":"e1000=BC:24:11:00:00:01,bridge=vmbr1",
                "net10":"model=virtio,macaddr=BC:24:11:00:00:0A,bridge=vmbr2",
                "scsi0":"local-lvm:vm-105-disk-0,iothread=1,size=20G",
                "ide2":"none,media=cdrom","boot":"order=scsi0;net0","agent":"enabled=1,fstrim_cloned_disks=1",
                "tags":"tenant-a;worker","ostype":"l26","scsihw":"virtio-scsi-single","vmgenid":"x"}"#,
        )
        .unwrap();
        assert_eq!(config.memory, Some(4096));
        assert_eq!(config.sockets, Some(1));
        assert_eq!(
            config.smbios_uuid(),
            Some("8a8a2f3c-5d3c-4b8e-9e5e-0c2f1f0a9b11")
        );
        assert!(config.agent_enabled());
        assert_eq!(config.tag_list(), ["tenant-a", "worker"]);
        assert!(!config.template);
        assert_eq!(
            config.get("scsi0").as_deref(),
            Some("local-lvm:vm-105-disk-0,iothread=1,size=20G")
        );
        let nets = config.network_devices();
        let keys: Vec<&str> = nets.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["net0", "net1", "net10"]);
        let net0 = &nets[0].1;
        assert_eq!(net0.model, "virtio");
        assert_eq!(net0.mac.as_deref(), Some("BC:24:11:2A:3B:4C"));
        assert_eq!(net0.bridge.as_deref(), Some("vmbr0"));
        assert_eq!(net0.vlan, Some(20));
        assert_eq!(net0.mtu, Some(1450));
        assert_eq!(nets[2].1.mac.as_deref(), Some("BC:24:11:00:00:0A"));
    }

    #[test]
    fn template_config_and_disabled_agent() {
        let config: VmConfig = serde_json::from_str(
            r#"{"template":1,"memory":"current=2048","agent":"0","net0":"virtio,bridge=vmbr0"}"#,
        )
        .unwrap();
        assert!(config.template);
        assert_eq!(config.memory, Some(2048));
        assert!(!config.agent_enabled());
        // A NIC without a MAC yet (PVE generates one on clone/config).
        assert_eq!(config.network_devices()[0].1.mac, None);
        assert_eq!(config.smbios_uuid(), None);
    }

    #[test]
    fn storage_list_and_content() {
        let storages: Vec<StorageSummary> = serde_json::from_str(
            r#"[{"storage":"local","type":"dir","content":"iso,vztmpl,backup","enabled":1,"active":1,
                 "shared":0,"total":100861726720,"used":12345,"avail":100861714375,"used_fraction":0.0001},
                {"storage":"local-lvm","type":"lvmthin","content":"rootdir,images","active":1,"shared":0},
                {"storage":"nfs-iso","type":"nfs","content":"iso","enabled":0,"active":0,"shared":1}]"#,
        )
        .unwrap();
        assert!(storages[0].holds("iso"));
        assert!(!storages[1].holds("iso"));
        assert!(storages[1].is_enabled());
        assert!(!storages[2].is_enabled());
        assert!(storages[2].shared);

        let content: Vec<StorageContent> = serde_json::from_str(
            r#"[{"volid":"local:iso/user-data-105.iso","content":"iso","format":"iso","size":372736,"ctime":1716580771},
                {"volid":"local-lvm:vm-105-disk-0","content":"images","format":"raw","size":21474836480,"vmid":"105"}]"#,
        )
        .unwrap();
        assert_eq!(content[0].volid, "local:iso/user-data-105.iso");
        assert_eq!(content[1].vmid, Some(105));
    }

    #[test]
    fn pools_with_members() {
        let pools: Vec<Pool> = serde_json::from_str(
            r#"[{"poolid":"tenant-a","comment":"tenant A workers","members":[
                  {"id":"qemu/105","type":"qemu","vmid":105,"node":"pve1","name":"worker-a","status":"running"},
                  {"id":"storage/pve1/local-lvm","type":"storage","node":"pve1","storage":"local-lvm"}]},
                {"poolid":"templates"}]"#,
        )
        .unwrap();
        assert_eq!(pools[0].vmids(), [105]);
        assert!(pools[0].contains_vm(105));
        assert!(!pools[0].contains_vm(106));
        assert!(pools[1].members.is_empty());
        assert_eq!(pools[0].members[1].member_type, ResourceType::Storage);
    }

    #[test]
    fn permissions_map() {
        let perms: Permissions = serde_json::from_str(
            r#"{"/":{"Sys.Audit":0},"/pool/tenant-a":{"VM.Allocate":1,"VM.Clone":1,"VM.Audit":"1"},
                "/vms/105":{"VM.PowerMgmt":1}}"#,
        )
        .unwrap();
        assert!(perms.has("/", "Sys.Audit"));
        assert!(
            !perms.at("/").unwrap()["Sys.Audit"],
            "held but not propagated"
        );
        assert!(perms.at("/pool/tenant-a").unwrap()["VM.Audit"]);
        assert!(!perms.has("/vms/105", "VM.Allocate"));
        assert!(!perms.has("/storage/local", "Datastore.Audit"));
    }

    #[test]
    fn acl_entries() {
        let acl: Vec<AclEntry> = serde_json::from_str(
            r#"[{"path":"/pool/tenant-a","roleid":"PVEVMAdmin","type":"token","ugid":"capmox@pve!capi","propagate":1},
                {"path":"/","roleid":"PVEAuditor","type":"group","ugid":"ops","propagate":0}]"#,
        )
        .unwrap();
        assert_eq!(acl[0].subject, AclSubject::Token);
        assert!(acl[0].propagate);
        assert!(!acl[1].propagate);
    }

    #[test]
    fn guest_interfaces_with_prefixes() {
        let raw: AgentResult<Vec<RawGuestInterface>> = serde_json::from_str(
            r#"{"result":[
                {"name":"lo","hardware-address":"00:00:00:00:00:00","ip-addresses":[
                    {"ip-address-type":"ipv4","ip-address":"127.0.0.1","prefix":8},
                    {"ip-address-type":"ipv6","ip-address":"::1","prefix":128}],
                 "statistics":{"rx-bytes":1}},
                {"name":"eth0","hardware-address":"bc:24:11:2a:3b:4c","ip-addresses":[
                    {"ip-address-type":"ipv4","ip-address":"10.0.0.15","prefix":24},
                    {"ip-address-type":"ipv6","ip-address":"fe80::be24:11ff:fe2a:3b4c%eth0","prefix":64},
                    {"ip-address-type":"ipv4","ip-address":"not-an-ip","prefix":24}]},
                {"name":"cilium_host"}]}"#,
        )
        .unwrap();
        let interfaces: Vec<GuestInterface> = raw.result.into_iter().map(Into::into).collect();
        assert!(interfaces[0].is_loopback());
        let eth0 = &interfaces[1];
        assert!(!eth0.is_loopback());
        assert_eq!(eth0.mac.as_deref(), Some("bc:24:11:2a:3b:4c"));
        assert_eq!(
            eth0.addresses,
            [
                GuestIpAddress {
                    ip: "10.0.0.15".parse().unwrap(),
                    prefix: 24
                },
                GuestIpAddress {
                    ip: "fe80::be24:11ff:fe2a:3b4c".parse().unwrap(),
                    prefix: 64
                },
            ]
        );
        assert!(interfaces[2].addresses.is_empty());
        assert_eq!(interfaces[2].mac, None);
    }

    #[test]
    fn guest_os_info() {
        let info: AgentResult<GuestOsInfo> = serde_json::from_str(
            r##"{"result":{"id":"talos","name":"Talos","pretty-name":"Talos (v1.8.0)",
                "version":"v1.8.0","version-id":"v1.8.0","kernel-release":"6.6.52-talos",
                "kernel-version":"#1 SMP","machine":"x86_64"}}"##,
        )
        .unwrap();
        assert_eq!(info.result.id.as_deref(), Some("talos"));
        assert_eq!(info.result.pretty_name.as_deref(), Some("Talos (v1.8.0)"));
        assert!(info.result.extra.contains_key("kernel-version"));
    }
}
