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

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tenantry_e2e::clusterctl::{Clusterctl, TENANTRY_VERSION};
use tenantry_e2e::management::{ManagementCluster, tenantry_image_reference};
use tenantry_e2e::sim::kubevirt::{
    DEFAULT_SCHEMATIC, ImageFactory, ImageFactoryConfig, KubevirtSimConfig, KubevirtSimulator,
};
use tenantry_e2e::sim::tenant::{
    KamajiControlPlaneSimulator, NodeSimConfig, NodeSimulator, TenantCluster, TenantClusters,
    TenantControlPlaneOptions,
};
use tenantry_e2e::wait;
use tenantry_provider::components;

const DEADLINE: Duration = Duration::from_secs(300);
const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const TEMPLATE: &str = "demo-workers";
const BOOTSTRAP_SECRET: &str = "demo-talos-worker";
const KUBERNETES_VERSION: &str = "v1.35.0";
const TALOS: &str = "v1.13.6";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn capi(kind: &str, plural: &str) -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", kind, plural)
}

/// A management cluster with Cluster API and tenantry deployed, cert-manager,
/// and the tenant side (Kamaji and the workers' kubelets).
struct Deployed {
    // Field order is drop order.
    nodes: NodeSimulator,
    kamaji: KamajiControlPlaneSimulator,
    cluster: ManagementCluster,
}

impl Deployed {
    /// The management cluster, cert-manager, Kamaji and the kubelets; no
    /// provider installed yet.
    async fn start(name: &str) -> Self {
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
        let nodes = NodeSimulator::start(tenants, NodeSimConfig::default());
        Self {
            nodes,
            kamaji,
            cluster,
        }
    }

    /// `clusterctl init` of Cluster API core and tenantry from a local
    /// repository holding this build's release (image pinned by digest);
    /// both managers become available.
    async fn install_with_clusterctl(name: &str) -> (Self, Clusterctl) {
        let world = Self::start(name).await;
        let image = tenantry_image_reference().expect("tenantry image (hack/image.sh)");
        let clusterctl =
            Clusterctl::with_releases(&[(TENANTRY_VERSION, &image)]).expect("local repository");
        clusterctl
            .run(
                world.cluster.control_plane.kubeconfig_path(),
                &[
                    "init",
                    "--core",
                    &clusterctl.core_provider(),
                    "--bootstrap=-",
                    "--control-plane=-",
                    "--infrastructure",
                    &clusterctl.infrastructure_provider(),
                ],
                &Default::default(),
            )
            .await
            .unwrap_or_else(|e| world.fail(e));
        world
            .wait_available("capi-system", "capi-controller-manager")
            .await;
        world
            .wait_available(components::NAMESPACE, components::DEPLOYMENT_NAME)
            .await;
        (world, clusterctl)
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
        let deployments: Api<Deployment> = Api::namespaced(self.client(), namespace);
        wait::until(
            format!("Deployment {namespace}/{name} to be available"),
            DEADLINE,
            || {
                let deployments = deployments.clone();
                async move {
                    let Some(deployment) = deployments.get_opt(name).await? else {
                        return Ok(None);
                    };
                    let status = deployment.status.unwrap_or_default();
                    let available = status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Available" && c.status == "True")
                        && status.updated_replicas == status.replicas
                        && status.ready_replicas == status.replicas;
                    Ok(available.then_some(()))
                }
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(e));
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
        Api::namespaced_with(self.client(), NAMESPACE, resource)
    }

    async fn create(&self, document: Value) {
        tenantry_e2e::manifests::create_object(&self.client(), &document, NAMESPACE)
            .await
            .unwrap_or_else(|e| self.fail(e));
    }

    /// A Cluster with a KubevirtCluster and a KamajiControlPlane; its tenant
    /// once Kamaji serves it and CAPI has initialized it.
    async fn create_kubevirt_cluster(&self) -> TenantCluster {
        self.create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtCluster",
            "metadata": { "name": CLUSTER },
            "spec": {},
        }))
        .await;
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
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": CLUSTER }
            }
        }))
        .await;
        let kamaji = &self.kamaji;
        let tenant = wait::until("the tenant control plane to run", DEADLINE, || async move {
            Ok(kamaji.tenant(NAMESPACE, CLUSTER))
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

    async fn create_kubevirt_workers(&self, factory: &ImageFactory, replicas: u32) {
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
                        "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachineTemplate", "name": TEMPLATE }
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
            let vms = self
                .dynamic(&resource(
                    "kubevirt.io",
                    "v1",
                    "VirtualMachine",
                    "virtualmachines",
                ))
                .list(&ListParams::default())
                .await?
                .items;
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
                vms: vms.iter().map(uid).collect(),
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

async fn start_kubevirt(world: &Deployed) -> (KubevirtSimulator, ImageFactory) {
    let sim = KubevirtSimulator::start(world.client(), KubevirtSimConfig::fast())
        .await
        .expect("KubeVirt simulator");
    let factory = ImageFactory::start(ImageFactoryConfig {
        versions: vec![TALOS.into()],
        ..Default::default()
    })
    .await
    .expect("image factory");
    world.nodes.follow_kubevirt(world.client());
    (sim, factory)
}

#[tokio::test]
async fn clusterctl_installs_a_manager_that_scales_kubevirt_workers_as_deployed() {
    let (world, _clusterctl) = Deployed::install_with_clusterctl("deployed-kubevirt").await;

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
    let (_kubevirt, factory) = start_kubevirt(&world).await;
    let tenant = world.create_kubevirt_cluster().await;
    world.create_kubevirt_workers(&factory, 0).await;
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
    world.scale(0).await;
    world.wait_workers(&tenant, 0).await;
}

#[tokio::test]
async fn a_rule_taken_out_of_the_managers_cluster_role_stops_it() {
    let (world, _clusterctl) = Deployed::install_with_clusterctl("deployed-rbac").await;
    let (_kubevirt, factory) = start_kubevirt(&world).await;
    let tenant = world.create_kubevirt_cluster().await;

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
    world.create_kubevirt_workers(&factory, 1).await;
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
