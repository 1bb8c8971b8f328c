//! The NoCloud seed a Proxmox VM boots with: `meta-data`, `network-config`
//! and `user-data` on an ISO 9660 image labelled `cidata`, attached as a
//! CD-ROM. Talos' `nocloud` platform and cloud-init both look for that label
//! and read those three files from the root directory.
//!
//! Everything here is pure: [`NoCloudSeed::render`] turns what the reconciler
//! observed (the VM's SMBIOS uuid and MACs, the machine's name, its static
//! addresses, the bootstrap data) into the files and the image. The same
//! input always renders to the same bytes, so a reconciler can compare a
//! fresh render with what it uploaded before.
//!
//! Choices, and the upstream behaviour behind them:
//! - `network-config` is version 2 **without** a top-level `network:` key.
//!   Talos reads the wrapped form only since 1.9 and failed on it before
//!   ("network-config metadata version=0 is not supported", capmox #51);
//!   cloud-init reads both. Talos matches `ethernets` entries by
//!   `match.macaddress` since 1.5 (older releases used the key as the link
//!   name, and only keys starting with `eth`), so keys are the guest names
//!   `eth0`, `eth1`… and every entry carries its MAC.
//! - Default gateways are written as routes to `0.0.0.0/0` / `::/0`, which
//!   Talos (1.5+) and cloud-init both read, instead of netplan's deprecated
//!   `gateway4`/`gateway6`.
//! - Every string value is double-quoted: cloud-init parses with PyYAML
//!   (YAML 1.1), where an unquoted MAC of digits such as `52:54:00:12:34:56`
//!   is a base-60 number and a device called `on` or `no` a boolean.
//! - The image has Joliet and Rock Ridge names: plain ISO 9660 names are
//!   upper-case 8.3 (`USER_DAT.;1`), which neither reader would find.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The volume label both Talos and cloud-init look for.
pub const VOLUME_LABEL: &str = "cidata";
/// File names in the image's root directory.
pub const META_DATA: &str = "meta-data";
pub const NETWORK_CONFIG: &str = "network-config";
pub const USER_DATA: &str = "user-data";

/// Prefix of every seed ISO tenantry uploads; see [`iso_file_name`].
pub const ISO_FILE_PREFIX: &str = "tenantry-";

/// What the seed's `user-data` carries: the machine's bootstrap data, for
/// tenantry usually a Talos machine config (with the cluster's keys), else a
/// `#cloud-config` or any other user-data. It is written byte for byte and
/// never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct UserData(Vec<u8>);

impl UserData {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserData(<{} bytes redacted>)", self.0.len())
    }
}

/// A NIC's MAC address, printed lowercase with colons (PVE prints it
/// uppercase in `netN`; Talos and cloud-init compare ignoring case).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddress([u8; 6]);

impl MacAddress {
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl FromStr for MacAddress {
    type Err = NoCloudError;

    /// `BC:24:11:0A:0B:0C` or `bc:24:11:0a:0b:0c`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || NoCloudError::InvalidMacAddress {
            value: text.to_string(),
        };
        let mut octets = [0u8; 6];
        let mut parts = text.split(':');
        for octet in &mut octets {
            let part = parts.next().ok_or_else(invalid)?;
            // `from_str_radix` alone would take "+a" as 0x0a.
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| invalid())?;
        }
        if parts.next().is_some() {
            return Err(invalid());
        }
        Ok(Self(octets))
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddress({self})")
    }
}

/// A static IPv4 address of a device, with its default gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Static {
    pub address: Ipv4Addr,
    pub prefix: u8,
    /// Becomes the device's IPv4 default route.
    pub gateway: Option<Ipv4Addr>,
    /// Metric of that default route (capmox's `ipv4Config.metric`).
    pub metric: Option<u32>,
}

/// A static IPv6 address of a device, with its default gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Static {
    pub address: Ipv6Addr,
    pub prefix: u8,
    /// Becomes the device's IPv6 default route; may be link-local.
    pub gateway: Option<Ipv6Addr>,
    /// Metric of that default route.
    pub metric: Option<u32>,
}

/// An extra route through a device (capmox's `routes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The destination network: its address (host bits zero) and prefix.
    pub destination: IpAddr,
    pub prefix: u8,
    pub via: IpAddr,
    pub metric: Option<u32>,
}

/// One NIC of the VM and its static configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkDevice {
    /// The guest interface name: the `ethernets` key and cloud-init's
    /// `set-name`. Use `eth<N>` for PVE's `net<N>`: Talos before 1.5 takes
    /// the key as the link name and skips keys not starting with `eth`.
    pub name: String,
    /// The MAC PVE gave `net<N>`; the device is matched by it.
    pub mac: MacAddress,
    pub ipv4: Option<Ipv4Static>,
    pub ipv6: Option<Ipv6Static>,
    pub dns_servers: Vec<IpAddr>,
    pub routes: Vec<Route>,
    pub mtu: Option<u32>,
}

impl NetworkDevice {
    /// A device without addresses, routes or DNS servers.
    pub fn new(name: impl Into<String>, mac: MacAddress) -> Self {
        Self {
            name: name.into(),
            mac,
            ipv4: None,
            ipv6: None,
            dns_servers: Vec::new(),
            routes: Vec::new(),
            mtu: None,
        }
    }
}

/// What one VM's seed says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoCloudSeed {
    /// The VM's SMBIOS uuid (PVE's `smbios1: uuid=…`). cloud-init runs its
    /// per-instance modules again when it changes, so a clone gets a fresh
    /// one and a re-render of the same VM keeps it.
    pub instance_id: String,
    /// The machine's name; written as `local-hostname` and `hostname`.
    pub hostname: String,
    /// `proxmox://<smbios uuid>`, for Talos to set the Node's providerID
    /// (capmox's `providerIDInjection`).
    pub provider_id: Option<String>,
    /// The VM's NICs in `net0`, `net1`… order.
    pub network: Vec<NetworkDevice>,
    pub user_data: UserData,
}

/// The rendered seed: the three files and the image holding them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedSeed {
    pub meta_data: String,
    pub network_config: String,
    pub user_data: UserData,
    pub image: SeedImage,
}

/// An ISO 9660 image labelled `cidata`. It holds the user-data, so `Debug`
/// prints only its size.
#[derive(Clone, PartialEq, Eq)]
pub struct SeedImage(Vec<u8>);

impl SeedImage {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SeedImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SeedImage(<{} bytes>)", self.0.len())
    }
}

/// Why a seed cannot be rendered.
///
/// Every variant but [`NoCloudError::Image`] is bad input (an IP pool
/// handing out an address its gateway is not in, a machine name that is no
/// hostname): it needs a human and retrying does not help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoCloudError {
    #[error("hostname {hostname:?} is not a DNS name: {reason}")]
    InvalidHostname {
        hostname: String,
        reason: &'static str,
    },
    #[error("instance-id {value:?} must be 1 to 255 printable ASCII characters without spaces")]
    InvalidInstanceId { value: String },
    #[error("provider-id {value:?} must be 1 to 255 printable ASCII characters without spaces")]
    InvalidProviderId { value: String },
    #[error("{value:?} is not a MAC address like BC:24:11:0A:0B:0C")]
    InvalidMacAddress { value: String },
    #[error("network device name {name:?}: {reason}")]
    InvalidDeviceName { name: String, reason: &'static str },
    #[error("network device name {name:?} is used twice")]
    DuplicateDeviceName { name: String },
    #[error("MAC address {mac} is used by two network devices")]
    DuplicateMacAddress { mac: MacAddress },
    #[error("network device {device}: address {address}: {reason}")]
    InvalidAddress {
        device: String,
        address: String,
        reason: String,
    },
    #[error("network device {device}: route {route}: {reason}")]
    InvalidRoute {
        device: String,
        route: String,
        reason: String,
    },
    #[error("network device {device}: MTU {mtu} {reason}")]
    InvalidMtu {
        device: String,
        mtu: u32,
        reason: &'static str,
    },
    #[error("machine uid {uid:?} may only hold letters, digits and '-' (1 to 64 characters)")]
    InvalidMachineUid { uid: String },
    /// The ISO writer refused the tree: a bug, not bad input.
    #[error("writing the seed ISO failed: {message}")]
    Image { message: String },
}

impl NoCloudError {
    /// Nothing here gets better by waiting.
    pub fn is_transient(&self) -> bool {
        false
    }

    pub fn needs_human(&self) -> bool {
        !self.is_transient()
    }

    /// CamelCase name for condition reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidHostname { .. }
            | Self::InvalidInstanceId { .. }
            | Self::InvalidProviderId { .. }
            | Self::InvalidMachineUid { .. } => "InvalidSeedMetadata",
            Self::InvalidMacAddress { .. }
            | Self::InvalidDeviceName { .. }
            | Self::DuplicateDeviceName { .. }
            | Self::DuplicateMacAddress { .. }
            | Self::InvalidAddress { .. }
            | Self::InvalidRoute { .. }
            | Self::InvalidMtu { .. } => "InvalidNetworkConfig",
            Self::Image { .. } => "SeedImageFailed",
        }
    }
}

/// The name the seed ISO of a machine is uploaded under:
/// `tenantry-<machine uid>.iso`.
///
/// capmox names it `user-data-<vmid>.iso`, which collides when two
/// management clusters (or two tenants' machines after a vmid is reused)
/// share an ISO storage. The ProxmoxMachine's uid is unique across
/// namespaces and across a delete and re-create of the same name, so one
/// machine never attaches another's seed (which holds that machine's keys).
/// The prefix lets a cleanup find tenantry's ISOs, and the uid leads back
/// to the owner.
pub fn iso_file_name(machine_uid: &str) -> Result<String, NoCloudError> {
    let valid = (1..=64).contains(&machine_uid.len())
        && machine_uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !valid {
        return Err(NoCloudError::InvalidMachineUid {
            uid: machine_uid.to_string(),
        });
    }
    Ok(format!("{ISO_FILE_PREFIX}{machine_uid}.iso"))
}

impl NoCloudSeed {
    /// Checks the seed and renders its files and image.
    pub fn render(&self) -> Result<RenderedSeed, NoCloudError> {
        self.validate()?;
        let meta_data = self.render_meta_data();
        let network_config = self.render_network_config();
        let image = write_image(&[
            (META_DATA, meta_data.as_bytes()),
            (NETWORK_CONFIG, network_config.as_bytes()),
            (USER_DATA, self.user_data.as_bytes()),
        ])?;
        Ok(RenderedSeed {
            meta_data,
            network_config,
            user_data: self.user_data.clone(),
            image,
        })
    }

    /// What [`NoCloudSeed::render`] refuses.
    pub fn validate(&self) -> Result<(), NoCloudError> {
        validate_hostname(&self.hostname)?;
        if !is_token(&self.instance_id) {
            return Err(NoCloudError::InvalidInstanceId {
                value: self.instance_id.clone(),
            });
        }
        if let Some(provider_id) = &self.provider_id
            && !is_token(provider_id)
        {
            return Err(NoCloudError::InvalidProviderId {
                value: provider_id.clone(),
            });
        }
        let mut names = BTreeSet::new();
        let mut macs = BTreeSet::new();
        for device in &self.network {
            validate_device(device)?;
            if !names.insert(device.name.as_str()) {
                return Err(NoCloudError::DuplicateDeviceName {
                    name: device.name.clone(),
                });
            }
            if !macs.insert(device.mac) {
                return Err(NoCloudError::DuplicateMacAddress { mac: device.mac });
            }
        }
        Ok(())
    }

    /// Talos reads `hostname` (falling back to `local-hostname`), cloud-init
    /// `local-hostname`; both read `instance-id`, Talos also `provider-id`.
    fn render_meta_data(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "instance-id: {}", quoted(&self.instance_id));
        let _ = writeln!(out, "local-hostname: {}", quoted(&self.hostname));
        let _ = writeln!(out, "hostname: {}", quoted(&self.hostname));
        if let Some(provider_id) = &self.provider_id {
            let _ = writeln!(out, "provider-id: {}", quoted(provider_id));
        }
        out
    }

    fn render_network_config(&self) -> String {
        let mut out = String::from("version: 2\n");
        if self.network.is_empty() {
            out.push_str("ethernets: {}\n");
            return out;
        }
        out.push_str("ethernets:\n");
        for device in &self.network {
            render_device(&mut out, device);
        }
        out
    }
}

fn render_device(out: &mut String, device: &NetworkDevice) {
    let _ = writeln!(out, "  {}:", quoted(&device.name));
    out.push_str("    match:\n");
    let _ = writeln!(out, "      macaddress: {}", quoted(&device.mac.to_string()));
    // Talos ignores it; cloud-init renames the NIC so the guest's names
    // follow PVE's netN order.
    let _ = writeln!(out, "    set-name: {}", quoted(&device.name));
    if let Some(mtu) = device.mtu {
        let _ = writeln!(out, "    mtu: {mtu}");
    }

    let addresses: Vec<String> = device
        .ipv4
        .map(|v4| format!("{}/{}", v4.address, v4.prefix))
        .into_iter()
        .chain(
            device
                .ipv6
                .map(|v6| format!("{}/{}", v6.address, v6.prefix)),
        )
        .collect();
    if !addresses.is_empty() {
        out.push_str("    addresses:\n");
        for address in &addresses {
            let _ = writeln!(out, "      - {}", quoted(address));
        }
    }

    let defaults = device
        .ipv4
        .and_then(|v4| {
            v4.gateway.map(|gateway| Route {
                destination: Ipv4Addr::UNSPECIFIED.into(),
                prefix: 0,
                via: gateway.into(),
                metric: v4.metric,
            })
        })
        .into_iter()
        .chain(device.ipv6.and_then(|v6| {
            v6.gateway.map(|gateway| Route {
                destination: Ipv6Addr::UNSPECIFIED.into(),
                prefix: 0,
                via: gateway.into(),
                metric: v6.metric,
            })
        }));
    let routes: Vec<Route> = defaults.chain(device.routes.iter().copied()).collect();
    if !routes.is_empty() {
        out.push_str("    routes:\n");
        for route in &routes {
            let to = format!("{}/{}", route.destination, route.prefix);
            let _ = writeln!(out, "      - to: {}", quoted(&to));
            let _ = writeln!(out, "        via: {}", quoted(&route.via.to_string()));
            if let Some(metric) = route.metric {
                let _ = writeln!(out, "        metric: {metric}");
            }
        }
    }

    if !device.dns_servers.is_empty() {
        out.push_str("    nameservers:\n      addresses:\n");
        for server in &device.dns_servers {
            let _ = writeln!(out, "        - {}", quoted(&server.to_string()));
        }
    }
}

/// A YAML double-quoted scalar. JSON's string escapes are a subset of
/// YAML's (1.1 and 1.2), so serde_json's quoting is valid YAML.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serializes")
}

/// Printable ASCII without spaces: what SMBIOS uuids and provider ids are.
fn is_token(text: &str) -> bool {
    (1..=255).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic())
}

/// Writes the files into the root of an ISO 9660 image labelled `cidata`.
///
/// hadris-iso writes Joliet and Rock Ridge names and, reading no clock,
/// dates the volume and every file at one fixed instant (set explicitly
/// here), so the image depends on the files only.
fn write_image(files: &[(&str, &[u8])]) -> Result<SeedImage, NoCloudError> {
    use hadris_fs::{Content, NoClock, Node, Tree};
    use hadris_iso::{IsoId, IsoOptions};
    use hadris_storage::{BlockSize, MemDevice};

    let failed = |error: &dyn fmt::Display| NoCloudError::Image {
        message: error.to_string(),
    };
    let mut tree = Tree::new();
    for (name, data) in files {
        tree.insert(name, Node::file(Content::bytes(data.to_vec())))
            .map_err(|e| failed(&e))?;
    }
    let options = IsoOptions::new()
        .with_id(IsoId::Volume, VOLUME_LABEL)
        .with_id(IsoId::Application, "TENANTRY NOCLOUD SEED")
        .with_joliet()
        .with_rock_ridge()
        .with_time(NoClock::TIME);
    let size = hadris_iso::plan(&tree, &options)
        .map_err(|e| failed(&e))?
        .size();
    let size = usize::try_from(size).map_err(|e| failed(&e))?;
    let block_size = BlockSize::new(2048).expect("2048 is a valid block size");
    let mut device = MemDevice::new(vec![0u8; size], block_size);
    hadris_iso::sync::write(&mut device, &tree, &options).map_err(|e| failed(&e))?;
    Ok(SeedImage(device.into_inner()))
}

mod validate;
use validate::*;

#[cfg(test)]
mod tests;
