//! Tenantry under the Cluster API the platform runs: the real core manager
//! v1.10.1, which serves `cluster.x-k8s.io/v1beta1` only (the v1beta1
//! contract), and Kamaji's control plane provider v0.19
//! (`KamajiControlPlane` v1alpha1, the tenant control plane simulator in
//! that mode). Everything is written as an operator on that platform writes
//! it, in v1beta1; the manager scales a MachineDeployment of KubeVirt
//! workers, its MachineHealthCheck replaces an unhealthy one, and deleting
//! the Cluster leaves nothing behind. The management apiserver's audit log
//! then shows that no request ever named `cluster.x-k8s.io/v1beta2`: such a
//! request answers 404, which a read would take for "absent".
//!
//! The same scenarios against the pinned Cluster API (v1beta2) are in
//! `machine_deployments.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::json;
use tenantry_e2e::bench::resource;
use tenantry_e2e::cluster_api::ClusterApiRelease;
use tenantry_e2e::fixtures;
use tenantry_e2e::sim::kubevirt::{ImageFactoryConfig, KubevirtSimConfig};
use tenantry_e2e::sim::tenant::{
    KamajiApi, NodeFault, NodeSimConfig, TenantCluster, TenantControlPlaneOptions,
};
use tenantry_e2e::{ControlPlaneOptions, Kubevirt, World, wait};

const DEADLINE: Duration = Duration::from_secs(240);
const NAMESPACE: &str = "default";
const CLUSTER: &str = "demo";
const DEPLOYMENT: &str = "demo-md-0";
const TEMPLATE: &str = "demo-workers";
const BOOTSTRAP_SECRET: &str = "demo-talos-worker";
const KUBERNETES_VERSION: &str = "v1.35.0";
const TALOS: &str = "v1.13.0";
const V1BETA1: &str = "cluster.x-k8s.io/v1beta1";

fn capi(kind: &str, plural: &str) -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta1", kind, plural)
}

async fn start() -> World {
    World::builder("management")
        .control_plane(ControlPlaneOptions {
            name: "management".into(),
            audit_log: true,
            ..Default::default()
        })
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
        .tenantry()
        .start()
        .await
}

fn dynamic(world: &World, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(world.client(), NAMESPACE, resource)
}

/// A Cluster as the platform writes it for Cluster API v1.10: a
/// KubevirtCluster and a v1alpha1 KamajiControlPlane, referenced by
/// apiVersion. Returns the tenant once Cluster API reports the control
/// plane ready and the infrastructure provisioned.
async fn create_cluster(world: &World) -> TenantCluster {
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
                    "infrastructureRef": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtCluster", "name": CLUSTER }
                }
            }),
        )
        .await;
    let kamaji = world.kamaji();
    let tenant = wait::until("the tenant control plane to run", DEADLINE, || async move {
        Ok(kamaji.tenant(NAMESPACE, CLUSTER))
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
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
        "Cluster API v1.10 to see the control plane and infrastructure ready",
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
    .unwrap_or_else(|e| world.fail(e));
    tenant
}

async fn create_workers(world: &World, replicas: u32) {
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "KubevirtMachineTemplate",
                "metadata": { "name": TEMPLATE },
                "spec": { "template": { "spec": fixtures::talos_machine_spec(world.factory().base_url(), TALOS) } }
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
                            "infrastructureRef": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtMachineTemplate", "name": TEMPLATE }
                        }
                    }
                }
            }),
        )
        .await;
}

/// The deployment's workers once Cluster API, tenantry, KubeVirt and the
/// tenant agree: Machines `Running` with a `nodeRef`, one live VM per
/// Machine and no other, one Node per Machine. `None` until they do.
async fn settled_workers(
    world: &World,
    tenant: &TenantCluster,
) -> anyhow::Result<Option<BTreeSet<String>>> {
    let machines = dynamic(world, &capi("Machine", "machines"))
        .list(
            &ListParams::default()
                .labels(&format!("cluster.x-k8s.io/deployment-name={DEPLOYMENT}")),
        )
        .await?
        .items;
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
    let vms = dynamic(
        world,
        &resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines"),
    )
    .list(&ListParams::default())
    .await?
    .items;
    let vm_names: BTreeSet<String> = vms
        .iter()
        .filter_map(|vm| vm.metadata.name.clone())
        .collect();
    let nodes: BTreeSet<String> = Api::<Node>::all(tenant.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    Ok((vm_names == names && nodes == node_refs).then_some(names))
}

async fn wait_workers(
    world: &World,
    tenant: &TenantCluster,
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
    .unwrap_or_else(|e| world.fail(e))
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
    wait_workers(world, tenant, &format!("{replicas} workers"), |w| {
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

/// Deletes the Cluster and waits until nothing of it is left.
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
            resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines"),
            resource(
                "kubevirt.io",
                "v1",
                "VirtualMachineInstance",
                "virtualmachineinstances",
            ),
        ] {
            for object in dynamic(world, &resource)
                .list(&ListParams::default())
                .await?
                .items
            {
                left.push(format!(
                    "{} {}",
                    resource.kind,
                    object.metadata.name.unwrap_or_default()
                ));
            }
        }
        for claim in Api::<PersistentVolumeClaim>::namespaced(world.client(), NAMESPACE)
            .list(&ListParams::default())
            .await?
            .items
        {
            left.push(format!("PVC {}", claim.metadata.name.unwrap_or_default()));
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
async fn workers_scale_heal_and_go_under_cluster_api_v1_10() {
    let world = start().await;
    let served = tenantry_provider::capi::CapiGeneration::discover(&world.client())
        .await
        .expect("discovery");
    assert_eq!(
        served,
        Some(tenantry_provider::capi::CapiGeneration::V1beta1),
        "Cluster API v1.10 serves v1beta1 only"
    );
    let tenant = create_cluster(&world).await;
    create_workers(&world, 2).await;
    wait_workers(&world, &tenant, "2 workers", |w| w.len() == 2).await;
    let three = scale(&world, &tenant, 3).await;

    // One worker's Node goes NotReady: Cluster API v1.10 deletes its
    // Machine, tenantry its VM, and a new worker joins.
    create_health_check(&world).await;
    healthy_count(&world, 3).await;
    let sick = three.iter().next().expect("a worker").clone();
    world.nodes().inject_fault(&sick, NodeFault::NotReady);
    let healed = wait_workers(&world, &tenant, &format!("{sick} to be replaced"), |w| {
        w.len() == 3 && !w.contains(&sick)
    })
    .await;
    world.nodes().clear_fault(&sick);
    assert_eq!(
        healed.intersection(&three).count(),
        2,
        "only the unhealthy worker was replaced"
    );
    healthy_count(&world, 3).await;

    scale(&world, &tenant, 1).await;
    delete_cluster(&world).await;

    let audit = world
        .control_plane()
        .audit_events()
        .expect("read the audit log");
    let v1beta2: Vec<String> = audit
        .iter()
        .filter_map(|event| {
            let object = event.object_ref.as_ref()?;
            (object.api_group.as_deref() == Some("cluster.x-k8s.io")
                && object.api_version.as_deref() == Some("v1beta2"))
            .then(|| format!("{} {}", event.verb, event.request_uri))
        })
        .collect();
    assert!(
        v1beta2.is_empty(),
        "requests for cluster.x-k8s.io/v1beta2: {v1beta2:?}"
    );
    // And the check looked at tenantry's reads: it watches Machines, with
    // no User-Agent (kube-rs sends none; the Go components all do), and the
    // test and the simulators only list them.
    let watched_v1beta1_machines = audit.iter().any(|event| {
        event.verb == "watch"
            && event.object_ref.as_ref().is_some_and(|object| {
                object.api_group.as_deref() == Some("cluster.x-k8s.io")
                    && object.api_version.as_deref() == Some("v1beta1")
                    && object.resource.as_deref() == Some("machines")
            })
            && event.user_agent.as_deref().unwrap_or_default().is_empty()
    });
    assert!(
        watched_v1beta1_machines,
        "tenantry's Machine watch is in the audit log"
    );
}
