//! ProxmoxCluster and ProxmoxMachine end to end: the real kube-apiserver,
//! the real Cluster API core manager, the real in-cluster IPAM provider,
//! tenantry's reconcilers in-process and the PVE simulator over HTTPS.
//!
//! The hypervisor is set up through the PVE API as a platform operator
//! would with `pveum`/`qm`: a template in a `templates` pool, one pool, one
//! user and one privilege-separated token per tenant, with the least
//! privileges `docs/proxmox.md` lists. Everything asserted is what a user
//! sees: object status, conditions, events, and what exists on the
//! hypervisor.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tenantry_api::generated::capi::ip_address_claim::IpAddressClaim;
use tenantry_api::generated::capi::machine::Machine;
use tenantry_api::generated::ipam::in_cluster_ip_pool::InClusterIpPool;
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine, ProxmoxMachineTemplate};
use tenantry_e2e::fixtures::{self, NamespacedKind, PROXMOX_API_VERSION as API_VERSION, names};
use tenantry_e2e::pve_lab::{PveLab, lab_config, worker_spec};
use tenantry_e2e::sim::proxmox::{
    ApiToken, ClusterSnapshot, DropMode, PveSimConfig, RequestMatch, Trigger, VmPower, VmSnapshot,
};
use tenantry_e2e::tenantry::out_of_cluster;
use tenantry_e2e::{WorldBuilder, wait};
use tenantry_provider::proxmox::client::ProxmoxError;
use tenantry_provider::reconciler::ManagerConfig;

const DEADLINE: Duration = Duration::from_secs(180);
const CREDENTIALS: &str = "pve-credentials";

// ---------------------------------------------------------------- the hypervisor

fn sim_config() -> PveSimConfig {
    lab_config(&[
        "tenant-a", "tenant-b", "no-clone", "no-space", "broad", "flaky", "restart", "crowd",
        "queue",
    ])
}

/// The guests (not templates) of a snapshot.
fn guests(snapshot: &ClusterSnapshot) -> Vec<&VmSnapshot> {
    snapshot.vms.iter().filter(|vm| !vm.template).collect()
}

/// Exactly one guest per machine, none cloned twice.
fn assert_one_guest_per_machine(snapshot: &ClusterSnapshot, machines: usize) {
    let vms = guests(snapshot);
    assert_eq!(
        vms.len(),
        machines,
        "one VM per machine: {:?}",
        vms.iter().map(|v| (v.vmid, &v.name)).collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------- the management cluster

/// Everything of a [`World`] but tenantry, which each test starts its way.
/// Everything logged in this test process is captured (tenantry's
/// reconcilers and the simulator run in it, at debug level), to check that
/// no secret ends up in a log line.
fn management() -> WorldBuilder {
    tenantry_e2e::World::builder("management")
        .cluster_api()
        .ipam()
        .pve(sim_config())
        .capture_logs()
}

/// A management cluster with CAPI core, the in-cluster IPAM provider, the
/// PVE simulator and tenantry.
struct World {
    parts: tenantry_e2e::World,
}

/// One tenant's cluster: namespace, credentials, Cluster and ProxmoxCluster.
struct Tenant {
    namespace: String,
    token: ApiToken,
}

impl World {
    async fn start() -> Self {
        Self::start_with(management().tenantry()).await
    }

    /// With tenantry's admission webhooks served and registered.
    async fn start_with_webhooks() -> Self {
        Self::start_with(management().tenantry().webhooks()).await
    }

    /// With tenantry working on at most `bound` machines at once.
    async fn start_with_reconcile_bound(bound: u16) -> Self {
        let config = ManagerConfig {
            max_concurrent_reconciles: Some(bound),
            ..out_of_cluster()
        };
        Self::start_with(management().tenantry_with(config)).await
    }

    async fn start_with(builder: WorldBuilder) -> Self {
        Self {
            parts: builder.start().await,
        }
    }

    fn client(&self) -> kube::Client {
        self.parts.client()
    }

    fn api<K: NamespacedKind>(&self, namespace: &str) -> Api<K> {
        self.parts.api(namespace)
    }

    fn pve(&self) -> &PveLab {
        self.parts.pve()
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        self.parts.fail(error)
    }

    async fn create(&self, namespace: &str, document: Value) {
        self.parts.create(namespace, document).await;
    }

    /// A tenant: its pool, user and token on the hypervisor (without the
    /// grants on the `skip` paths), its namespace with the credentials
    /// Secret, a ProxmoxCluster whose machines take 10.10.<subnet>.10-60,
    /// and the CAPI Cluster owning it.
    async fn tenant(&self, tenant: &str, subnet: u8, skip: &[&str], paused: bool) -> Tenant {
        let token = self.pve().tenant(tenant, skip).await;
        self.tenant_with_token(tenant, subnet, token, paused).await
    }

    async fn tenant_with_token(
        &self,
        tenant: &str,
        subnet: u8,
        token: ApiToken,
        paused: bool,
    ) -> Tenant {
        let namespace = tenant.to_string();
        self.parts.create_namespace(&namespace).await;
        self.create(
            &namespace,
            fixtures::pve_credentials(CREDENTIALS, self.pve(), &token),
        )
        .await;
        self.create(
            &namespace,
            fixtures::proxmox_cluster("demo", subnet, CREDENTIALS),
        )
        .await;
        let mut cluster = fixtures::cluster("demo", "ProxmoxCluster");
        cluster["spec"]["paused"] = json!(paused);
        self.create(&namespace, cluster).await;
        Tenant { namespace, token }
    }

    /// An unpaused tenant whose ProxmoxCluster is ready.
    async fn ready_tenant(&self, tenant: &str, subnet: u8) -> Tenant {
        let tenant = self.tenant(tenant, subnet, &[], false).await;
        self.wait_cluster(&tenant, "provisioned", |c| {
            c.status.as_ref().is_some_and(|s| s.ready)
        })
        .await;
        tenant
    }

    /// A worker: bootstrap data Secret, ProxmoxMachine and Machine, as a
    /// MachineSet makes them.
    async fn create_worker(&self, tenant: &Tenant, name: &str, spec: Value) {
        let data = talos_worker_config(&tenant.namespace, name);
        for document in fixtures::worker(
            API_VERSION,
            "ProxmoxMachine",
            "demo",
            name,
            spec,
            json!({ "value": data, "format": "cloud-config" }),
        ) {
            self.create(&tenant.namespace, document).await;
        }
    }

    async fn delete_machine(&self, tenant: &Tenant, name: &str) {
        self.api::<Machine>(&tenant.namespace)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete Machine");
    }

    async fn wait_machine(
        &self,
        tenant: &Tenant,
        name: &str,
        what: &str,
        predicate: impl Fn(&ProxmoxMachine) -> bool,
    ) -> ProxmoxMachine {
        let last = Mutex::new(None);
        fixtures::wait_for_object(
            &self.api(&tenant.namespace),
            name,
            format!("ProxmoxMachine {}/{name}: {what}", tenant.namespace),
            DEADLINE,
            |m: ProxmoxMachine| {
                *last.lock().unwrap() = Some(serde_json::to_string(&m.status).unwrap_or_default());
                predicate(&m).then_some(m)
            },
        )
        .await
        .unwrap_or_else(|e| {
            self.fail(e.context(format!("last status: {:?}", last.lock().unwrap())))
        })
    }

    async fn wait_cluster(
        &self,
        tenant: &Tenant,
        what: &str,
        predicate: impl Fn(&ProxmoxCluster) -> bool,
    ) -> ProxmoxCluster {
        fixtures::wait_for_object(
            &self.api(&tenant.namespace),
            "demo",
            format!("ProxmoxCluster {}/demo: {what}", tenant.namespace),
            DEADLINE,
            |c: ProxmoxCluster| predicate(&c).then_some(c),
        )
        .await
        .unwrap_or_else(|e| self.fail(e))
    }

    /// Waits until the machines are provisioned and returns them.
    async fn wait_provisioned(&self, tenant: &Tenant, names: &[String]) -> Vec<ProxmoxMachine> {
        let mut machines = Vec::new();
        for name in names {
            machines.push(
                self.wait_machine(tenant, name, "provisioned", is_provisioned)
                    .await,
            );
        }
        machines
    }

    /// Waits until the hypervisor holds at least `count` guests.
    async fn wait_guests(&self, what: &str, count: usize) {
        let sim = &self.pve().sim;
        wait::until(what, DEADLINE, || async move {
            Ok((guests(&sim.snapshot()).len() >= count).then_some(()))
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
    }

    async fn warning_events(&self, namespace: &str, object: &str, reason: &str) -> Vec<Event> {
        self.api::<Event>(namespace)
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
            })
            .collect()
    }

    /// Waits until nothing of the tenant's machines is left: no Machine,
    /// ProxmoxMachine or IPAddressClaim in the namespace, no guest and no
    /// seed ISO on the hypervisor.
    async fn wait_nothing_left(&self, tenant: &Tenant) {
        let client = self.client();
        let namespace = tenant.namespace.clone();
        let sim = &self.pve().sim;
        let last = Mutex::new(Vec::new());
        wait::until(
            format!("nothing of tenant {namespace}'s machines to be left"),
            DEADLINE,
            || {
                let client = client.clone();
                let namespace = namespace.clone();
                let last = &last;
                async move {
                    let objects = [
                        (
                            "Machine",
                            names(&Api::<Machine>::namespaced(client.clone(), &namespace)).await?,
                        ),
                        (
                            "ProxmoxMachine",
                            names(&Api::<ProxmoxMachine>::namespaced(
                                client.clone(),
                                &namespace,
                            ))
                            .await?,
                        ),
                        (
                            "IPAddressClaim",
                            names(&Api::<IpAddressClaim>::namespaced(
                                client.clone(),
                                &namespace,
                            ))
                            .await?,
                        ),
                    ];
                    let mut left: Vec<String> = objects
                        .into_iter()
                        .flat_map(|(kind, items)| {
                            items.into_iter().map(move |n| format!("{kind} {n}"))
                        })
                        .collect();
                    let snapshot = sim.snapshot();
                    // In the pool, or not yet: a clone joins its pool last.
                    left.extend(
                        guests(&snapshot)
                            .iter()
                            .filter(|vm| vm.pool.as_deref().is_none_or(|p| p == namespace))
                            .map(|vm| format!("VM {} ({})", vm.vmid, vm.name)),
                    );
                    left.extend(
                        snapshot
                            .volumes
                            .iter()
                            .filter(|v| {
                                v.content == "iso" && v.storage == format!("{namespace}-iso")
                            })
                            .map(|v| format!("ISO {}", v.volid)),
                    );
                    left.extend(
                        snapshot
                            .tasks
                            .iter()
                            .filter(|t| {
                                t.exitstatus.is_none()
                                    && t.user.starts_with(&format!("{namespace}@"))
                            })
                            .map(|t| format!("running task {}", t.upid)),
                    );
                    *last.lock().unwrap() = left.clone();
                    Ok(left.is_empty().then_some(()))
                }
            },
        )
        .await
        .unwrap_or_else(|e| {
            self.fail(e.context(format!("still there: {:?}", last.lock().unwrap())))
        });
    }
}

/// A Talos worker config; its token is unique to the machine, so a log
/// line holding bootstrap data would show it.
fn talos_worker_config(namespace: &str, name: &str) -> String {
    fixtures::talos_worker_config(
        &machine_token(namespace, name),
        &format!("https://kubernetes-demo.{namespace}.svc:6443"),
    )
}

/// A worker of one core and 1 GiB, for tests that run many.
fn small_worker_spec(tenant: &str) -> Value {
    let mut spec = worker_spec(tenant);
    spec["numCores"] = json!(1);
    spec["memoryMiB"] = json!(1024);
    spec
}

fn machine_token(namespace: &str, name: &str) -> String {
    format!("bootstrap-token-{namespace}-{name}-6f1d2c")
}

fn condition<'a>(machine: &'a ProxmoxMachine, type_: &str) -> Option<&'a Condition> {
    fixtures::condition(&machine.status.as_ref()?.conditions, type_)
}

fn cluster_condition<'a>(cluster: &'a ProxmoxCluster, type_: &str) -> Option<&'a Condition> {
    fixtures::condition(&cluster.status.as_ref()?.conditions, type_)
}

fn is_provisioned(machine: &ProxmoxMachine) -> bool {
    machine
        .status
        .as_ref()
        .is_some_and(|s| fixtures::provisioned(&s.initialization))
}

fn has_reason(machine: &ProxmoxMachine, reason: &str) -> bool {
    condition(machine, "Ready").is_some_and(|c| c.reason == reason)
}

fn vmid_of(machine: &ProxmoxMachine) -> u32 {
    machine
        .spec
        .virtual_machine_id
        .expect("spec.virtualMachineID") as u32
}

// ---------------------------------------------------------------- tests

/// The whole life of a machine: paused until its cluster is unpaused, then
/// cloned into its pool, sized, seeded, started, provisioned when the guest
/// agent reports its address, its seed removed; deleted with nothing left.
/// No log line holds the token secret or the bootstrap data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machine_is_cloned_into_its_pool_provisioned_and_deleted_without_leftovers() {
    let world = World::start_with_webhooks().await;
    let tenant = world.tenant("tenant-a", 1, &[], true).await;
    world
        .create_worker(&tenant, "worker-1", worker_spec("tenant-a"))
        .await;
    world
        .create(
            &tenant.namespace,
            json!({
                "apiVersion": API_VERSION, "kind": "ProxmoxMachineTemplate",
                "metadata": { "name": "workers" },
                "spec": { "template": { "spec": worker_spec("tenant-a") } }
            }),
        )
        .await;

    // Paused: the machine says so and nothing is cloned.
    world
        .wait_machine(&tenant, "worker-1", "Paused", |m| {
            condition(m, "Paused").is_some_and(|c| c.status == "True")
        })
        .await;
    assert!(
        guests(&world.pve().sim.snapshot()).is_empty(),
        "nothing is cloned while the cluster is paused"
    );
    world
        .api::<tenantry_api::generated::capi::cluster::Cluster>(&tenant.namespace)
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": false } })),
        )
        .await
        .expect("unpause");

    // The ProxmoxCluster: provisioned, the token checked, the pool made.
    let cluster = world
        .wait_cluster(&tenant, "provisioned with privileges checked", |c| {
            c.status
                .as_ref()
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.provisioned)
                == Some(true)
                && cluster_condition(c, "PrivilegesSufficient").is_some()
        })
        .await;
    for (type_, reason) in [
        ("ProxmoxAvailable", "Available"),
        ("PrivilegesSufficient", "AllPrivilegesHeld"),
        ("TokenScoped", "ScopedToTenant"),
        ("Ready", "Provisioned"),
    ] {
        let found = cluster_condition(&cluster, type_).unwrap_or_else(|| panic!("{type_} missing"));
        assert_eq!(
            (found.status.as_str(), found.reason.as_str()),
            ("True", reason),
            "{type_}: {}",
            found.message
        );
    }
    let pool = world
        .api::<InClusterIpPool>(&tenant.namespace)
        .get("demo-v4-icip")
        .await
        .expect("InClusterIPPool demo-v4-icip");
    assert_eq!(pool.spec.addresses, ["10.10.1.10-10.10.1.60"]);
    assert_eq!(pool.spec.gateway.as_deref(), Some("10.10.1.1"));
    assert!(
        pool.owner_references()
            .iter()
            .any(|o| o.kind == "ProxmoxCluster" && o.name == "demo")
    );
    let credentials = world
        .api::<Secret>(&tenant.namespace)
        .get(CREDENTIALS)
        .await
        .expect("credentials");
    assert!(
        credentials
            .finalizers()
            .iter()
            .any(|f| f == "proxmoxcluster.infrastructure.cluster.x-k8s.io/secret")
    );

    // The machine.
    let machine = world
        .wait_machine(
            &tenant,
            "worker-1",
            "provisioned and its seed removed",
            |m| {
                is_provisioned(m)
                    && m.status.as_ref().and_then(|s| s.vm_status.as_deref()) == Some("ready")
            },
        )
        .await;
    let vmid = vmid_of(&machine);
    let status = machine.status.clone().unwrap();
    assert!(status.ready);
    assert_eq!(
        condition(&machine, "VirtualMachineProvisioned")
            .unwrap()
            .status,
        "True"
    );
    let addresses: Vec<String> = status
        .addresses
        .unwrap()
        .iter()
        .map(|a| format!("{:?}={}", a.type_, a.address))
        .collect();
    assert_eq!(addresses, ["Hostname=worker-1", "InternalIP=10.10.1.10"]);
    let claim = world
        .api::<IpAddressClaim>(&tenant.namespace)
        .get("worker-1-net0-00-inet")
        .await
        .expect("IPAddressClaim");
    assert!(
        claim
            .owner_references()
            .iter()
            .any(|o| o.kind == "ProxmoxMachine" && o.name == "worker-1")
    );

    // On the hypervisor: one VM, in the tenant's pool, sized, MAC kept,
    // disk grown; the guest read its seed and reports the address.
    let snapshot = world.pve().sim.snapshot();
    let vms = guests(&snapshot);
    assert_eq!(vms.len(), 1, "{vms:?}");
    let vm = vms[0];
    assert_eq!(
        (vm.vmid, vm.name.as_str(), vm.pool.as_deref()),
        (vmid, "worker-1", Some("tenant-a"))
    );
    assert!(["pve1", "pve2"].contains(&vm.node.as_str()));
    assert_eq!(status.proxmox_node.as_deref(), Some(vm.node.as_str()));
    // The cluster says where its machines run (capmox's nodeLocations).
    let worker_locations = |c: &ProxmoxCluster| -> Vec<(String, String)> {
        c.status
            .as_ref()
            .and_then(|s| s.node_locations.as_ref())
            .and_then(|l| l.workers.as_ref())
            .map(|workers| {
                workers
                    .iter()
                    .map(|w| (w.machine.name.clone(), w.node.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    world
        .wait_cluster(&tenant, "worker-1 in nodeLocations", |c| {
            worker_locations(c) == [("worker-1".to_string(), vm.node.clone())]
        })
        .await;
    assert_eq!(vm.power, VmPower::Running);
    assert_eq!(vm.config["cores"], "2");
    assert_eq!(vm.config["memory"], "2048");
    assert!(
        vm.config["scsi0"].starts_with("tenant-a-disks:vm-")
            && vm.config["scsi0"].contains("size=10G"),
        "{}",
        vm.config["scsi0"]
    );
    assert!(
        vm.config["description"].contains("tenantry.dev/proxmoxmachine: tenant-a/worker-1"),
        "{:?}",
        vm.config.get("description")
    );
    assert_eq!(
        machine.spec.provider_id.as_deref(),
        Some(format!("proxmox://{}", vm.smbios_uuid.as_deref().unwrap()).as_str())
    );
    let seed = vm.seed_read.as_ref().expect("the guest read a seed");
    assert_eq!(seed.label, "cidata");
    assert!(
        seed.meta_data.contains("hostname: \"worker-1\""),
        "{}",
        seed.meta_data
    );
    assert!(
        seed.meta_data.contains(vm.smbios_uuid.as_deref().unwrap()),
        "instance-id is the SMBIOS uuid"
    );
    let network = seed.network_config.as_deref().expect("network-config");
    assert!(
        network.contains("10.10.1.10/24")
            && network.contains("10.10.1.1")
            && network.contains("10.10.0.53"),
        "{network}"
    );
    assert!(
        network.to_lowercase().contains(&vm.macs[0].to_lowercase()),
        "matched by the MAC PVE gave net0: {network}"
    );
    assert_eq!(seed.user_data, talos_worker_config("tenant-a", "worker-1"));
    assert_eq!(
        vm.ip_addresses,
        ["10.10.1.10".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(
        vm.attached_iso.is_none(),
        "the seed is detached once provisioned"
    );
    assert!(
        !snapshot.volumes.iter().any(|v| v.content == "iso"),
        "the seed ISO is deleted once provisioned"
    );

    // The template reports what its nodes provide.
    let template = fixtures::wait_for_object(
        &world.api::<ProxmoxMachineTemplate>(&tenant.namespace),
        "workers",
        "ProxmoxMachineTemplate capacity",
        DEADLINE,
        |t| t.status.filter(|s| s.capacity.is_some()),
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    let capacity = template.capacity.unwrap();
    assert_eq!(
        (capacity["cpu"].0.as_str(), capacity["memory"].0.as_str()),
        ("2", "2048Mi")
    );
    // ...and cannot be changed: a new template rolls the machines.
    let refused = world
        .api::<ProxmoxMachineTemplate>(&tenant.namespace)
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "spec": { "numCores": 4 } } } })),
        )
        .await
        .expect_err("a template's spec is immutable");
    assert!(
        refused.to_string().contains(
            "ProxmoxMachineTemplate spec is immutable (changed: spec.template.spec.numCores)"
        ),
        "{refused}"
    );

    // Deleting the Machine deletes the VM (stopped, purged), the claim and
    // then the ProxmoxMachine.
    world.delete_machine(&tenant, "worker-1").await;
    world.wait_nothing_left(&tenant).await;
    world
        .wait_cluster(&tenant, "nodeLocations without worker-1", |c| {
            worker_locations(c).is_empty()
        })
        .await;
    assert!(
        world
            .pve()
            .sim
            .snapshot()
            .pool("tenant-a")
            .unwrap()
            .vms
            .is_empty()
    );

    // Nothing secret was logged, though every reconcile logged at debug.
    let logs = tenantry_e2e::logs::captured();
    assert!(
        logs.contains("PVE API request"),
        "the client's debug lines were captured"
    );
    assert!(
        logs.contains("worker-1"),
        "the reconciler's lines were captured"
    );
    for secret in [
        tenant.token.secret.as_str(),
        &machine_token("tenant-a", "worker-1"),
    ] {
        assert!(!logs.contains(secret), "a log line holds a secret value");
    }
    for event in world
        .api::<Event>(&tenant.namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let note = event.note.unwrap_or_default();
        assert!(
            !note.contains(&tenant.token.secret)
                && !note.contains(&machine_token("tenant-a", "worker-1")),
            "{note}"
        );
    }
}

/// Two tenants, two pools, two tokens: each tenant's machine lands in its
/// own pool, and a machine of tenant A that names tenant B's VM or storages
/// is refused with a condition and an event; B's VM is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_cannot_touch_each_others_vms_or_storages() {
    let world = World::start().await;
    let a = world.tenant("tenant-a", 1, &[], false).await;
    let b = world.tenant("tenant-b", 2, &[], false).await;
    // Both name their machine worker-1: names do not make a VM anyone's.
    world
        .create_worker(&a, "worker-1", worker_spec("tenant-a"))
        .await;
    world
        .create_worker(&b, "worker-1", worker_spec("tenant-b"))
        .await;
    let in_a = world
        .wait_provisioned(&a, &["worker-1".into()])
        .await
        .remove(0);
    let in_b = world
        .wait_provisioned(&b, &["worker-1".into()])
        .await
        .remove(0);
    let (vmid_a, vmid_b) = (vmid_of(&in_a), vmid_of(&in_b));
    let snapshot = world.pve().sim.snapshot();
    assert_eq!(
        snapshot.vm(vmid_a).unwrap().pool.as_deref(),
        Some("tenant-a")
    );
    assert_eq!(
        snapshot.vm(vmid_b).unwrap().pool.as_deref(),
        Some("tenant-b")
    );
    let b_before = snapshot.vm(vmid_b).unwrap().clone();

    // A machine of tenant A naming B's VM.
    let mut intruder = worker_spec("tenant-a");
    intruder["virtualMachineID"] = json!(vmid_b);
    world.create_worker(&a, "intruder", intruder).await;
    let refused = world
        .wait_machine(&a, "intruder", "refused", |m| {
            has_reason(m, "VMOutsidePool")
        })
        .await;
    let message = &condition(&refused, "VirtualMachineProvisioned")
        .unwrap()
        .message;
    assert!(
        message.contains(&format!("VM {vmid_b} is not in pool tenant-a")),
        "{message}"
    );
    // A machine of tenant A putting its disk on B's storage, and one its seed.
    for (name, field, storage, named) in [
        (
            "disk-thief",
            "storage",
            "tenant-b-disks",
            "storage tenant-b-disks",
        ),
        (
            "seed-thief",
            "isoStorage",
            "tenant-b-iso",
            "ISO storage tenant-b-iso",
        ),
    ] {
        let mut thief = worker_spec("tenant-a");
        thief[field] = json!(storage);
        world.create_worker(&a, name, thief).await;
        let refused = world
            .wait_machine(&a, name, "refused", |m| has_reason(m, "StorageOutsidePool"))
            .await;
        let ready = condition(&refused, "Ready").unwrap();
        assert!(ready.message.contains(named), "{ready:?}");
    }
    for (name, reason) in [
        ("intruder", "VMOutsidePool"),
        ("disk-thief", "StorageOutsidePool"),
        ("seed-thief", "StorageOutsidePool"),
    ] {
        let events = world.warning_events(&a.namespace, name, reason).await;
        assert!(!events.is_empty(), "a Warning event {reason} for {name}");
    }

    // A machine that lost the VM ID race: the ID it reserved went to B's
    // VM. It reserves another and clones; B's VM is left alone.
    let mut racer = worker_spec("tenant-a");
    racer["numCores"] = json!(1);
    world.create_worker(&a, "racer", racer).await;
    let machines = world.api::<ProxmoxMachine>(&a.namespace);
    let pause_racer = |paused: Value| {
        let machines = machines.clone();
        async move {
            machines
                .patch(
                    "racer",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({ "metadata": { "annotations": { "cluster.x-k8s.io/paused": paused } } }),
                    ),
                )
                .await
                .expect("pause or unpause racer");
        }
    };
    pause_racer(json!("")).await;
    world
        .wait_machine(&a, "racer", "paused", |m| {
            condition(m, "Paused").is_some_and(|c| c.status == "True")
        })
        .await;
    machines
        .patch_status(
            "racer",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "virtualMachineID": vmid_b } })),
        )
        .await
        .expect("reserve B's VM ID");
    pause_racer(Value::Null).await;
    let racer = world
        .wait_provisioned(&a, &["racer".into()])
        .await
        .remove(0);
    assert_ne!(vmid_of(&racer), vmid_b);
    assert_eq!(
        world
            .pve()
            .sim
            .snapshot()
            .vm(vmid_of(&racer))
            .unwrap()
            .pool
            .as_deref(),
        Some("tenant-a")
    );

    // Tenant A's token cannot act on B's VM either (PVE's own check).
    let error = world
        .pve()
        .client(&a.token)
        .qemu(&b_before.node, vmid_b)
        .stop()
        .await
        .expect_err("A stops B's VM");
    assert!(
        matches!(error, ProxmoxError::PermissionDenied { .. }),
        "{error:?}"
    );

    // Deleting the intruder leaves B's VM as it was.
    let refused_machines = ["intruder", "disk-thief", "seed-thief"];
    for name in refused_machines {
        world.delete_machine(&a, name).await;
    }
    for name in refused_machines {
        fixtures::wait_for_absence(
            &world.api::<ProxmoxMachine>(&a.namespace),
            name,
            format!("ProxmoxMachine {name} to be gone"),
            DEADLINE,
        )
        .await
        .unwrap_or_else(|e| world.fail(e));
    }
    let after = world.pve().sim.snapshot();
    let b_after = after.vm(vmid_b).expect("B's VM still exists");
    assert_eq!(
        (b_after.power, &b_after.config, b_after.pool.as_deref()),
        (VmPower::Running, &b_before.config, Some("tenant-b"))
    );
    assert!(
        !after
            .volumes
            .iter()
            .any(|v| v.storage == "tenant-b-disks" && v.vmid != Some(vmid_b)),
        "nothing of A on B's disks"
    );
    assert!(
        !after.volumes.iter().any(|v| v.storage == "tenant-b-iso"),
        "nothing of A on B's ISO storage"
    );
    let mut a_vms: Vec<&str> = guests(&after)
        .iter()
        .filter(|vm| vm.pool.as_deref() == Some("tenant-a"))
        .map(|vm| vm.name.as_str())
        .collect();
    a_vms.sort();
    assert_eq!(
        a_vms,
        ["racer", "worker-1"],
        "the seed thief's clone went with it"
    );
}

/// A token without VM.Clone on the template, one without
/// Datastore.AllocateSpace on the disk storage: the ProxmoxCluster's
/// preflight and the machine both name the missing privilege and path. A
/// token reaching every VM gets a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_privileges_are_named_and_a_broad_token_is_flagged() {
    let world = World::start().await;
    let no_clone = world
        .tenant("no-clone", 3, &["/pool/templates"], false)
        .await;
    let no_space = world
        .tenant("no-space", 4, &["/storage/no-space-disks"], false)
        .await;
    world
        .create_worker(&no_clone, "worker-1", worker_spec("no-clone"))
        .await;
    world
        .create_worker(&no_space, "worker-1", worker_spec("no-space"))
        .await;

    let cluster = world
        .wait_cluster(&no_clone, "missing VM.Clone named", |c| {
            cluster_condition(c, "PrivilegesSufficient")
                .is_some_and(|c| c.status == "False" && c.message.contains("VM.Clone on /vms/9000"))
        })
        .await;
    assert_eq!(
        cluster_condition(&cluster, "PrivilegesSufficient")
            .unwrap()
            .reason,
        "MissingPrivileges"
    );
    assert!(
        !world
            .warning_events(&no_clone.namespace, "demo", "MissingPrivileges")
            .await
            .is_empty(),
        "a Warning event says the token lacks privileges"
    );
    let machine = world
        .wait_machine(&no_clone, "worker-1", "clone refused", |m| {
            has_reason(m, "PermissionDenied")
        })
        .await;
    let message = &condition(&machine, "Ready").unwrap().message;
    assert!(
        message.contains("(/vms/9000, VM.Clone)")
            && message.contains("grant VM.Clone on /vms/9000"),
        "{message}"
    );

    world
        .wait_cluster(&no_space, "missing Datastore.AllocateSpace named", |c| {
            cluster_condition(c, "PrivilegesSufficient").is_some_and(|c| {
                c.status == "False"
                    && c.message
                        .contains("Datastore.AllocateSpace on /storage/no-space-disks")
            })
        })
        .await;
    let machine = world
        .wait_machine(&no_space, "worker-1", "clone refused", |m| {
            has_reason(m, "PermissionDenied")
        })
        .await;
    let message = &condition(&machine, "Ready").unwrap().message;
    assert!(
        message.contains("(/storage/no-space-disks, Datastore.AllocateSpace)"),
        "{message}"
    );
    assert!(
        !world
            .warning_events(&no_space.namespace, "worker-1", "PermissionDenied")
            .await
            .is_empty()
    );
    assert!(
        guests(&world.pve().sim.snapshot()).is_empty(),
        "nothing was cloned"
    );

    // PVEVMAdmin on / (the upstream charts' recipe) reaches every VM.
    let token = world.pve().tenant("broad", &[]).await;
    world
        .pve()
        .grant("/", "PVEVMAdmin", "broad@pve", &token.id)
        .await;
    let broad = world.tenant_with_token("broad", 5, token, false).await;
    let cluster = world
        .wait_cluster(&broad, "flagged", |c| {
            cluster_condition(c, "TokenScoped").is_some_and(|c| c.status == "False")
        })
        .await;
    let scoped = cluster_condition(&cluster, "TokenScoped").unwrap();
    assert_eq!(scoped.reason, "TokenReachesEveryVM");
    assert!(
        scoped
            .message
            .contains("reaches every VM on the hypervisor")
            && scoped.message.contains("VM.Allocate"),
        "{}",
        scoped.message
    );
    wait::until("a TokenReachesEveryVM Warning event", DEADLINE, || {
        let world = &world;
        async move {
            Ok((!world
                .warning_events("broad", "demo", "TokenReachesEveryVM")
                .await
                .is_empty())
            .then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
}

/// While the PVE API answers nothing but 503, a new machine says so on
/// `Ready`. Then, with 10% of all API calls answered 503 and clone and start
/// tasks running slow, every machine is provisioned, each with exactly one
/// VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flaky_api_and_slow_tasks_provision_every_machine_exactly_once() {
    let world = World::start().await;
    let tenant = world.ready_tenant("flaky", 6).await;
    let faults = world.pve().sim.faults();

    let outage = faults.http_error(
        RequestMatch::everything(),
        503,
        "Service Unavailable",
        Trigger::Always,
    );
    let mut spec = worker_spec("flaky");
    spec["numCores"] = json!(1);
    world.create_worker(&tenant, "worker-1", spec).await;
    let waiting = world
        .wait_machine(&tenant, "worker-1", "the outage named", |m| {
            has_reason(m, "ProxmoxUnavailable")
        })
        .await;
    let ready = condition(&waiting, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("503") && ready.message.contains("retrying"),
        "{}",
        ready.message
    );
    assert!(!ready.message.contains(&tenant.token.secret));
    faults.remove(outage);

    let errors = faults.http_error(
        RequestMatch::everything(),
        503,
        "Service Unavailable",
        Trigger::Probability(0.1),
    );
    faults.slow_tasks("qmclone", Duration::from_secs(2), Trigger::Probability(0.5));
    faults.slow_tasks("qmstart", Duration::from_secs(1), Trigger::Probability(0.5));
    let names: Vec<String> = (1..=5).map(|i| format!("worker-{i}")).collect();
    for name in &names[1..] {
        let mut spec = worker_spec("flaky");
        spec["numCores"] = json!(1);
        world.create_worker(&tenant, name, spec).await;
    }
    let machines = world.wait_provisioned(&tenant, &names).await;
    assert!(faults.fired(errors) > 0, "errors were injected");

    let snapshot = world.pve().sim.snapshot();
    assert_one_guest_per_machine(&snapshot, names.len());
    for machine in &machines {
        let vm = snapshot.vm(vmid_of(machine)).expect("the machine's VM");
        assert_eq!(vm.name, machine.name_any());
        assert_eq!(vm.pool.as_deref(), Some("flaky"));
        assert_eq!(vm.power, VmPower::Running);
    }
    let mut addresses: Vec<String> = machines
        .iter()
        .map(|m| {
            m.status.as_ref().unwrap().addresses.as_ref().unwrap()[1]
                .address
                .clone()
        })
        .collect();
    addresses.sort();
    addresses.dedup();
    assert_eq!(
        addresses.len(),
        names.len(),
        "every machine has its own address"
    );
}

/// The manager is killed while slow clones run (and a clone's answer is
/// lost on the wire), then restarted: every machine ends with exactly one
/// VM, found from what the first manager recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manager_restart_during_clones_keeps_one_vm_per_machine() {
    let mut world = World::start().await;
    let tenant = world.ready_tenant("restart", 7).await;
    let faults = world.pve().sim.faults();
    faults.slow_tasks("qmclone", Duration::from_secs(8), Trigger::Always);
    // The first clone is made, but its answer never arrives.
    let lost = faults.drop_connection(
        RequestMatch::new("POST", "/nodes/{node}/qemu/{vmid}/clone"),
        DropMode::MidResponse,
        Trigger::Times(1),
    );
    let names: Vec<String> = (1..=3).map(|i| format!("worker-{i}")).collect();
    for name in &names {
        world
            .create_worker(&tenant, name, worker_spec("restart"))
            .await;
    }
    // Every machine reserved its VM ID and the clones run.
    for name in &names {
        world
            .wait_machine(&tenant, name, "cloning", |m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| s.virtual_machine_id.is_some())
            })
            .await;
    }
    wait::until("three clones started, one still running", DEADLINE, || {
        let sim = &world.pve().sim;
        async move {
            let snapshot = sim.snapshot();
            let clones: Vec<_> = snapshot
                .tasks
                .iter()
                .filter(|t| t.task_type == "qmclone" && t.user.starts_with("restart@"))
                .collect();
            let running = clones.iter().any(|t| t.exitstatus.is_none());
            Ok((clones.len() == 3 && running).then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| {
        let tasks: Vec<String> = world
            .pve()
            .sim
            .snapshot()
            .tasks
            .iter()
            .map(|t| format!("{} {:?}", t.upid, t.exitstatus))
            .collect();
        world.fail(e.context(format!("tasks: {tasks:#?}")))
    });
    assert_eq!(faults.fired(lost), 1, "a clone's answer was lost");
    world.parts.tenantry_mut().restart();

    let machines = world.wait_provisioned(&tenant, &names).await;
    let snapshot = world.pve().sim.snapshot();
    assert_one_guest_per_machine(&snapshot, names.len());
    let clones = snapshot
        .tasks
        .iter()
        .filter(|t| t.task_type == "qmclone")
        .count();
    assert_eq!(clones, names.len(), "no clone was repeated");
    for machine in &machines {
        assert_eq!(
            snapshot.vm(vmid_of(machine)).unwrap().name,
            machine.name_any()
        );
    }
}

/// Twenty machines deleted while they are being provisioned leave no VM,
/// no seed ISO and no IP claim behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_twenty_machines_mid_provisioning_leaves_nothing() {
    let world = World::start().await;
    let tenant = world.ready_tenant("crowd", 8).await;
    world
        .pve()
        .sim
        .faults()
        .slow_tasks("qmstart", Duration::from_millis(500), Trigger::Always);
    let names: Vec<String> = (1..=20).map(|i| format!("worker-{i:02}")).collect();
    for name in &names {
        world
            .create_worker(&tenant, name, small_worker_spec("crowd"))
            .await;
    }
    // Mid-provisioning: some clones made, not all machines provisioned.
    world.wait_guests("some of the machines cloned", 5).await;
    let machines = world.api::<Machine>(&tenant.namespace);
    for name in &names {
        machines
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete Machine");
    }
    world.wait_nothing_left(&tenant).await;
    let snapshot = world.pve().sim.snapshot();
    assert!(snapshot.pool("crowd").unwrap().vms.is_empty());
    assert!(
        !snapshot.volumes.iter().any(|v| v.storage == "crowd-disks"),
        "no disk left"
    );
}

/// Machines that arrive while every reconcile slot is busy with slow clones
/// get their turn in the order they came: each has said where it stands (a
/// `Ready` condition) before any machine ahead of it is provisioned, and
/// all end provisioned with one VM each. Kube's runner, saturated, served
/// waiting machines in hash order, so a newcomer could stay without a word
/// until the machines ahead of it were done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machines_arriving_while_every_slot_is_busy_take_turns_in_order() {
    let world = World::start_with_reconcile_bound(2).await;
    let tenant = world.ready_tenant("queue", 9).await;
    let faults = world.pve().sim.faults();
    faults.latency(
        RequestMatch::everything(),
        Duration::from_millis(100),
        Trigger::Always,
    );
    faults.slow_tasks("qmclone", Duration::from_secs(10), Trigger::Always);
    let worker = || small_worker_spec("queue");
    let early: Vec<String> = (1..=6).map(|i| format!("early-{i}")).collect();
    for name in &early {
        world.create_worker(&tenant, name, worker()).await;
    }
    // Both slots busy: clones run, and a reconcile waits on its clone.
    world.wait_guests("two early machines cloning", 2).await;
    let late: Vec<String> = (1..=6).map(|i| format!("late-{i}")).collect();
    for name in &late {
        world.create_worker(&tenant, name, worker()).await;
    }

    // Look until the first machine is provisioned; by then none is silent.
    let api = world.api::<ProxmoxMachine>(&tenant.namespace);
    let silent_at_first_provisioned =
        wait::until("the first machine provisioned", DEADLINE, || {
            let api = api.clone();
            async move {
                let machines = api.list(&ListParams::default()).await?.items;
                if !machines.iter().any(is_provisioned) {
                    return Ok(None);
                }
                let silent: Vec<String> = machines
                    .iter()
                    .filter(|m| condition(m, "Ready").is_none())
                    .map(|m| m.name_any())
                    .collect();
                Ok(Some(silent))
            }
        })
        .await
        .unwrap_or_else(|e| world.fail(e));
    assert!(
        silent_at_first_provisioned.is_empty(),
        "machines without a word when the first was provisioned: {silent_at_first_provisioned:?}"
    );

    let names: Vec<String> = early.into_iter().chain(late).collect();
    let machines = world.wait_provisioned(&tenant, &names).await;
    let snapshot = world.pve().sim.snapshot();
    assert_eq!(
        snapshot.pool("queue").unwrap().vms.len(),
        names.len(),
        "one VM per machine"
    );
    for machine in &machines {
        let vm = snapshot.vm(vmid_of(machine)).expect("the machine's VM");
        assert_eq!(vm.name, machine.name_any());
        assert_eq!(vm.power, VmPower::Running);
    }
}
