//! What a seed's hostname, devices, addresses and routes must be for
//! cloud-init to apply them: checked before anything is rendered.

use super::*;

/// RFC 1123 host names, as Kubernetes object names already are: Talos
/// splits a dotted name into host and domain, and a label longer than 63
/// characters would be refused by the guest.
pub(super) fn validate_hostname(hostname: &str) -> Result<(), NoCloudError> {
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

pub(super) fn validate_device(device: &NetworkDevice) -> Result<(), NoCloudError> {
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

pub(super) fn max_prefix(address: IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

/// The network `address/prefix` lies in (the address with its host bits
/// cleared).
pub(super) fn network_of(address: IpAddr, prefix: u8) -> IpAddr {
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
pub(super) fn contains(network: IpAddr, prefix: u8, address: IpAddr) -> bool {
    network.is_ipv4() == address.is_ipv4()
        && network_of(network, prefix) == network_of(address, prefix)
}

pub(super) fn is_link_local(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

pub(super) fn check_address(
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

pub(super) fn check_route(device: &NetworkDevice, route: &Route) -> Result<(), NoCloudError> {
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
