//! Tenantry takes over a running cluster from capmox v0.9.0 in place, as a
//! platform operator replaces one infrastructure provider with the other
//! (`clusterctl delete --infrastructure proxmox`, keeping the CRDs and every
//! object, then `clusterctl init --infrastructure tenantry`).
//!
//! The management cluster runs the real Cluster API core manager, the real
//! in-cluster IPAM provider, the PVE simulator set up as `docs/proxmox.md`
//! sets up a tenant, and a Kamaji control plane simulator whose tenant
//! Nodes follow the PVE simulator's VMs. The real capmox binary, with its
//! own CRDs, provisions a cluster: a ProxmoxCluster whose `ipv4Config`
//! becomes an InClusterIPPool, and a MachineDeployment of two workers, each
//! with a static address claimed from it. Then capmox is killed, tenantry's
//! CRDs replace capmox's and tenantry's manager starts.
//!
//! What a user checks after such a switch: every Machine, ProxmoxMachine,
//! IPAddressClaim, IPAddress and tenant Node is the same object (UID), every
//! VM the same VM (ID, SMBIOS UUID) on the same node, never stopped,
//! rebooted or reconfigured (no task on it, no write to the PVE API), and
//! the Machines still run with the same providerID. Then tenantry runs the
//! cluster's life on its own: it scales up, a MachineHealthCheck replaces
//! a worker capmox made whose Node went NotReady, it scales down, and
//! deleting the Cluster leaves nothing behind, neither on the hypervisor
//! nor in the management cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{Value, json};
use tenantry_e2e::bench::providers::{self, Binaries, Provider, ProviderLaunch, RunningProvider};
use tenantry_e2e::bench::resource;
use tenantry_e2e::fixtures::{self, capi};
use tenantry_e2e::pve_lab::{TEMPLATE, TEMPLATE_NODE, lab_config};
use tenantry_e2e::sim::proxmox::{ApiToken, ClusterSnapshot, VmPower};
use tenantry_e2e::sim::tenant::{
    NodeFault, NodeSimConfig, TenantCluster, TenantControlPlaneOptions,
};
use tenantry_e2e::{Upstream, World, wait};

const DEADLINE: Duration = Duration::from_secs(240);
/// The PVE tenant (pool, user, storages) and the namespace of its cluster.
const TENANT: &str = "tenant-a";
const CREDENTIALS: &str = "pve-credentials";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const MACHINE_TEMPLATE: &str = "demo-workers";
const BOOTSTRAP_SECRET: &str = "demo-talos-worker";
const KUBERNETES_VERSION: &str = "v1.35.0";
const INFRA: &str = "infrastructure.cluster.x-k8s.io";
/// Where tenantry names the machine a VM it cloned belongs to.
const IDENTITY_LINE: &str = "tenantry.dev/proxmoxmachine:";
/// The label tenantry puts on a machine's IPAddressClaims.
const CLAIM_LABEL: &str = "infrastructure.tenantry.dev/proxmoxmachine";
/// capmox's finalizer on ProxmoxMachines, which tenantry keeps.
const MACHINE_FINALIZER: &str = "proxmoxmachine.infrastructure.cluster.x-k8s.io";
/// A finalizer the test puts on a ProxmoxMachine so that it stays (being
/// deleted) after tenantry is done with it.
const HOLD_FINALIZER: &str = "test.tenantry.dev/hold";

fn proxmox_machines() -> ApiResource {
    resource(INFRA, "v1alpha2", "ProxmoxMachine", "proxmoxmachines")
}

fn proxmox_clusters() -> ApiResource {
    resource(INFRA, "v1alpha2", "ProxmoxCluster", "proxmoxclusters")
}

fn ipam(kind: &str, plural: &str) -> ApiResource {
    resource("ipam.cluster.x-k8s.io", "v1beta2", kind, plural)
}

fn in_cluster_ip_pools() -> ApiResource {
    resource(
        "ipam.cluster.x-k8s.io",
        "v1alpha2",
        "InClusterIPPool",
        "inclusterippools",
    )
}

/// The worker both providers accept: a full clone of the Talos template
/// into the tenant's pool and disk storage, sized, boot disk grown, `net0`
/// taking its address from the cluster's pool. `defaultIPv4` is what
/// capmox's defaulting webhook would set (its webhooks do not run here);
/// Talos has no cloud-init for capmox to ask about through the agent.
fn worker_spec() -> Value {
    json!({
        "sourceNode": TEMPLATE_NODE, "templateID": TEMPLATE,
        "pool": TENANT, "full": true, "storage": format!("{TENANT}-disks"),
        "numSockets": 1, "numCores": 2, "memoryMiB": 2048,
        "disks": { "bootVolume": { "disk": "scsi0", "sizeGb": 10 } },
        "description": format!("{TENANT} worker"),
        "network": { "networkDevices": [{
            "name": "net0", "bridge": "vmbr0", "model": "virtio", "defaultIPv4": true
        }] },
        "checks": { "skipCloudInitStatus": true },
    })
}

/// A Talos worker config naming the tenant's endpoint, as CABPT renders
/// one (trimmed to what a kubelet reads).
fn talos_worker_config(endpoint: &str) -> String {
    format!(
        "version: v1alpha1\ndebug: false\npersist: true\nmachine:\n  type: worker\n  token: test-token\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:{KUBERNETES_VERSION}\ncluster:\n  controlPlane:\n    endpoint: {endpoint}\n  clusterName: {CLUSTER}\n"
    )
}

fn name_of(object: &DynamicObject) -> String {
    object.metadata.name.clone().unwrap_or_default()
}

fn uid_of(object: &DynamicObject) -> String {
    object.metadata.uid.clone().unwrap_or_default()
}

/// The condition `type_` of an object's `status.conditions`.
fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

// ---------------------------------------------------------------- what is recorded

/// A worker as Cluster API, the infrastructure provider and the tenant
/// see it.
#[derive(Debug, PartialEq, Eq)]
struct Worker {
    machine_uid: String,
    provider_id: String,
    phase: String,
    node_ref: String,
    proxmox_machine_uid: String,
    proxmox_machine_finalizers: Vec<String>,
    virtual_machine_id: i64,
    node_uid: String,
}

/// A VM as the hypervisor has it: a re-created VM has another SMBIOS UUID,
/// a restarted guest one boot more.
#[derive(Debug, PartialEq, Eq)]
struct Vm {
    name: String,
    node: String,
    pool: Option<String>,
    smbios_uuid: Option<String>,
    power: VmPower,
    boots: u32,
    config: BTreeMap<String, String>,
}

/// An IPAddressClaim and the IPAddress it holds.
#[derive(Debug, PartialEq, Eq)]
struct Claim {
    uid: String,
    pool: String,
    address_name: String,
    address_uid: String,
    address: String,
}

/// Everything a takeover must leave as it found it.
#[derive(Debug, PartialEq, Eq)]
struct Recorded {
    workers: BTreeMap<String, Worker>,
    vms: BTreeMap<u32, Vm>,
    claims: BTreeMap<String, Claim>,
    /// InClusterIPPools by name, with their UIDs.
    pools: BTreeMap<String, String>,
    proxmox_cluster_uid: String,
}

// ---------------------------------------------------------------- the world

struct Takeover {
    world: World,
    capmox: Option<RunningProvider>,
    token: ApiToken,
    tenant: Option<TenantCluster>,
}

impl Takeover {
    /// The management cluster without any infrastructure provider: CAPI
    /// core, the in-cluster IPAM provider, the PVE lab with the tenant, and
    /// Kamaji with the tenants' kubelets.
    async fn start() -> Self {
        let world = World::builder("management")
            .without_tenantry_crds()
            .cluster_api()
            .ipam()
            .pve(lab_config(&[TENANT]))
            .kamaji(TenantControlPlaneOptions {
                node_monitor_grace_period: Duration::from_secs(8),
                ..Default::default()
            })
            .nodes(NodeSimConfig::default())
            .start()
            .await;
        let token = world.pve().tenant(TENANT, &[]).await;
        Self {
            world,
            capmox: None,
            token,
            tenant: None,
        }
    }

    /// capmox v0.9.0 as its release runs it, with its own CRDs: no
    /// `PROXMOX_*` environment, the credentials come from the
    /// ProxmoxCluster's Secret.
    async fn start_capmox(&mut self) {
        let binaries = Binaries {
            tenantry: PathBuf::new(),
            upstream: Upstream::locate().expect("upstream cache").root().into(),
        };
        let crds = providers::provider_crds(&binaries, Provider::Capmox)
            .unwrap_or_else(|e| panic!("capmox's CRDs: {e:#}"));
        tenantry_e2e::manifests::apply_crds(&self.world.client(), crds)
            .await
            .unwrap_or_else(|e| panic!("install capmox's CRDs: {e:#}"));
        let mut capmox = providers::start(
            Provider::Capmox,
            ProviderLaunch {
                binaries: &binaries,
                control_plane: self.world.control_plane(),
                env: Vec::new(),
                args: Vec::new(),
                instance: None,
            },
        )
        .unwrap_or_else(|e| panic!("start capmox: {e:#}"));
        capmox
            .wait_healthy(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        self.capmox = Some(capmox);
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        let capmox = self
            .capmox
            .as_ref()
            .map(|c| format!("\n---- capmox log ----\n{}", c.process.log_tail(40)))
            .unwrap_or_default();
        self.world.fail(error.context(capmox))
    }

    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.world.client(), TENANT, resource)
    }

    async fn list(&self, resource: &ApiResource) -> anyhow::Result<Vec<DynamicObject>> {
        Ok(self.api(resource).list(&ListParams::default()).await?.items)
    }

    async fn create(&self, document: Value) {
        self.world.create(TENANT, document).await;
    }

    fn tenant(&self) -> &TenantCluster {
        self.tenant.as_ref().expect("the tenant control plane runs")
    }

    /// What a platform makes for a tenant cluster with capmox: the
    /// credentials Secret with capmox's keys (tenantry reads them too), a
    /// ProxmoxCluster whose addresses become an InClusterIPPool, a
    /// KamajiControlPlane, the Cluster, the workers' Talos config, their
    /// ProxmoxMachineTemplate and a MachineDeployment of `replicas`.
    async fn create_cluster(&mut self, replicas: u32) {
        let pve = self.world.pve();
        self.world.create_namespace(TENANT).await;
        self.create(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": CREDENTIALS },
            "stringData": {
                "url": pve.sim.url().as_str(),
                "token": self.token.id,
                "secret": self.token.secret,
                "root_ca": pve.sim.ca_pem(),
                "insecure": "false",
            }
        }))
        .await;
        self.create(fixtures::proxmox_cluster(CLUSTER, 1, CREDENTIALS))
            .await;
        self.create(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2",
            "kind": "KamajiControlPlane",
            "metadata": { "name": CLUSTER },
            "spec": { "version": KUBERNETES_VERSION, "replicas": 2, "dataStoreName": "default" },
        }))
        .await;
        let mut cluster = fixtures::cluster(CLUSTER, "ProxmoxCluster");
        cluster["spec"]["controlPlaneRef"] = json!({ "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KamajiControlPlane", "name": CLUSTER });
        self.create(cluster).await;
        let kamaji = self.world.kamaji();
        let tenant = wait::until("the tenant control plane to run", DEADLINE, || async move {
            Ok(kamaji.tenant(TENANT, CLUSTER))
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        self.create(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": BOOTSTRAP_SECRET },
            "stringData": { "value": talos_worker_config(&tenant.endpoint), "format": "cloud-config" }
        }))
        .await;
        self.tenant = Some(tenant);
        self.create(json!({
            "apiVersion": format!("{INFRA}/v1alpha2"),
            "kind": "ProxmoxMachineTemplate",
            "metadata": { "name": MACHINE_TEMPLATE },
            "spec": { "template": { "spec": worker_spec() } }
        }))
        .await;
        let labels = json!({ "cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/deployment-name": DEPLOYMENT });
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineDeployment",
            "metadata": { "name": DEPLOYMENT },
            "spec": {
                "clusterName": CLUSTER,
                "replicas": replicas,
                "selector": { "matchLabels": labels },
                "template": {
                    "metadata": { "labels": labels },
                    "spec": {
                        "clusterName": CLUSTER,
                        "version": KUBERNETES_VERSION,
                        "bootstrap": { "dataSecretName": BOOTSTRAP_SECRET },
                        "infrastructureRef": { "apiGroup": INFRA, "kind": "ProxmoxMachineTemplate", "name": MACHINE_TEMPLATE }
                    }
                }
            }
        }))
        .await;
    }

    /// The deployment's workers once CAPI, the infrastructure provider, the
    /// hypervisor and the tenant agree on `replicas` of them: each Machine
    /// Running with a nodeRef, each ProxmoxMachine provisioned, exactly one
    /// VM per ProxmoxMachine (and no other), a Node per Machine, and the
    /// MachineDeployment counting them ready. `None` until then.
    async fn settled(&self, replicas: usize) -> anyhow::Result<Option<BTreeSet<String>>> {
        let machines = self.list(&capi("Machine", "machines")).await?;
        let infra = self.list(&proxmox_machines()).await?;
        let nodes: BTreeSet<String> = Api::<Node>::all(self.tenant().client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let mut names = BTreeSet::new();
        for machine in &machines {
            let running = machine.data["status"]["phase"] == "Running";
            let node = machine.data["status"]["nodeRef"]["name"].as_str();
            if machine.metadata.deletion_timestamp.is_some() || !running || node.is_none() {
                return Ok(None);
            }
            names.insert(name_of(machine));
        }
        let provisioned = infra.iter().all(|m| {
            m.metadata.deletion_timestamp.is_none()
                && m.data["status"]["initialization"]["provisioned"] == true
        });
        let infra_names: BTreeSet<String> = infra.iter().map(name_of).collect();
        let vms: Vec<String> = self
            .world
            .pve()
            .sim
            .snapshot()
            .vms
            .iter()
            .filter(|vm| !vm.template)
            .map(|vm| vm.name.clone())
            .collect();
        let vm_names: BTreeSet<String> = vms.iter().cloned().collect();
        let md = self
            .api(&capi("MachineDeployment", "machinedeployments"))
            .get(DEPLOYMENT)
            .await?;
        let counted = ["replicas", "readyReplicas", "availableReplicas"]
            .iter()
            .all(|field| md.data["status"][field] == replicas);
        let settled = names.len() == replicas
            && provisioned
            && infra_names == names
            && vms.len() == vm_names.len()
            && vm_names == names
            && nodes == names
            && counted;
        Ok(settled.then_some(names))
    }

    async fn wait_settled(&self, replicas: usize, what: &str) -> BTreeSet<String> {
        wait::until(what, DEADLINE, || self.settled(replicas))
            .await
            .unwrap_or_else(|e| self.fail(e))
    }

    async fn scale(&self, replicas: usize) -> BTreeSet<String> {
        self.api(&capi("MachineDeployment", "machinedeployments"))
            .patch(
                DEPLOYMENT,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
            )
            .await
            .expect("scale the MachineDeployment");
        self.wait_settled(replicas, &format!("{replicas} workers"))
            .await
    }

    /// What a takeover must keep, read now.
    async fn record(&self) -> anyhow::Result<Recorded> {
        let nodes: BTreeMap<String, String> = Api::<Node>::all(self.tenant().client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|n| {
                (
                    n.metadata.name.unwrap_or_default(),
                    n.metadata.uid.unwrap_or_default(),
                )
            })
            .collect();
        let infra: BTreeMap<String, DynamicObject> = self
            .list(&proxmox_machines())
            .await?
            .into_iter()
            .map(|m| (name_of(&m), m))
            .collect();
        let mut workers = BTreeMap::new();
        for machine in self.list(&capi("Machine", "machines")).await? {
            let name = name_of(&machine);
            let status = &machine.data["status"];
            let node_ref = status["nodeRef"]["name"].as_str().unwrap_or_default();
            let pm = infra
                .get(&name)
                .ok_or_else(|| anyhow::anyhow!("no ProxmoxMachine {name}"))?;
            workers.insert(
                name.clone(),
                Worker {
                    machine_uid: uid_of(&machine),
                    provider_id: machine.data["spec"]["providerID"]
                        .as_str()
                        .unwrap_or_default()
                        .into(),
                    phase: status["phase"].as_str().unwrap_or_default().into(),
                    node_ref: node_ref.into(),
                    proxmox_machine_uid: uid_of(pm),
                    proxmox_machine_finalizers: pm.metadata.finalizers.clone().unwrap_or_default(),
                    virtual_machine_id: pm.data["spec"]["virtualMachineID"]
                        .as_i64()
                        .unwrap_or_default(),
                    node_uid: nodes.get(node_ref).cloned().unwrap_or_default(),
                },
            );
        }
        let vms = self
            .world
            .pve()
            .sim
            .snapshot()
            .vms
            .into_iter()
            .filter(|vm| !vm.template)
            .map(|vm| {
                (
                    vm.vmid,
                    Vm {
                        name: vm.name,
                        node: vm.node,
                        pool: vm.pool,
                        smbios_uuid: vm.smbios_uuid,
                        power: vm.power,
                        boots: vm.boots,
                        config: vm.config,
                    },
                )
            })
            .collect();
        let addresses: BTreeMap<String, DynamicObject> = self
            .list(&ipam("IPAddress", "ipaddresses"))
            .await?
            .into_iter()
            .map(|a| (name_of(&a), a))
            .collect();
        let mut claims = BTreeMap::new();
        for claim in self
            .list(&ipam("IPAddressClaim", "ipaddressclaims"))
            .await?
        {
            let address_name = claim.data["status"]["addressRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let address = addresses.get(&address_name);
            claims.insert(
                name_of(&claim),
                Claim {
                    uid: uid_of(&claim),
                    pool: claim.data["spec"]["poolRef"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .into(),
                    address_uid: address.map(uid_of).unwrap_or_default(),
                    address: address
                        .and_then(|a| a.data["spec"]["address"].as_str())
                        .unwrap_or_default()
                        .into(),
                    address_name,
                },
            );
        }
        let pools = self
            .list(&in_cluster_ip_pools())
            .await?
            .iter()
            .map(|p| (name_of(p), uid_of(p)))
            .collect();
        let proxmox_cluster = self.api(&proxmox_clusters()).get(CLUSTER).await?;
        Ok(Recorded {
            workers,
            vms,
            claims,
            pools,
            proxmox_cluster_uid: uid_of(&proxmox_cluster),
        })
    }

    /// A MachineHealthCheck of the deployment's workers: Ready False or
    /// Unknown for 5 s is unhealthy, at most half of them remediated.
    async fn create_health_check(&self) {
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineHealthCheck",
            "metadata": { "name": DEPLOYMENT },
            "spec": {
                "clusterName": CLUSTER,
                "selector": { "matchLabels": { "cluster.x-k8s.io/deployment-name": DEPLOYMENT } },
                "checks": {
                    "nodeStartupTimeoutSeconds": 600,
                    "unhealthyNodeConditions": [
                        { "type": "Ready", "status": "False", "timeoutSeconds": 5 },
                        { "type": "Ready", "status": "Unknown", "timeoutSeconds": 5 }
                    ]
                },
                "remediation": { "triggerIf": { "unhealthyLessThanOrEqualTo": "50%" } }
            }
        }))
        .await;
    }

    async fn wait_healthy_count(&self, healthy: i64) {
        let checks = self.api(&capi("MachineHealthCheck", "machinehealthchecks"));
        wait::until(
            format!("the health check to count {healthy} healthy workers"),
            DEADLINE,
            || {
                let checks = checks.clone();
                async move {
                    let mhc = checks.get(DEPLOYMENT).await?;
                    let status = &mhc.data["status"];
                    Ok((status["expectedMachines"] == healthy
                        && status["currentHealthy"] == healthy)
                        .then_some(()))
                }
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(e));
    }

    /// What is left of the deleted Cluster in the management cluster, on
    /// the hypervisor and on the Kamaji side.
    async fn leftovers(&self) -> anyhow::Result<Vec<String>> {
        let mut left = Vec::new();
        for resource in [
            capi("Cluster", "clusters"),
            capi("Machine", "machines"),
            proxmox_machines(),
            proxmox_clusters(),
            ipam("IPAddressClaim", "ipaddressclaims"),
            ipam("IPAddress", "ipaddresses"),
            in_cluster_ip_pools(),
        ] {
            left.extend(
                self.list(&resource)
                    .await?
                    .iter()
                    .map(|o| format!("{} {}", resource.kind, name_of(o))),
            );
        }
        let snapshot = self.world.pve().sim.snapshot();
        left.extend(
            snapshot
                .vms
                .iter()
                .filter(|vm| !vm.template)
                .map(|vm| format!("VM {} ({})", vm.vmid, vm.name)),
        );
        left.extend(
            snapshot
                .volumes
                .iter()
                .filter(|v| v.storage.starts_with(TENANT))
                .map(|v| format!("volume {}", v.volid)),
        );
        let tenants = self.world.kamaji().running().await;
        if tenants > 0 {
            left.push(format!("{tenants} tenant control plane(s)"));
        }
        if !self.world.nodes().nodes().is_empty() {
            left.push(format!("kubelets {:?}", self.world.nodes().nodes()));
        }
        Ok(left)
    }
}

/// Tasks on the hypervisor that touch one of `vmids` and are not in
/// `before`: a start, stop, reboot, reconfiguration, clone or destroy.
fn new_tasks_on(
    snapshot: &ClusterSnapshot,
    before: &BTreeSet<String>,
    vmids: &BTreeSet<u32>,
) -> Vec<String> {
    snapshot
        .tasks
        .iter()
        .filter(|t| !before.contains(&t.upid))
        .filter(|t| t.id.parse().is_ok_and(|id: u32| vmids.contains(&id)))
        .map(|t| format!("{} on {} by {}", t.task_type, t.id, t.user))
        .collect()
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenantry_takes_over_capmox_workers_without_recreating_or_restarting_them() {
    let mut takeover = Takeover::start().await;
    takeover.start_capmox().await;

    // capmox provisions the cluster: two workers, each with a static
    // address from the pool capmox made of the ProxmoxCluster's ipv4Config.
    takeover.create_cluster(2).await;
    let capmox_workers = takeover.wait_settled(2, "capmox's 2 workers").await;
    // capmox is done with a worker once it detached and deleted its seed
    // (it does so when the Machine is Available); a switch mid-way would
    // leave its `user-data-<vmid>.iso` to nobody.
    let pve = takeover.world.pve();
    wait::until("capmox to detach its seeds", DEADLINE, || async move {
        let snapshot = pve.sim.snapshot();
        let isos = snapshot.volumes.iter().any(|v| v.content == "iso");
        let attached = snapshot.vms.iter().any(|vm| vm.attached_iso.is_some());
        Ok((!isos && !attached).then_some(()))
    })
    .await
    .unwrap_or_else(|e| takeover.fail(e));
    let before = takeover.record().await.unwrap_or_else(|e| takeover.fail(e));
    assert_eq!(before.workers.len(), 2, "{before:#?}");
    assert_eq!(before.claims.len(), 2, "one claim per worker: {before:#?}");
    for (name, claim) in &before.claims {
        assert!(
            !claim.address.is_empty() && claim.pool == format!("{CLUSTER}-v4-icip"),
            "{name}: {claim:?}"
        );
    }
    let vmids: BTreeSet<u32> = before.vms.keys().copied().collect();

    // The switch: capmox goes as `clusterctl delete --infrastructure
    // proxmox` takes it (its CRDs and objects stay), tenantry's CRDs
    // replace capmox's and its manager starts.
    takeover.capmox.take().expect("capmox runs").process.kill();
    let handover = takeover.world.pve().sim.snapshot();
    let tasks_before: BTreeSet<String> = handover.tasks.iter().map(|t| t.upid.clone()).collect();
    let calls_before = takeover.world.pve().sim.call_counts();
    takeover
        .world
        .start_tenantry(tenantry_e2e::tenantry::out_of_cluster())
        .await;

    // Tenantry has looked at every machine and the cluster when it says so
    // in their status: the VM it found (`status.virtualMachineID`, which
    // capmox does not write) and its own checks of the cluster's token.
    let machines = takeover.api(&proxmox_machines());
    wait::until("tenantry to adopt every ProxmoxMachine", DEADLINE, || {
        let machines = machines.clone();
        async move {
            let list = machines.list(&ListParams::default()).await?.items;
            let adopted = list.len() == 2
                && list.iter().all(|m| {
                    let ready = condition(m, "Ready");
                    m.data["status"]["virtualMachineID"] == m.data["spec"]["virtualMachineID"]
                        && ready
                            .is_some_and(|c| c["status"] == "True" && c["reason"] == "Provisioned")
                });
            Ok(adopted.then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| takeover.fail(e));
    let clusters = takeover.api(&proxmox_clusters());
    wait::until("tenantry to check the ProxmoxCluster", DEADLINE, || {
        let clusters = clusters.clone();
        async move {
            let cluster = clusters.get(CLUSTER).await?;
            let checked = condition(&cluster, "PrivilegesSufficient")
                .is_some_and(|c| c["status"] == "True")
                && condition(&cluster, "Ready").is_some_and(|c| c["status"] == "True");
            Ok(checked.then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| takeover.fail(e));

    // Nothing was re-created, restarted or re-addressed.
    let after = takeover.record().await.unwrap_or_else(|e| takeover.fail(e));
    assert_eq!(after.workers, before.workers, "the same workers");
    assert_eq!(after.vms, before.vms, "the same VMs, never restarted");
    assert_eq!(after.claims, before.claims, "the same claims and addresses");
    assert_eq!(after.pools, before.pools, "the same address pool");
    assert_eq!(after.proxmox_cluster_uid, before.proxmox_cluster_uid);
    let snapshot = takeover.world.pve().sim.snapshot();
    let touched = new_tasks_on(&snapshot, &tasks_before, &vmids);
    assert!(touched.is_empty(), "tasks on the adopted VMs: {touched:?}");
    let writes: Vec<String> = takeover
        .world
        .pve()
        .sim
        .call_counts()
        .since(&calls_before)
        .by_endpoint
        .into_keys()
        .filter(|endpoint| !endpoint.starts_with("GET "))
        .collect();
    assert!(
        writes.is_empty(),
        "tenantry only read the hypervisor: {writes:?}"
    );
    for worker in after.workers.values() {
        assert_eq!(worker.phase, "Running");
        assert!(worker.provider_id.starts_with("proxmox://"), "{worker:?}");
        assert_eq!(worker.proxmox_machine_finalizers, [MACHINE_FINALIZER]);
    }
    // capmox's claims (named as tenantry names them, owned by their
    // ProxmoxMachine) now carry tenantry's machine label, so that tenantry
    // releases them like its own.
    for claim in takeover
        .list(&ipam("IPAddressClaim", "ipaddressclaims"))
        .await
        .expect("list claims")
    {
        let machine = claim.metadata.owner_references.as_ref().expect("owned")[0]
            .name
            .clone();
        assert_eq!(
            claim
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CLAIM_LABEL)),
            Some(&machine),
            "{claim:?}"
        );
    }
    let warnings: Vec<String> = Api::<Event>::namespaced(takeover.world.client(), TENANT)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reporting_controller
                    .as_deref()
                    .is_some_and(|c| c.starts_with("tenantry"))
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.note))
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");

    // The cluster's life under tenantry: a third worker is tenantry's own
    // clone, with its own claim from the same pool.
    takeover.create_health_check().await;
    let three = takeover.scale(3).await;
    let added: Vec<&String> = three.difference(&capmox_workers).collect();
    assert_eq!(added.len(), 1, "{three:?}");
    let snapshot = takeover.world.pve().sim.snapshot();
    let new_vm = snapshot
        .vms
        .iter()
        .find(|vm| &vm.name == added[0])
        .expect("the new worker's VM");
    assert_eq!(new_vm.pool.as_deref(), Some(TENANT));
    assert!(
        new_vm
            .config
            .get("description")
            .is_some_and(|d| d.contains(IDENTITY_LINE)),
        "cloned by tenantry: {:?}",
        new_vm.config.get("description")
    );
    takeover.wait_healthy_count(3).await;

    // A worker capmox made turns NotReady: CAPI remediates it, tenantry
    // deletes the VM it adopted and releases its claim, a replacement of
    // its own joins. The ProxmoxMachine is held once tenantry is done, so
    // that the garbage collector (which deletes what an object owns once
    // the object is gone) cannot be what released the claim.
    let sick = capmox_workers.iter().next().expect("a worker").clone();
    let sick_vmid = before.workers[&sick].virtual_machine_id as u32;
    let machines = takeover.api(&proxmox_machines());
    let finalizers = |list: &[&str]| Patch::Merge(json!({ "metadata": { "finalizers": list } }));
    machines
        .patch(
            &sick,
            &PatchParams::default(),
            &finalizers(&[MACHINE_FINALIZER, HOLD_FINALIZER]),
        )
        .await
        .expect("hold the ProxmoxMachine");
    takeover
        .world
        .nodes()
        .inject_fault(&sick, NodeFault::NotReady);
    let released = fixtures::wait_for_object(
        &machines,
        &sick,
        format!("tenantry to be done with ProxmoxMachine {sick}"),
        DEADLINE,
        |m| {
            let done = m.metadata.deletion_timestamp.is_some()
                && m.metadata.finalizers.as_deref() == Some(&[HOLD_FINALIZER.to_string()]);
            done.then_some(())
        },
    )
    .await;
    released.unwrap_or_else(|e| takeover.fail(e));
    // Its VM is gone (its ID may already serve the replacement: PVE hands
    // out the lowest free one), and so is its claim, or the IPAM provider
    // holds it for the pool's reuse grace period.
    let sick_uuid = before.vms[&sick_vmid].smbios_uuid.clone();
    let snapshot = takeover.world.pve().sim.snapshot();
    assert!(
        !snapshot
            .vms
            .iter()
            .any(|vm| vm.name == sick || vm.smbios_uuid == sick_uuid),
        "the sick worker's VM {sick_vmid} is gone"
    );
    let claims = takeover.api(&ipam("IPAddressClaim", "ipaddressclaims"));
    for name in before.claims.keys().filter(|c| c.starts_with(&sick)) {
        let claim = claims.get_opt(name).await.expect("read claim");
        assert!(
            claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
            "{name} is released by tenantry"
        );
    }
    machines
        .patch(&sick, &PatchParams::default(), &finalizers(&[]))
        .await
        .expect("let the ProxmoxMachine go");
    let (this, gone) = (&takeover, &sick);
    let healed = wait::until(format!("{sick} to be replaced"), DEADLINE, || async move {
        Ok(this.settled(3).await?.filter(|names| !names.contains(gone)))
    })
    .await
    .unwrap_or_else(|e| takeover.fail(e));
    takeover.world.nodes().clear_fault(&sick);
    assert_eq!(healed.intersection(&three).count(), 2, "{healed:?}");
    takeover.wait_healthy_count(3).await;

    takeover.scale(1).await;

    // Deleting the Cluster leaves nothing behind.
    takeover
        .api(&capi("Cluster", "clusters"))
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .expect("delete the Cluster");
    let this = &takeover;
    let outcome = wait::until(
        "everything of the Cluster to be gone",
        DEADLINE,
        || async move { Ok(this.leftovers().await?.is_empty().then_some(())) },
    )
    .await;
    if let Err(error) = outcome {
        let left = takeover.leftovers().await;
        takeover.fail(error.context(format!("still there: {left:?}")));
    }
    // capmox made the ProxmoxCluster an owner of the credentials Secret;
    // tenantry kept that, so the Secret goes with the cluster, as it did
    // under capmox. It must at least be free of the provider's finalizer.
    let secrets = Api::<Secret>::namespaced(takeover.world.client(), TENANT);
    wait::until("the credentials Secret to be gone", DEADLINE, || {
        let secrets = secrets.clone();
        async move { Ok(secrets.get_opt(CREDENTIALS).await?.is_none().then_some(())) }
    })
    .await
    .unwrap_or_else(|e| takeover.fail(e));
}
