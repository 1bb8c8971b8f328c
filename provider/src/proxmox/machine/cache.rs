//! What ProxmoxMachine reconciles keep between calls so they do not ask the
//! apiserver and Proxmox VE the same questions again and again
//! (`docs/performance.md`):
//!
//! - stores fed by the controller's watches: owner Machines, Clusters,
//!   ProxmoxClusters, the machines' IPAddressClaims and the IPAddresses
//!   (a miss falls back to a GET, except for a claim this manager has just
//!   created, which the watch brings soon);
//! - the resourceVersion and status of each machine's last write (or fresh
//!   read) by this manager: a machine from the controller's store that shows
//!   either is current and is not read again; one that does not yet waits a
//!   moment for the watch to bring the write rather than reading it;
//! - the VM IDs this manager picked and has not seen cloned yet, so two
//!   machines of one manager never race for the same ID;
//! - each pool's members for a moment, trusted only to say where a VM *is*
//!   (a miss is read afresh, so a clone that just landed is never taken for
//!   a lost one).

use std::collections::{BTreeSet, HashMap, HashSet};
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
/// How long a stored machine that does not show this manager's last write
/// waits for the watch to bring it before the machine is read afresh. A
/// watch delivers within milliseconds, or seconds under a wave; what it
/// has not delivered by then is someone else's change, read at once.
const WATCH_GRACE: Duration = Duration::from_secs(5);
/// How long a claim this manager created is taken to exist though the
/// store does not show it yet.
const CREATED_CLAIM_GRACE: Duration = Duration::from_secs(30);

/// How far the controller's copy of a machine can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// It shows this manager's last write or fresh read.
    Current,
    /// This manager has neither written nor read it afresh since it
    /// started: the copy comes from a list made after it started leading.
    Unwritten,
    /// It predates this manager's last write, made this long ago: the
    /// watch should bring the write within the rest of the grace.
    BehindOwnWrite(Duration),
    /// Someone else changed its status, or a conditional write found the
    /// copy out of date: read it afresh.
    Stale,
}

/// A machine's version and status as this manager last wrote or read them.
struct Known {
    version: String,
    status: u64,
    at: Instant,
}

/// The controller's stores and memos.
pub struct Caches {
    pub capi: CapiStores,
    pub proxmox_clusters: Store<ProxmoxCluster>,
    pub claims: Store<IpAddressClaim>,
    pub addresses: Store<IpAddress>,
    known: Mutex<HashMap<String, Known>>,
    distrusted: Mutex<HashSet<String>>,
    created_claims: Mutex<HashMap<String, Instant>>,
    vm_checks: Mutex<HashMap<String, (Option<i64>, Instant)>>,
    vmids: Mutex<HashMap<u32, String>>,
    pools: Mutex<HashMap<String, (Instant, Pool)>>,
}

/// What is known of an IPAddressClaim (see [`Caches::claim`]).
pub enum ClaimLookup {
    Found(Box<IpAddressClaim>),
    /// Created by this manager a moment ago; the store has not caught up.
    JustCreated,
    Absent,
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
            known: Mutex::default(),
            distrusted: Mutex::default(),
            created_claims: Mutex::default(),
            vm_checks: Mutex::default(),
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

    /// The IPAddressClaim `name` in `namespace` as far as it is known:
    /// the store's copy; else, once the store has listed, one this manager
    /// created within `CREATED_CLAIM_GRACE` (with no status yet — the
    /// watch wakes the machine when the IPAM provider gives it one) or
    /// [`ClaimLookup::Absent`] (a create answers 409 if it exists after
    /// all); else read.
    pub async fn claim(
        &self,
        api: &Api<IpAddressClaim>,
        namespace: &str,
        name: &str,
    ) -> kube::Result<ClaimLookup> {
        let key = format!("{namespace}/{name}");
        if let Some(claim) = lookup(&self.claims, namespace, name) {
            self.created_claims
                .lock()
                .expect("created claims")
                .remove(&key);
            return Ok(ClaimLookup::Found(Box::new(claim)));
        }
        if crate::capi::stores::is_ready(&self.claims) {
            let created = self.created_claims.lock().expect("created claims");
            return Ok(match created.get(&key) {
                Some(at) if at.elapsed() < CREATED_CLAIM_GRACE => ClaimLookup::JustCreated,
                _ => ClaimLookup::Absent,
            });
        }
        Ok(match api.get_opt(name).await? {
            Some(claim) => ClaimLookup::Found(Box::new(claim)),
            None => ClaimLookup::Absent,
        })
    }

    /// Remembers a claim this manager created, until the store shows it.
    pub fn created_claim(&self, namespace: &str, name: &str) {
        let mut created = self.created_claims.lock().expect("created claims");
        created.retain(|_, at| at.elapsed() < CREATED_CLAIM_GRACE);
        created.insert(format!("{namespace}/{name}"), Instant::now());
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

    /// Remembers the resourceVersion and status of a machine as this
    /// manager just wrote it or read it from the apiserver.
    pub fn saw_latest(&self, machine: &ProxmoxMachine) {
        let (Some(uid), Some(version)) = (
            machine.metadata.uid.clone(),
            machine.metadata.resource_version.clone(),
        ) else {
            return;
        };
        let status = crate::reconciler::status_fingerprint(&machine.status);
        self.distrusted
            .lock()
            .expect("distrusted machines")
            .remove(&uid);
        let mut known = self.known.lock().expect("known versions");
        known.insert(
            uid,
            Known {
                version,
                status,
                at: Instant::now(),
            },
        );
    }

    /// How far `machine` (from the controller's store) can be trusted: it
    /// is current when it shows the version this manager last wrote or
    /// read, or a later one with that status (someone else changed
    /// metadata, such as the finalizer or a label). Versions are compared
    /// for equality only, as the API asks.
    pub fn freshness(&self, machine: &ProxmoxMachine) -> Freshness {
        let (Some(uid), Some(version)) = (
            machine.metadata.uid.as_deref(),
            machine.metadata.resource_version.as_deref(),
        ) else {
            return Freshness::Stale;
        };
        if self
            .distrusted
            .lock()
            .expect("distrusted machines")
            .contains(uid)
        {
            return Freshness::Stale;
        }
        let known = self.known.lock().expect("known versions");
        let Some(known) = known.get(uid) else {
            return Freshness::Unwritten;
        };
        if known.version == version
            || known.status == crate::reconciler::status_fingerprint(&machine.status)
        {
            return Freshness::Current;
        }
        match WATCH_GRACE.checked_sub(known.at.elapsed()) {
            Some(left) if !left.is_zero() => Freshness::BehindOwnWrite(left),
            _ => Freshness::Stale,
        }
    }

    /// A write conditional on the stored copy's version was refused: the
    /// next reconcile reads the machine afresh.
    pub fn distrust(&self, uid: &str) {
        self.distrusted
            .lock()
            .expect("distrusted machines")
            .insert(uid.to_string());
    }

    /// Remembers that machine `uid` at `generation` was found provisioned
    /// and its VM running just now.
    pub fn checked_vm(&self, uid: &str, generation: Option<i64>) {
        self.vm_checks
            .lock()
            .expect("VM checks")
            .insert(uid.to_string(), (generation, Instant::now()));
    }

    /// How long ago machine `uid`'s VM was last found running, if its spec
    /// is still at the generation it was then.
    pub fn vm_checked_since(&self, uid: &str, generation: Option<i64>) -> Option<Duration> {
        let checks = self.vm_checks.lock().expect("VM checks");
        checks
            .get(uid)
            .filter(|(checked, _)| *checked == generation)
            .map(|(_, at)| at.elapsed())
    }

    /// Forgets a machine that is gone.
    pub fn forget(&self, uid: &str) {
        self.known.lock().expect("known versions").remove(uid);
        self.vm_checks.lock().expect("VM checks").remove(uid);
        self.distrusted
            .lock()
            .expect("distrusted machines")
            .remove(uid);
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
            CapiStores {
                machines,
                clusters,
                generation: crate::capi::CapiGeneration::V1beta2,
            },
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
        assert_eq!(
            caches.freshness(&machine("u1", "5")),
            Freshness::Unwritten,
            "nothing written yet"
        );
        caches.saw_latest(&with_vmid(machine("u1", "7"), 100));
        assert_eq!(
            caches.freshness(&machine("u1", "7")),
            Freshness::Current,
            "that very version"
        );
        assert!(
            matches!(
                caches.freshness(&machine("u1", "5")),
                Freshness::BehindOwnWrite(left) if left <= WATCH_GRACE
            ),
            "an older copy, without the reservation: the watch brings the write soon"
        );
        assert_eq!(
            caches.freshness(&with_vmid(machine("u1", "9"), 100)),
            Freshness::Current,
            "a later version with the status as written (a finalizer added)"
        );
        assert_eq!(
            caches.freshness(&machine("u2", "7")),
            Freshness::Unwritten,
            "another machine"
        );
        caches.distrust("u1");
        assert_eq!(
            caches.freshness(&machine("u1", "7")),
            Freshness::Stale,
            "a conditional write was refused"
        );
        caches.saw_latest(&with_vmid(machine("u1", "10"), 100));
        assert_eq!(caches.freshness(&machine("u1", "10")), Freshness::Current);
        caches.forget("u1");
        assert_eq!(caches.freshness(&machine("u1", "10")), Freshness::Unwritten);
    }

    /// A status changed by someone else is only waited for as long as the
    /// watch may take to bring this manager's own write.
    #[test]
    fn a_copy_behind_the_last_write_is_stale_after_the_grace() {
        let caches = caches();
        caches.saw_latest(&with_vmid(machine("u1", "7"), 100));
        caches.known.lock().unwrap().get_mut("u1").unwrap().at -= WATCH_GRACE;
        assert_eq!(
            caches.freshness(&with_vmid(machine("u1", "9"), 101)),
            Freshness::Stale
        );
    }

    #[test]
    fn a_vm_check_answers_only_for_the_spec_it_was_made_for() {
        let caches = caches();
        assert_eq!(caches.vm_checked_since("u1", Some(1)), None);
        caches.checked_vm("u1", Some(1));
        assert!(caches.vm_checked_since("u1", Some(1)).unwrap() < Duration::from_secs(5));
        assert_eq!(caches.vm_checked_since("u1", Some(2)), None, "spec changed");
        caches.forget("u1");
        assert_eq!(caches.vm_checked_since("u1", Some(1)), None);
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
