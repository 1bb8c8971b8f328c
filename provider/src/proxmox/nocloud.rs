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

/// RFC 1123 host names, as Kubernetes object names already are: Talos
/// splits a dotted name into host and domain, and a label longer than 63
/// characters would be refused by the guest.
fn validate_hostname(hostname: &str) -> Result<(), NoCloudError> {
    let invalid = |reason| NoCloudError::InvalidHostname {
        hostname: hostname.to_string(),
        reason,
    };
    if hostname.is_empty() || hostname.len() > 253 {
        return Err(invalid("it must be 1 to 253 characters long"));
    }
    for label in hostname.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(invalid(
                "each dot-separated label must be 1 to 63 characters long",
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "only lowercase letters, digits, '-' and '.' are allowed",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(invalid("a label must not start or end with '-'"));
        }
    }
    Ok(())
}

fn validate_device(device: &NetworkDevice) -> Result<(), NoCloudError> {
    let name = &device.name;
    let invalid_name = |reason| NoCloudError::InvalidDeviceName {
        name: name.clone(),
        reason,
    };
    // Linux interface names: at most IFNAMSIZ - 1 = 15 bytes.
    if name.is_empty() || name.len() > 15 {
        return Err(invalid_name("it must be 1 to 15 characters long"));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase())
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_'))
    {
        return Err(invalid_name(
            "it must start with a lowercase letter and hold only lowercase letters, digits, '-' and '_'",
        ));
    }

    if let Some(v4) = device.ipv4 {
        check_address(
            name,
            v4.address.into(),
            v4.prefix,
            v4.gateway.map(IpAddr::from),
            v4.metric,
        )?;
    }
    if let Some(v6) = device.ipv6 {
        check_address(
            name,
            v6.address.into(),
            v6.prefix,
            v6.gateway.map(IpAddr::from),
            v6.metric,
        )?;
    }
    for route in &device.routes {
        check_route(device, route)?;
    }
    if let Some(mtu) = device.mtu {
        let invalid_mtu = |reason| NoCloudError::InvalidMtu {
            device: name.clone(),
            mtu,
            reason,
        };
        // RFC 791's minimum for IPv4, RFC 8200's for IPv6; above 65535 the
        // kernel refuses it.
        if !(68..=65535).contains(&mtu) {
            return Err(invalid_mtu("is outside 68..=65535"));
        }
        if device.ipv6.is_some() && mtu < 1280 {
            return Err(invalid_mtu("is below IPv6's minimum of 1280"));
        }
    }
    Ok(())
}

fn max_prefix(address: IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

/// The network `address/prefix` lies in (the address with its host bits
/// cleared).
fn network_of(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// Whether `address` lies in the subnet of `network/prefix`.
fn contains(network: IpAddr, prefix: u8, address: IpAddr) -> bool {
    network.is_ipv4() == address.is_ipv4()
        && network_of(network, prefix) == network_of(address, prefix)
}

fn is_link_local(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

fn check_address(
    device: &str,
    address: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
    metric: Option<u32>,
) -> Result<(), NoCloudError> {
    let invalid = |reason: String| NoCloudError::InvalidAddress {
        device: device.to_string(),
        address: format!("{address}/{prefix}"),
        reason,
    };
    if prefix == 0 || prefix > max_prefix(address) {
        return Err(invalid(format!(
            "prefix must be 1 to {}",
            max_prefix(address)
        )));
    }
    match gateway {
        Some(gateway) if gateway == address => {
            return Err(invalid("the gateway is the address itself".into()));
        }
        // Neither Talos nor cloud-init adds an on-link route for a gateway
        // outside the subnet, so the default route would fail to install.
        // IPv6 routers are usually reached by their link-local address.
        Some(gateway) if !contains(address, prefix, gateway) && !is_link_local(gateway) => {
            return Err(invalid(format!("gateway {gateway} is outside the subnet")));
        }
        None if metric.is_some() => {
            return Err(invalid("a metric is set but no gateway".into()));
        }
        _ => {}
    }
    Ok(())
}

fn check_route(device: &NetworkDevice, route: &Route) -> Result<(), NoCloudError> {
    let invalid = |reason: &str| NoCloudError::InvalidRoute {
        device: device.name.clone(),
        route: format!("{}/{} via {}", route.destination, route.prefix, route.via),
        reason: reason.to_string(),
    };
    if route.destination.is_ipv4() != route.via.is_ipv4() {
        return Err(invalid(
            "destination and gateway are of different IP families",
        ));
    }
    if route.prefix > max_prefix(route.destination) {
        return Err(invalid("prefix is too long"));
    }
    // The kernel refuses a route whose destination has host bits set.
    if network_of(route.destination, route.prefix) != route.destination {
        return Err(invalid("the destination has host bits set"));
    }
    let duplicates_gateway = route.prefix == 0
        && match route.destination {
            IpAddr::V4(_) => device.ipv4.is_some_and(|v4| v4.gateway.is_some()),
            IpAddr::V6(_) => device.ipv6.is_some_and(|v6| v6.gateway.is_some()),
        };
    if duplicates_gateway {
        return Err(invalid(
            "it is a second default route next to the address's gateway",
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "3f2a9c4e-7b1d-4e8a-9c0f-1a2b3c4d5e6f";

    fn mac(text: &str) -> MacAddress {
        text.parse().unwrap()
    }

    fn v4(address: &str, prefix: u8, gateway: Option<&str>) -> Ipv4Static {
        Ipv4Static {
            address: address.parse().unwrap(),
            prefix,
            gateway: gateway.map(|g| g.parse().unwrap()),
            metric: None,
        }
    }

    fn v6(address: &str, prefix: u8, gateway: Option<&str>) -> Ipv6Static {
        Ipv6Static {
            address: address.parse().unwrap(),
            prefix,
            gateway: gateway.map(|g| g.parse().unwrap()),
            metric: None,
        }
    }

    fn seed(network: Vec<NetworkDevice>) -> NoCloudSeed {
        NoCloudSeed {
            instance_id: UUID.into(),
            hostname: "tenant-a-workers-7d9f8-x2k4q".into(),
            provider_id: Some(format!("proxmox://{UUID}")),
            network,
            user_data: UserData::new(
                "version: v1alpha1\nmachine:\n  type: worker\n  token: s3cr3t\n",
            ),
        }
    }

    fn eth0() -> NetworkDevice {
        NetworkDevice::new("eth0", mac("BC:24:11:0A:0B:0C"))
    }

    fn network_config(network: Vec<NetworkDevice>) -> String {
        seed(network).render().unwrap().network_config
    }

    /// Lines joined as a file: each ends in a newline.
    fn file(lines: &[&str]) -> String {
        lines.iter().map(|line| format!("{line}\n")).collect()
    }

    #[test]
    fn meta_data_names_instance_host_and_provider() {
        let rendered = seed(vec![]).render().unwrap();
        assert_eq!(
            rendered.meta_data,
            file(&[
                &format!("instance-id: \"{UUID}\""),
                "local-hostname: \"tenant-a-workers-7d9f8-x2k4q\"",
                "hostname: \"tenant-a-workers-7d9f8-x2k4q\"",
                &format!("provider-id: \"proxmox://{UUID}\""),
            ])
        );
        let mut without = seed(vec![]);
        without.provider_id = None;
        let meta = without.render().unwrap().meta_data;
        assert!(!meta.contains("provider-id"), "{meta}");
    }

    #[test]
    fn ipv4_only_device_gets_address_default_route_and_dns() {
        let mut device = eth0();
        device.ipv4 = Some(Ipv4Static {
            metric: Some(100),
            ..v4("10.10.0.21", 24, Some("10.10.0.1"))
        });
        device.dns_servers = vec!["10.10.0.2".parse().unwrap(), "1.1.1.1".parse().unwrap()];
        assert_eq!(
            network_config(vec![device]),
            file(&[
                "version: 2",
                "ethernets:",
                "  \"eth0\":",
                "    match:",
                "      macaddress: \"bc:24:11:0a:0b:0c\"",
                "    set-name: \"eth0\"",
                "    addresses:",
                "      - \"10.10.0.21/24\"",
                "    routes:",
                "      - to: \"0.0.0.0/0\"",
                "        via: \"10.10.0.1\"",
                "        metric: 100",
                "    nameservers:",
                "      addresses:",
                "        - \"10.10.0.2\"",
                "        - \"1.1.1.1\"",
            ])
        );
    }

    #[test]
    fn ipv6_only_device_may_use_a_link_local_gateway() {
        let mut device = eth0();
        device.ipv6 = Some(v6("2001:db8:10::21", 64, Some("fe80::1")));
        device.dns_servers = vec!["2001:4860:4860::8888".parse().unwrap()];
        assert_eq!(
            network_config(vec![device]),
            file(&[
                "version: 2",
                "ethernets:",
                "  \"eth0\":",
                "    match:",
                "      macaddress: \"bc:24:11:0a:0b:0c\"",
                "    set-name: \"eth0\"",
                "    addresses:",
                "      - \"2001:db8:10::21/64\"",
                "    routes:",
                "      - to: \"::/0\"",
                "        via: \"fe80::1\"",
                "    nameservers:",
                "      addresses:",
                "        - \"2001:4860:4860::8888\"",
            ])
        );
    }

    #[test]
    fn dual_stack_device_lists_ipv4_before_ipv6() {
        let mut device = eth0();
        device.ipv4 = Some(v4("10.10.0.21", 24, Some("10.10.0.1")));
        device.ipv6 = Some(v6("2001:db8:10::21", 64, Some("2001:db8:10::1")));
        device.mtu = Some(1450);
        assert_eq!(
            network_config(vec![device]),
            file(&[
                "version: 2",
                "ethernets:",
                "  \"eth0\":",
                "    match:",
                "      macaddress: \"bc:24:11:0a:0b:0c\"",
                "    set-name: \"eth0\"",
                "    mtu: 1450",
                "    addresses:",
                "      - \"10.10.0.21/24\"",
                "      - \"2001:db8:10::21/64\"",
                "    routes:",
                "      - to: \"0.0.0.0/0\"",
                "        via: \"10.10.0.1\"",
                "      - to: \"::/0\"",
                "        via: \"2001:db8:10::1\"",
            ])
        );
    }

    #[test]
    fn several_devices_keep_their_order_and_extra_routes() {
        let mut public = eth0();
        public.ipv4 = Some(v4("10.10.0.21", 24, Some("10.10.0.1")));
        let mut storage = NetworkDevice::new("eth1", mac("bc:24:11:0a:0b:0d"));
        storage.ipv4 = Some(v4("192.168.50.21", 24, None));
        storage.routes = vec![Route {
            destination: "192.168.0.0".parse().unwrap(),
            prefix: 16,
            via: "192.168.50.1".parse().unwrap(),
            metric: Some(200),
        }];
        storage.mtu = Some(9000);
        let text = network_config(vec![public, storage]);
        assert_eq!(
            text,
            file(&[
                "version: 2",
                "ethernets:",
                "  \"eth0\":",
                "    match:",
                "      macaddress: \"bc:24:11:0a:0b:0c\"",
                "    set-name: \"eth0\"",
                "    addresses:",
                "      - \"10.10.0.21/24\"",
                "    routes:",
                "      - to: \"0.0.0.0/0\"",
                "        via: \"10.10.0.1\"",
                "  \"eth1\":",
                "    match:",
                "      macaddress: \"bc:24:11:0a:0b:0d\"",
                "    set-name: \"eth1\"",
                "    mtu: 9000",
                "    addresses:",
                "      - \"192.168.50.21/24\"",
                "    routes:",
                "      - to: \"192.168.0.0/16\"",
                "        via: \"192.168.50.1\"",
                "        metric: 200",
            ])
        );

        // The structure a YAML reader sees, as Talos' decoder would map it.
        let value: serde_norway::Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(value["version"], serde_norway::Value::from(2));
        let eth1 = &value["ethernets"]["eth1"];
        assert_eq!(eth1["match"]["macaddress"], "bc:24:11:0a:0b:0d");
        assert_eq!(eth1["addresses"][0], "192.168.50.21/24");
        assert_eq!(eth1["routes"][0]["metric"], serde_norway::Value::from(200));
        assert!(value.get("network").is_none(), "no top-level network: key");
    }

    #[test]
    fn no_devices_render_an_empty_version_2_config() {
        let text = network_config(vec![]);
        assert_eq!(text, "version: 2\nethernets: {}\n");
        let value: serde_norway::Value = serde_norway::from_str(&text).unwrap();
        assert!(value["ethernets"].as_mapping().unwrap().is_empty());
    }

    #[test]
    fn mac_addresses_parse_in_either_case_and_print_lowercase() {
        assert_eq!(mac("BC:24:11:AA:bb:0c").to_string(), "bc:24:11:aa:bb:0c");
        for bad in [
            "",
            "bc:24:11:aa:bb",
            "bc:24:11:aa:bb:0c:01",
            "bc-24-11-aa-bb-0c",
            "bc:24:11:aa:bb:0g",
            "bc:24:11:aa:bb:c",
            "+c:24:11:aa:bb:0c",
            "bc:24:11:aa:bb:+c",
        ] {
            assert!(
                matches!(
                    bad.parse::<MacAddress>(),
                    Err(NoCloudError::InvalidMacAddress { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn user_data_is_passed_through_byte_for_byte() {
        // Not UTF-8, CRLF line ends, no final newline: nothing is touched.
        let bytes = b"#cloud-config\r\nwrite_files: []\r\n\xff\xfe\x00tail".to_vec();
        let mut input = seed(vec![]);
        input.user_data = UserData::new(bytes.clone());
        let rendered = input.render().unwrap();
        assert_eq!(rendered.user_data.as_bytes(), bytes.as_slice());
        let image = rendered.image.as_bytes();
        assert!(
            image.windows(bytes.len()).any(|w| w == bytes.as_slice()),
            "the image holds the user-data unchanged"
        );
    }

    #[test]
    fn image_is_iso9660_labelled_cidata() {
        let rendered = seed(vec![]).render().unwrap();
        let image = rendered.image.as_bytes();
        // The primary volume descriptor: sector 16, type 1, "CD001", and
        // the volume identifier at bytes 40..72, padded with spaces.
        let pvd = &image[16 * 2048..17 * 2048];
        assert_eq!(pvd[0], 1);
        assert_eq!(&pvd[1..6], b"CD001");
        assert_eq!(String::from_utf8_lossy(&pvd[40..72]).trim_end(), "cidata");
        assert_eq!(image.len() % 2048, 0);
    }

    #[test]
    fn rendering_twice_gives_identical_bytes() {
        let mut device = eth0();
        device.ipv4 = Some(v4("10.10.0.21", 24, Some("10.10.0.1")));
        let input = seed(vec![device]);
        let first = input.render().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert_eq!(first, input.render().unwrap());
    }

    #[test]
    fn debug_never_prints_user_data() {
        let rendered = seed(vec![]).render().unwrap();
        let printed = format!("{:?} {rendered:?}", seed(vec![]));
        assert!(!printed.contains("s3cr3t"), "{printed}");
        assert!(printed.contains("bytes redacted"), "{printed}");
    }

    #[test]
    fn iso_file_name_is_unique_per_machine_uid() {
        assert_eq!(
            iso_file_name("9b2e8d1c-4f6a-4b3e-8c7d-0e1f2a3b4c5d").unwrap(),
            "tenantry-9b2e8d1c-4f6a-4b3e-8c7d-0e1f2a3b4c5d.iso"
        );
        for bad in ["", "../etc/passwd", "a b", &"x".repeat(65)] {
            assert!(
                matches!(
                    iso_file_name(bad),
                    Err(NoCloudError::InvalidMachineUid { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn hostnames_must_be_dns_names() {
        for bad in [
            "",
            "Worker-1",
            "worker_1",
            "-worker",
            "a..b",
            &"a".repeat(64),
        ] {
            let mut input = seed(vec![]);
            input.hostname = bad.to_string();
            let error = input.render().unwrap_err();
            assert!(
                matches!(error, NoCloudError::InvalidHostname { .. }),
                "{bad:?}: {error:?}"
            );
            assert_eq!(error.reason(), "InvalidSeedMetadata");
        }
        let mut dotted = seed(vec![]);
        dotted.hostname = "worker-1.tenant-a.example".into();
        dotted.render().unwrap();
    }

    #[test]
    fn instance_and_provider_ids_must_be_printable_tokens() {
        let mut input = seed(vec![]);
        input.instance_id = "a\nb".into();
        assert!(matches!(
            input.validate(),
            Err(NoCloudError::InvalidInstanceId { .. })
        ));
        let mut input = seed(vec![]);
        input.provider_id = Some(String::new());
        assert!(matches!(
            input.validate(),
            Err(NoCloudError::InvalidProviderId { .. })
        ));
    }

    #[test]
    fn gateway_outside_the_subnet_is_refused_with_the_device_named() {
        let mut device = eth0();
        device.ipv4 = Some(v4("10.10.0.21", 24, Some("10.20.0.1")));
        let error = seed(vec![device]).render().unwrap_err();
        assert_eq!(
            error.to_string(),
            "network device eth0: address 10.10.0.21/24: gateway 10.20.0.1 is outside the subnet"
        );
        assert_eq!(error.reason(), "InvalidNetworkConfig");
        assert!(error.needs_human());

        let mut device = eth0();
        device.ipv6 = Some(v6("2001:db8:10::21", 64, Some("2001:db8:20::1")));
        assert!(matches!(
            seed(vec![device]).render(),
            Err(NoCloudError::InvalidAddress { .. })
        ));
    }

    #[test]
    fn bad_addresses_routes_and_mtus_are_refused() {
        type Change = Box<dyn Fn(&mut NetworkDevice)>;
        let cases: Vec<(&str, Change)> = vec![
            (
                "prefix 33",
                Box::new(|d| d.ipv4 = Some(v4("10.0.0.5", 33, None))),
            ),
            (
                "prefix 0",
                Box::new(|d| d.ipv6 = Some(v6("2001:db8::5", 0, None))),
            ),
            (
                "gateway is the address",
                Box::new(|d| d.ipv4 = Some(v4("10.0.0.5", 24, Some("10.0.0.5")))),
            ),
            (
                "metric without gateway",
                Box::new(|d| {
                    d.ipv4 = Some(Ipv4Static {
                        metric: Some(10),
                        ..v4("10.0.0.5", 24, None)
                    })
                }),
            ),
            (
                "route with host bits",
                Box::new(|d| {
                    d.routes = vec![Route {
                        destination: "192.168.1.1".parse().unwrap(),
                        prefix: 16,
                        via: "10.0.0.1".parse().unwrap(),
                        metric: None,
                    }]
                }),
            ),
            (
                "route across families",
                Box::new(|d| {
                    d.routes = vec![Route {
                        destination: "192.168.0.0".parse().unwrap(),
                        prefix: 16,
                        via: "fe80::1".parse().unwrap(),
                        metric: None,
                    }]
                }),
            ),
            (
                "second default route",
                Box::new(|d| {
                    d.ipv4 = Some(v4("10.0.0.5", 24, Some("10.0.0.1")));
                    d.routes = vec![Route {
                        destination: "0.0.0.0".parse().unwrap(),
                        prefix: 0,
                        via: "10.0.0.254".parse().unwrap(),
                        metric: None,
                    }]
                }),
            ),
            ("MTU 40", Box::new(|d| d.mtu = Some(40))),
            (
                "MTU below IPv6 minimum",
                Box::new(|d| {
                    d.ipv6 = Some(v6("2001:db8::5", 64, None));
                    d.mtu = Some(1200)
                }),
            ),
            ("uppercase name", Box::new(|d| d.name = "Eth0".into())),
            (
                "long name",
                Box::new(|d| d.name = "eth0123456789012".into()),
            ),
        ];
        for (case, change) in cases {
            let mut device = eth0();
            change(&mut device);
            let error = seed(vec![device]).render().unwrap_err();
            assert_eq!(error.reason(), "InvalidNetworkConfig", "{case}: {error}");
        }
    }

    #[test]
    fn devices_must_differ_in_name_and_mac() {
        let other_mac = NetworkDevice::new("eth0", mac("bc:24:11:00:00:99"));
        assert_eq!(
            seed(vec![eth0(), other_mac]).render().unwrap_err(),
            NoCloudError::DuplicateDeviceName {
                name: "eth0".into()
            }
        );
        let same_mac = NetworkDevice::new("eth1", mac("BC:24:11:0a:0b:0c"));
        assert_eq!(
            seed(vec![eth0(), same_mac])
                .render()
                .unwrap_err()
                .to_string(),
            "MAC address bc:24:11:0a:0b:0c is used by two network devices"
        );
    }
}
