//! A VM as PVE reports it: its summary, status, configuration and network
//! devices.

use super::*;

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
            .and_then(super::super::serde_helpers::value_to_string)
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
