//! The QEMU VM configuration as qemu-server keeps it: a flat map of keys to
//! property strings (`scsi0: local-lvm:vm-100-disk-0,size=32G`,
//! `net0: virtio=BC:24:11:AA:BB:CC,bridge=vmbr0`), with the per-key
//! privileges qemu-server checks and the types the API returns them as.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use rand::Rng;
use regex::Regex;

use super::params::Kind;

/// Keys of `VM.Config.CPU` (qemu-server's `$cpuoptions`).
const CPU_OPTIONS: &[&str] = &[
    "cores", "cpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus", "affinity",
];
/// Keys of `VM.Config.Memory`.
const MEMORY_OPTIONS: &[&str] = &["memory", "balloon", "shares", "allow-ksm"];
/// Keys of `VM.Config.HWType`.
const HWTYPE_OPTIONS: &[&str] = &[
    "acpi", "hotplug", "kvm", "machine", "scsihw", "smbios1", "tablet", "vga", "watchdog",
    "audio0", "rng0",
];
/// Keys of `VM.Config.Options` (`$generaloptions`).
const GENERAL_OPTIONS: &[&str] = &[
    "agent",
    "autostart",
    "bios",
    "description",
    "keyboard",
    "localtime",
    "migrate_downtime",
    "migrate_speed",
    "name",
    "onboot",
    "ostype",
    "protection",
    "reboot",
    "startdate",
    "startup",
    "tdf",
    "template",
];
/// Keys of `VM.Config.Disk` besides drives.
const DISK_OPTIONS: &[&str] = &["boot", "bootdisk", "vmstatestorage"];
/// Keys of `VM.Config.Cloudinit` (or `VM.Config.Network`).
const CLOUDINIT_OPTIONS: &[&str] = &[
    "cicustom",
    "cipassword",
    "citype",
    "ciuser",
    "ciupgrade",
    "nameserver",
    "searchdomain",
    "sshkeys",
];

/// Options a running VM takes at once; the rest waits as pending until the
/// next start (qemu-server's fast-plug options plus default hotplug of
/// network and disk).
const FAST_PLUG: &[&str] = &[
    "name",
    "onboot",
    "shares",
    "startup",
    "description",
    "protection",
    "vmstatestorage",
    "hookscript",
    "tags",
];

/// Keys the API returns as integers rather than strings.
const INTEGER_KEYS: &[&str] = &[
    "cores",
    "sockets",
    "vcpus",
    "template",
    "onboot",
    "numa",
    "kvm",
    "acpi",
    "tablet",
    "protection",
    "cpuunits",
    "balloon",
    "shares",
    "localtime",
    "reboot",
    "migrate_speed",
    "tdf",
    "autostart",
];

/// The disk bus prefixes and how many slots each has.
const DRIVE_BUSES: &[(&str, u32)] = &[("ide", 4), ("sata", 6), ("scsi", 31), ("virtio", 16)];

pub fn is_drive_key(key: &str) -> bool {
    if key == "efidisk0" || key == "tpmstate0" {
        return true;
    }
    DRIVE_BUSES
        .iter()
        .any(|(bus, count)| indexed(key, bus, *count))
}

/// Drive keys in the order a guest firmware enumerates them.
pub fn drive_keys() -> impl Iterator<Item = String> {
    DRIVE_BUSES
        .iter()
        .flat_map(|(bus, count)| (0..*count).map(move |i| format!("{bus}{i}")))
}

fn indexed(key: &str, prefix: &str, count: u32) -> bool {
    key.strip_prefix(prefix)
        .and_then(|n| {
            if n.len() > 1 && n.starts_with('0') {
                return None;
            }
            n.parse::<u32>().ok()
        })
        .is_some_and(|n| n < count)
}

pub fn is_net_key(key: &str) -> bool {
    indexed(key, "net", 32)
}

/// Which parameter kind a VM config key has, or `None` for unknown keys.
pub fn config_key_kind(key: &str) -> Option<Kind> {
    if is_drive_key(key)
        || is_net_key(key)
        || indexed(key, "unused", 256)
        || indexed(key, "ipconfig", 32)
        || indexed(key, "serial", 4)
        || indexed(key, "usb", 14)
        || indexed(key, "hostpci", 16)
        || indexed(key, "numa", 8)
    {
        return Some(Kind::String);
    }
    if INTEGER_KEYS.contains(&key) {
        return Some(match key {
            "cores" | "sockets" | "vcpus" => Kind::int_min(1),
            "template" | "onboot" | "numa" | "kvm" | "acpi" | "tablet" | "protection"
            | "localtime" | "reboot" | "autostart" => Kind::Boolean,
            _ => Kind::int(),
        });
    }
    let known = CPU_OPTIONS
        .iter()
        .chain(MEMORY_OPTIONS)
        .chain(HWTYPE_OPTIONS)
        .chain(GENERAL_OPTIONS)
        .chain(DISK_OPTIONS)
        .chain(CLOUDINIT_OPTIONS)
        .chain(&[
            "tags",
            "vmgenid",
            "meta",
            "lock",
            "args",
            "hookscript",
            "freeze",
            "cdrom",
        ])
        .any(|k| *k == key);
    known.then_some(Kind::String)
}

/// The privileges one config key needs, as `check_vm_modify_config_perm`
/// decides (drives, `tags` and devices are checked elsewhere by value).
pub enum KeyPrivilege {
    All(&'static [&'static str]),
    Any(&'static [&'static str]),
    /// Checked per value (drives) or by the tag rules.
    ByValue,
    RootOnly,
}

pub fn key_privilege(key: &str) -> KeyPrivilege {
    if is_drive_key(key)
        || key == "cdrom"
        || key == "tags"
        || indexed(key, "unused", 256)
        || indexed(key, "serial", 4)
        || indexed(key, "usb", 14)
        || indexed(key, "hostpci", 16)
    {
        return KeyPrivilege::ByValue;
    }
    if CPU_OPTIONS.contains(&key) || indexed(key, "numa", 8) {
        KeyPrivilege::All(&["VM.Config.CPU"])
    } else if MEMORY_OPTIONS.contains(&key) {
        KeyPrivilege::All(&["VM.Config.Memory"])
    } else if HWTYPE_OPTIONS.contains(&key) {
        KeyPrivilege::All(&["VM.Config.HWType"])
    } else if GENERAL_OPTIONS.contains(&key) {
        KeyPrivilege::All(&["VM.Config.Options"])
    } else if key == "freeze" {
        KeyPrivilege::All(&["VM.PowerMgmt"])
    } else if DISK_OPTIONS.contains(&key) {
        KeyPrivilege::All(&["VM.Config.Disk"])
    } else if is_net_key(key) {
        KeyPrivilege::All(&["VM.Config.Network"])
    } else if CLOUDINIT_OPTIONS.contains(&key) || indexed(key, "ipconfig", 32) {
        KeyPrivilege::Any(&["VM.Config.Cloudinit", "VM.Config.Network"])
    } else {
        // `args`, `lock` and anything new: only root may set them.
        KeyPrivilege::RootOnly
    }
}

pub fn takes_effect_while_running(key: &str) -> bool {
    FAST_PLUG.contains(&key) || is_net_key(key) || is_drive_key(key) || key.starts_with("unused")
}

/// A config value as the API returns it.
pub fn render_value(key: &str, value: &str) -> serde_json::Value {
    if INTEGER_KEYS.contains(&key)
        && let Ok(n) = value.parse::<i64>()
    {
        return serde_json::Value::from(n);
    }
    serde_json::Value::from(value)
}

/// A property string: an optional leading unnamed value, then `k=v` pairs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PropertyString {
    pub first: Option<String>,
    pub options: Vec<(String, String)>,
}

impl PropertyString {
    pub fn parse(text: &str) -> Self {
        let mut parsed = Self::default();
        for (index, part) in text.split(',').enumerate() {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            match part.split_once('=') {
                Some((k, v)) => parsed.options.push((k.to_string(), v.to_string())),
                None if index == 0 => parsed.first = Some(part.to_string()),
                None => parsed.options.push((part.to_string(), String::new())),
            }
        }
        parsed
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.options.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.options.push((key.to_string(), value)),
        }
    }

    pub fn remove(&mut self, key: &str) {
        self.options.retain(|(k, _)| k != key);
    }

    /// Prints the leading value first, then the options sorted by key, as
    /// PVE prints property strings.
    pub fn print(&self) -> String {
        let mut options = self.options.clone();
        options.sort_by(|a, b| a.0.cmp(&b.0));
        let mut parts: Vec<String> = Vec::new();
        if let Some(first) = &self.first {
            parts.push(first.clone());
        }
        parts.extend(options.into_iter().map(|(k, v)| format!("{k}={v}")));
        parts.join(",")
    }
}

/// A drive (`scsi0`, `ide2`…): its volume (or `none`/`cdrom`) and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drive {
    pub file: String,
    pub props: PropertyString,
}

impl Drive {
    pub fn parse(text: &str) -> Option<Self> {
        let mut props = PropertyString::parse(text);
        let file = match props.first.take() {
            Some(file) => file,
            None => {
                let file = props.get("file")?.to_string();
                props.remove("file");
                file
            }
        };
        Some(Self { file, props })
    }

    pub fn is_cdrom(&self) -> bool {
        self.props.get("media") == Some("cdrom")
    }

    pub fn print(&self) -> String {
        let mut props = self.props.clone();
        props.first = Some(self.file.clone());
        props.print()
    }

    /// A `<storage>:<size in GiB>` request for a new disk.
    pub fn new_disk_request(&self) -> Option<(Option<&str>, f64)> {
        static NEW_DISK: LazyLock<Regex> = LazyLock::new(|| {
            Regex::new(r"^(?:([^/:\s]+):)?(\d+(?:\.\d+)?)$").expect("valid regex")
        });
        let captures = NEW_DISK.captures(&self.file)?;
        let size = captures.get(2)?.as_str().parse().ok()?;
        Some((captures.get(1).map(|m| m.as_str()), size))
    }

    /// The storage id of a `storage:volume` volid.
    pub fn storage(&self) -> Option<&str> {
        volid_storage(&self.file)
    }
}

pub fn volid_storage(volid: &str) -> Option<&str> {
    let (storage, rest) = volid.split_once(':')?;
    (!storage.is_empty() && !rest.is_empty()).then_some(storage)
}

/// A network device: model, MAC address and options (`bridge`, `tag`…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDevice {
    pub model: String,
    pub mac: Option<String>,
    pub props: PropertyString,
}

pub const NET_MODELS: &[&str] = &["virtio", "e1000", "e1000e", "rtl8139", "vmxnet3"];

impl NetDevice {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut props = PropertyString::parse(text);
        let mut found: Option<(String, Option<String>)> = None;
        if let Some(first) = props.first.take() {
            found = Some((first, None));
        }
        if found.is_none()
            && let Some(index) = props
                .options
                .iter()
                .position(|(k, _)| NET_MODELS.contains(&k.as_str()))
        {
            let (model, mac) = props.options.remove(index);
            found = Some((model, (!mac.is_empty()).then_some(mac)));
        }
        if let Some(model) = props.get("model").map(str::to_string) {
            props.remove("model");
            let mac = props.get("macaddr").map(str::to_string);
            props.remove("macaddr");
            found = Some((model, mac));
        }
        let (model, mac) = found.ok_or_else(|| "missing network model".to_string())?;
        if !NET_MODELS.contains(&model.as_str()) {
            return Err(format!("invalid network model '{model}'"));
        }
        if let Some(mac) = &mac
            && !is_mac(mac)
        {
            return Err(format!("invalid MAC address '{mac}'"));
        }
        if let Some(tag) = props.get("tag")
            && !tag.parse::<u16>().is_ok_and(|t| (1..=4094).contains(&t))
        {
            return Err(format!("invalid VLAN tag '{tag}'"));
        }
        Ok(Self { model, mac, props })
    }

    pub fn bridge(&self) -> Option<&str> {
        self.props.get("bridge")
    }

    pub fn tag(&self) -> Option<&str> {
        self.props.get("tag")
    }

    pub fn print(&self) -> String {
        let mut props = self.props.clone();
        props.first = Some(match &self.mac {
            Some(mac) => format!("{}={mac}", self.model),
            None => self.model.clone(),
        });
        props.print()
    }
}

fn is_mac(text: &str) -> bool {
    let parts: Vec<&str> = text.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// PVE's default datacenter MAC prefix (`mac_prefix`, Proxmox's OUI).
pub fn random_mac(rng: &mut impl Rng) -> String {
    let bytes: [u8; 3] = rng.random();
    format!(
        "BC:24:11:{:02X}:{:02X}:{:02X}",
        bytes[0], bytes[1], bytes[2]
    )
}

/// A version-4 UUID drawn from the simulator's seeded generator.
pub fn random_uuid(rng: &mut impl Rng) -> uuid::Uuid {
    let bytes: [u8; 16] = rng.random();
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// The `uuid=` of an `smbios1` value.
pub fn smbios_uuid(smbios1: &str) -> Option<String> {
    PropertyString::parse(smbios1)
        .get("uuid")
        .map(str::to_string)
}

/// The boot option must be the `order=` format or the legacy `[acdn]{1,4}`;
/// a legacy value with appended devices (`c;ide0`) is refused (capmox #225).
pub fn valid_boot(value: &str) -> bool {
    static LEGACY: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^[acdn]{1,4}$").expect("valid regex"));
    if LEGACY.is_match(value) {
        return true;
    }
    let props = PropertyString::parse(value);
    if props.first.is_some() {
        return false;
    }
    props.options.iter().all(|(k, v)| {
        k == "order"
            && v.split(';')
                .all(|dev| is_drive_key(dev) || is_net_key(dev) || dev.is_empty())
    })
}

/// PVE's tag format; tags are split on `;`, `,` and spaces.
pub fn parse_tags(value: &str) -> Result<Vec<String>, String> {
    static TAG: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^(?i)[a-z0-9_][a-z0-9_\-\+\.]*$").expect("valid regex"));
    let mut tags: Vec<String> = Vec::new();
    for tag in value
        .split([';', ',', ' '])
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        if !TAG.is_match(tag) {
            return Err(format!("invalid format - invalid tag '{tag}'"));
        }
        if !tags.iter().any(|t| t == tag) {
            tags.push(tag.to_string());
        }
    }
    Ok(tags)
}

/// `dns-name` format of the VM name.
pub fn valid_dns_name(name: &str) -> bool {
    static DNS: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?\.)*[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?$")
            .expect("valid regex")
    });
    DNS.is_match(name)
}

/// Memory in MiB from the `memory` option (`2048` or `current=2048`).
pub fn memory_mib(config: &BTreeMap<String, String>) -> u64 {
    config
        .get("memory")
        .and_then(|m| {
            let props = PropertyString::parse(m);
            props
                .first
                .as_deref()
                .or(props.get("current"))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(512)
}

pub fn cpus(config: &BTreeMap<String, String>) -> u64 {
    let get = |k: &str, default: u64| {
        config
            .get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if let Some(vcpus) = config.get("vcpus").and_then(|v| v.parse().ok()) {
        return vcpus;
    }
    get("sockets", 1) * get("cores", 1)
}

/// PVE's size format (`32G`, `512M`, `4K`, bytes otherwise).
pub fn format_size(bytes: u64) -> String {
    const K: u64 = 1024;
    for (unit, factor) in [
        ("T", K * K * K * K),
        ("G", K * K * K),
        ("M", K * K),
        ("K", K),
    ] {
        if bytes >= factor && bytes.is_multiple_of(factor) {
            return format!("{}{unit}", bytes / factor);
        }
    }
    bytes.to_string()
}

/// Parses `32G`, `+2G`, `1024M`, `4096` (bytes) into (grow, bytes).
pub fn parse_resize(text: &str) -> Option<(bool, u64)> {
    static SIZE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^(\+)?(\d+(?:\.\d+)?)([KMGT])?$").expect("valid regex"));
    let captures = SIZE.captures(text.trim())?;
    let grow = captures.get(1).is_some();
    let number: f64 = captures.get(2)?.as_str().parse().ok()?;
    let factor = match captures.get(3).map(|m| m.as_str()) {
        Some("K") => 1024.0,
        Some("M") => 1024.0 * 1024.0,
        Some("G") => 1024.0 * 1024.0 * 1024.0,
        Some("T") => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    Some((grow, (number * factor) as u64))
}

/// Parses a drive's `size=` option into bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    match parse_resize(text)? {
        (false, bytes) => Some(bytes),
        (true, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_device_round_trips_in_pve_order() {
        let net = NetDevice::parse("virtio=BC:24:11:00:00:01,tag=10,bridge=vmbr0").unwrap();
        assert_eq!(net.model, "virtio");
        assert_eq!(net.mac.as_deref(), Some("BC:24:11:00:00:01"));
        assert_eq!(net.print(), "virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=10");
        let bare = NetDevice::parse("virtio,bridge=vmbr0").unwrap();
        assert_eq!(bare.mac, None);
        assert!(NetDevice::parse("bogus,bridge=vmbr0").is_err());
    }

    #[test]
    fn boot_order_rejects_legacy_with_appended_device() {
        assert!(valid_boot("order=scsi0;ide0;net0"));
        assert!(valid_boot("cdn"));
        assert!(!valid_boot("c;ide0"));
    }

    #[test]
    fn sizes_print_like_pve() {
        assert_eq!(format_size(32 * 1024 * 1024 * 1024), "32G");
        assert_eq!(format_size(1536 * 1024 * 1024), "1536M");
        assert_eq!(parse_resize("+2G"), Some((true, 2 * 1024 * 1024 * 1024)));
        assert_eq!(parse_size("10G"), Some(10 * 1024 * 1024 * 1024));
    }
}
