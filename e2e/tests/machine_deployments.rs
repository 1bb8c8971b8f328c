//! Cluster API in the loop: MachineDeployments and MachineHealthChecks of
//! tenantry's workers, driven by the real Cluster API core manager.
//!
//! Each workload cluster has a Kamaji control plane (the tenant control
//! plane simulator: a real kube-apiserver per tenant), and every worker VM
//! that the substrate simulators run gets a kubelet stand-in that registers
//! its Node there. Workers take their Talos machine config through
//! `bootstrap.dataSecretName`: CABPT's output is a Talos config in a Secret,
//! and what matters to CAPI and tenantry is exactly that Secret, so the
//! tests write it themselves instead of running CABPT.
//!
//! Asserted is what an operator sees: Machines `Running` with a `nodeRef`,
//! Nodes in the tenant cluster, exactly as many VMs as Machines, the
//! MachineHealthCheck's conditions, and nothing left in the substrate after
//! the Cluster is deleted.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tenantry_e2e::bench::resource;
use tenantry_e2e::clusterctl::{Clusterctl, install_cert_manager_crds};
use tenantry_e2e::fixtures::{self, Substrate, capi};
use tenantry_e2e::pve_lab::{PveLab, lab_config, worker_spec};
use tenantry_e2e::sim::kubevirt::{
    DEFAULT_SCHEMATIC, Fault, FaultTarget, ImageFactoryConfig, KubevirtSimConfig,
};
use tenantry_e2e::sim::tenant::{
    NodeFault, NodeSimConfig, TenantCluster, TenantControlPlaneOptions,
};
use tenantry_e2e::{ControlPlane, Kubevirt, WorldBuilder, wait};

const DEADLINE: Duration = Duration::from_secs(240);
/// The KubeVirt world's namespace; the Proxmox world's is its PVE tenant.
const NAMESPACE: &str = "default";
const PVE_TENANT: &str = "tenant-a";
const PVE_CREDENTIALS: &str = "pve-credentials";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const BOOTSTRAP_SECRET: &str = "demo-talos-worker";
const KUBERNETES_VERSION: &str = "v1.35.0";
const TALOS: &str = "v1.13.0";
const TALOS_NEXT: &str = "v1.13.1";

fn virtual_machines() -> ApiResource {
    resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines")
}

fn virtual_machine_instances() -> ApiResource {
    resource(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
        "virtualmachineinstances",
    )
}

/// A management cluster with CAPI core, tenantry, a substrate simulator,
/// Kamaji (simulated) and the tenant nodes' kubelets.
struct World {
    parts: tenantry_e2e::World,
    substrate: Substrate,
    namespace: String,
}

/// Initialises a management cluster with the real clusterctl from the local
/// provider repository (Cluster API core and tenantry), as an operator
/// would. Nothing runs pods here, so the controllers clusterctl deployed
/// stay pending; the real managers run as processes instead and their
/// webhooks are registered by URL, replacing the ones clusterctl installed
/// (they point at Services with no pods behind them).
async fn init_with_clusterctl(control_plane: &ControlPlane, clusterctl: &Clusterctl) {
    let client = control_plane.client();
    install_cert_manager_crds(&client)
        .await
        .expect("install cert-manager CRDs");
    clusterctl
        .run(
            control_plane.kubeconfig_path(),
            &[
                "init",
                "--bootstrap=-",
                "--control-plane=-",
                "--infrastructure",
                "tenantry",
            ],
            &Default::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let installed = ListParams::default().labels("clusterctl.cluster.x-k8s.io");
    // Conversion webhooks too: the manager started next points them at
    // itself by URL, and a CRD may name a Service or a URL, not both.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds.list(&installed).await.expect("list CRDs").items {
        let by_service = crd
            .spec
            .conversion
            .as_ref()
            .and_then(|c| c.webhook.as_ref())
            .and_then(|w| w.client_config.as_ref())
            .is_some_and(|c| c.service.is_some());
        if by_service {
            crds.patch(
                &crd.metadata.name.unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "spec": { "conversion": { "strategy": "None", "webhook": null } } }),
                ),
            )
            .await
            .expect("unhook CRD conversion");
        }
    }
    delete_webhooks(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        &installed,
    )
    .await;
    delete_webhooks(Api::<MutatingWebhookConfiguration>::all(client), &installed).await;
}

/// Deletes the webhook configurations `api` lists with `selector`.
async fn delete_webhooks<K>(api: Api<K>, selector: &ListParams)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    for hook in api.list(selector).await.expect("list webhooks").items {
        api.delete(&hook.name_any(), &DeleteParams::default())
            .await
            .expect("delete webhook configuration");
    }
}

/// The world `builder` asks for, on a management cluster set up by
/// [`init_with_clusterctl`] before any controller starts; without the
/// harness's tenantry CRDs, which clusterctl installs.
async fn start_with_clusterctl(
    builder: WorldBuilder,
    clusterctl: &Clusterctl,
) -> tenantry_e2e::World {
    builder
        .without_tenantry_crds()
        .start_after(async |control_plane: &ControlPlane| {
            init_with_clusterctl(control_plane, clusterctl).await
        })
        .await
}

/// Kamaji for the tenants' control planes, and their Nodes' kubelets.
fn with_tenant_side(builder: WorldBuilder) -> WorldBuilder {
    builder
        .kamaji(TenantControlPlaneOptions {
            node_monitor_grace_period: Duration::from_secs(8),
            ..Default::default()
        })
        .nodes(NodeSimConfig::default())
}

/// CAPI core, the in-cluster IPAM provider, the PVE simulator, the tenant
/// side and tenantry, on `builder`'s management cluster.
fn with_proxmox(builder: WorldBuilder) -> WorldBuilder {
    with_tenant_side(builder.cluster_api().ipam().pve(lab_config(&[PVE_TENANT]))).tenantry()
}

impl World {
    async fn start_kubevirt() -> Self {
        let builder = tenantry_e2e::World::builder("management")
            .cluster_api()
            .kubevirt(Kubevirt::Real, KubevirtSimConfig::fast())
            .image_factory(ImageFactoryConfig {
                versions: vec![TALOS.into(), TALOS_NEXT.into()],
                ..Default::default()
            });
        Self {
            parts: with_tenant_side(builder).tenantry().start().await,
            substrate: Substrate::Kubevirt,
            namespace: NAMESPACE.into(),
        }
    }

    async fn start_proxmox() -> Self {
        Self::proxmox(
            with_proxmox(tenantry_e2e::World::builder("management"))
                .start()
                .await,
        )
    }

    fn proxmox(parts: tenantry_e2e::World) -> Self {
        Self {
            parts,
            substrate: Substrate::Proxmox,
            namespace: PVE_TENANT.into(),
        }
    }

    fn client(&self) -> kube::Client {
        self.parts.client()
    }

    /// After `clusterctl move`: the world's management cluster becomes
    /// `target`'s (with its CAPI manager, IPAM provider and tenantry); the
    /// source's are handed back to be stopped.
    fn move_to(&mut self, mut target: tenantry_e2e::World) -> tenantry_e2e::World {
        assert!(
            matches!(self.substrate, Substrate::Proxmox),
            "moving is tested with Proxmox workers"
        );
        self.parts.swap_management(&mut target);
        target
    }

    fn dynamic(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), &self.namespace, resource)
    }

    /// A MachineHealthCheck of the deployment's workers: the platform's
    /// default (Ready False or Unknown, at most 50% unhealthy) with short
    /// timeouts, remediating through `template_ref` when given.
    async fn create_health_check(&self, template_ref: Option<Value>) {
        let mut remediation = json!({ "triggerIf": { "unhealthyLessThanOrEqualTo": "50%" } });
        if let Some(template_ref) = template_ref {
            remediation["templateRef"] = template_ref;
        }
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
                "remediation": remediation
            }
        }))
        .await;
    }

    /// `Kubevirt<suffix>` or `Proxmox<suffix>`.
    fn infrastructure_kind(&self, suffix: &str) -> String {
        match self.substrate {
            Substrate::Kubevirt => format!("Kubevirt{suffix}"),
            Substrate::Proxmox => format!("Proxmox{suffix}"),
        }
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        self.parts.fail(error)
    }

    async fn create(&self, document: Value) {
        self.parts.create(&self.namespace, document).await;
    }

    /// The substrate's cluster object: a KubevirtCluster, or for Proxmox
    /// the tenant's pool, user and token on the hypervisor, its namespace
    /// with the credentials Secret, and a ProxmoxCluster.
    async fn create_infrastructure_cluster(&self) {
        match self.substrate {
            Substrate::Kubevirt => {
                self.create(fixtures::kubevirt_cluster(CLUSTER, json!({})))
                    .await;
            }
            Substrate::Proxmox => {
                let pve = self.parts.pve();
                let token = pve.tenant(PVE_TENANT, &[]).await;
                self.parts.create_namespace(PVE_TENANT).await;
                let mut credentials = fixtures::pve_credentials(PVE_CREDENTIALS, pve, &token);
                // Labelled so that `clusterctl move` takes it along.
                credentials["metadata"]["labels"] =
                    json!({ "clusterctl.cluster.x-k8s.io/move": "" });
                self.create(credentials).await;
                self.create(fixtures::proxmox_cluster(CLUSTER, 1, PVE_CREDENTIALS))
                    .await;
            }
        }
    }

    /// A Cluster with the substrate's cluster object and a
    /// KamajiControlPlane, as the platform makes tenant clusters; returns
    /// its tenant control plane once Kamaji serves it, after writing the
    /// workers' Talos config.
    async fn create_cluster(&self) -> TenantCluster {
        self.create_infrastructure_cluster().await;
        self.create(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2",
            "kind": "KamajiControlPlane",
            "metadata": { "name": CLUSTER },
            "spec": { "version": KUBERNETES_VERSION, "replicas": 2, "dataStoreName": "default" },
        }))
        .await;
        let mut cluster = fixtures::cluster(CLUSTER, &self.infrastructure_kind("Cluster"));
        cluster["spec"]["controlPlaneRef"] = json!({ "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KamajiControlPlane", "name": CLUSTER });
        self.create(cluster).await;
        let (kamaji, namespace) = (self.parts.kamaji(), self.namespace.as_str());
        let tenant = wait::until("the tenant control plane to run", DEADLINE, || async move {
            Ok(kamaji.tenant(namespace, CLUSTER))
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        self.create(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            // Not owned by any Machine: labelled so that `clusterctl move`
            // takes it along, as CAPI's move documentation asks.
            "metadata": { "name": BOOTSTRAP_SECRET, "labels": { "clusterctl.cluster.x-k8s.io/move": "" } },
            "stringData": { "value": talos_worker_config(&tenant.endpoint), "format": "cloud-config" }
        }))
        .await;
        // CAPI reports the control plane initialized (from Kamaji's status)
        // and the infrastructure provisioned (from tenantry's): from here on
        // it watches the tenant's Nodes.
        let clusters = self.dynamic(&capi("Cluster", "clusters"));
        wait::until("the Cluster to be initialized", DEADLINE, || {
            let clusters = clusters.clone();
            async move {
                let cluster = clusters.get(CLUSTER).await?;
                let status = &cluster.data["status"];
                let initialized = status["initialization"]["controlPlaneInitialized"] == true
                    && status["initialization"]["infrastructureProvisioned"] == true;
                Ok(initialized.then_some(()))
            }
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        tenant
    }

    /// A machine template for Talos workers of version `talos`. KubeVirt
    /// workers boot a disk from the image factory; Proxmox workers are
    /// clones of the Talos template VM.
    async fn create_template(&self, name: &str, talos: &str) {
        let factory = match self.substrate {
            Substrate::Kubevirt => self.parts.factory(),
            Substrate::Proxmox => {
                self.create(json!({
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
                    "kind": "ProxmoxMachineTemplate",
                    "metadata": { "name": name },
                    "spec": { "template": { "spec": worker_spec(PVE_TENANT) } }
                }))
                .await;
                return;
            }
        };
        self.create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachineTemplate",
            "metadata": { "name": name },
            "spec": { "template": { "spec": fixtures::talos_machine_spec(factory.base_url(), talos) } }
        }))
        .await;
    }

    async fn create_machine_deployment(&self, template: &str, replicas: u32) {
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
                        "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": self.infrastructure_kind("MachineTemplate"), "name": template }
                    }
                }
            }
        }))
        .await;
    }

    /// The cluster with a deployment of `replicas` Talos `TALOS` workers,
    /// once they all run.
    async fn create_cluster_with_workers(&self, replicas: usize) -> (TenantCluster, Fleet) {
        let tenant = self.create_cluster().await;
        self.create_template("demo-workers-a", TALOS).await;
        self.create_machine_deployment("demo-workers-a", replicas as u32)
            .await;
        let fleet = self
            .wait_fleet(&tenant, format!("{replicas} workers"), |f| {
                f.machines.len() == replicas
            })
            .await;
        (tenant, fleet)
    }

    async fn patch_machine_deployment(&self, patch: Value) {
        self.dynamic(&capi("MachineDeployment", "machinedeployments"))
            .patch(DEPLOYMENT, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("patch MachineDeployment");
    }

    /// The names of the substrate's VMs that are not being deleted, and how
    /// many VMs there are in all.
    async fn vms(&self) -> anyhow::Result<(BTreeSet<String>, usize)> {
        match self.substrate {
            Substrate::Kubevirt => {
                let vms = self
                    .dynamic(&virtual_machines())
                    .list(&ListParams::default())
                    .await?
                    .items;
                let live = vms
                    .iter()
                    .filter(|vm| vm.metadata.deletion_timestamp.is_none())
                    .filter_map(|vm| vm.metadata.name.clone())
                    .collect();
                Ok((live, vms.len()))
            }
            Substrate::Proxmox => {
                let guests: BTreeSet<String> = self
                    .parts
                    .pve()
                    .sim
                    .snapshot()
                    .vms
                    .iter()
                    .filter(|vm| !vm.template)
                    .map(|vm| vm.name.clone())
                    .collect();
                let count = guests.len();
                Ok((guests, count))
            }
        }
    }

    /// What an operator checks after a scale or rollout: the deployment's
    /// Machines, each `Running` with a Node in the tenant, and exactly one
    /// VM per Machine (and no VM without a Machine). `None` until all agree.
    async fn settled_fleet(&self, tenant: &TenantCluster) -> anyhow::Result<Option<Fleet>> {
        let machines = self
            .dynamic(&capi("Machine", "machines"))
            .list(
                &ListParams::default()
                    .labels(&format!("cluster.x-k8s.io/deployment-name={DEPLOYMENT}")),
            )
            .await?
            .items;
        let nodes = Api::<Node>::all(tenant.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let mut fleet = Fleet::default();
        for machine in &machines {
            let name = machine.metadata.name.clone().unwrap_or_default();
            let running = machine.data["status"]["phase"] == "Running";
            let node = machine.data["status"]["nodeRef"]["name"].as_str();
            if machine.metadata.deletion_timestamp.is_some() || !running || node.is_none() {
                return Ok(None);
            }
            fleet.machines.insert(name);
            fleet.infra.insert(
                machine.data["spec"]["infrastructureRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            fleet.node_refs.insert(node.unwrap_or_default().to_string());
        }
        (fleet.vms, fleet.all_vms) = self.vms().await?;
        fleet.nodes = nodes
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        fleet.os_images = nodes
            .iter()
            .filter_map(|n| Some(n.status.as_ref()?.node_info.as_ref()?.os_image.clone()))
            .collect();
        let consistent = fleet.vms == fleet.infra
            && fleet.all_vms == fleet.vms.len()
            && fleet.nodes == fleet.node_refs;
        Ok(consistent.then_some(fleet))
    }

    /// Scales the deployment and waits until CAPI, tenantry, the substrate
    /// and the tenant all agree on `replicas` workers.
    async fn scale(&self, tenant: &TenantCluster, replicas: usize) -> Fleet {
        self.patch_machine_deployment(json!({ "spec": { "replicas": replicas } }))
            .await;
        self.wait_fleet(tenant, format!("{replicas} workers"), |fleet| {
            fleet.machines.len() == replicas
        })
        .await
    }

    async fn wait_fleet(
        &self,
        tenant: &TenantCluster,
        what: String,
        done: impl Fn(&Fleet) -> bool,
    ) -> Fleet {
        let done = &done;
        let fleet = wait::until(what, DEADLINE, || async move {
            Ok(self.settled_fleet(tenant).await?.filter(|f| done(f)))
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        // And the MachineDeployment says so.
        let deployments = self.dynamic(&capi("MachineDeployment", "machinedeployments"));
        let replicas = fleet.machines.len() as i64;
        wait::until(
            "the MachineDeployment to count its ready workers",
            DEADLINE,
            || {
                let deployments = deployments.clone();
                async move {
                    let md = deployments.get(DEPLOYMENT).await?;
                    let status = &md.data["status"];
                    let counted = status["replicas"] == replicas
                        && status["readyReplicas"] == replicas
                        && status["availableReplicas"] == replicas;
                    Ok(counted.then_some(()))
                }
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(e));
        fleet
    }

    /// What is left of a deleted Cluster: CAPI objects, VMs, disks, IP
    /// claims and tenant control planes.
    async fn leftovers(&self) -> anyhow::Result<Vec<String>> {
        let mut left = Vec::new();
        let names = |resource: ApiResource| async move {
            anyhow::Ok(
                self.dynamic(&resource)
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(|o| {
                        format!(
                            "{} {}",
                            resource.kind,
                            o.metadata.name.clone().unwrap_or_default()
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        };
        left.extend(names(capi("Cluster", "clusters")).await?);
        left.extend(names(capi("Machine", "machines")).await?);
        match self.substrate {
            Substrate::Kubevirt => {
                left.extend(names(virtual_machines()).await?);
                left.extend(names(virtual_machine_instances()).await?);
                left.extend(
                    Api::<PersistentVolumeClaim>::namespaced(self.client(), &self.namespace)
                        .list(&ListParams::default())
                        .await?
                        .items
                        .iter()
                        .map(|o| format!("PVC {}", o.metadata.name.clone().unwrap_or_default())),
                );
            }
            Substrate::Proxmox => {
                left.extend(
                    names(resource(
                        "ipam.cluster.x-k8s.io",
                        "v1beta2",
                        "IPAddressClaim",
                        "ipaddressclaims",
                    ))
                    .await?,
                );
                let snapshot = self.parts.pve().sim.snapshot();
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
                        .filter(|v| v.storage.starts_with(PVE_TENANT))
                        .map(|v| format!("volume {}", v.volid)),
                );
            }
        }
        let tenants = self.parts.kamaji().running().await;
        if tenants > 0 {
            left.push(format!("{tenants} tenant control plane(s)"));
        }
        if !self.parts.nodes().nodes().is_empty() {
            left.push(format!("kubelets {:?}", self.parts.nodes().nodes()));
        }
        Ok(left)
    }

    /// Deletes the Cluster and waits until the substrate and Kamaji hold
    /// nothing of it.
    async fn delete_cluster_and_check_nothing_is_left(&self) {
        self.dynamic(&capi("Cluster", "clusters"))
            .delete(CLUSTER, &DeleteParams::default())
            .await
            .expect("delete Cluster");
        let outcome = wait::until(
            "everything of the Cluster to be gone",
            DEADLINE,
            || async move { Ok(self.leftovers().await?.is_empty().then_some(())) },
        )
        .await;
        if let Err(error) = outcome {
            let left = self.leftovers().await;
            self.fail(error.context(format!("still there: {left:?}")));
        }
    }
}

/// The workers as CAPI, the substrate and the tenant see them.
#[derive(Debug, Default)]
struct Fleet {
    machines: BTreeSet<String>,
    /// The infrastructure machines the Machines reference.
    infra: BTreeSet<String>,
    node_refs: BTreeSet<String>,
    /// VMs not being deleted.
    vms: BTreeSet<String>,
    /// All VMs, including those being deleted.
    all_vms: usize,
    nodes: BTreeSet<String>,
    os_images: BTreeSet<String>,
}

/// A Talos worker config naming the tenant's endpoint, as CABPT renders
/// one (trimmed to what a kubelet reads).
fn talos_worker_config(endpoint: &str) -> String {
    format!(
        "version: v1alpha1\ndebug: false\npersist: true\nmachine:\n  type: worker\n  token: test-token\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:{KUBERNETES_VERSION}\ncluster:\n  controlPlane:\n    endpoint: {endpoint}\n  clusterName: {CLUSTER}\n"
    )
}

#[tokio::test]
async fn kubevirt_machine_deployment_scales_up_and_down_with_capi() {
    let world = World::start_kubevirt().await;
    let (tenant, none) = world.create_cluster_with_workers(0).await;
    assert!(none.vms.is_empty());

    let three = world.scale(&tenant, 3).await;
    assert_eq!(three.nodes.len(), 3, "{three:?}");
    // Each Node carries the providerID tenantry reported for its Machine.
    let nodes = Api::<Node>::all(tenant.client.clone())
        .list(&ListParams::default())
        .await
        .expect("list Nodes");
    for node in &nodes.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.clone()),
            Some(format!("kubevirt://{name}"))
        );
    }

    let five = world.scale(&tenant, 5).await;
    assert!(
        three.machines.is_subset(&five.machines),
        "scale-up keeps the workers it had"
    );

    let one = world.scale(&tenant, 1).await;
    assert!(
        one.machines.is_subset(&five.machines),
        "scale-down keeps one of the existing workers: {one:?}"
    );
    // The VMs that went are exactly those of the Machines CAPI deleted.
    let removed: BTreeSet<&String> = five.infra.difference(&one.infra).collect();
    assert_eq!(removed.len(), 4);
    assert!(one.vms.iter().all(|vm| !removed.contains(vm)));

    world.delete_cluster_and_check_nothing_is_left().await;
}

#[tokio::test]
async fn rolling_update_to_a_new_talos_version_replaces_every_worker() {
    let world = World::start_kubevirt().await;
    let (tenant, before) = world.create_cluster_with_workers(3).await;
    assert_eq!(
        before.os_images,
        BTreeSet::from([format!("Talos ({TALOS})")])
    );

    // Templates are immutable: a new version is a new template.
    world.create_template("demo-workers-b", TALOS_NEXT).await;
    world
        .patch_machine_deployment(json!({ "spec": { "template": { "spec": {
            "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachineTemplate", "name": "demo-workers-b" }
        }}}}))
        .await;
    let expected_image = format!("Talos ({TALOS_NEXT})");
    let after = world
        .wait_fleet(&tenant, "3 workers on the new Talos version".into(), |f| {
            f.machines.len() == 3
                && f.machines.is_disjoint(&before.machines)
                && f.os_images == BTreeSet::from([expected_image.clone()])
        })
        .await;
    assert!(after.vms.is_disjoint(&before.vms), "every VM was replaced");
    // Each new VM boots the new image.
    let vms = world.dynamic(&virtual_machines());
    let url =
        world
            .parts
            .factory()
            .image_url(DEFAULT_SCHEMATIC, TALOS_NEXT, "openstack-amd64.raw.xz");
    for name in &after.vms {
        let vm = vms.get(name).await.expect("VM");
        assert_eq!(
            vm.data["spec"]["dataVolumeTemplates"][0]["spec"]["source"]["http"]["url"],
            url
        );
    }

    world.delete_cluster_and_check_nothing_is_left().await;
}

#[tokio::test]
async fn machine_health_check_replaces_an_unhealthy_worker_but_not_half_the_pool() {
    let world = World::start_kubevirt().await;
    let (tenant, before) = world.create_cluster_with_workers(3).await;
    world.create_health_check(None).await;
    let checks = world.dynamic(&capi("MachineHealthCheck", "machinehealthchecks"));
    let check_counts = |healthy: i64| {
        let checks = checks.clone();
        move || {
            let checks = checks.clone();
            async move {
                let mhc = checks.get(DEPLOYMENT).await?;
                let status = &mhc.data["status"];
                Ok(
                    (status["expectedMachines"] == 3 && status["currentHealthy"] == healthy)
                        .then_some(mhc),
                )
            }
        }
    };
    wait::until(
        "the health check to count 3 healthy workers",
        DEADLINE,
        check_counts(3),
    )
    .await
    .unwrap_or_else(|e| world.fail(e));

    // One worker's kubelet reports NotReady: CAPI remediates it, tenantry
    // deletes its VM, a replacement joins.
    let machine_of = |fleet: &Fleet, node: &str| -> String {
        // Nodes, VMs and Machines share their name here.
        assert!(fleet.machines.contains(node), "{node} in {fleet:?}");
        node.to_string()
    };
    let sick = before.node_refs.iter().next().expect("a node").clone();
    let sick_machine = machine_of(&before, &sick);
    world.parts.nodes().inject_fault(&sick, NodeFault::NotReady);
    let healed = world
        .wait_fleet(&tenant, format!("{sick} to be replaced"), |f| {
            f.machines.len() == 3 && !f.machines.contains(&sick_machine)
        })
        .await;
    world.parts.nodes().clear_fault(&sick);
    assert_eq!(
        healed.machines.intersection(&before.machines).count(),
        2,
        "only the unhealthy worker was replaced"
    );
    assert!(!healed.vms.contains(&sick), "its VM is gone");
    wait::until(
        "the health check to count 3 healthy workers again",
        DEADLINE,
        check_counts(3),
    )
    .await
    .unwrap_or_else(|e| world.fail(e));

    // Two of three NotReady is more than 50%: nothing is remediated, and the
    // health check says why.
    let pair: Vec<&str> = healed
        .node_refs
        .iter()
        .take(2)
        .map(String::as_str)
        .collect();
    world
        .parts
        .nodes()
        .inject_faults(&pair, NodeFault::NotReady);
    let mhc = wait::until("the health check to restrict remediation", DEADLINE, || {
        let checks = checks.clone();
        async move {
            let mhc = checks.get(DEPLOYMENT).await?;
            let restricted = mhc.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == "RemediationAllowed"
                        && c["status"] == "False"
                        && c["reason"] == "TooManyUnhealthy"
                });
            Ok((restricted && mhc.data["status"]["currentHealthy"] == 1).then_some(mhc))
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        mhc.data["status"]["remediationsAllowed"], 0,
        "{}",
        mhc.data["status"]
    );
    let machines = world.dynamic(&capi("Machine", "machines"));
    for name in &pair {
        let machine = machines
            .get(name)
            .await
            .expect("the unhealthy Machine is kept");
        assert!(
            machine.metadata.deletion_timestamp.is_none(),
            "{name} is not remediated"
        );
        let conditions = machine.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == "HealthCheckSucceeded" && c["status"] == "False"),
            "{name} is marked unhealthy: {conditions:?}"
        );
        assert!(
            !conditions
                .iter()
                .any(|c| c["type"] == "OwnerRemediated" && c["status"] == "False"),
            "{name} is not handed to its owner for remediation: {conditions:?}"
        );
    }
    for name in &pair {
        world.parts.nodes().clear_fault(name);
    }
    wait::until(
        "the health check to count 3 healthy workers at last",
        DEADLINE,
        check_counts(3),
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    let still = world
        .wait_fleet(&tenant, "the same 3 workers".into(), |f| {
            f.machines.len() == 3
        })
        .await;
    assert_eq!(still.machines, healed.machines, "no worker was replaced");

    world.delete_cluster_and_check_nothing_is_left().await;
}

#[tokio::test]
async fn proxmox_machine_deployment_scales_up_and_down_with_capi() {
    let world = World::start_proxmox().await;
    let (tenant, _) = world.create_cluster_with_workers(0).await;

    let three = world.scale(&tenant, 3).await;
    // Each worker was cloned into the tenant's pool, and its Node carries
    // the SMBIOS UUID providerID that tenantry reported for its Machine.
    let pve = world.parts.pve();
    let snapshot = pve.sim.snapshot();
    let machines = world.dynamic(&capi("Machine", "machines"));
    for name in &three.machines {
        let vm = snapshot
            .vms
            .iter()
            .find(|vm| &vm.name == name)
            .expect("a VM per Machine");
        assert_eq!(vm.pool.as_deref(), Some(PVE_TENANT));
        let machine = machines.get(name).await.expect("Machine");
        let provider_id = format!("proxmox://{}", vm.smbios_uuid.clone().expect("uuid"));
        assert_eq!(machine.data["spec"]["providerID"], provider_id.as_str());
        let node = Api::<Node>::all(tenant.client.clone())
            .get(name)
            .await
            .expect("Node");
        assert_eq!(node.spec.and_then(|s| s.provider_id), Some(provider_id));
    }

    let five = world.scale(&tenant, 5).await;
    assert!(three.machines.is_subset(&five.machines));
    let one = world.scale(&tenant, 1).await;
    assert!(one.machines.is_subset(&five.machines), "{one:?}");
    assert_eq!(five.vms.difference(&one.vms).count(), 4);

    world.delete_cluster_and_check_nothing_is_left().await;
}

/// The UIDs that tell a restarted VM from a replaced one.
#[derive(Debug, PartialEq, Eq)]
struct VmIdentity {
    vm: String,
    data_volume: String,
    pvc: String,
}

async fn vm_identity(world: &World, name: &str) -> VmIdentity {
    let uid = |o: DynamicObject| o.metadata.uid.unwrap_or_default();
    let vm = world
        .dynamic(&virtual_machines())
        .get(name)
        .await
        .expect("VM");
    let disk = vm.data["spec"]["dataVolumeTemplates"][0]["metadata"]["name"]
        .as_str()
        .expect("boot disk DataVolume")
        .to_string();
    let data_volume = world
        .dynamic(&resource(
            "cdi.kubevirt.io",
            "v1beta1",
            "DataVolume",
            "datavolumes",
        ))
        .get(&disk)
        .await
        .expect("DataVolume");
    let pvc = Api::<PersistentVolumeClaim>::namespaced(world.client(), &world.namespace)
        .get(&disk)
        .await
        .expect("PVC");
    VmIdentity {
        vm: uid(vm),
        data_volume: uid(data_volume),
        pvc: pvc.metadata.uid.unwrap_or_default(),
    }
}

async fn vmi_uid(world: &World, name: &str) -> Option<String> {
    world
        .dynamic(&virtual_machine_instances())
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|vmi| vmi.metadata.uid)
}

#[tokio::test]
async fn health_check_reboots_a_worker_first_and_replaces_it_only_when_reboots_fail() {
    let world = World::start_kubevirt().await;
    let (tenant, before) = world.create_cluster_with_workers(3).await;
    world
        .create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtRemediationTemplate",
            "metadata": { "name": "reboot-first" },
            "spec": { "template": { "spec": { "strategy": { "type": "Reboot", "retryLimit": 2, "timeout": "15s" } } } }
        }))
        .await;
    world
        .create_health_check(Some(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtRemediationTemplate",
            "name": "reboot-first",
        })))
        .await;
    let remediations = world.dynamic(&resource(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "KubevirtRemediation",
        "kubevirtremediations",
    ));
    let mut names = before.machines.iter();

    // A kubelet that a reboot fixes: one restart, same VM and disk.
    let wedged = names.next().expect("a worker").clone();
    let identity = vm_identity(&world, &wedged).await;
    let first_boot = vmi_uid(&world, &wedged).await.expect("a running VMI");
    world
        .parts
        .nodes()
        .inject_fault(&wedged, NodeFault::NotReadyUntilReboot);
    let remediation = wait::until(
        format!("a KubevirtRemediation for {wedged} to restart it"),
        DEADLINE,
        || {
            let remediations = remediations.clone();
            let wedged = wedged.clone();
            async move {
                let remediation = remediations.get_opt(&wedged).await?;
                Ok(remediation.filter(|r| r.data["status"]["retryCount"] == 1))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        remediation.data["spec"]["strategy"]["retryLimit"], 2,
        "cloned from the template"
    );
    wait::until(
        format!("{wedged} to be healthy and its remediation done"),
        DEADLINE,
        || {
            let remediations = remediations.clone();
            let wedged = wedged.clone();
            let nodes = world.parts.nodes();
            async move {
                let gone = remediations.get_opt(&wedged).await?.is_none();
                Ok((gone && !nodes.faults().contains_key(&wedged)).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    let rebooted = world
        .wait_fleet(&tenant, "the same 3 workers".into(), |f| {
            f.machines.len() == 3
        })
        .await;
    assert_eq!(rebooted.machines, before.machines, "nothing was replaced");
    assert_eq!(
        vm_identity(&world, &wedged).await,
        identity,
        "same VM, same disk"
    );
    assert_ne!(
        vmi_uid(&world, &wedged).await.as_deref(),
        Some(first_boot.as_str()),
        "the VM was restarted"
    );

    // A guest that hangs at every boot: two restarts, then CAPI replaces it.
    let hung = names.next().expect("a second worker").clone();
    world.parts.kubevirt().faults().inject(
        FaultTarget::named(&world.namespace, &hung),
        Fault::HungGuest,
    );
    let boots = std::sync::Mutex::new(BTreeSet::new());
    let given_up = wait::until(
        format!("remediation of {hung} to give up after its retries"),
        DEADLINE,
        || {
            let remediations = remediations.clone();
            let hung = hung.clone();
            let boots = &boots;
            let world = &world;
            async move {
                if let Some(uid) = vmi_uid(world, &hung).await {
                    boots.lock().expect("boots").insert(uid);
                }
                let remediation = remediations.get_opt(&hung).await?;
                Ok(remediation.filter(|r| {
                    r.data["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Remediated" && c["reason"] == "RetriesExhausted")
                }))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        given_up.data["status"]["retryCount"], 2,
        "{}",
        given_up.data["status"]
    );
    assert_eq!(given_up.data["status"]["phase"], "Replacing");
    let boots = boots.into_inner().expect("boots");
    assert!(
        boots.len() >= 3,
        "booted three times before giving up: {boots:?}"
    );
    let replaced = world
        .wait_fleet(&tenant, format!("{hung} to be replaced"), |f| {
            f.machines.len() == 3 && !f.machines.contains(&hung)
        })
        .await;
    assert!(replaced.machines.contains(&wedged));
    assert!(!replaced.vms.contains(&hung), "its VM is gone");
    let events = Api::<Event>::namespaced(world.client(), &world.namespace)
        .list(&ListParams::default())
        .await
        .expect("events");
    assert!(
        events.items.iter().any(|e| {
            e.reason.as_deref() == Some("MachineDeleted")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(hung.as_str())
        }),
        "an event says the Machine was handed over for replacement"
    );

    world.delete_cluster_and_check_nothing_is_left().await;
}

// `clusterctl move` between two management clusters set up by
// `clusterctl init`: the target's tenantry adopts the running VMs (status
// does not move with the objects), the source's leaves them alone while
// clusterctl deletes its copies.
#[tokio::test]
async fn clusterctl_move_hands_proxmox_workers_to_another_management_cluster() {
    tenantry_e2e::logs::from_env();
    let clusterctl = Clusterctl::with_local_repository().expect("local provider repository");
    let source = start_with_clusterctl(
        with_proxmox(tenantry_e2e::World::builder("source")),
        &clusterctl,
    )
    .await;
    let mut world = World::proxmox(source);
    let (tenant, before) = world.create_cluster_with_workers(2).await;
    let pve = world.parts.pve();
    let hypervisor = |pve: &PveLab| {
        let snapshot = pve.sim.snapshot();
        let vms: Vec<(u32, String, u32)> = snapshot
            .vms
            .iter()
            .filter(|vm| !vm.template)
            .map(|vm| (vm.vmid, vm.name.clone(), vm.boots))
            .collect();
        let lifecycle_tasks = snapshot
            .tasks
            .iter()
            .filter(|t| {
                ["qmclone", "qmdestroy", "qmreset", "qmstop", "qmstart"]
                    .contains(&t.task_type.as_str())
            })
            .count();
        (vms, lifecycle_tasks)
    };
    let (vms_before, tasks_before) = hypervisor(pve);
    assert_eq!(vms_before.len(), 2);

    // The target: initialised the same way, with its own controllers and
    // tenantry already running, as an operator prepares it.
    let target = start_with_clusterctl(
        tenantry_e2e::World::builder("target")
            .cluster_api()
            .ipam()
            .tenantry(),
        &clusterctl,
    )
    .await;
    world
        .parts
        .kamaji()
        .serve(target.client())
        .await
        .expect("Kamaji serves the target");

    // clusterctl pauses the cluster for the move itself, and refuses one
    // that is paused already: whoever paused it may not want it moved.
    let clusters = world.dynamic(&capi("Cluster", "clusters"));
    let pause = |paused: bool| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    CLUSTER,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "paused": paused } })),
                )
                .await
                .expect("pause or resume the Cluster");
        }
    };
    let to_kubeconfig = target
        .control_plane()
        .kubeconfig_path()
        .display()
        .to_string();
    let move_args = [
        "move",
        "--namespace",
        PVE_TENANT,
        "--to-kubeconfig",
        to_kubeconfig.as_str(),
    ];
    pause(true).await;
    let refused = clusterctl
        .run(
            world.parts.control_plane().kubeconfig_path(),
            &move_args,
            &Default::default(),
        )
        .await
        .expect_err("clusterctl refuses to move a paused cluster");
    assert!(
        format!("{refused:#}").contains("following Clusters are paused"),
        "{refused:#}"
    );
    pause(false).await;
    let output = clusterctl
        .run(
            world.parts.control_plane().kubeconfig_path(),
            &move_args,
            &Default::default(),
        )
        .await
        .unwrap_or_else(|e| world.fail(e))
        .combined();
    assert!(output.contains("Moving Cluster API objects"), "{output}");
    let source = world.move_to(target);
    world.parts.kamaji().serve_only(world.client());

    // Nothing of the cluster is left in the source.
    let source_machines: Api<DynamicObject> =
        Api::namespaced_with(source.client(), PVE_TENANT, &capi("Machine", "machines"));
    assert!(
        source_machines
            .list(&ListParams::default())
            .await
            .expect("list source Machines")
            .items
            .is_empty(),
        "the source keeps no Machine"
    );
    drop(source);

    // In the target, tenantry and CAPI pick the same workers up:
    // ProxmoxMachines provisioned again, Machines Running with their
    // Nodes, and on the hypervisor not a single VM created, deleted or
    // restarted.
    let machines = world.dynamic(&resource(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha2",
        "ProxmoxMachine",
        "proxmoxmachines",
    ));
    let provisioned = wait::until(
        "the moved ProxmoxMachines to be provisioned",
        DEADLINE,
        || {
            let machines = machines.clone();
            async move {
                let list = machines.list(&ListParams::default()).await?.items;
                let ready = list.len() == 2
                    && list.iter().all(|m| {
                        m.data["status"]["initialization"]["provisioned"] == true
                            && m.data["status"]["conditions"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                Ok(ready.then_some(()))
            }
        },
    )
    .await;
    if let Err(error) = provisioned {
        let list = machines
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let states: Vec<String> = list
            .iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m.metadata.name.as_deref().unwrap_or_default(),
                    m.data["status"]
                )
            })
            .collect();
        world.fail(error.context(states.join("\n")));
    }
    let after = world
        .wait_fleet(&tenant, "the moved workers to run".into(), |f| {
            f.machines == before.machines
        })
        .await;
    assert_eq!(after.vms, before.vms);
    let pve = world.parts.pve();
    let (vms_after, tasks_after) = hypervisor(pve);
    assert_eq!(vms_after, vms_before, "same VMs, same boots");
    assert_eq!(
        tasks_after, tasks_before,
        "no VM was cloned, deleted or power-cycled"
    );

    // Deleting the moved cluster still cleans up everything.
    world.delete_cluster_and_check_nothing_is_left().await;
}
