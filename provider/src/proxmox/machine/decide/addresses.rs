//! The machine's addresses: which claims it makes, which address another
//! machine holds, what the seed's network says, what the machine reports
//! and when the guest has taken them.

use std::net::IpAddr;

use tenantry_api::contract::{MachineAddress, MachineAddressType};
use tenantry_api::proxmox::{
    IpFamily, NetworkDevice as DeviceSpec, ProxmoxClusterSpec, ProxmoxMachineSpec,
    in_cluster_ip_pool_name,
};

use super::vm_config::network_devices;
use crate::proxmox::client::{GuestInterface, VmConfig};
use crate::proxmox::nocloud::{self, Ipv4Static, Ipv6Static, MacAddress, Route};

/// The API group of IPAM pools.
pub const IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// The kind of the pools a ProxmoxCluster makes.
pub const IN_CLUSTER_IP_POOL: &str = "InClusterIPPool";

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

/// Where a machine's addresses stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addresses {
    /// Every claim has its address.
    Allocated(Vec<DeviceAddress>),
    /// Some claim waits; the message says which and why.
    Pending(String),
    /// The IPAM provider says why a claim has no address (pool exhausted,
    /// no such pool…); it keeps trying.
    Failed(String),
}

/// `status.ipAddresses`: per device, its IPv4 and IPv6 addresses.
pub fn ip_addresses_status(
    addresses: &[DeviceAddress],
) -> Vec<tenantry_api::proxmox::IpAddressesSpec> {
    let mut devices: Vec<String> = addresses.iter().map(|a| a.device.clone()).collect();
    devices.sort();
    devices.dedup();
    devices
        .into_iter()
        .map(|device| {
            let of = |v4: bool| {
                let list: Vec<String> = addresses
                    .iter()
                    .filter(|a| a.device == device && a.address.is_ipv4() == v4)
                    .map(|a| a.address.to_string())
                    .collect();
                (!list.is_empty()).then_some(list)
            };
            tenantry_api::proxmox::IpAddressesSpec {
                net: device.clone(),
                ipv4: of(true),
                ipv6: of(false),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tenantry_api::proxmox::{IpConfigSpec, IpPoolReference, ZoneConfigSpec};

    fn config(value: serde_json::Value) -> VmConfig {
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

    #[test]
    fn ip_addresses_are_listed_per_device_and_family() {
        let address = |device: &str, ip: &str| DeviceAddress {
            device: device.into(),
            address: ip.parse().unwrap(),
            prefix: 24,
            gateway: None,
        };
        let listed = ip_addresses_status(&[
            address("net1", "192.168.0.5"),
            address("net0", "10.0.0.5"),
            address("net0", "2001:db8::5"),
        ]);
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].net, "net0");
        assert_eq!(
            listed[0].ipv4.as_deref(),
            Some(&["10.0.0.5".to_string()][..])
        );
        assert_eq!(
            listed[0].ipv6.as_deref(),
            Some(&["2001:db8::5".to_string()][..])
        );
        assert_eq!(listed[1].ipv6, None);
    }
}
