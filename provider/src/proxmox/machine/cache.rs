//! What ProxmoxMachine reconciles keep between calls so they do not ask the
//! apiserver and Proxmox VE the same questions again and again
//! (`docs/performance.md`):
//!
//! - stores fed by the controller's watches: owner Machines, Clusters,
//!   ProxmoxClusters, the machines' IPAddressClaims and the IPAddresses
//!   (a miss falls back to a GET);
//! - the resourceVersion and status of each machine's last write by this
//!   manager: a machine from the controller's store that shows either is
//!   current and is not read again;
//! - the VM IDs this manager picked and has not seen cloned yet, so two
//!   machines of one manager never race for the same ID;
//! - each pool's members for a moment, trusted only to say where a VM *is*
//!   (a miss is read afresh, so a clone that just landed is never taken for
//!   a lost one).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::reflector::Store;
use tenantry_api::generated::capi::ip_address::IpAddress;
use tenantry_api::generated::capi::ip_address_claim::IpAddressClaim;
#[cfg(test)]
use tenantry_api::proxmox::ProxmoxMachineStatus;
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine};

use crate::capi::stores::{CapiStores, lookup};
use crate::proxmox::client::{Pool, ProxmoxClient, ProxmoxError};

/// How long a pool's members answer for where a VM is.
const POOL_SNAPSHOT_TTL: Duration = Duration::from_secs(2);

/// The controller's stores and memos.
pub struct Caches {
    pub capi: CapiStores,
    pub proxmox_clusters: Store<ProxmoxCluster>,
    pub claims: Store<IpAddressClaim>,
    pub addresses: Store<IpAddress>,
    written: Mutex<HashMap<String, (String, u64)>>,
    vmids: Mutex<HashMap<u32, String>>,
    pools: Mutex<HashMap<String, (Instant, Pool)>>,
}

impl Caches {
    pub fn new(
        capi: CapiStores,
        proxmox_clusters: Store<ProxmoxCluster>,
        claims: Store<IpAddressClaim>,
        addresses: Store<IpAddress>,
    ) -> Self {
        Self {
            capi,
            proxmox_clusters,
            claims,
            addresses,
            written: Mutex::default(),
            vmids: Mutex::default(),
            pools: Mutex::default(),
        }
    }

    /// The ProxmoxCluster `name` in `namespace`, if it exists.
    pub async fn proxmox_cluster(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<ProxmoxCluster>> {
        if let Some(cluster) = lookup(&self.proxmox_clusters, namespace, name) {
            return Ok(Some(cluster));
        }
        Api::<ProxmoxCluster>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
    }

    /// The IPAddressClaim `name` in `namespace`, if it exists.
    pub async fn claim(
        &self,
        api: &Api<IpAddressClaim>,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<IpAddressClaim>> {
        if let Some(claim) = lookup(&self.claims, namespace, name) {
            return Ok(Some(claim));
        }
        api.get_opt(name).await
    }

    /// The IPAddress `name` in `namespace`, if it exists. Addresses never
    /// change once allocated, so a stored one is as good as a read.
    pub async fn address(
        &self,
        api: &Api<IpAddress>,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<IpAddress>> {
        if let Some(address) = lookup(&self.addresses, namespace, name) {
            return Ok(Some(address));
        }
        api.get_opt(name).await
    }

    // -------------------------------------------------- the machine itself

    /// Remembers the resourceVersion and status a write of this manager
    /// gave a machine.
    pub fn wrote(&self, machine: &ProxmoxMachine) {
        let (Some(uid), Some(version)) = (
            machine.metadata.uid.clone(),
            machine.metadata.resource_version.clone(),
        ) else {
            return;
        };
        let status = crate::runtime::status_fingerprint(&machine.status);
        let mut written = self.written.lock().expect("written versions");
        written.insert(uid, (version, status));
    }

    /// Whether `machine` (from the controller's store) shows this manager's
    /// last write to it: that very version, or a later one with the status
    /// as written (someone else changed metadata, such as the finalizer or
    /// a label). Versions are compared for equality only, as the API asks.
    /// Anything else — an older copy, a status changed by someone else — is
    /// read afresh: a stale status could mean a second clone.
    pub fn is_current(&self, machine: &ProxmoxMachine) -> bool {
        let (Some(uid), Some(version)) = (
            machine.metadata.uid.as_deref(),
            machine.metadata.resource_version.as_deref(),
        ) else {
            return false;
        };
        let written = self.written.lock().expect("written versions");
        written.get(uid).is_some_and(|(v, status)| {
            v == version || *status == crate::runtime::status_fingerprint(&machine.status)
        })
    }

    /// Forgets a machine that is gone.
    pub fn forget(&self, uid: &str) {
        self.written.lock().expect("written versions").remove(uid);
        self.release_vmid(uid);
    }

    // --------------------------------------------------------------- VM IDs

    /// Reserves for machine `uid` the ID `choose` picks, handing it the IDs
    /// this manager reserved for other machines (their clones may not be in
    /// their statuses, let alone in PVE, yet). One reservation at a time
    /// and no I/O under the lock: two reconciles never get the same ID,
    /// and a slow hypervisor does not queue them behind each other. The
    /// machine's earlier reservation is given back.
    pub fn reserve_vmid(
        &self,
        uid: &str,
        choose: impl FnOnce(&BTreeSet<u32>) -> Option<u32>,
    ) -> Option<u32> {
        let mut reserved = self.vmids.lock().expect("reserved VM IDs");
        reserved.retain(|_, owner| owner != uid);
        let others: BTreeSet<u32> = reserved.keys().copied().collect();
        let vmid = choose(&others)?;
        reserved.insert(vmid, uid.to_string());
        Some(vmid)
    }

    /// Drops machine `uid`'s reserved ID (it chose another, or is gone).
    pub fn release_vmid(&self, uid: &str) {
        self.vmids
            .lock()
            .expect("reserved VM IDs")
            .retain(|_, owner| owner != uid);
    }

    // ---------------------------------------------------------------- pools

    fn pool_key(client: &ProxmoxClient, pool: &str) -> String {
        format!("{}|{}|{pool}", client.url(), client.token_id())
    }

    /// A pool's members as read within the last moment, if any.
    pub fn recent_pool(&self, client: &ProxmoxClient, pool: &str) -> Option<Pool> {
        let pools = self.pools.lock().expect("pool snapshots");
        pools
            .get(&Self::pool_key(client, pool))
            .filter(|(at, _)| at.elapsed() < POOL_SNAPSHOT_TTL)
            .map(|(_, pool)| pool.clone())
    }

    /// Reads a pool's members and keeps them for a moment.
    pub async fn read_pool(
        &self,
        client: &ProxmoxClient,
        pool: &str,
    ) -> Result<Pool, ProxmoxError> {
        let read = client.pools().get(pool).await?;
        let mut pools = self.pools.lock().expect("pool snapshots");
        pools.retain(|_, (at, _)| at.elapsed() < POOL_SNAPSHOT_TTL);
        pools.insert(Self::pool_key(client, pool), (Instant::now(), read.clone()));
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caches() -> Caches {
        let (machines, _) = kube::runtime::reflector::store();
        let (clusters, _) = kube::runtime::reflector::store();
        let (proxmox_clusters, _) = kube::runtime::reflector::store();
        let (claims, _) = kube::runtime::reflector::store();
        let (addresses, _) = kube::runtime::reflector::store();
        Caches::new(
            CapiStores { machines, clusters },
            proxmox_clusters,
            claims,
            addresses,
        )
    }

    fn machine(uid: &str, version: &str) -> ProxmoxMachine {
        let mut machine = ProxmoxMachine::new("m", Default::default());
        machine.metadata.uid = Some(uid.into());
        machine.metadata.resource_version = Some(version.into());
        machine
    }

    fn with_vmid(mut machine: ProxmoxMachine, vmid: i64) -> ProxmoxMachine {
        machine.status = Some(ProxmoxMachineStatus {
            virtual_machine_id: Some(vmid),
            ..Default::default()
        });
        machine
    }

    #[test]
    fn only_the_last_write_is_current() {
        let caches = caches();
        assert!(
            !caches.is_current(&machine("u1", "5")),
            "nothing written yet"
        );
        caches.wrote(&with_vmid(machine("u1", "7"), 100));
        assert!(caches.is_current(&machine("u1", "7")), "that very version");
        assert!(
            !caches.is_current(&machine("u1", "5")),
            "an older copy, without the reservation"
        );
        assert!(
            caches.is_current(&with_vmid(machine("u1", "9"), 100)),
            "a later version with the status as written (a finalizer added)"
        );
        assert!(
            !caches.is_current(&with_vmid(machine("u1", "9"), 101)),
            "someone else wrote the status"
        );
        assert!(!caches.is_current(&machine("u2", "7")), "another machine");
        caches.forget("u1");
        assert!(!caches.is_current(&machine("u1", "7")));
    }

    /// PVE's `nextid` answers the same ID to concurrent callers; the
    /// reservations of one manager must not.
    #[test]
    fn reservations_are_distinct_and_given_back() {
        let caches = caches();
        let lowest_free = |taken: &BTreeSet<u32>| (100..).find(|id| !taken.contains(id));
        let mut ids = BTreeSet::new();
        for i in 0..20 {
            ids.insert(
                caches
                    .reserve_vmid(&format!("uid-{i}"), lowest_free)
                    .unwrap(),
            );
        }
        assert_eq!(ids, (100..120).collect());
        // A machine that reserves again gives its earlier ID back.
        assert_eq!(caches.reserve_vmid("uid-0", |_| Some(500)), Some(500));
        assert_eq!(caches.reserve_vmid("uid-20", lowest_free), Some(100));
        caches.release_vmid("uid-20");
        caches.forget("uid-1");
        assert_eq!(caches.reserve_vmid("uid-21", lowest_free), Some(100));
        assert_eq!(caches.reserve_vmid("uid-22", lowest_free), Some(101));
    }
}
