//! Tenantry as a platform installs and runs it: its release components
//! (the manager image pinned by digest) installed by the real `clusterctl
//! init` or by the real cluster-api-operator from a compressed ConfigMap,
//! into a management cluster whose pods run (`tenantry_e2e::management`:
//! real kube-scheduler, Deployment/ReplicaSet/EndpointSlice controllers,
//! real cert-manager, and the pod runner as its node). The manager runs
//! from its image with its own ServiceAccount and RBAC, its webhooks are
//! reached through their Service, and Cluster API's core manager runs the
//! same way from its own release components.
//!
//! Asserted is what an operator sees: Deployments available, webhooks
//! answering, MachineDeployments scaled 0 → 3 → 0 with one VM per Machine
//! and Nodes in the tenant, a `Kubernetes` object's pool joining, upgrades
//! that replace no Machine and no VM, and a manager that stops working
//! when a rule it needs is taken out of its ClusterRole.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tenantry_e2e::cluster_api_operator::{
    ClusterApiOperator, ProviderKind, compressed_provider_config_map, provider,
    provider_components_selector,
};
use tenantry_e2e::clusterctl::{Clusterctl, TENANTRY_VERSION};
use tenantry_e2e::demo::DemoCluster;
use tenantry_e2e::management::{
    ManagementCluster, NEXT_VERSION, next_build, tenantry_image_reference,
};
use tenantry_e2e::pve_lab::{PveLab, lab_config, worker_spec};
use tenantry_e2e::scrape::{Scrape, Scraper, service_account_token};
use tenantry_e2e::sim::kubevirt::{
    DEFAULT_SCHEMATIC, ImageFactory, ImageFactoryConfig, KubevirtSimConfig, KubevirtSimulator,
};
use tenantry_e2e::sim::tenant::{
    EtcdSimulator, KamajiControlPlaneSimulator, NodeSimConfig, NodeSimulator, TenantCluster,
    TenantClusters, TenantControlPlaneOptions,
};
use tenantry_e2e::{UpstreamManager, wait};
use tenantry_provider::components;

const DEADLINE: Duration = Duration::from_secs(300);
const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const TEMPLATE: &str = "demo-workers";
const BOOTSTRAP_SECRET: &str = "demo-talos-worker";
const KUBERNETES_VERSION: &str = "v1.35.0";
const TALOS: &str = "v1.13.6";
const PVE_TENANT: &str = "tenant-a";
const PVE_CREDENTIALS: &str = "pve-credentials";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn capi(kind: &str, plural: &str) -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", kind, plural)
}

/// Where the workers run. Simulators of what cannot run here: they run on
/// the host and serve the node address, where the deployed managers reach
/// them.
enum Substrate {
    None,
    Kubevirt {
        _sim: KubevirtSimulator,
        factory: ImageFactory,
    },
    Proxmox {
        pve: PveLab,
        _ipam: UpstreamManager,
    },
}

/// A management cluster with Cluster API and tenantry deployed, cert-manager,
/// and the tenant side (Kamaji and the workers' kubelets).
struct Deployed {
    // Field order is drop order.
    nodes: NodeSimulator,
    kamaji: KamajiControlPlaneSimulator,
    substrate: Substrate,
    namespace: String,
    cluster: ManagementCluster,
}

impl Deployed {
    /// The management cluster, cert-manager, Kamaji and the kubelets; no
    /// provider installed yet. With `verify_join`, a worker's kubelet joins
    /// only with the tenant's CA and a bootstrap token that exists in the
    /// tenant (which tenantry's companion writes there for `Kubernetes`
    /// pools); raw MachineDeployments carry a test config without them.
    async fn start(name: &str, verify_join: bool) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn,tenantry_e2e=info".into()),
            )
            .with_test_writer()
            .try_init();
        let cluster = ManagementCluster::start(name)
            .await
            .expect("management cluster");
        let tenants = TenantClusters::new();
        let kamaji = KamajiControlPlaneSimulator::start(
            cluster.client(),
            tenants.clone(),
            TenantControlPlaneOptions {
                address: Some(cluster.node_ip()),
                ..Default::default()
            },
        )
        .await
        .expect("Kamaji simulator");
        let nodes = NodeSimulator::start(
            tenants,
            NodeSimConfig {
                verify_join,
                ..Default::default()
            },
        );
        Self {
            nodes,
            kamaji,
            substrate: Substrate::None,
            namespace: NAMESPACE.into(),
            cluster,
        }
    }

    /// KubeVirt (simulated, with CDI and the image factory) for the workers.
    async fn with_kubevirt(mut self) -> Self {
        let sim = KubevirtSimulator::start(self.client(), KubevirtSimConfig::fast())
            .await
            .expect("KubeVirt simulator");
        let factory = ImageFactory::start(ImageFactoryConfig {
            versions: vec![TALOS.into()],
            ..Default::default()
        })
        .await
        .expect("image factory");
        self.nodes.follow_kubevirt(self.client());
        self.substrate = Substrate::Kubevirt { _sim: sim, factory };
        self
    }

    /// A Proxmox VE cluster (simulated) listening on the node address, its
    /// tenant's pool, user and token, and the in-cluster IPAM provider for
    /// the workers' addresses (run beside the cluster: only tenantry and
    /// Cluster API run deployed here).
    async fn with_proxmox(mut self) -> Self {
        let ipam = UpstreamManager::start_ipam_in_cluster(&self.cluster.control_plane)
            .await
            .expect("in-cluster IPAM provider");
        let mut config = lab_config(&[PVE_TENANT]);
        config.listen = (self.cluster.node_ip(), 0).into();
        let pve = PveLab::start(config).await;
        self.nodes.follow_proxmox(pve.sim.observer());
        self.namespace = PVE_TENANT.into();
        self.substrate = Substrate::Proxmox { pve, _ipam: ipam };
        self
    }

    /// `clusterctl init` of Cluster API core and tenantry from a local
    /// repository holding this build's release (image pinned by digest);
    /// both managers become available.
    async fn install_with_clusterctl(self) -> (Self, Clusterctl) {
        let clusterctl = self
            .cluster
            .install_with_clusterctl(&Default::default(), DEADLINE)
            .await
            .unwrap_or_else(|e| self.fail(e));
        (self, clusterctl)
    }

    fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        panic!(
            "{error:#}\n{}\n---- tenantry ----\n{}\n---- Cluster API ----\n{}\n---- cert-manager ----\n{}",
            self.cluster.describe(),
            self.cluster
                .runner
                .logs(components::NAMESPACE, "tenantry", 60),
            self.cluster.runner.logs("capi-system", "capi", 30),
            self.cluster.cert_manager.log_tails(20),
        )
    }

    async fn wait_available(&self, namespace: &str, name: &str) {
        self.cluster
            .wait_available(namespace, name, DEADLINE)
            .await
            .unwrap_or_else(|e| self.fail(e));
    }

    /// The manager's Deployment runs `image` on all its pods, and only them.
    async fn wait_manager_image(&self, image: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client(), components::NAMESPACE);
        wait::until(format!("the manager to run {image}"), DEADLINE, || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("control-plane=controller-manager"))
                    .await?
                    .items;
                let rolled = !list.is_empty()
                    && list.iter().all(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec
                                .as_ref()
                                .and_then(|s| s.containers[0].image.as_deref())
                                == Some(image)
                            && p.status
                                .as_ref()
                                .and_then(|s| s.container_statuses.as_ref())
                                .is_some_and(|c| c.iter().all(|c| c.ready))
                    });
                Ok(rolled.then_some(()))
            }
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        self.wait_available(components::NAMESPACE, components::DEPLOYMENT_NAME)
            .await;
    }

    /// The manager's pods, as `kubectl get pods` lists them.
    async fn manager_pods(&self) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client(), components::NAMESPACE)
            .list(&ListParams::default().labels("control-plane=controller-manager"))
            .await
            .expect("list manager pods")
            .items
    }

    fn dynamic(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), &self.namespace, resource)
    }

    async fn create(&self, document: Value) {
        tenantry_e2e::manifests::create_object(&self.client(), &document, &self.namespace)
            .await
            .unwrap_or_else(|e| self.fail(e));
    }

    /// `Kubevirt<suffix>` or `Proxmox<suffix>`.
    fn kind(&self, suffix: &str) -> String {
        match self.substrate {
            Substrate::Proxmox { .. } => format!("Proxmox{suffix}"),
            _ => format!("Kubevirt{suffix}"),
        }
    }

    /// The substrate's cluster object (for Proxmox with the tenant's
    /// namespace and credentials Secret).
    async fn create_infrastructure_cluster(&self) {
        match &self.substrate {
            Substrate::Proxmox { pve, .. } => {
                let token = pve.tenant(PVE_TENANT, &[]).await;
                tenantry_e2e::manifests::apply_object(
                    &self.client(),
                    &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": PVE_TENANT } }),
                    "default",
                )
                .await
                .unwrap_or_else(|e| self.fail(e));
                self.create(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": { "name": PVE_CREDENTIALS },
                    "stringData": {
                        "url": pve.sim.url().as_str(),
                        "token_id": token.id,
                        "token_secret": token.secret,
                        "root_ca": pve.sim.ca_pem(),
                    }
                }))
                .await;
                self.create(json!({
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2", "kind": "ProxmoxCluster",
                    "metadata": { "name": CLUSTER },
                    "spec": {
                        "controlPlaneEndpoint": { "host": "10.10.0.5", "port": 6443 },
                        "ipv4Config": { "addresses": ["10.10.1.10-10.10.1.60"], "prefix": 24, "gateway": "10.10.1.1" },
                        "dnsServers": ["10.10.0.53"],
                        "allowedNodes": ["pve1", "pve2"],
                        "credentialsRef": { "name": PVE_CREDENTIALS },
                    }
                }))
                .await;
            }
            _ => {
                self.create(json!({
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                    "kind": "KubevirtCluster",
                    "metadata": { "name": CLUSTER },
                    "spec": {},
                }))
                .await;
            }
        }
    }

    /// The names of the substrate's VMs (KubeVirt VirtualMachines, or
    /// Proxmox guests that are not templates), by UID or VMID.
    async fn vms(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(match &self.substrate {
            Substrate::Proxmox { pve, .. } => pve
                .sim
                .snapshot()
                .vms
                .iter()
                .filter(|vm| !vm.template)
                .map(|vm| format!("{}:{}", vm.vmid, vm.name))
                .collect(),
            _ => self
                .dynamic(&resource(
                    "kubevirt.io",
                    "v1",
                    "VirtualMachine",
                    "virtualmachines",
                ))
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(uid)
                .collect(),
        })
    }

    /// A Cluster with the substrate's cluster object and a
    /// KamajiControlPlane; its tenant once Kamaji serves it and CAPI has
    /// initialized it.
    async fn create_cluster(&self) -> TenantCluster {
        self.create_infrastructure_cluster().await;
        self.create(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2",
            "kind": "KamajiControlPlane",
            "metadata": { "name": CLUSTER },
            "spec": { "version": KUBERNETES_VERSION, "replicas": 2, "dataStoreName": "default" },
        }))
        .await;
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": CLUSTER },
            "spec": {
                "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] }, "services": { "cidrBlocks": ["10.95.0.0/16"] } },
                "controlPlaneRef": { "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KamajiControlPlane", "name": CLUSTER },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": self.kind("Cluster"), "name": CLUSTER }
            }
        }))
        .await;
        let (kamaji, namespace) = (&self.kamaji, self.namespace.as_str());
        let tenant = wait::until("the tenant control plane to run", DEADLINE, || async move {
            Ok(kamaji.tenant(namespace, CLUSTER))
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
        let clusters = self.dynamic(&capi("Cluster", "clusters"));
        wait::until("the Cluster to be initialized", DEADLINE, || {
            let clusters = clusters.clone();
            async move {
                let cluster = clusters.get(CLUSTER).await?;
                let status = &cluster.data["status"]["initialization"];
                Ok((status["controlPlaneInitialized"] == true
                    && status["infrastructureProvisioned"] == true)
                    .then_some(()))
            }
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        tenant
    }

    /// A machine template and a MachineDeployment of `replicas` workers.
    async fn create_workers(&self, replicas: u32) {
        let factory = match &self.substrate {
            Substrate::Kubevirt { factory, .. } => factory,
            Substrate::Proxmox { .. } => {
                self.create(json!({
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
                    "kind": "ProxmoxMachineTemplate",
                    "metadata": { "name": TEMPLATE },
                    "spec": { "template": { "spec": worker_spec(PVE_TENANT) } }
                }))
                .await;
                return self.create_machine_deployment(replicas).await;
            }
            Substrate::None => panic!("no substrate for workers"),
        };
        self.create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachineTemplate",
            "metadata": { "name": TEMPLATE },
            "spec": { "template": { "spec": {
                "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
                "bootDisk": {
                    "imageFactoryURL": factory.base_url().trim_end_matches('/'),
                    "schematicID": DEFAULT_SCHEMATIC,
                    "talosVersion": TALOS,
                    "diskSize": "20Gi",
                    "storageClass": "replicated"
                },
                "virtualMachineTemplate": { "spec": {
                    "runStrategy": "Always",
                    "template": { "spec": {
                        "domain": {
                            "cpu": { "cores": 2 },
                            "memory": { "guest": "4Gi" },
                            "devices": { "interfaces": [{ "name": "default", "bridge": {} }] }
                        },
                        "networks": [{ "name": "default", "pod": {} }]
                    }}
                }}
            }}}
        }))
        .await;
        self.create_machine_deployment(replicas).await;
    }

    async fn create_machine_deployment(&self, replicas: u32) {
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
                        "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": self.kind("MachineTemplate"), "name": TEMPLATE }
                    }
                }
            }
        }))
        .await;
    }

    async fn scale(&self, replicas: usize) {
        self.dynamic(&capi("MachineDeployment", "machinedeployments"))
            .patch(
                DEPLOYMENT,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
            )
            .await
            .unwrap_or_else(|e| self.fail(e.into()));
    }

    /// The workers once CAPI, tenantry, KubeVirt and the tenant agree on
    /// `replicas`: Machines `Running` with a Node each, one VM per Machine.
    async fn wait_workers(&self, tenant: &TenantCluster, replicas: usize) -> Workers {
        let what = format!("{replicas} workers running with a Node and a VM each");
        wait::until(what, DEADLINE, || async {
            let machines = self
                .dynamic(&capi("Machine", "machines"))
                .list(
                    &ListParams::default()
                        .labels(&format!("cluster.x-k8s.io/deployment-name={DEPLOYMENT}")),
                )
                .await?
                .items;
            let vms = self.vms().await?;
            let nodes = Api::<Node>::all(tenant.client.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let running: Vec<&DynamicObject> = machines
                .iter()
                .filter(|m| {
                    m.metadata.deletion_timestamp.is_none()
                        && m.data["status"]["phase"] == "Running"
                        && m.data["status"]["nodeRef"]["name"].is_string()
                })
                .collect();
            let settled = machines.len() == replicas
                && running.len() == replicas
                && vms.len() == replicas
                && nodes.len() == replicas;
            Ok(settled.then(|| Workers {
                machines: machines.iter().map(uid).collect(),
                vms,
            }))
        })
        .await
        .unwrap_or_else(|e| self.fail(e))
    }
}

/// The UIDs of what runs: a replaced Machine or a recreated VM has a new one.
#[derive(Debug, PartialEq, Eq)]
struct Workers {
    machines: BTreeSet<String>,
    vms: BTreeSet<String>,
}

fn uid(object: &DynamicObject) -> String {
    object.metadata.uid.clone().unwrap_or_default()
}

fn talos_worker_config(endpoint: &str) -> String {
    format!(
        "version: v1alpha1\ndebug: false\npersist: true\nmachine:\n  type: worker\n  token: test-token\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:{KUBERNETES_VERSION}\ncluster:\n  controlPlane:\n    endpoint: {endpoint}\n  clusterName: {CLUSTER}\n"
    )
}

#[tokio::test]
async fn clusterctl_installs_and_upgrades_a_manager_that_scales_kubevirt_workers() {
    let (world, clusterctl) = Deployed::start("deployed-kubevirt", false)
        .await
        .with_kubevirt()
        .await
        .install_with_clusterctl()
        .await;

    // The manager runs from the pinned image, as its ServiceAccount, hardened.
    let image = tenantry_image_reference().expect("image");
    let pods = world.manager_pods().await;
    assert_eq!(pods.len(), 1, "one manager pod");
    let spec = pods[0].spec.as_ref().expect("spec");
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("tenantry-manager")
    );
    assert_eq!(spec.containers[0].image.as_deref(), Some(image.as_str()));
    let status = &pods[0]
        .status
        .as_ref()
        .expect("status")
        .container_statuses
        .as_ref()
        .expect("statuses")[0];
    assert!(status.ready, "{status:?}");
    assert!(
        status
            .image_id
            .ends_with(image.split('@').nth(1).expect("digest"))
    );

    // Its webhooks answer through the Service: an update of a machine
    // template is refused by tenantry's validating webhook.
    let tenant = world.create_cluster().await;
    world.create_workers(0).await;
    let templates = world.dynamic(&resource(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "KubevirtMachineTemplate",
        "kubevirtmachinetemplates",
    ));
    let refused = templates
        .patch(
            TEMPLATE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "spec": { "bootDisk": { "talosVersion": "v1.13.7" } } } } })),
        )
        .await
        .expect_err("templates are immutable");
    assert!(
        refused.to_string().contains("immutable"),
        "not tenantry's webhook answering: {refused}"
    );

    world.wait_workers(&tenant, 0).await;
    world.scale(3).await;
    let three = world.wait_workers(&tenant, 3).await;
    assert_eq!(three.vms.len(), 3);

    // `clusterctl upgrade` to the next build with the workers running:
    // the manager rolls over, no Machine is replaced, no VM recreated.
    let (_, next) = next_build().expect("next build");
    clusterctl
        .run(
            world.cluster.control_plane.kubeconfig_path(),
            &[
                "upgrade",
                "apply",
                "--infrastructure",
                &format!(
                    "{}/{}:{NEXT_VERSION}",
                    components::NAMESPACE,
                    components::PROVIDER_NAME
                ),
            ],
            &Default::default(),
        )
        .await
        .unwrap_or_else(|e| world.fail(e));
    world.wait_manager_image(&next).await;
    world.scale(4).await;
    let four = world.wait_workers(&tenant, 4).await;
    assert!(
        three.machines.is_subset(&four.machines),
        "a Machine was replaced: {three:?} {four:?}"
    );
    assert!(
        three.vms.is_subset(&four.vms),
        "a VM was recreated: {three:?} {four:?}"
    );

    world.scale(0).await;
    world.wait_workers(&tenant, 0).await;
}

#[tokio::test]
async fn a_rule_taken_out_of_the_managers_cluster_role_stops_it() {
    let (world, _clusterctl) = Deployed::start("deployed-rbac", false)
        .await
        .with_kubevirt()
        .await
        .install_with_clusterctl()
        .await;
    let tenant = world.create_cluster().await;

    // The manager may no longer create VirtualMachines: the workers stay
    // without a VM, and the KubevirtMachine says why.
    let roles: Api<ClusterRole> = Api::all(world.client());
    let role = roles
        .get("tenantry-manager-role")
        .await
        .expect("the manager's ClusterRole");
    let complete = role.rules.clone().unwrap_or_default();
    let without_vms: Vec<_> = complete
        .iter()
        .filter(|r| {
            !r.resources
                .as_deref()
                .unwrap_or_default()
                .contains(&"virtualmachines".to_string())
        })
        .cloned()
        .collect();
    assert!(
        without_vms.len() < complete.len(),
        "the role grants VirtualMachines"
    );
    roles
        .patch(
            "tenantry-manager-role",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": without_vms })),
        )
        .await
        .expect("take the rule out");
    world.create_workers(1).await;
    let machines = world.dynamic(&resource(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "KubevirtMachine",
        "kubevirtmachines",
    ));
    wait::until(
        "the KubevirtMachine to report the refusal",
        DEADLINE,
        || {
            let machines = machines.clone();
            async move {
                let list = machines.list(&ListParams::default()).await?;
                Ok(list
                    .items
                    .iter()
                    .flat_map(|m| {
                        m.data["status"]["conditions"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                    })
                    .find(|c| {
                        c["status"] == "False"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("forbidden"))
                    })
                    .map(|c| c["message"].as_str().unwrap_or_default().to_string()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    let vms = world
        .dynamic(&resource(
            "kubevirt.io",
            "v1",
            "VirtualMachine",
            "virtualmachines",
        ))
        .list(&ListParams::default())
        .await
        .expect("VMs");
    assert!(vms.items.is_empty(), "a VM was made without the rule");

    // The rule back: the worker comes up.
    roles
        .patch(
            "tenantry-manager-role",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": complete })),
        )
        .await
        .expect("restore the rule");
    world.wait_workers(&tenant, 1).await;
}

/// The metrics a Prometheus scrapes from the deployed manager tell what
/// happened: three workers provisioned and deleted, every PVE request the
/// hypervisor answered, reconciles run; with no series per machine, and no
/// scrape without a token of someone allowed to.
#[tokio::test]
async fn clusterctl_installs_a_manager_that_scales_proxmox_workers_and_reports_it_in_metrics() {
    // The IPAM provider serves Cluster API's IPAddressClaims: after init.
    let (world, _clusterctl) = Deployed::start("deployed-proxmox", false)
        .await
        .install_with_clusterctl()
        .await;
    let world = world.with_proxmox().await;
    let client = world.client();
    let scraper = Scraper::new(&client)
        .await
        .unwrap_or_else(|e| world.fail(e));
    let prometheus = service_account_token(&client, "monitoring", "prometheus", true)
        .await
        .unwrap_or_else(|e| world.fail(e));
    let stranger = service_account_token(&client, "monitoring", "stranger", false)
        .await
        .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        scraper.status(None).await.ok(),
        Some(401),
        "scrape without a token"
    );
    assert_eq!(scraper.status(Some("not-a-token")).await.ok(), Some(401));
    assert_eq!(
        scraper.status(Some(&stranger)).await.ok(),
        Some(403),
        "scrape without the reader role"
    );
    let before = scraper
        .scrape(&prometheus)
        .await
        .unwrap_or_else(|e| world.fail(e));

    let tenant = world.create_cluster().await;
    world.create_workers(0).await;
    world.wait_workers(&tenant, 0).await;
    world.scale(3).await;
    let three = world.wait_workers(&tenant, 3).await;
    assert_eq!(three.vms.len(), 3);
    let machines: Vec<String> = world
        .dynamic(&resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha2",
            "ProxmoxMachine",
            "proxmoxmachines",
        ))
        .list(&ListParams::default())
        .await
        .expect("ProxmoxMachines")
        .items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    assert_eq!(machines.len(), 3);
    let during = scraper
        .scrape(&prometheus)
        .await
        .unwrap_or_else(|e| world.fail(e));
    let proxmox = [("substrate", "proxmox")];
    assert_eq!(
        during.sum(
            "tenantry_machines",
            &[("substrate", "proxmox"), ("ready", "true")]
        ),
        3.0,
        "machines by Ready, from the manager's cache"
    );
    world.scale(0).await;
    world.wait_workers(&tenant, 0).await;

    let after = pve_counts_settled(&world, &scraper, &prometheus).await;
    let histogram = |name: &str| after.sum(&format!("{name}_count"), &proxmox);
    assert_eq!(
        histogram("tenantry_machine_provisioning_duration_seconds"),
        3.0
    );
    assert_eq!(histogram("tenantry_machine_deletion_duration_seconds"), 3.0);
    let reconciles = |scrape: &Scrape| {
        scrape.sum(
            "controller_runtime_reconcile_total",
            &[("controller", "proxmoxmachine")],
        )
    };
    assert!(
        reconciles(&after) > reconciles(&before),
        "ProxmoxMachine reconciles counted: {} then {}",
        reconciles(&before),
        reconciles(&after)
    );
    assert_eq!(
        after.sum(
            "controller_runtime_active_workers",
            &[("controller", "proxmoxmachine")]
        ),
        0.0
    );
    assert_eq!(after.sum("leader_election_master_status", &[]), 1.0);
    // No series names a machine, a VM or an address: label values come
    // from fixed sets.
    for (label, values) in after.label_values() {
        for value in values {
            for named in machines.iter().chain(&three.vms) {
                assert!(
                    !value.contains(named.as_str()),
                    "label {label}={value:?} names {named}"
                );
            }
            assert!(
                !value.contains("10.10.1."),
                "label {label}={value:?} holds an address"
            );
        }
    }
}

/// A scrape whose PVE request counts equal what the PVE simulator counted
/// for the tenant's token, per endpoint template and method; taken when
/// two scrapes around the simulator's count agree (a resync may be on its
/// way between them).
async fn pve_counts_settled(world: &Deployed, scraper: &Scraper, token: &str) -> Scrape {
    let Substrate::Proxmox { pve, .. } = &world.substrate else {
        panic!("no PVE");
    };
    let caller = format!("{PVE_TENANT}@pve!capi");
    let by_endpoint = |scrape: &Scrape| -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for sample in scrape.matching("tenantry_proxmox_api_requests_total", &[]) {
            let key = format!("{} {}", sample.labels["method"], sample.labels["endpoint"]);
            *counts.entry(key).or_default() += sample.value as u64;
        }
        counts
    };
    let last = std::sync::Mutex::new(String::new());
    let settled = wait::until(
        "tenantry's PVE request counts to match the hypervisor's",
        DEADLINE,
        || async {
            let first = scraper.scrape(token).await?;
            let counted = pve.sim.call_counts();
            let second = scraper.scrape(token).await?;
            let hypervisor: BTreeMap<String, u64> = counted
                .by_caller_endpoint
                .iter()
                .filter(|((who, _), _)| *who == caller)
                .map(|((_, endpoint), calls)| (endpoint.clone(), *calls))
                .collect();
            let (first_counts, second_counts) = (by_endpoint(&first), by_endpoint(&second));
            *last.lock().unwrap() =
                format!("tenantry {second_counts:#?}\nPVE simulator {hypervisor:#?}");
            Ok((first_counts == hypervisor
                && second_counts == hypervisor
                && !hypervisor.is_empty())
            .then_some(second))
        },
    )
    .await;
    settled.unwrap_or_else(|e| world.fail(e.context(last.into_inner().unwrap())))
}

/// Cluster API core and tenantry installed as Cozystack installs them:
/// cluster-api-operator provider objects whose fetchConfig selects a
/// ConfigMap named after the version, with gzipped components.
async fn install_with_operator(world: &Deployed) -> ClusterApiOperator {
    let client = world.client();
    let operator = ClusterApiOperator::start(&world.cluster.control_plane)
        .await
        .unwrap_or_else(|e| world.fail(e));
    for namespace in ["capi-system", components::NAMESPACE] {
        tenantry_e2e::manifests::apply_object(
            &client,
            &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace } }),
            "default",
        )
        .await
        .unwrap_or_else(|e| world.fail(e));
    }
    let upstream = tenantry_e2e::Upstream::locate().expect("upstream cache");
    let release = upstream
        .cluster_api_release()
        .expect("Cluster API release artifacts");
    let capi_version =
        tenantry_e2e::clusterctl::pinned_cluster_api_version().expect("CAPI version");
    let read = |name: &str| std::fs::read_to_string(release.join(name)).expect("release file");
    let apply = |document: Value, namespace: &'static str| {
        let client = client.clone();
        async move {
            tenantry_e2e::manifests::apply_object(&client, &document, namespace)
                .await
                .expect("apply")
        }
    };
    apply(
        compressed_provider_config_map(
            "capi-system",
            &capi_version,
            "core",
            &read("core-components.yaml"),
            &read("metadata.yaml"),
        ),
        "capi-system",
    )
    .await;
    apply(
        provider(
            ProviderKind::Core,
            "capi-system",
            "cluster-api",
            &capi_version,
            &provider_components_selector("core"),
        ),
        "capi-system",
    )
    .await;
    let image = tenantry_image_reference().expect("image");
    apply(
        compressed_provider_config_map(
            components::NAMESPACE,
            TENANTRY_VERSION,
            "tenantry",
            &components::infrastructure_components_yaml_for(&image),
            &components::metadata_yaml(),
        ),
        components::NAMESPACE,
    )
    .await;
    apply(
        provider(
            ProviderKind::Infrastructure,
            components::NAMESPACE,
            components::PROVIDER_NAME,
            TENANTRY_VERSION,
            &provider_components_selector("tenantry"),
        ),
        components::NAMESPACE,
    )
    .await;
    world
        .wait_available("capi-system", "capi-controller-manager")
        .await;
    world
        .wait_available(components::NAMESPACE, components::DEPLOYMENT_NAME)
        .await;
    operator
}

#[tokio::test]
async fn the_operator_installs_and_upgrades_a_manager_whose_tenant_pools_join() {
    let world = Deployed::start("deployed-operator", true).await;
    let operator = install_with_operator(&world).await;
    let world = world.with_kubevirt().await;
    let Substrate::Kubevirt { factory, .. } = &world.substrate else {
        unreachable!("KubeVirt world");
    };
    // The platform's other parts: etcd-operator (simulated) and CABPT (real,
    // beside the cluster like the IPAM provider).
    let client = world.client();
    let _etcd = EtcdSimulator::start(client.clone())
        .await
        .expect("etcd simulator");
    let _cabpt = UpstreamManager::start_cabpt(&world.cluster.control_plane)
        .await
        .expect("CABPT");
    world.kamaji.wait_for_data_stores(true);

    // A tenant cluster as a platform user asks for one: its pool joins,
    // which takes the deployed manager reaching the tenant's apiserver
    // through Kamaji's Service by its cluster DNS name.
    let demo = DemoCluster {
        namespace: NAMESPACE.into(),
        name: "demo".into(),
        kubernetes_version: "v1.35".into(),
        talos_version: TALOS.into(),
        schematic: DEFAULT_SCHEMATIC.into(),
        image_factory_url: factory.base_url().to_string(),
        workers: 2,
    };
    tenantry_e2e::manifests::apply_object(&client, &demo.kubernetes(), NAMESPACE)
        .await
        .unwrap_or_else(|e| world.fail(e));
    tenantry_e2e::manifests::apply_object(&client, &demo.nodes(), NAMESPACE)
        .await
        .unwrap_or_else(|e| world.fail(e));
    let kamaji = &world.kamaji;
    let capi_cluster = demo.capi_cluster();
    let tenant = wait::until("the tenant control plane to run", DEADLINE, || {
        let capi_cluster = capi_cluster.clone();
        async move { Ok(kamaji.tenant(NAMESPACE, &capi_cluster)) }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    let pool = |replicas: usize| {
        let world = &world;
        let tenant = &tenant;
        let selector = format!("cluster.x-k8s.io/deployment-name={}", demo.deployment());
        async move {
            wait::until(
                format!("{replicas} pool workers joined"),
                DEADLINE,
                || async {
                    let machines = world
                        .dynamic(&capi("Machine", "machines"))
                        .list(&ListParams::default().labels(&selector))
                        .await?
                        .items;
                    let nodes = Api::<Node>::all(tenant.client.clone())
                        .list(&ListParams::default())
                        .await?
                        .items;
                    let running = machines
                        .iter()
                        .filter(|m| m.data["status"]["phase"] == "Running")
                        .count();
                    let vms = world.vms().await?;
                    Ok((machines.len() == replicas
                        && running == replicas
                        && nodes.len() == replicas
                        && vms.len() == replicas)
                        .then(|| Workers {
                            machines: machines.iter().map(uid).collect(),
                            vms,
                        }))
                },
            )
            .await
            .unwrap_or_else(|e| world.fail(e))
        }
    };
    let before = pool(2).await;

    // The operator's upgrade: a ConfigMap for the next version (the one
    // before it goes: a selector must match exactly one) and the new
    // version on the InfrastructureProvider.
    let (_, next) = next_build().expect("next build");
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), components::NAMESPACE);
    config_maps
        .delete(TENANTRY_VERSION, &Default::default())
        .await
        .unwrap_or_else(|e| world.fail(e.into()));
    tenantry_e2e::manifests::apply_object(
        &client,
        &compressed_provider_config_map(
            components::NAMESPACE,
            NEXT_VERSION,
            "tenantry",
            &components::infrastructure_components_yaml_for(&next),
            &components::metadata_yaml(),
        ),
        components::NAMESPACE,
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    ProviderKind::Infrastructure
        .api(&client, components::NAMESPACE)
        .patch(
            components::PROVIDER_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "version": NEXT_VERSION } })),
        )
        .await
        .unwrap_or_else(|e| world.fail(e.into()));
    world.wait_manager_image(&next).await;
    let providers = ProviderKind::Infrastructure.api(&client, components::NAMESPACE);
    wait::until(
        "the InfrastructureProvider to report the new version",
        DEADLINE,
        || {
            let providers = providers.clone();
            async move {
                let provider = providers.get(components::PROVIDER_NAME).await?;
                Ok((provider.data["status"]["installedVersion"] == NEXT_VERSION).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", operator.log_tail(40)));

    // Still the same workers, and the pool still scales.
    tenantry_e2e::manifests::apply_object(
        &client,
        &DemoCluster {
            workers: 3,
            ..demo.clone()
        }
        .nodes(),
        NAMESPACE,
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    let after = pool(3).await;
    assert!(
        before.machines.is_subset(&after.machines),
        "a Machine was replaced: {before:?} {after:?}"
    );
    assert!(
        before.vms.is_subset(&after.vms),
        "a VM was recreated: {before:?} {after:?}"
    );
}
