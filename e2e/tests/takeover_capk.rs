//! Tenantry takes over a running cluster from cluster-api-provider-kubevirt
//! (CAPK) v0.1.10 in place, as a platform operator does it: under the
//! Cluster API the platform runs with CAPK (core v1.10.1, v1beta1; Kamaji's
//! v1alpha1 control plane), CAPK provisions a KubevirtCluster and a
//! MachineDeployment of two workers (a Talos disk imported by a DataVolume
//! template written by hand, no bootstrap check). Then the operator does
//! what `clusterctl delete --infrastructure kubevirt` (without
//! `--include-crd`) and `clusterctl init --infrastructure tenantry` do: CAPK
//! stops, its CRDs and objects stay, tenantry's CRDs replace CAPK's and
//! tenantry starts.
//!
//! Once tenantry has reconciled every KubevirtMachine and the
//! KubevirtCluster (it writes `status.initialization`, which CAPK never
//! does), nothing was recreated or restarted: Machines, KubevirtMachines,
//! VirtualMachines (same generation too), their instances and launcher
//! pods, DataVolumes, PVCs, the control-plane Service, the SSH keys and
//! userdata Secrets and the tenant's Nodes keep their UIDs; the Machines
//! stay Running with the same providerID, the endpoint stays. Then tenantry
//! runs the cluster's whole life: scale up (a VM of its own), a
//! MachineHealthCheck replacing one of CAPK's workers, scale down, and
//! deleting the Cluster leaves nothing behind — CAPK's userdata Secret
//! included, which tenantry deletes with the last VM that reads it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{Value, json};
use tenantry_e2e::bench::providers::{self, ProviderLaunch, RunningProvider};
use tenantry_e2e::bench::{Binaries, Provider, resource};
use tenantry_e2e::cluster_api::ClusterApiRelease;
use tenantry_e2e::sim::kubevirt::{DEFAULT_SCHEMATIC, ImageFactoryConfig, KubevirtSimConfig};
use tenantry_e2e::sim::tenant::{
    KamajiApi, NodeFault, NodeSimConfig, TenantCluster, TenantControlPlaneOptions,
};
use tenantry_e2e::{ControlPlane, Kubevirt, Upstream, World, fixtures, wait};

const DEADLINE: Duration = Duration::from_secs(240);
const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const TEMPLATE: &str = "demo-workers";
const BOOTSTRAP_SECRET: &str = "demo-talos-worker";
const KUBERNETES_VERSION: &str = "v1.35.0";
const TALOS: &str = "v1.13.0";
const V1BETA1: &str = "cluster.x-k8s.io/v1beta1";
const INFRASTRUCTURE: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";
/// What tenantry records on the VMs it creates (CAPK's have no such mark).
const BOOTSTRAP_FORMAT_ANNOTATION: &str = "infrastructure.tenantry.dev/bootstrap-format";

fn capi(kind: &str, plural: &str) -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta1", kind, plural)
}

fn infrastructure(kind: &str, plural: &str) -> ApiResource {
    resource("infrastructure.cluster.x-k8s.io", "v1alpha1", kind, plural)
}

fn kubevirt(kind: &str, plural: &str) -> ApiResource {
    resource("kubevirt.io", "v1", kind, plural)
}

fn data_volumes() -> ApiResource {
    resource("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes")
}

fn dynamic(world: &World, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(world.client(), NAMESPACE, resource)
}

fn binaries() -> Binaries {
    Binaries {
        tenantry: providers::default_tenantry_binary(),
        upstream: Upstream::locate()
            .expect("the upstream cache (hack/upstream/build.sh capk)")
            .root()
            .to_path_buf(),
    }
}

/// The platform's management cluster with CAPK's CRDs installed first, as
/// `clusterctl init --infrastructure kubevirt` does, and neither tenantry's
/// CRDs nor its manager.
async fn start() -> World {
    World::builder("management")
        .without_tenantry_crds()
        .cluster_api_release(ClusterApiRelease::V1_10)
        .kubevirt(Kubevirt::Real, KubevirtSimConfig::fast())
        .image_factory(ImageFactoryConfig {
            versions: vec![TALOS.into()],
            ..Default::default()
        })
        .kamaji(TenantControlPlaneOptions {
            api: KamajiApi::V1alpha1,
            node_monitor_grace_period: Duration::from_secs(8),
            ..Default::default()
        })
        .nodes(NodeSimConfig::default())
        .start_after(async |control_plane: &ControlPlane| {
            let crds = providers::provider_crds(&binaries(), Provider::Capk)
                .unwrap_or_else(|e| panic!("CAPK's CRDs: {e:#}"));
            tenantry_e2e::manifests::apply_crds(&control_plane.client(), crds)
                .await
                .unwrap_or_else(|e| panic!("install CAPK's CRDs: {e:#}"));
        })
        .await
}

async fn start_capk(world: &World) -> RunningProvider {
    let binaries = binaries();
    let mut capk = providers::start(
        Provider::Capk,
        ProviderLaunch {
            binaries: &binaries,
            control_plane: world.control_plane(),
            env: Vec::new(),
            args: Vec::new(),
            instance: None,
        },
    )
    .unwrap_or_else(|e| world.fail(e.context("start CAPK")));
    capk.wait_healthy(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| world.fail(e));
    capk
}

/// Fails the test with the world's diagnostics and, while it runs, CAPK's log.
fn fail(world: &World, capk: Option<&RunningProvider>, error: anyhow::Error) -> ! {
    match capk {
        Some(capk) => {
            world.fail(error.context(format!("---- CAPK log ----\n{}", capk.process.log_tail(40))))
        }
        None => world.fail(error),
    }
}

/// A KubevirtCluster, a v1alpha1 KamajiControlPlane and a v1beta1 Cluster,
/// as the platform writes them. Returns the tenant once Cluster API reports
/// the control plane ready and the infrastructure (CAPK's) provisioned.
async fn create_cluster(world: &World, capk: &RunningProvider) -> TenantCluster {
    world
        .create(NAMESPACE, fixtures::kubevirt_cluster(CLUSTER, json!({})))
        .await;
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha1",
                "kind": "KamajiControlPlane",
                "metadata": { "name": CLUSTER },
                "spec": { "version": KUBERNETES_VERSION, "replicas": 1, "dataStoreName": "default" },
            }),
        )
        .await;
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": V1BETA1,
                "kind": "Cluster",
                "metadata": { "name": CLUSTER },
                "spec": {
                    "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] }, "services": { "cidrBlocks": ["10.95.0.0/16"] } },
                    "controlPlaneRef": { "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha1", "kind": "KamajiControlPlane", "name": CLUSTER },
                    "infrastructureRef": { "apiVersion": INFRASTRUCTURE, "kind": "KubevirtCluster", "name": CLUSTER }
                }
            }),
        )
        .await;
    let kamaji = world.kamaji();
    let tenant = wait::until("the tenant control plane to run", DEADLINE, || async move {
        Ok(kamaji.tenant(NAMESPACE, CLUSTER))
    })
    .await
    .unwrap_or_else(|e| fail(world, Some(capk), e));
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": BOOTSTRAP_SECRET },
                "stringData": {
                    "value": fixtures::talos_worker_config("test-token", &tenant.endpoint),
                    "format": "cloud-config"
                }
            }),
        )
        .await;
    let clusters = dynamic(world, &capi("Cluster", "clusters"));
    wait::until(
        "Cluster API to see the control plane ready and CAPK's infrastructure provisioned",
        DEADLINE,
        || {
            let clusters = clusters.clone();
            async move {
                let status = clusters.get(CLUSTER).await?.data["status"].clone();
                let ready =
                    status["controlPlaneReady"] == true && status["infrastructureReady"] == true;
                Ok(ready.then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| fail(world, Some(capk), e));
    tenant
}

/// A worker as CAPK users write one: the Talos disk is a DataVolume
/// template importing the image factory's image (CAPK prefixes it with the
/// machine's name), no bootstrap check.
fn capk_machine_spec(factory_url: &str) -> Value {
    let image = format!(
        "{}/image/{DEFAULT_SCHEMATIC}/{TALOS}/openstack-amd64.raw.xz",
        factory_url.trim_end_matches('/')
    );
    json!({
        "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
        "virtualMachineTemplate": { "spec": {
            "runStrategy": "Always",
            "dataVolumeTemplates": [{
                "metadata": { "name": "talos-boot" },
                "spec": {
                    "source": { "http": { "url": image } },
                    "storage": { "resources": { "requests": { "storage": "20Gi" } }, "storageClassName": "replicated" }
                }
            }],
            "template": { "spec": {
                "domain": {
                    "cpu": { "cores": 2 },
                    "memory": { "guest": "4Gi" },
                    "devices": {
                        "disks": [{ "name": "talos-boot", "bootOrder": 1, "disk": { "bus": "virtio" } }],
                        "interfaces": [{ "name": "default", "bridge": {} }]
                    }
                },
                "networks": [{ "name": "default", "pod": {} }],
                "volumes": [{ "name": "talos-boot", "dataVolume": { "name": "talos-boot" } }]
            }}
        }}
    })
}

async fn create_workers(world: &World, replicas: u32) {
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": INFRASTRUCTURE,
                "kind": "KubevirtMachineTemplate",
                "metadata": { "name": TEMPLATE },
                "spec": { "template": { "spec": capk_machine_spec(world.factory().base_url()) } }
            }),
        )
        .await;
    let labels = json!({ "cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/deployment-name": DEPLOYMENT });
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": V1BETA1,
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
                            "infrastructureRef": { "apiVersion": INFRASTRUCTURE, "kind": "KubevirtMachineTemplate", "name": TEMPLATE }
                        }
                    }
                }
            }),
        )
        .await;
}

async fn list(world: &World, resource: &ApiResource) -> anyhow::Result<Vec<DynamicObject>> {
    Ok(dynamic(world, resource)
        .list(&ListParams::default())
        .await?
        .items)
}

fn name(object: &DynamicObject) -> String {
    object.metadata.name.clone().unwrap_or_default()
}

/// The deployment's workers once Cluster API, the provider, KubeVirt and
/// the tenant agree: Machines `Running` with a `nodeRef`, KubevirtMachines
/// ready, one running VM per Machine and no other, one Node per Machine.
/// `None` until they do.
async fn settled_workers(
    world: &World,
    tenant: &TenantCluster,
) -> anyhow::Result<Option<BTreeSet<String>>> {
    let machines = list(world, &capi("Machine", "machines")).await?;
    let mut names = BTreeSet::new();
    let mut node_refs = BTreeSet::new();
    for machine in &machines {
        let node = machine.data["status"]["nodeRef"]["name"].as_str();
        if machine.metadata.deletion_timestamp.is_some()
            || machine.data["status"]["phase"] != "Running"
            || node.is_none()
        {
            return Ok(None);
        }
        names.insert(
            machine.data["spec"]["infrastructureRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        node_refs.insert(node.unwrap_or_default().to_string());
    }
    let ready_machines: BTreeSet<String> = list(
        world,
        &infrastructure("KubevirtMachine", "kubevirtmachines"),
    )
    .await?
    .iter()
    .filter(|m| m.data["status"]["ready"] == true)
    .map(name)
    .collect();
    let vm_names: BTreeSet<String> = list(world, &kubevirt("VirtualMachine", "virtualmachines"))
        .await?
        .iter()
        .map(name)
        .collect();
    let running: BTreeSet<String> = list(
        world,
        &kubevirt("VirtualMachineInstance", "virtualmachineinstances"),
    )
    .await?
    .iter()
    .filter(|vmi| vmi.data["status"]["phase"] == "Running")
    .map(name)
    .collect();
    let nodes: BTreeSet<String> = Api::<Node>::all(tenant.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let settled =
        vm_names == names && running == names && ready_machines == names && nodes == node_refs;
    Ok(settled.then_some(names))
}

async fn wait_workers(
    world: &World,
    tenant: &TenantCluster,
    capk: Option<&RunningProvider>,
    what: &str,
    done: impl Fn(&BTreeSet<String>) -> bool,
) -> BTreeSet<String> {
    let done = &done;
    wait::until(what, DEADLINE, || async move {
        Ok(settled_workers(world, tenant)
            .await?
            .filter(|workers| done(workers)))
    })
    .await
    .unwrap_or_else(|e| fail(world, capk, e))
}

/// Everything of the workers that must survive the takeover untouched, as
/// `"<kind> <name>" → "<uid>"` (and what else must not change after it):
/// a recreated or restarted object shows as a changed value, a new one as
/// a new key.
async fn identities(
    world: &World,
    tenant: &TenantCluster,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut seen = BTreeMap::new();
    let uid = |object: &DynamicObject| object.metadata.uid.clone().unwrap_or_default();
    for machine in list(world, &capi("Machine", "machines")).await? {
        let provider_id = machine.data["spec"]["providerID"].as_str().unwrap_or("-");
        seen.insert(
            format!("Machine {}", name(&machine)),
            format!("{} {provider_id}", uid(&machine)),
        );
    }
    for (kind, resource) in [
        (
            "KubevirtMachine",
            infrastructure("KubevirtMachine", "kubevirtmachines"),
        ),
        (
            "VirtualMachineInstance",
            kubevirt("VirtualMachineInstance", "virtualmachineinstances"),
        ),
        ("DataVolume", data_volumes()),
    ] {
        for object in list(world, &resource).await? {
            seen.insert(format!("{kind} {}", name(&object)), uid(&object));
        }
    }
    // A changed VM spec (a new generation) would restart nothing yet, but
    // it is a change tenantry must not make.
    for vm in list(world, &kubevirt("VirtualMachine", "virtualmachines")).await? {
        seen.insert(
            format!("VirtualMachine {}", name(&vm)),
            format!(
                "{} generation {}",
                uid(&vm),
                vm.metadata.generation.unwrap_or_default()
            ),
        );
    }
    for claim in Api::<PersistentVolumeClaim>::namespaced(world.client(), NAMESPACE)
        .list(&ListParams::default())
        .await?
    {
        seen.insert(
            format!("PVC {}", claim.metadata.name.unwrap_or_default()),
            claim.metadata.uid.unwrap_or_default(),
        );
    }
    for pod in Api::<Pod>::namespaced(world.client(), NAMESPACE)
        .list(&ListParams::default().labels("kubevirt.io=virt-launcher"))
        .await?
    {
        seen.insert(
            format!("launcher Pod {}", pod.metadata.name.unwrap_or_default()),
            pod.metadata.uid.unwrap_or_default(),
        );
    }
    // The cluster's side: CAPK's control-plane Service (its ClusterIP is
    // the endpoint), the endpoint itself, and the SSH key pair.
    let kubevirt_cluster = dynamic(
        world,
        &infrastructure("KubevirtCluster", "kubevirtclusters"),
    )
    .get(CLUSTER)
    .await?;
    seen.insert(
        format!("KubevirtCluster {CLUSTER}"),
        format!(
            "{} endpoint {} keys {}",
            uid(&kubevirt_cluster),
            kubevirt_cluster.data["spec"]["controlPlaneEndpoint"],
            kubevirt_cluster.data["spec"]["sshKeys"]["dataSecretName"]
        ),
    );
    let service = Api::<Service>::namespaced(world.client(), NAMESPACE)
        .get(&format!("{CLUSTER}-lb"))
        .await?;
    seen.insert(
        format!("Service {CLUSTER}-lb"),
        format!(
            "{} {}",
            service.metadata.uid.unwrap_or_default(),
            service.spec.and_then(|s| s.cluster_ip).unwrap_or_default()
        ),
    );
    for secret in Api::<Secret>::namespaced(world.client(), NAMESPACE)
        .list(&ListParams::default())
        .await?
    {
        let secret_name = secret.metadata.name.unwrap_or_default();
        if secret_name.ends_with("-userdata") || secret_name.ends_with("-ssh-keys") {
            seen.insert(
                format!("Secret {secret_name}"),
                secret.metadata.uid.unwrap_or_default(),
            );
        }
    }
    for node in Api::<Node>::all(tenant.client.clone())
        .list(&ListParams::default())
        .await?
    {
        seen.insert(
            format!("tenant Node {}", node.metadata.name.unwrap_or_default()),
            node.metadata.uid.unwrap_or_default(),
        );
    }
    Ok(seen)
}

/// Whether tenantry has reconciled the object: it writes the v1beta2
/// contract's `status.initialization.provisioned`, which CAPK never does.
fn reconciled_by_tenantry(object: &DynamicObject) -> bool {
    object.data["status"]["initialization"]["provisioned"] == true
}

/// Waits until tenantry has reconciled the KubevirtCluster and every
/// KubevirtMachine of `workers`, each found provisioned.
async fn wait_adopted(world: &World, workers: &BTreeSet<String>) {
    let machines = dynamic(
        world,
        &infrastructure("KubevirtMachine", "kubevirtmachines"),
    );
    let clusters = dynamic(
        world,
        &infrastructure("KubevirtCluster", "kubevirtclusters"),
    );
    wait::until(
        "tenantry to report every KubevirtMachine and the KubevirtCluster provisioned",
        DEADLINE,
        || {
            let machines = machines.clone();
            let clusters = clusters.clone();
            async move {
                let adopted: BTreeSet<String> = machines
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|m| reconciled_by_tenantry(m))
                    .map(name)
                    .collect();
                let cluster = clusters.get(CLUSTER).await?;
                Ok((&adopted == workers && reconciled_by_tenantry(&cluster)).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
}

/// What an operator checks on the adopted objects besides their identity:
/// CAPK's finalizers are tenantry's (the same names, nothing added), the
/// KubevirtMachines are ready with CAPK's providerID, and the instances run.
async fn check_adopted(world: &World) {
    for machine in list(
        world,
        &infrastructure("KubevirtMachine", "kubevirtmachines"),
    )
    .await
    .expect("list KubevirtMachines")
    {
        let machine_name = name(&machine);
        assert_eq!(
            machine.metadata.finalizers.clone().unwrap_or_default(),
            ["kubevirtmachine.infrastructure.cluster.x-k8s.io"],
            "finalizers of KubevirtMachine {machine_name}"
        );
        assert_eq!(
            machine.data["status"]["ready"], true,
            "KubevirtMachine {machine_name} is ready"
        );
        assert_eq!(
            machine.data["spec"]["providerID"],
            format!("kubevirt://{machine_name}"),
            "KubevirtMachine {machine_name} keeps CAPK's providerID"
        );
        let ready = machine.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready");
        assert_eq!(
            ready.map(|c| c["status"].clone()),
            Some(json!("True")),
            "KubevirtMachine {machine_name} Ready: {ready:?}"
        );
    }
    let cluster = dynamic(
        world,
        &infrastructure("KubevirtCluster", "kubevirtclusters"),
    )
    .get(CLUSTER)
    .await
    .expect("get KubevirtCluster");
    assert_eq!(
        cluster.metadata.finalizers.clone().unwrap_or_default(),
        ["kubevirtcluster.infrastructure.cluster.x-k8s.io"],
        "finalizers of the KubevirtCluster"
    );
    for vmi in list(
        world,
        &kubevirt("VirtualMachineInstance", "virtualmachineinstances"),
    )
    .await
    .expect("list VMIs")
    {
        assert_eq!(vmi.data["status"]["phase"], "Running", "VMI {}", name(&vmi));
    }
}

async fn scale(world: &World, tenant: &TenantCluster, replicas: usize) -> BTreeSet<String> {
    dynamic(world, &capi("MachineDeployment", "machinedeployments"))
        .patch(
            DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
        )
        .await
        .expect("scale the MachineDeployment");
    wait_workers(world, tenant, None, &format!("{replicas} workers"), |w| {
        w.len() == replicas
    })
    .await
}

/// A v1beta1 MachineHealthCheck: Ready False or Unknown for 5 s is
/// unhealthy, at most half the pool is remediated.
async fn create_health_check(world: &World) {
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": V1BETA1,
                "kind": "MachineHealthCheck",
                "metadata": { "name": DEPLOYMENT },
                "spec": {
                    "clusterName": CLUSTER,
                    "selector": { "matchLabels": { "cluster.x-k8s.io/deployment-name": DEPLOYMENT } },
                    "maxUnhealthy": "50%",
                    "nodeStartupTimeout": "10m",
                    "unhealthyConditions": [
                        { "type": "Ready", "status": "False", "timeout": "5s" },
                        { "type": "Ready", "status": "Unknown", "timeout": "5s" }
                    ]
                }
            }),
        )
        .await;
}

async fn healthy_count(world: &World, expected: i64) {
    let checks = dynamic(world, &capi("MachineHealthCheck", "machinehealthchecks"));
    wait::until(
        format!("the health check to count {expected} healthy workers"),
        DEADLINE,
        || {
            let checks = checks.clone();
            async move {
                let status = checks.get(DEPLOYMENT).await?.data["status"].clone();
                Ok(
                    (status["expectedMachines"] == expected
                        && status["currentHealthy"] == expected)
                        .then_some(()),
                )
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
}

/// Deletes the Cluster and waits until nothing of it is left: no Cluster
/// API or infrastructure object, VM, instance, disk or machine Secret.
async fn delete_cluster(world: &World) {
    dynamic(world, &capi("Cluster", "clusters"))
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .expect("delete Cluster");
    let leftovers = || async {
        let mut left: Vec<String> = Vec::new();
        for resource in [
            capi("Cluster", "clusters"),
            capi("Machine", "machines"),
            infrastructure("KubevirtCluster", "kubevirtclusters"),
            infrastructure("KubevirtMachine", "kubevirtmachines"),
            kubevirt("VirtualMachine", "virtualmachines"),
            kubevirt("VirtualMachineInstance", "virtualmachineinstances"),
            data_volumes(),
        ] {
            for object in list(world, &resource).await? {
                left.push(format!("{} {}", resource.kind, name(&object)));
            }
        }
        for claim in Api::<PersistentVolumeClaim>::namespaced(world.client(), NAMESPACE)
            .list(&ListParams::default())
            .await?
        {
            left.push(format!("PVC {}", claim.metadata.name.unwrap_or_default()));
        }
        // The machines' userdata Secrets (tenantry's `<machine>-userdata`,
        // CAPK's `<bootstrap secret>-userdata`) and the cluster's SSH keys.
        for secret in Api::<Secret>::namespaced(world.client(), NAMESPACE)
            .list(&ListParams::default())
            .await?
        {
            let secret_name = secret.metadata.name.unwrap_or_default();
            if secret_name.ends_with("-userdata") || secret_name.ends_with("-ssh-keys") {
                left.push(format!("Secret {secret_name}"));
            }
        }
        let tenants = world.kamaji().running().await;
        if tenants > 0 {
            left.push(format!("{tenants} tenant control plane(s)"));
        }
        anyhow::Ok(left)
    };
    let outcome = wait::until("everything of the Cluster to be gone", DEADLINE, || async {
        Ok(leftovers().await?.is_empty().then_some(()))
    })
    .await;
    if let Err(error) = outcome {
        let left = leftovers().await;
        world.fail(error.context(format!("still there: {left:?}")));
    }
}

#[tokio::test]
async fn tenantry_takes_over_a_running_cluster_from_capk() {
    let mut world = start().await;
    let mut capk = start_capk(&world).await;
    let tenant = create_cluster(&world, &capk).await;
    create_workers(&world, 2).await;
    let capk_workers = wait_workers(&world, &tenant, Some(&capk), "CAPK's 2 workers", |w| {
        w.len() == 2
    })
    .await;
    let before = identities(&world, &tenant)
        .await
        .unwrap_or_else(|e| fail(&world, Some(&capk), e));

    // `clusterctl delete --infrastructure kubevirt` stops CAPK and keeps
    // its CRDs and objects; `clusterctl init --infrastructure tenantry`
    // installs tenantry's CRDs over them and starts it.
    capk.process.stop(Duration::from_secs(10));
    world
        .start_tenantry(tenantry_e2e::tenantry::out_of_cluster())
        .await;
    wait_adopted(&world, &capk_workers).await;
    check_adopted(&world).await;
    let after = identities(&world, &tenant)
        .await
        .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        before, after,
        "the takeover recreated, restarted or changed something"
    );
    let adopted = wait_workers(&world, &tenant, None, "the adopted workers", |w| {
        w.len() == 2
    })
    .await;
    assert_eq!(adopted, capk_workers);

    // Tenantry's own machine joins the adopted ones.
    let three = scale(&world, &tenant, 3).await;
    let new = three
        .difference(&capk_workers)
        .next()
        .expect("a new worker")
        .clone();
    let vm = dynamic(&world, &kubevirt("VirtualMachine", "virtualmachines"))
        .get(&new)
        .await
        .expect("the new worker's VM");
    assert!(
        vm.annotations().contains_key(BOOTSTRAP_FORMAT_ANNOTATION),
        "tenantry created VM {new}"
    );

    // One of CAPK's workers goes NotReady: Cluster API deletes its
    // Machine, tenantry the VM CAPK made, and a new worker joins.
    create_health_check(&world).await;
    healthy_count(&world, 3).await;
    let sick = capk_workers.iter().next().expect("a CAPK worker").clone();
    world.nodes().inject_fault(&sick, NodeFault::NotReady);
    let healed = wait_workers(
        &world,
        &tenant,
        None,
        &format!("{sick} to be replaced"),
        |w| w.len() == 3 && !w.contains(&sick),
    )
    .await;
    world.nodes().clear_fault(&sick);
    assert_eq!(
        healed.intersection(&three).count(),
        2,
        "only the unhealthy worker was replaced"
    );
    healthy_count(&world, 3).await;
    // CAPK's workers share one userdata Secret (one bootstrap Secret): the
    // one still running reboots from it, so it stays.
    let capk_userdata = format!("{BOOTSTRAP_SECRET}-userdata");
    assert!(
        world
            .api::<Secret>(NAMESPACE)
            .get_opt(&capk_userdata)
            .await
            .expect("read Secrets")
            .is_some(),
        "{capk_userdata} is kept while a VM CAPK made reads it"
    );

    scale(&world, &tenant, 1).await;
    delete_cluster(&world).await;
}
