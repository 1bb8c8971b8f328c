//! Addresses for VMI interfaces. On the pod network a VMI's address is its
//! virt-launcher pod's IP, new for every VMI (CAPK's FAQ: IPs change when a
//! VM restarts); the pool hands out each address once, in order.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use anyhow::{Context as _, bail};
use kube::api::{Api, DynamicObject, ListParams};

use super::resources::vmi_resource;

pub(super) struct IpPool {
    base: u32,
    size: u32,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    next: u32,
    taken: HashSet<u32>,
}

impl IpPool {
    /// An IPv4 CIDR such as `10.244.0.0/16`.
    pub fn parse(cidr: &str) -> anyhow::Result<Self> {
        let (address, prefix) = cidr
            .split_once('/')
            .with_context(|| format!("IP pool {cidr:?} is not a CIDR"))?;
        let address: Ipv4Addr = address
            .parse()
            .with_context(|| format!("IP pool {cidr:?}: bad address"))?;
        let prefix: u32 = prefix
            .parse()
            .with_context(|| format!("IP pool {cidr:?}: bad prefix"))?;
        if !(8..=30).contains(&prefix) {
            bail!("IP pool {cidr:?}: prefix must be between 8 and 30");
        }
        let size = 1u32 << (32 - prefix);
        let base = u32::from(address) & !(size - 1);
        Ok(Self {
            base,
            size,
            // Skip the network address and the first few, where a gateway
            // would be.
            state: Mutex::new(PoolState {
                next: 10,
                taken: HashSet::new(),
            }),
        })
    }

    fn contains(&self, ip: Ipv4Addr) -> Option<u32> {
        let offset = u32::from(ip).wrapping_sub(self.base);
        (offset < self.size).then_some(offset)
    }

    /// Marks an address as used (found on an existing VMI).
    pub fn mark(&self, ip: &str) {
        if let Some(offset) = ip.parse().ok().and_then(|ip| self.contains(ip)) {
            let mut state = self.state.lock().expect("ip pool lock");
            state.taken.insert(offset);
            state.next = state.next.max(offset + 1);
        }
    }

    /// The next free address.
    pub fn allocate(&self) -> anyhow::Result<Ipv4Addr> {
        let mut state = self.state.lock().expect("ip pool lock");
        for _ in 0..self.size {
            let offset = state.next;
            state.next = if offset + 2 >= self.size {
                10
            } else {
                offset + 1
            };
            if state.taken.insert(offset) {
                return Ok(Ipv4Addr::from(self.base + offset));
            }
        }
        bail!("IP pool exhausted")
    }

    /// Marks the addresses of every existing VMI, so a restarted simulator
    /// does not hand them out again.
    pub async fn seed_from_cluster(&self, client: &kube::Client) -> anyhow::Result<()> {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &vmi_resource());
        for vmi in api.list(&ListParams::default()).await?.items {
            let interfaces = vmi.data["status"]["interfaces"].as_array().cloned();
            for interface in interfaces.unwrap_or_default() {
                for ip in interface["ipAddresses"].as_array().into_iter().flatten() {
                    if let Some(ip) = ip.as_str() {
                        self.mark(ip);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_each_address_once_and_skips_marked_ones() {
        let pool = IpPool::parse("10.1.0.0/24").expect("pool");
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(10, 1, 0, 10));
        pool.mark("10.1.0.11");
        pool.mark("192.168.0.1");
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(10, 1, 0, 12));
        assert!(IpPool::parse("10.0.0.0").is_err());
        assert!(IpPool::parse("10.0.0.0/31").is_err());
    }
}
