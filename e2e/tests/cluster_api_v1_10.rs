//! Tenantry under the Cluster API the platform runs: the real core manager
//! v1.10.1, which serves `cluster.x-k8s.io/v1beta1` only (the v1beta1
//! contract), and Kamaji's control plane provider v0.19
//! (`KamajiControlPlane` v1alpha1, the tenant control plane simulator in
//! that mode). Everything is written as an operator on that platform writes
//! it, in v1beta1; the manager scales a MachineDeployment of KubeVirt
//! workers, its MachineHealthCheck replaces an unhealthy one, and deleting
//! the Cluster leaves nothing behind. A second world wires tenantry's
//! reboot-first remediation into a v1beta1 MachineHealthCheck
//! (`spec.remediationTemplate`): Cluster API v1.10 creates the
//! KubevirtRemediation, tenantry restarts the VM in place, and the Machine
//! stays. After either scenario the management apiserver's audit log shows
//! that no request ever named `cluster.x-k8s.io/v1beta2`: such a request
//! answers 404, which a read would take for "absent".
//!
//! The same scenarios against the pinned Cluster API (v1beta2) are in
//! `machine_deployments.rs`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};
use tenantry_api::remediation::{KubevirtRemediation, RemediationPhase};
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
const REMEDIATION_TEMPLATE: &str = "reboot-first";

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
/// unhealthy, at most half the pool is remediated. Cluster API remediates
/// by deleting the Machine, or, given `remediation_template`, by creating a
/// KubevirtRemediation from the KubevirtRemediationTemplate of that name
/// (v1beta1's `spec.remediationTemplate`, an object reference).
async fn create_health_check(world: &World, remediation_template: Option<&str>) {
    let mut health_check = json!({
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
    });
    if let Some(template) = remediation_template {
        health_check["spec"]["remediationTemplate"] = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtRemediationTemplate",
            "name": template,
        });
    }
    world.create(NAMESPACE, health_check).await;
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

/// The management apiserver's audit log: no request named
/// `cluster.x-k8s.io/v1beta2`, and tenantry did read Machines as v1beta1.
fn assert_no_v1beta2_request(world: &World) {
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
    create_health_check(&world, None).await;
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

    assert_no_v1beta2_request(&world);
}

fn virtual_machine_instances() -> ApiResource {
    resource(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
        "virtualmachineinstances",
    )
}

/// The UID of the running (not deleting) VMI of the VM `name`, once there
/// is one.
async fn running_vmi(world: &World, name: &str) -> String {
    let vmis = dynamic(world, &virtual_machine_instances());
    wait::until(format!("a running VMI {name}"), DEADLINE, || {
        let vmis = vmis.clone();
        async move {
            let uid = vmis.get_opt(name).await?.and_then(|vmi| {
                let running = vmi.metadata.deletion_timestamp.is_none()
                    && vmi.data["status"]["phase"] == "Running";
                vmi.metadata.uid.filter(|_| running)
            });
            Ok(uid)
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e))
}

/// Every version of the KubevirtRemediation `name` the apiserver
/// announces, the last one included (a watch's DELETED event carries it),
/// recorded in the background: the remediation lives only from the health
/// check's failure to its success, which a poll could miss.
fn record_remediation(world: &World, name: &str) -> Arc<Mutex<Vec<KubevirtRemediation>>> {
    let versions = Arc::new(Mutex::new(Vec::new()));
    let api: Api<KubevirtRemediation> = world.api(NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let recorded = versions.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            if let Ok(
                watcher::Event::Apply(remediation)
                | watcher::Event::InitApply(remediation)
                | watcher::Event::Delete(remediation),
            ) = event
            {
                recorded.lock().expect("versions").push(remediation);
            }
        }
    });
    versions
}

fn v1beta1_condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Reboot first under Cluster API v1.10: a v1beta1 MachineHealthCheck whose
/// `spec.remediationTemplate` names a KubevirtRemediationTemplate. A
/// worker whose kubelet is wedged until the next boot fails its health
/// check; Cluster API creates a KubevirtRemediation owned by the Machine,
/// tenantry restarts the VM (a new instance, the same VM), the Node turns
/// Ready, and Cluster API deletes the remediation. The Machine is the same
/// one throughout, and nothing was replaced.
#[tokio::test]
async fn health_check_reboots_a_worker_in_place_under_cluster_api_v1_10() {
    let world = start().await;
    let tenant = create_cluster(&world).await;
    create_workers(&world, 2).await;
    let workers = wait_workers(&world, &tenant, "2 workers", |w| w.len() == 2).await;
    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "KubevirtRemediationTemplate",
                "metadata": { "name": REMEDIATION_TEMPLATE },
                "spec": { "template": { "spec": { "strategy": { "type": "Reboot", "retryLimit": 1, "timeout": "3m" } } } }
            }),
        )
        .await;
    create_health_check(&world, Some(REMEDIATION_TEMPLATE)).await;
    healthy_count(&world, 2).await;

    let mut names = workers.iter();
    let (sick, well) = (
        names.next().expect("a worker").clone(),
        names.next().expect("a second worker").clone(),
    );
    let machines = dynamic(&world, &capi("Machine", "machines"));
    let machine = machines
        .list(&ListParams::default())
        .await
        .expect("list Machines")
        .items
        .into_iter()
        .find(|m| m.data["status"]["nodeRef"]["name"] == sick.as_str())
        .unwrap_or_else(|| panic!("the Machine of Node {sick}"));
    let machine_name = machine.metadata.name.clone().expect("Machine name");
    let machine_uid = machine.metadata.uid.clone().expect("Machine UID");
    let virtual_machines = dynamic(
        &world,
        &resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines"),
    );
    let vm_uid = virtual_machines.get(&sick).await.expect("VM").metadata.uid;
    let first_boot = running_vmi(&world, &sick).await;
    let well_boot = running_vmi(&world, &well).await;
    let versions = record_remediation(&world, &machine_name);

    world
        .nodes()
        .inject_fault(&sick, NodeFault::NotReadyUntilReboot);
    let remediations: Api<KubevirtRemediation> = world.api(NAMESPACE);
    wait::until(
        format!("the remediation of {machine_name} to come and go"),
        DEADLINE,
        || {
            let (remediations, versions, machine_name) = (&remediations, &versions, &machine_name);
            async move {
                let seen = !versions.lock().expect("versions").is_empty();
                let gone = remediations.get_opt(machine_name).await?.is_none();
                Ok((seen && gone).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        let versions = versions.lock().expect("versions");
        world.fail(e.context(format!(
            "remediation as last seen: {:?}",
            versions.last().map(|r| &r.status)
        )))
    });

    let versions = versions.lock().expect("versions").clone();
    let created = versions.first().expect("the remediation as created");
    let owner = created
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Machine")
        .expect("owned by its Machine");
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        (V1BETA1, machine_name.as_str(), machine_uid.as_str()),
        "Cluster API v1.10 made it for the Machine"
    );
    assert_eq!(
        created
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("cluster.x-k8s.io/cloned-from-name"))
            .map(String::as_str),
        Some(REMEDIATION_TEMPLATE)
    );
    assert_eq!(
        created.spec.strategy.timeout, "3m",
        "cloned from the template"
    );
    // The last word before Cluster API deleted it: one restart, of the
    // instance that ran, waiting for the Node.
    let status = versions
        .last()
        .and_then(|r| r.status.clone())
        .expect("a status");
    assert_eq!(status.phase, Some(RemediationPhase::Waiting), "{status:?}");
    assert_eq!(status.retry_count, Some(1), "{status:?}");
    assert_eq!(
        status.virtual_machine_instance_uid.as_deref(),
        Some(first_boot.as_str())
    );
    let remediated = fixtures::condition(&status.conditions, "Remediated").expect("Remediated");
    assert_eq!(
        (remediated.status.as_str(), remediated.reason.as_str()),
        ("False", "WaitingForNodeHealthy"),
        "{remediated:?}"
    );
    let events = Api::<Event>::namespaced(world.client(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("list Events");
    assert!(
        events.items.iter().any(|e| {
            e.reason.as_deref() == Some("Rebooted")
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("KubevirtRemediation")
                        && r.name.as_deref() == Some(machine_name.as_str())
                })
        }),
        "a Rebooted event on the remediation"
    );

    // The same Machine, healthy again, on a restarted VM.
    let healthy = wait::until(
        format!("Machine {machine_name} to pass its health check"),
        DEADLINE,
        || {
            let (machines, machine_name) = (&machines, &machine_name);
            async move {
                let machine = machines.get(machine_name).await?;
                let passed = v1beta1_condition(&machine, "HealthCheckSucceeded")
                    .is_some_and(|c| c["status"] == "True");
                Ok(passed.then_some(machine))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(healthy.metadata.uid.as_deref(), Some(machine_uid.as_str()));
    assert!(healthy.metadata.deletion_timestamp.is_none());
    let node = Api::<Node>::all(tenant.client.clone())
        .get(&sick)
        .await
        .expect("Node");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status);
    assert_eq!(ready.as_deref(), Some("True"), "Node {sick} is Ready");
    assert!(
        !world.nodes().faults().contains_key(&sick),
        "the reboot cured the kubelet"
    );
    let second_boot = running_vmi(&world, &sick).await;
    assert_ne!(second_boot, first_boot, "the VM was restarted");
    assert_eq!(
        virtual_machines.get(&sick).await.expect("VM").metadata.uid,
        vm_uid,
        "the same VM"
    );
    assert_eq!(
        running_vmi(&world, &well).await,
        well_boot,
        "the healthy worker was left alone"
    );
    let after = wait_workers(&world, &tenant, "the same 2 workers", |w| w.len() == 2).await;
    assert_eq!(after, workers, "nothing was replaced");
    healthy_count(&world, 2).await;

    assert_no_v1beta2_request(&world);
}
