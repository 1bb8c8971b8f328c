//! The Proxmox VE world of the chaos scenarios: the benchmark's (the PVE
//! simulator set up with one tenant, the real in-cluster IPAM provider),
//! with tenantry as [`Replicas`], tasks and guests paced so that a kill
//! lands while PVE is at work, and counts taken from the simulator's own
//! state.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{ApiResource, DynamicObject, ListParams};
use tenantry_api::proxmox::PROXMOX_MACHINE_FINALIZER;

use super::audit::AuditLog;
use super::lab::ManagerSetup;
use super::lab::{self, Lab, extra_occurrences, list, names, some_of};
use super::{ChaosConfig, Outcome, Replicas};
use crate::bench::proxmox::{self as world, World};
use crate::bench::{BenchConfig, NAMESPACE, Provider, resource};
use crate::control_plane::ControlPlane;
use crate::sim::proxmox::{ClusterSnapshot, PveSimConfig, PveSimulator, Timings, VmPower};

/// The Cluster API version the machines' owners are written in.
const CAPI_VERSION: &str = "v1beta2";
/// The tenant's pool (the benchmark's).
const POOL: &str = "bench";
/// How long deleted objects get to go (garbage collection, a last
/// reconcile) before they count as left behind.
const GRACE: Duration = Duration::from_secs(20);
/// How long a provisioned wave gets to finish its last steps (detach and
/// delete the seeds) before its counts are taken.
const SETTLE: Duration = Duration::from_secs(60);

fn ip_addresses() -> kube::api::ApiResource {
    resource(
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddress",
        "ipaddresses",
    )
}

/// The benchmark's lab, with PVE taking its time: tasks 100 ms, clones
/// 600 ms, guests 500 ms to boot; faults drawn from `seed`.
fn sim_config(seed: u64) -> PveSimConfig {
    let mut config = world::sim_config();
    config.seed = seed;
    config.timings = Timings {
        task: Duration::from_millis(100),
        tasks: [("qmclone", 600), ("imgcopy", 200)]
            .into_iter()
            .map(|(task, ms)| (task.to_string(), Duration::from_millis(ms)))
            .collect(),
        guest_boot: Duration::from_millis(500),
        cloud_init: Duration::from_millis(100),
        shutdown_timeout: Duration::from_millis(500),
        auth_failure_delay: Duration::from_millis(100),
    };
    config
}

/// The Proxmox VE world with tenantry running as replicas.
pub(crate) struct ProxmoxLab {
    world: World<Replicas>,
    bench: BenchConfig,
    audit: Option<AuditLog>,
}

impl ProxmoxLab {
    /// A fresh world named `name` with `replicas` tenantry processes, the
    /// simulator's faults drawn from `seed`, and the Cluster with its
    /// ProxmoxCluster ready.
    pub(crate) async fn start(
        config: &ChaosConfig,
        name: &str,
        setup: &ManagerSetup,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let bench = config.bench()?;
        let (audit, apiserver_args) = setup.audit_log()?;
        let staged = world::stage(
            &bench,
            Provider::Tenantry,
            false,
            name,
            apiserver_args,
            sim_config(seed),
        )
        .await?;
        let running = setup
            .start_replicas(bench.binaries.clone(), &staged.control_plane, NAMESPACE)
            .await?;
        let world = staged.with_provider(running);
        world::create_cluster(&world, CAPI_VERSION, false, &bench)
            .await
            .with_context(|| world.provider.log_tails(20))?;
        Ok(Self {
            world,
            bench,
            audit,
        })
    }

    pub(crate) fn sim(&self) -> &PveSimulator {
        &self.world.pve.sim
    }
}

/// Which machine each VM of the hypervisor is: the one whose UID its
/// description names (tenantry writes `uid=<uid>` there), else the one it
/// is named after.
struct Owners {
    /// Machine name → its VMs' IDs.
    per_machine: BTreeMap<String, Vec<u32>>,
    /// VMs no machine claims.
    orphans: Vec<u32>,
}

fn owners(snapshot: &ClusterSnapshot, machines: &[DynamicObject]) -> Owners {
    let mut per_machine: BTreeMap<String, Vec<u32>> = machines
        .iter()
        .map(|m| (m.metadata.name.clone().unwrap_or_default(), Vec::new()))
        .collect();
    let by_uid: HashMap<String, String> = machines
        .iter()
        .filter_map(|m| Some((m.metadata.uid.clone()?, m.metadata.name.clone()?)))
        .collect();
    let mut orphans = Vec::new();
    for vm in snapshot.vms.iter().filter(|vm| !vm.template) {
        let description = vm.config.get("description").cloned().unwrap_or_default();
        let named_uid = description
            .split_whitespace()
            .find_map(|word| word.strip_prefix("uid="))
            .and_then(|uid| by_uid.get(uid));
        let owner = named_uid
            .cloned()
            .or_else(|| per_machine.contains_key(&vm.name).then(|| vm.name.clone()));
        match owner.and_then(|o| per_machine.get_mut(&o)) {
            Some(vms) => vms.push(vm.vmid),
            None => orphans.push(vm.vmid),
        }
    }
    Owners {
        per_machine,
        orphans,
    }
}

fn guests(snapshot: &ClusterSnapshot) -> usize {
    snapshot.vms.iter().filter(|vm| !vm.template).count()
}

fn isos(snapshot: &ClusterSnapshot) -> Vec<String> {
    snapshot
        .volumes
        .iter()
        .filter(|v| v.content == "iso")
        .map(|v| v.volid.clone())
        .collect()
}

fn running_tasks(snapshot: &ClusterSnapshot) -> usize {
    snapshot
        .tasks
        .iter()
        .filter(|t| t.exitstatus.is_none())
        .count()
}

fn vmid_of(machine: &DynamicObject) -> Option<u64> {
    machine.data["spec"]["virtualMachineID"]
        .as_u64()
        .or_else(|| machine.data["status"]["virtualMachineID"].as_u64())
}

/// The IPv4 and IPv6 addresses a machine's status lists.
fn status_addresses(machine: &DynamicObject) -> Vec<String> {
    let mut addresses = Vec::new();
    for device in machine.data["status"]["ipAddresses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for family in ["ipv4", "ipv6"] {
            addresses.extend(
                device[family]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_string)),
            );
        }
    }
    addresses
}

impl Lab for ProxmoxLab {
    fn control_plane(&self) -> &ControlPlane {
        &self.world.control_plane
    }

    fn replicas_and_control_plane(&mut self) -> (&mut Replicas, &mut ControlPlane) {
        (&mut self.world.provider, &mut self.world.control_plane)
    }

    fn vms_made(&self) -> (&'static str, usize) {
        let clones = self
            .sim()
            .snapshot()
            .tasks
            .iter()
            .filter(|t| t.task_type == "qmclone")
            .count();
        ("clone tasks", clones)
    }

    fn audit(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    async fn create_machines(&self, machines: usize) -> anyhow::Result<()> {
        let requested = Arc::new(Mutex::new(HashMap::new()));
        world::create_machines(&self.world, CAPI_VERSION, machines, &self.bench, &requested).await
    }

    fn machine_resource() -> ApiResource {
        world::proxmox_machines()
    }

    fn api(&self, resource: &ApiResource) -> kube::Api<DynamicObject> {
        self.world.api(resource)
    }

    async fn count_provisioned(
        &self,
        expected: usize,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        // Provisioned, a machine still detaches and deletes its seed.
        let snapshot = lab::settle(SETTLE, || async {
            let snapshot = self.sim().snapshot();
            let settled = isos(&snapshot).is_empty() && running_tasks(&snapshot) == 0;
            Ok((snapshot, settled))
        })
        .await?;
        let machines = self.machines().await?;
        lab::count_machines(&machines, expected, outcome);

        outcome.count("VMs", guests(&snapshot));
        let owners = owners(&snapshot, &machines);
        let one_each = owners.per_machine.values().filter(|v| v.len() == 1).count();
        outcome.exactly("machines with exactly one VM", one_each, expected);
        let missing: Vec<String> = owners
            .per_machine
            .iter()
            .filter(|(_, vms)| vms.is_empty())
            .map(|(m, _)| m.clone())
            .collect();
        outcome.none("machines without a VM", &missing);
        let duplicated: Vec<String> = owners
            .per_machine
            .iter()
            .filter(|(_, vms)| vms.len() > 1)
            .map(|(m, vms)| format!("{m}: VMs {vms:?}"))
            .collect();
        outcome.zero(
            "duplicate VMs",
            owners
                .per_machine
                .values()
                .map(|v| v.len().saturating_sub(1))
                .sum(),
            || some_of(&duplicated, 5),
        );
        let orphans: Vec<String> = owners.orphans.iter().map(u32::to_string).collect();
        outcome.zero("orphaned VMs", orphans.len(), || {
            format!("VM IDs {}", some_of(&orphans, 10))
        });
        let mismatched: Vec<String> = machines
            .iter()
            .filter_map(|m| {
                let name = m.metadata.name.clone().unwrap_or_default();
                let vms = owners.per_machine.get(&name)?;
                let recorded = vmid_of(m);
                (vms.len() == 1 && recorded != Some(u64::from(vms[0])))
                    .then(|| format!("{name} records {recorded:?}, its VM is {}", vms[0]))
            })
            .collect();
        outcome.none("machines naming another VM", &mismatched);
        let outside: Vec<String> = snapshot
            .vms
            .iter()
            .filter(|vm| !vm.template && vm.pool.as_deref() != Some(POOL))
            .map(|vm| vm.vmid.to_string())
            .collect();
        outcome.zero("VMs outside the tenant's pool", outside.len(), || {
            format!("VM IDs {}", some_of(&outside, 10))
        });
        let stopped: Vec<String> = snapshot
            .vms
            .iter()
            .filter(|vm| !vm.template && vm.power != VmPower::Running)
            .map(|vm| format!("{} ({:?})", vm.vmid, vm.power))
            .collect();
        outcome.none("VMs not running", &stopped);
        outcome.none("seed ISOs left after provisioning", &isos(&snapshot));
        outcome.count("tasks running", running_tasks(&snapshot));

        let claims = list(&self.world.api(&world::ip_address_claims())).await?;
        outcome.exactly("IPAddressClaims", claims.len(), expected);
        let addresses = list(&self.world.api(&ip_addresses())).await?;
        outcome.exactly("IPAddresses", addresses.len(), expected);
        let leased: Vec<String> = addresses
            .iter()
            .filter_map(|a| a.data["spec"]["address"].as_str().map(str::to_string))
            .collect();
        // Who holds an address leased twice, for the failure message.
        let holders = |address: &str| {
            addresses
                .iter()
                .filter(|a| a.data["spec"]["address"] == address)
                .map(|a| a.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(" and ")
        };
        let in_status: Vec<String> = machines.iter().flat_map(status_addresses).collect();
        let in_guests: Vec<String> = snapshot
            .vms
            .iter()
            .filter(|vm| !vm.template)
            .flat_map(|vm| vm.ip_addresses.iter().map(|ip| ip.to_string()))
            .collect();
        outcome.count("machine addresses", in_status.len());
        let twice = extra_occurrences(leased.iter())
            + extra_occurrences(in_status.iter())
            + extra_occurrences(in_guests.iter());
        // The in-cluster IPAM provider can lease an address twice from a
        // stale cache; tenantry must catch that before a guest takes it.
        let conflicts = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.world.client.clone(),
            crate::bench::NAMESPACE,
        )
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("IPAddressConflict"))
        .count();
        outcome.count("IPAM double leases caught (Events)", conflicts);
        outcome.zero("IP addresses leased twice", twice, || {
            let shared: Vec<String> = lab::repeated(leased.iter())
                .into_iter()
                .map(|(address, _)| format!("{address} ({})", holders(address)))
                .collect();
            format!(
                "{} among IPAddresses ({}), {} among machine statuses, {} among guests",
                extra_occurrences(leased.iter()),
                some_of(&shared, 5),
                extra_occurrences(in_status.iter()),
                extra_occurrences(in_guests.iter())
            )
        });
        Ok(())
    }

    async fn count_leftovers(&self, outcome: &mut Outcome) -> anyhow::Result<()> {
        struct Left {
            machines: Vec<String>,
            finalized: usize,
            guests: Vec<String>,
            ipam: world::Leftovers,
            addresses: Vec<String>,
        }
        let left = lab::settle(GRACE, || async {
            let machines = self.machines().await?;
            let ipam = world::leftovers(&self.world, Duration::ZERO).await?;
            let claims = list(&self.world.api(&world::ip_address_claims())).await?;
            let releasing: Vec<String> = claims
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_some())
                .map(|c| c.metadata.name.clone().unwrap_or_default())
                .collect();
            // An address whose claim is being released goes with it after
            // the pool's reuse grace period; any other is left behind.
            let addresses: Vec<String> = list(&self.world.api(&ip_addresses()))
                .await?
                .into_iter()
                .filter(|a| {
                    a.data["spec"]["claimRef"]["name"]
                        .as_str()
                        .is_none_or(|claim| !releasing.iter().any(|r| r == claim))
                })
                .map(|a| a.metadata.name.unwrap_or_default())
                .collect();
            let snapshot = self.sim().snapshot();
            let left = Left {
                finalized: lab::holding(&machines, PROXMOX_MACHINE_FINALIZER),
                machines: names(&machines),
                guests: snapshot
                    .vms
                    .iter()
                    .filter(|vm| !vm.template)
                    .map(|vm| vm.vmid.to_string())
                    .collect(),
                ipam,
                addresses,
            };
            let clean = left.machines.is_empty()
                && left.guests.is_empty()
                && left.ipam.is_empty()
                && left.addresses.is_empty();
            Ok((left, clean))
        })
        .await?;
        lab::count_machines_left(outcome, &left.machines, left.finalized);
        outcome.zero("VMs left", left.guests.len(), || {
            format!("VM IDs {}", some_of(&left.guests, 10))
        });
        outcome.none("seed ISOs left", &left.ipam.isos);
        outcome.none("IPAddressClaims left", &left.ipam.claims);
        outcome.count(
            "IPAddressClaims releasing (IPAM grace)",
            left.ipam.releasing_claims,
        );
        outcome.none("IPAddresses left", &left.addresses);
        outcome.zero("tasks still running", left.ipam.running_tasks.len(), || {
            some_of(&left.ipam.running_tasks, 3)
        });
        Ok(())
    }

    fn log_paths(&self) -> Vec<std::path::PathBuf> {
        let mut paths = self.world.provider.log_paths();
        paths.push(self.world.control_plane.dir().join("kube-apiserver.log"));
        paths
    }

    fn log_tails(&self) -> String {
        format!(
            "{}\n---- in-cluster IPAM provider log ----\n{}",
            self.world.provider.log_tails(30),
            self.world.ipam.log_tail(10)
        )
    }
}
