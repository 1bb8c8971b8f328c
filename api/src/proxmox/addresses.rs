//! Address rules: IP families, the InClusterIPPools a cluster's address
//! configuration becomes, and the blocks (ranges and CIDRs) it lists.

use super::*;

/// An IP address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(address: &IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// The value of the ip-family annotation: `ipv4` or `ipv6`.
    pub fn annotation_value(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }

    /// The longest prefix of the family.
    pub fn max_prefix(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    fn short(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V6 => "v6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}

/// The name capmox gives the InClusterIPPool of a cluster and family:
/// `<cluster>-v4-icip` / `<cluster>-v6-icip`, and `<cluster>-<zone>-v4-icip`
/// for a zone. Tenantry uses the same names, so pools made by capmox are
/// adopted rather than duplicated.
pub fn in_cluster_ip_pool_name(cluster_name: &str, zone: Option<&str>, family: IpFamily) -> String {
    match zone {
        Some(zone) => format!("{cluster_name}-{zone}-{}-icip", family.short()),
        None => format!("{cluster_name}-{}-icip", family.short()),
    }
}

/// One InClusterIPPool a ProxmoxCluster needs.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredIpPool {
    /// The pool's name.
    pub name: String,
    /// The zone it serves; None for the cluster-wide configuration.
    pub zone: Option<String>,
    /// Its family (the ip-family annotation).
    pub family: IpFamily,
    /// The metric of its gateway route (the gateway-metric annotation).
    pub gateway_metric: i32,
    /// Its spec.
    pub spec: InClusterIpPoolSpec,
}

/// Why an entry of `addresses` (or the gateway) cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressError {
    /// Not an IP, a range `a-b` or a CIDR.
    Unparsable(String),
    /// A range whose end lies before its start.
    BackwardsRange(String),
    /// A range mixing IPv4 and IPv6, or a CIDR prefix longer than its family allows.
    Malformed(String),
    /// An address of the other family (e.g. IPv6 in ipv4Config).
    WrongFamily {
        /// The entry.
        entry: String,
        /// The family the configuration is for.
        expected: IpFamily,
    },
    /// A prefix longer than the family allows.
    PrefixTooLong {
        /// The prefix.
        prefix: i32,
        /// The family the configuration is for.
        family: IpFamily,
    },
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unparsable(entry) => {
                write!(f, "{entry:?} is not an IP address, a range a-b or a CIDR")
            }
            Self::BackwardsRange(entry) => write!(f, "range {entry:?} ends before it starts"),
            Self::Malformed(entry) => write!(
                f,
                "{entry:?} mixes address families or has a prefix too long for its family"
            ),
            Self::WrongFamily { entry, expected } => {
                write!(f, "{entry:?} is not an {expected} address")
            }
            Self::PrefixTooLong { prefix, family } => {
                write!(f, "prefix {prefix} is too long for {family}")
            }
        }
    }
}

impl std::error::Error for AddressError {}

/// One entry of an address pool: a single address, an inclusive range or a
/// CIDR block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpBlock {
    /// One address.
    Address(IpAddr),
    /// Every address from `first` to `last`, both included.
    Range {
        /// First address.
        first: IpAddr,
        /// Last address.
        last: IpAddr,
    },
    /// Every address of a network.
    Cidr {
        /// The network address (host bits cleared).
        network: IpAddr,
        /// The prefix length.
        prefix: u8,
    },
}

fn to_bits(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_bits(family: IpFamily, bits: u128) -> IpAddr {
    match family {
        // Truncation is intended: IPv4 bits never exceed 32.
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

impl FromStr for IpBlock {
    type Err = AddressError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let text = entry.trim();
        let parse = |s: &str| {
            s.trim()
                .parse::<IpAddr>()
                .map_err(|_| AddressError::Unparsable(entry.to_string()))
        };
        if let Some((first, last)) = text.split_once('-') {
            let (first, last) = (parse(first)?, parse(last)?);
            if IpFamily::of(&first) != IpFamily::of(&last) {
                return Err(AddressError::Malformed(entry.to_string()));
            }
            if to_bits(first) > to_bits(last) {
                return Err(AddressError::BackwardsRange(entry.to_string()));
            }
            return Ok(Self::Range { first, last });
        }
        if let Some((address, prefix)) = text.split_once('/') {
            let address = parse(address)?;
            let family = IpFamily::of(&address);
            let prefix: u8 = prefix
                .trim()
                .parse()
                .map_err(|_| AddressError::Unparsable(entry.to_string()))?;
            if prefix > family.max_prefix() {
                return Err(AddressError::Malformed(entry.to_string()));
            }
            let host_bits = u32::from(family.max_prefix() - prefix);
            let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
            let network = from_bits(family, to_bits(address) & mask);
            return Ok(Self::Cidr { network, prefix });
        }
        Ok(Self::Address(parse(text)?))
    }
}

impl fmt::Display for IpBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Address(address) => write!(f, "{address}"),
            Self::Range { first, last } => write!(f, "{first}-{last}"),
            Self::Cidr { network, prefix } => write!(f, "{network}/{prefix}"),
        }
    }
}

impl IpBlock {
    /// The block's address family.
    pub fn family(&self) -> IpFamily {
        match self {
            Self::Address(address)
            | Self::Range { first: address, .. }
            | Self::Cidr {
                network: address, ..
            } => IpFamily::of(address),
        }
    }

    /// The first and last address of the block, as integers.
    fn bounds(&self) -> (u128, u128) {
        match *self {
            Self::Address(address) => (to_bits(address), to_bits(address)),
            Self::Range { first, last } => (to_bits(first), to_bits(last)),
            Self::Cidr { network, prefix } => {
                let host_bits = u32::from(self.family().max_prefix() - prefix);
                let size_minus_one = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
                let start = to_bits(network);
                (start, start + size_minus_one)
            }
        }
    }

    /// Whether `address` lies in the block.
    pub fn contains(&self, address: IpAddr) -> bool {
        if IpFamily::of(&address) != self.family() {
            return false;
        }
        let (first, last) = self.bounds();
        (first..=last).contains(&to_bits(address))
    }

    /// How many addresses the block spans (saturating at u128::MAX for ::/0).
    pub fn len(&self) -> u128 {
        let (first, last) = self.bounds();
        (last - first).saturating_add(1)
    }

    /// Whether the block is empty; never, since every form holds an address.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl IpConfigSpec {
    /// Every entry of `addresses`, parsed and checked to be of `family`.
    pub fn blocks(&self, family: IpFamily) -> Result<Vec<IpBlock>, AddressError> {
        self.addresses
            .iter()
            .map(|entry| {
                let block: IpBlock = entry.parse()?;
                if block.family() == family {
                    Ok(block)
                } else {
                    Err(AddressError::WrongFamily {
                        entry: entry.clone(),
                        expected: family,
                    })
                }
            })
            .collect()
    }

    /// Whether any entry of `addresses` covers `address`, e.g. the
    /// control-plane endpoint, which must not be handed to a machine.
    pub fn contains(&self, address: IpAddr) -> Result<bool, AddressError> {
        let mut found = false;
        for entry in &self.addresses {
            let block: IpBlock = entry.parse()?;
            found |= block.contains(address);
        }
        Ok(found)
    }

    /// The spec of the InClusterIPPool made from this configuration: the
    /// addresses in the canonical text the in-cluster IPAM provider accepts
    /// (single IPs, `first-last` ranges, CIDRs with host bits cleared), the
    /// prefix, the gateway, and capmox's reuse grace period.
    pub fn in_cluster_ip_pool_spec(
        &self,
        family: IpFamily,
    ) -> Result<InClusterIpPoolSpec, AddressError> {
        let addresses = self
            .blocks(family)?
            .iter()
            .map(IpBlock::to_string)
            .collect();
        let gateway: IpAddr = self
            .gateway
            .trim()
            .parse()
            .map_err(|_| AddressError::Unparsable(self.gateway.clone()))?;
        if IpFamily::of(&gateway) != family {
            return Err(AddressError::WrongFamily {
                entry: self.gateway.clone(),
                expected: family,
            });
        }
        if self.prefix < 1 || self.prefix > i32::from(family.max_prefix()) {
            return Err(AddressError::PrefixTooLong {
                prefix: self.prefix,
                family,
            });
        }
        Ok(InClusterIpPoolSpec {
            address_reuse_grace_period_seconds: Some(ADDRESS_REUSE_GRACE_PERIOD_SECONDS),
            addresses,
            gateway: Some(gateway.to_string()),
            prefix: i64::from(self.prefix),
            ..Default::default()
        })
    }
}
