//! The NoCloud seed (provider/src/proxmox/nocloud.rs): `NoCloudSeed::render`
//! and `validate`, `iso_file_name`, and `MacAddress: FromStr`.
//!
//! The input is an `Input` built by `arbitrary`: one of the realistic seeds
//! in `base` (its index is the input's first byte, so a one-byte file is
//! that seed as it is), then overrides and small tweaks of its devices. The
//! committed corpus holds one file per base.
//!
//! Invariants:
//! - render fails exactly when validate does, with the same error, never
//!   with `Image` (the ISO writer refusing a valid seed is a bug);
//! - a rendered image is ISO 9660: whole 2048-byte sectors, the primary
//!   volume descriptor ("CD001") at sector 16 labelled `cidata`, and it
//!   holds the user-data byte for byte;
//! - rendering twice gives identical bytes;
//! - `meta-data` and `network-config` read back, with a YAML reader, as the
//!   values that went in (ids, hostname, devices, MACs, addresses, routes);
//! - a MAC parses only in the documented forms and prints lowercase;
//! - `iso_file_name` accepts 1 to 64 letters, digits and '-' and names the
//!   file `tenantry-<uid>.iso`.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_norway::Value;
use tenantry_provider::proxmox::nocloud::{
    ISO_FILE_PREFIX, Ipv4Static, Ipv6Static, MacAddress, NetworkDevice, NoCloudError, NoCloudSeed,
    RenderedSeed, Route, UserData, VOLUME_LABEL, iso_file_name,
};

#[derive(Arbitrary, Debug)]
struct Input {
    base: u8,
    hostname: Option<Hostname>,
    instance_id: Option<String>,
    provider_id: Option<Option<String>>,
    machine_uid: Option<String>,
    user_data: Option<Vec<u8>>,
    network: Option<Vec<Device>>,
    tweaks: Vec<Tweak>,
}

#[derive(Arbitrary, Debug)]
enum Hostname {
    /// Dot-joined labels over `[a-z0-9-]`, to reach valid names often.
    Labels(Vec<Vec<u8>>),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Device {
    name: DeviceName,
    mac: Mac,
    ipv4: Option<V4>,
    ipv6: Option<V6>,
    dns_servers: Vec<IpAddr>,
    routes: Vec<RouteInput>,
    mtu: Option<u32>,
}

#[derive(Arbitrary, Debug)]
enum DeviceName {
    /// `eth<N>`, what tenantry uses.
    Eth(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Mac {
    Octets([u8; 6]),
    Text(String),
}

#[derive(Arbitrary, Debug)]
struct V4 {
    address: Ipv4Addr,
    prefix: u8,
    gateway: Option<Gateway4>,
    metric: Option<u32>,
}

#[derive(Arbitrary, Debug)]
enum Gateway4 {
    /// The address's network with these host bits.
    InSubnet(u32),
    Raw(Ipv4Addr),
}

#[derive(Arbitrary, Debug)]
struct V6 {
    address: Ipv6Addr,
    prefix: u8,
    gateway: Option<Gateway6>,
    metric: Option<u32>,
}

#[derive(Arbitrary, Debug)]
enum Gateway6 {
    InSubnet(u128),
    /// `fe80::<interface id>`.
    LinkLocal(u64),
    Raw(Ipv6Addr),
}

#[derive(Arbitrary, Debug)]
struct RouteInput {
    destination: IpAddr,
    prefix: u8,
    via: IpAddr,
    metric: Option<u32>,
    /// Clear the destination's host bits, as a valid route has them.
    clear_host_bits: bool,
}

/// A change to the device at index `.0` (modulo the device count).
#[derive(Arbitrary, Debug)]
enum Tweak {
    Mtu(u8, Option<u32>),
    Ipv4(u8, Option<V4>),
    Ipv6(u8, Option<V6>),
    AddRoute(u8, RouteInput),
    AddDnsServer(u8, IpAddr),
    Rename(u8, DeviceName),
    SetMac(u8, Mac),
    Duplicate(u8),
    Remove(u8),
}

const UUID: &str = "3f2a9c4e-7b1d-4e8a-9c0f-1a2b3c4d5e6f";
const MACHINE_UID: &str = "9b2e8d1c-4f6a-4b3e-8c7d-0e1f2a3b4c5d";
const TALOS_CONFIG: &str = "version: v1alpha1\nmachine:\n  type: worker\n  token: 7x1k2q.0123456789abcdef\n  ca:\n    crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t\n  install:\n    disk: /dev/sda\ncluster:\n  controlPlane:\n    endpoint: https://tenant-a.k8s.example:6443\n";
const CLOUD_CONFIG: &str = "#cloud-config\r\nssh_authorized_keys:\r\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE5Q tenant@example\r\nruncmd:\r\n  - [ sh, -c, 'echo ok' ]\r\n";

fn mac(text: &str) -> MacAddress {
    text.parse().expect("a base MAC parses")
}

fn v4(address: [u8; 4], prefix: u8, gateway: Option<[u8; 4]>, metric: Option<u32>) -> Ipv4Static {
    Ipv4Static {
        address: address.into(),
        prefix,
        gateway: gateway.map(Ipv4Addr::from),
        metric,
    }
}

fn v6(address: &str, prefix: u8, gateway: Option<&str>) -> Ipv6Static {
    Ipv6Static {
        address: address.parse().expect("base address"),
        prefix,
        gateway: gateway.map(|g| g.parse().expect("base gateway")),
        metric: None,
    }
}

/// The realistic seeds the corpus starts from (`fuzz/corpus/nocloud/seed-<n>`).
fn base(index: u8) -> NoCloudSeed {
    let mut seed = NoCloudSeed {
        instance_id: UUID.into(),
        hostname: "tenant-a-workers-7d9f8-x2k4q".into(),
        provider_id: Some(format!("proxmox://{UUID}")),
        network: Vec::new(),
        user_data: UserData::new(TALOS_CONFIG),
    };
    let mut eth0 = NetworkDevice::new("eth0", mac("BC:24:11:0A:0B:0C"));
    match index % 6 {
        // A Talos worker with one static IPv4 NIC.
        0 => {
            eth0.ipv4 = Some(v4([10, 10, 0, 21], 24, Some([10, 10, 0, 1]), Some(100)));
            eth0.dns_servers = vec![[10, 10, 0, 2].into(), [1, 1, 1, 1].into()];
            seed.network = vec![eth0];
        }
        // Dual stack, jumbo-ish MTU, IPv6 gateway in the subnet.
        1 => {
            eth0.ipv4 = Some(v4([10, 10, 0, 21], 24, Some([10, 10, 0, 1]), None));
            eth0.ipv6 = Some(v6("2001:db8:10::21", 64, Some("2001:db8:10::1")));
            eth0.mtu = Some(1450);
            eth0.dns_servers = vec!["2001:4860:4860::8888".parse().expect("dns")];
            seed.network = vec![eth0];
        }
        // Two NICs: public with the default route, storage with a route.
        2 => {
            eth0.ipv4 = Some(v4([10, 10, 0, 21], 24, Some([10, 10, 0, 1]), None));
            let mut eth1 = NetworkDevice::new("eth1", mac("bc:24:11:0a:0b:0d"));
            eth1.ipv4 = Some(v4([192, 168, 50, 21], 24, None, None));
            eth1.routes = vec![Route {
                destination: Ipv4Addr::new(192, 168, 0, 0).into(),
                prefix: 16,
                via: Ipv4Addr::new(192, 168, 50, 1).into(),
                metric: Some(200),
            }];
            eth1.mtu = Some(9000);
            seed.network = vec![eth0, eth1];
        }
        // DHCP (no devices), cloud-init user-data, a dotted host name.
        3 => {
            seed.hostname = "worker-1.tenant-a.example".into();
            seed.provider_id = None;
            seed.user_data = UserData::new(CLOUD_CONFIG);
        }
        // IPv6 only, link-local gateway, an extra route.
        4 => {
            eth0.ipv6 = Some(Ipv6Static {
                metric: Some(1024),
                ..v6("2001:db8:10::21", 64, Some("fe80::1"))
            });
            eth0.routes = vec![Route {
                destination: "2001:db8:ff::".parse().expect("route"),
                prefix: 48,
                via: "2001:db8:10::fe".parse().expect("via"),
                metric: None,
            }];
            seed.network = vec![eth0];
        }
        // Limits: a 63-character label, no user-data, a plain-id provider.
        _ => {
            seed.hostname = format!("w{}", "0123456789".repeat(7))[..63].to_string();
            seed.provider_id = Some("proxmox://00000000-0000-0000-0000-000000000000".into());
            seed.user_data = UserData::default();
            eth0.name = "ens18".into();
            seed.network = vec![eth0];
        }
    }
    seed
}

fn hostname(input: Hostname) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
    match input {
        Hostname::Raw(text) => text,
        Hostname::Labels(labels) => labels
            .iter()
            .map(|label| {
                label
                    .iter()
                    .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("."),
    }
}

fn device_name(input: DeviceName) -> String {
    match input {
        DeviceName::Eth(n) => format!("eth{n}"),
        DeviceName::Raw(name) => name,
    }
}

/// Parses the MAC the way tenantry gets one (text from PVE's `netN`), and
/// checks what the parser promises.
fn mac_address(input: Mac) -> MacAddress {
    let text = match input {
        Mac::Octets(octets) => {
            let text = octets
                .iter()
                .map(|o| format!("{o:02X}"))
                .collect::<Vec<_>>()
                .join(":");
            let parsed: MacAddress = text.parse().expect("six hex octets are a MAC");
            assert_eq!(parsed.octets(), octets);
            return parsed;
        }
        Mac::Text(text) => text,
    };
    match text.parse::<MacAddress>() {
        Ok(parsed) => {
            // `BC:24:11:0A:0B:0C` or `bc:24:11:0a:0b:0c`, printed lowercase.
            assert_eq!(parsed.to_string(), text.to_ascii_lowercase(), "{text:?}");
            parsed
        }
        Err(error) => {
            assert_eq!(error, NoCloudError::InvalidMacAddress { value: text });
            mac("02:00:00:00:00:01")
        }
    }
}

fn v4_mask(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0)
}

fn v6_mask(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0)
}

fn ipv4(input: V4) -> Ipv4Static {
    let gateway = input.gateway.map(|gateway| match gateway {
        Gateway4::InSubnet(host) => {
            let mask = v4_mask(input.prefix);
            Ipv4Addr::from((u32::from(input.address) & mask) | (host & !mask))
        }
        Gateway4::Raw(address) => address,
    });
    Ipv4Static {
        address: input.address,
        prefix: input.prefix,
        gateway,
        metric: input.metric,
    }
}

fn ipv6(input: V6) -> Ipv6Static {
    let gateway = input.gateway.map(|gateway| match gateway {
        Gateway6::InSubnet(host) => {
            let mask = v6_mask(input.prefix);
            Ipv6Addr::from((u128::from(input.address) & mask) | (host & !mask))
        }
        Gateway6::LinkLocal(id) => Ipv6Addr::from((0xfe80u128 << 112) | u128::from(id)),
        Gateway6::Raw(address) => address,
    });
    Ipv6Static {
        address: input.address,
        prefix: input.prefix,
        gateway,
        metric: input.metric,
    }
}

fn route(input: RouteInput) -> Route {
    let destination = match (input.destination, input.clear_host_bits) {
        (IpAddr::V4(v4), true) => IpAddr::V4((u32::from(v4) & v4_mask(input.prefix)).into()),
        (IpAddr::V6(v6), true) => IpAddr::V6((u128::from(v6) & v6_mask(input.prefix)).into()),
        (destination, false) => destination,
    };
    Route {
        destination,
        prefix: input.prefix,
        via: input.via,
        metric: input.metric,
    }
}

fn device(input: Device) -> NetworkDevice {
    NetworkDevice {
        name: device_name(input.name),
        mac: mac_address(input.mac),
        ipv4: input.ipv4.map(ipv4),
        ipv6: input.ipv6.map(ipv6),
        dns_servers: input.dns_servers,
        routes: input.routes.into_iter().map(route).collect(),
        mtu: input.mtu,
    }
}

fn apply(network: &mut Vec<NetworkDevice>, tweak: Tweak) {
    let count = network.len();
    let index = |i: u8| (count > 0).then(|| usize::from(i) % count);
    match tweak {
        Tweak::Mtu(i, mtu) => index(i).map(|i| network[i].mtu = mtu),
        Tweak::Ipv4(i, v4) => index(i).map(|i| network[i].ipv4 = v4.map(ipv4)),
        Tweak::Ipv6(i, v6) => index(i).map(|i| network[i].ipv6 = v6.map(ipv6)),
        Tweak::AddRoute(i, r) => index(i).map(|i| network[i].routes.push(route(r))),
        Tweak::AddDnsServer(i, ip) => index(i).map(|i| network[i].dns_servers.push(ip)),
        Tweak::Rename(i, name) => index(i).map(|i| network[i].name = device_name(name)),
        Tweak::SetMac(i, m) => index(i).map(|i| network[i].mac = mac_address(m)),
        Tweak::Duplicate(i) => index(i).map(|i| network.push(network[i].clone())),
        Tweak::Remove(i) => index(i).map(|i| {
            network.remove(i);
        }),
    };
}

fuzz_target!(|input: Input| {
    let mut seed = base(input.base);
    if let Some(name) = input.hostname {
        seed.hostname = hostname(name);
    }
    if let Some(id) = input.instance_id {
        seed.instance_id = id;
    }
    if let Some(id) = input.provider_id {
        seed.provider_id = id;
    }
    if let Some(bytes) = input.user_data {
        seed.user_data = UserData::new(bytes);
    }
    if let Some(devices) = input.network {
        seed.network = devices.into_iter().map(device).collect();
    }
    for tweak in input.tweaks {
        apply(&mut seed.network, tweak);
    }
    check_iso_file_name(input.machine_uid.as_deref().unwrap_or(MACHINE_UID));

    let validated = seed.validate();
    match seed.render() {
        Err(error) => {
            assert!(
                !matches!(error, NoCloudError::Image { .. }),
                "the ISO writer refused a valid seed: {error}"
            );
            assert_eq!(
                validated,
                Err(error.clone()),
                "render and validate disagree"
            );
            assert!(error.needs_human());
            assert!(!error.to_string().is_empty());
            assert!(matches!(
                error.reason(),
                "InvalidSeedMetadata" | "InvalidNetworkConfig"
            ));
        }
        Ok(rendered) => {
            assert_eq!(validated, Ok(()));
            check_image(&seed, &rendered);
            check_meta_data(&seed, &rendered.meta_data);
            check_network_config(&seed, &rendered.network_config);
            let again = seed.render().expect("a seed that rendered renders again");
            assert!(again == rendered, "rendering twice gave different bytes");
        }
    }
});

fn check_iso_file_name(uid: &str) {
    let valid = (1..=64).contains(&uid.len())
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    match iso_file_name(uid) {
        Ok(name) => {
            assert!(valid, "{uid:?} accepted");
            assert_eq!(name, format!("{ISO_FILE_PREFIX}{uid}.iso"));
        }
        Err(error) => {
            assert!(!valid, "{uid:?} refused");
            assert_eq!(error.reason(), "InvalidSeedMetadata");
        }
    }
}

const SECTOR: usize = 2048;

fn check_image(seed: &NoCloudSeed, rendered: &RenderedSeed) {
    assert_eq!(rendered.user_data, seed.user_data);
    let image = rendered.image.as_bytes();
    assert_eq!(image.len() % SECTOR, 0, "whole sectors");
    assert!(image.len() >= 18 * SECTOR, "system area, PVD, terminator");
    let pvd = &image[16 * SECTOR..17 * SECTOR];
    assert_eq!(pvd[0], 1, "primary volume descriptor type");
    assert_eq!(&pvd[1..6], b"CD001");
    assert_eq!(
        String::from_utf8_lossy(&pvd[40..72]).trim_end(),
        VOLUME_LABEL
    );
    for file in [
        seed.user_data.as_bytes(),
        rendered.meta_data.as_bytes(),
        rendered.network_config.as_bytes(),
    ] {
        if !file.is_empty() {
            assert!(
                memchr::memmem::find(image, file).is_some(),
                "the image holds every file byte for byte"
            );
        }
    }
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}"))
}

fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{value:?} is not a string"))
}

fn check_meta_data(seed: &NoCloudSeed, meta_data: &str) {
    let meta = yaml(meta_data);
    assert_eq!(text(&meta["instance-id"]), seed.instance_id);
    assert_eq!(text(&meta["local-hostname"]), seed.hostname);
    assert_eq!(text(&meta["hostname"]), seed.hostname);
    match &seed.provider_id {
        Some(id) => assert_eq!(text(&meta["provider-id"]), id),
        None => assert!(meta.get("provider-id").is_none()),
    }
}

fn check_network_config(seed: &NoCloudSeed, network_config: &str) {
    let config = yaml(network_config);
    assert_eq!(config["version"], Value::from(2));
    assert!(config.get("network").is_none(), "no top-level network: key");
    let ethernets = &config["ethernets"];
    let names: Vec<&str> = ethernets
        .as_mapping()
        .expect("ethernets is a mapping")
        .keys()
        .map(text)
        .collect();
    let want: Vec<&str> = seed.network.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, want, "one entry per device, in order");
    for device in &seed.network {
        let entry = &ethernets[device.name.as_str()];
        assert_eq!(text(&entry["match"]["macaddress"]), device.mac.to_string());
        assert_eq!(text(&entry["set-name"]), device.name);
        match device.mtu {
            Some(mtu) => assert_eq!(entry["mtu"], Value::from(mtu)),
            None => assert!(entry.get("mtu").is_none()),
        }
        let addresses: Vec<String> = device
            .ipv4
            .map(|a| format!("{}/{}", a.address, a.prefix))
            .into_iter()
            .chain(device.ipv6.map(|a| format!("{}/{}", a.address, a.prefix)))
            .collect();
        let listed: Vec<&str> = entry
            .get("addresses")
            .and_then(Value::as_sequence)
            .map(|s| s.iter().map(text).collect())
            .unwrap_or_default();
        assert_eq!(listed, addresses);
        let gateways = device.ipv4.and_then(|a| a.gateway).is_some() as usize
            + device.ipv6.and_then(|a| a.gateway).is_some() as usize;
        let routes = entry
            .get("routes")
            .and_then(Value::as_sequence)
            .map_or(0, Vec::len);
        assert_eq!(routes, gateways + device.routes.len());
        let servers: Vec<IpAddr> = entry
            .get("nameservers")
            .and_then(|n| n["addresses"].as_sequence())
            .map(|s| s.iter().map(|v| text(v).parse().expect("an IP")).collect())
            .unwrap_or_default();
        assert_eq!(servers, device.dns_servers);
    }
}
