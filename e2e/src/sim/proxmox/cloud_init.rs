//! What the simulated guest understands of its NoCloud seed: `meta-data`
//! (instance id, hostname) and `network-config` in cloud-init's version 1
//! (`config: [{type: physical, mac_address, subnets}]`) or version 2 (netplan
//! `ethernets`) format, possibly wrapped in a top-level `network:` key.
//! Only static addresses are configured; DHCP is not simulated.

use std::net::IpAddr;

use serde_norway::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudInitError {
    #[error("network-config is not valid YAML: {0}")]
    Yaml(String),
    #[error("network-config has unsupported version {0:?}")]
    Version(String),
    #[error("network-config: {0}")]
    Invalid(String),
}

/// An address with its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpCidr {
    pub address: IpAddr,
    pub prefix: u8,
}

impl std::fmt::Display for IpCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

impl IpCidr {
    fn parse(text: &str, netmask: Option<&str>) -> Result<Self, CloudInitError> {
        let invalid = || CloudInitError::Invalid(format!("invalid address {text:?}"));
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (
                address.parse::<IpAddr>().map_err(|_| invalid())?,
                Some(prefix.parse::<u8>().map_err(|_| invalid())?),
            ),
            None => (text.parse::<IpAddr>().map_err(|_| invalid())?, None),
        };
        let prefix = match (prefix, netmask) {
            (Some(prefix), _) => prefix,
            (None, Some(mask)) => netmask_prefix(mask).ok_or_else(invalid)?,
            (None, None) if address.is_ipv4() => 32,
            (None, None) => 128,
        };
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(invalid());
        }
        Ok(Self { address, prefix })
    }
}

fn netmask_prefix(mask: &str) -> Option<u8> {
    if let Ok(prefix) = mask.parse::<u8>() {
        return Some(prefix);
    }
    let mask: std::net::Ipv4Addr = mask.parse().ok()?;
    let bits = u32::from(mask);
    (bits.leading_ones() + bits.trailing_zeros() == 32).then_some(bits.leading_ones() as u8)
}

/// One configured interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterfaceConfig {
    /// v1 `name`, or the v2 `ethernets` key.
    pub id: String,
    /// The MAC the config matches on, lowercase.
    pub mac: Option<String>,
    /// v2 `match.name`.
    pub match_name: Option<String>,
    /// v2 `set-name`, or the v1 `name` when matched by MAC.
    pub set_name: Option<String>,
    pub addresses: Vec<IpCidr>,
    pub gateways: Vec<IpAddr>,
    pub dhcp4: bool,
    pub dhcp6: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetworkConfig {
    pub version: u8,
    pub interfaces: Vec<InterfaceConfig>,
}

impl NetworkConfig {
    /// The configuration of the guest NIC with this MAC and kernel name.
    pub fn for_nic(&self, mac: &str, kernel_name: &str) -> Option<&InterfaceConfig> {
        let mac = mac.to_ascii_lowercase();
        self.interfaces
            .iter()
            .find(|i| i.mac.as_deref() == Some(mac.as_str()))
            .or_else(|| {
                self.interfaces.iter().find(|i| {
                    i.mac.is_none()
                        && (i.match_name.as_deref() == Some(kernel_name)
                            || (i.match_name.is_none() && i.id == kernel_name))
                })
            })
    }
}

/// Parses a `network-config` file; an empty file means "no configuration".
pub fn parse_network_config(text: &str) -> Result<NetworkConfig, CloudInitError> {
    if text.trim().is_empty() {
        return Ok(NetworkConfig::default());
    }
    let mut root: Value =
        serde_norway::from_str(text).map_err(|e| CloudInitError::Yaml(e.to_string()))?;
    if let Some(inner) = root.get("network").cloned() {
        root = inner;
    }
    let version = match root.get("version") {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => format!("{other:?}"),
        None => return Err(CloudInitError::Invalid("missing version".into())),
    };
    match version.as_str() {
        "1" => parse_v1(&root),
        "2" => parse_v2(&root),
        other => Err(CloudInitError::Version(other.to_string())),
    }
}

fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn is_true(value: Option<&Value>) -> bool {
    matches!(value, Some(Value::Bool(true)))
        || text(value).is_some_and(|t| matches!(t.as_str(), "true" | "yes" | "on"))
}

fn parse_v1(root: &Value) -> Result<NetworkConfig, CloudInitError> {
    let mut config = NetworkConfig {
        version: 1,
        interfaces: Vec::new(),
    };
    let Some(entries) = root.get("config").and_then(Value::as_sequence) else {
        return Ok(config);
    };
    for entry in entries {
        if text(entry.get("type")).as_deref() != Some("physical") {
            continue;
        }
        let name = text(entry.get("name")).unwrap_or_default();
        let mac = text(entry.get("mac_address")).map(|m| m.to_ascii_lowercase());
        let mut interface = InterfaceConfig {
            set_name: mac.as_ref().map(|_| name.clone()).filter(|n| !n.is_empty()),
            id: name,
            mac,
            ..InterfaceConfig::default()
        };
        for subnet in entry
            .get("subnets")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            match text(subnet.get("type")).as_deref() {
                Some("static" | "static6") => {
                    let address = text(subnet.get("address")).ok_or_else(|| {
                        CloudInitError::Invalid("static subnet without address".into())
                    })?;
                    let netmask = text(subnet.get("netmask")).or(text(subnet.get("prefix")));
                    interface
                        .addresses
                        .push(IpCidr::parse(&address, netmask.as_deref())?);
                    if let Some(gateway) = text(subnet.get("gateway")) {
                        interface.gateways.push(gateway.parse().map_err(|_| {
                            CloudInitError::Invalid(format!("invalid gateway {gateway:?}"))
                        })?);
                    }
                }
                Some("dhcp" | "dhcp4") => interface.dhcp4 = true,
                Some("dhcp6" | "ipv6_dhcpv6-stateless" | "ipv6_slaac") => interface.dhcp6 = true,
                _ => {}
            }
        }
        config.interfaces.push(interface);
    }
    Ok(config)
}

fn parse_v2(root: &Value) -> Result<NetworkConfig, CloudInitError> {
    let mut config = NetworkConfig {
        version: 2,
        interfaces: Vec::new(),
    };
    let Some(ethernets) = root.get("ethernets").and_then(Value::as_mapping) else {
        return Ok(config);
    };
    for (key, entry) in ethernets {
        let id = text(Some(key)).unwrap_or_default();
        let matcher = entry.get("match");
        let mut interface = InterfaceConfig {
            id,
            mac: text(matcher.and_then(|m| m.get("macaddress"))).map(|m| m.to_ascii_lowercase()),
            match_name: text(matcher.and_then(|m| m.get("name"))),
            set_name: text(entry.get("set-name")),
            dhcp4: is_true(entry.get("dhcp4")),
            dhcp6: is_true(entry.get("dhcp6")),
            ..InterfaceConfig::default()
        };
        for address in entry
            .get("addresses")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            // An address is a string, or a one-key mapping with options.
            let address = match address {
                Value::Mapping(m) => m.keys().next().and_then(|k| text(Some(k))),
                other => text(Some(other)),
            }
            .ok_or_else(|| CloudInitError::Invalid("address is not a string".into()))?;
            interface.addresses.push(IpCidr::parse(&address, None)?);
        }
        for key in ["gateway4", "gateway6"] {
            if let Some(gateway) = text(entry.get(key)) {
                interface.gateways.push(
                    gateway.parse().map_err(|_| {
                        CloudInitError::Invalid(format!("invalid {key} {gateway:?}"))
                    })?,
                );
            }
        }
        for route in entry
            .get("routes")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let to = text(route.get("to"));
            if matches!(to.as_deref(), Some("default" | "0.0.0.0/0" | "::/0"))
                && let Some(via) = text(route.get("via"))
                && let Ok(via) = via.parse()
            {
                interface.gateways.push(via);
            }
        }
        config.interfaces.push(interface);
    }
    Ok(config)
}

/// The keys of `meta-data` the guest uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaData {
    pub instance_id: Option<String>,
    pub local_hostname: Option<String>,
}

pub fn parse_meta_data(text_: &str) -> MetaData {
    let Ok(value) = serde_norway::from_str::<Value>(text_) else {
        return MetaData::default();
    };
    MetaData {
        instance_id: text(value.get("instance-id")),
        local_hostname: text(value.get("local-hostname")).or(text(value.get("hostname"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_2_matched_by_mac() {
        let config = parse_network_config(
            "network:\n  version: 2\n  ethernets:\n    eth0:\n      match:\n        macaddress: BC:24:11:00:00:01\n      set-name: eth0\n      addresses: [10.0.0.10/24]\n      gateway4: 10.0.0.1\n",
        )
        .unwrap();
        let nic = config.for_nic("bc:24:11:00:00:01", "eth0").unwrap();
        assert_eq!(nic.addresses[0].to_string(), "10.0.0.10/24");
        assert_eq!(nic.gateways, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn version_1_with_netmask() {
        let config = parse_network_config(
            "version: 1\nconfig:\n  - type: physical\n    name: eth0\n    mac_address: bc:24:11:00:00:02\n    subnets:\n      - type: static\n        address: 192.168.1.5\n        netmask: 255.255.255.0\n        gateway: 192.168.1.1\n",
        )
        .unwrap();
        let nic = config.for_nic("BC:24:11:00:00:02", "eth0").unwrap();
        assert_eq!(nic.addresses[0].to_string(), "192.168.1.5/24");
    }

    #[test]
    fn unknown_version_is_an_error() {
        assert!(matches!(
            parse_network_config("version: 3\n"),
            Err(CloudInitError::Version(_))
        ));
    }
}
