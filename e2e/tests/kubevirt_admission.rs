//! KubeVirt's own admission (virt-api of the release Cozystack runs,
//! `hack/upstream/kubevirt`) on what tenantry writes. A VirtualMachine
//! KubeVirt refuses is refused here too — the webhooks are live — and every
//! VirtualMachine tenantry renders is admitted: from each of CAPK's cluster
//! templates (but the one whose interface binding KubeVirt dropped), and
//! from `Kubernetes` worker pools (Talos disk from the image factory, an
//! instance type or explicit resources, GPUs, the eviction strategy). And
//! KubeVirt's own virt-controller takes one such VM to Running.

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolumeClaim, Pod, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::kubevirt::KubevirtMachine;
use tenantry_api::tenant::{Kubernetes, KubernetesSpec};
use tenantry_api::tenant_nodes::quantity_milli_value;
use tenantry_api::tenant_nodes::{KubernetesNodes, KubernetesNodesSpec};
use tenantry_e2e::clusterctl_template::{capk_templates, substitute, test_variables};
use tenantry_e2e::kubevirt_upstream::{
    LAUNCHER_IMAGE, SERVICE_ACCOUNT_GROUPS, VIRT_HANDLER_USER, VirtController,
    refused_virtual_machine,
};
use tenantry_e2e::manifests::{FIELD_MANAGER, parse_documents};
use tenantry_e2e::{World, wait};
use tenantry_provider::capi::bootstrap::BootstrapFormat;
use tenantry_provider::kubevirt::render::{MachineRole, VmPlacement, desired_virtual_machine};
use tenantry_provider::tenant::kubernetes_nodes::render::{PoolNames, machine_template};

const NAMESPACE: &str = "tenant-a";

/// A control plane (no kube-controller-manager, no tenantry CRDs) with
/// KubeVirt's virt-api, and the tenant's namespace.
async fn world() -> World {
    let world = World::builder("harness")
        .without_tenantry_crds()
        .without_controller_manager()
        .virt_api()
        .start()
        .await;
    Api::<Namespace>::all(world.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NAMESPACE } })).unwrap(),
        )
        .await
        .expect("namespace");
    world
}

/// The VirtualMachine tenantry makes of a KubevirtMachine with `spec`.
fn rendered(name: &str, spec: &Value, format: BootstrapFormat) -> VirtualMachine {
    let mut machine = KubevirtMachine::new(
        name,
        serde_json::from_value(spec.clone()).expect("a KubevirtMachine spec"),
    );
    machine.metadata.namespace = Some(NAMESPACE.into());
    let placement = VmPlacement {
        cluster_name: "demo",
        role: MachineRole::Worker,
        namespace: NAMESPACE,
        userdata_secret: &format!("{name}-userdata"),
        bootstrap_format: format,
    };
    desired_virtual_machine(&machine, &placement).expect("tenantry renders the VM")
}

async fn create(client: &kube::Client, vm: &VirtualMachine) -> kube::Result<VirtualMachine> {
    let api: Api<VirtualMachine> = Api::namespaced(client.clone(), NAMESPACE);
    let name = vm.metadata.name.clone().expect("name");
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(vm))
        .await
}

/// Creates the VM as tenantry does; panics with KubeVirt's answer if refused.
async fn admitted(client: &kube::Client, vm: &VirtualMachine, origin: &str) {
    create(client, vm)
        .await
        .unwrap_or_else(|e| panic!("{origin}: KubeVirt refuses the VM tenantry renders: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_kubevirt_refuses_is_refused() {
    let world = world().await;
    // The KubeVirt in the loop is the release the wrapper pins.
    let version = world
        .virt_api()
        .version(&world.control_plane().ca().cert_pem())
        .await
        .expect("virt-api's version");
    println!("virt-api reports KubeVirt {version}");
    assert_eq!(
        version,
        tenantry_e2e::upstream::pinned_version("kubevirt", "kubevirt.io/kubevirt")
            .expect("pinned KubeVirt version")
    );
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(world.client(), NAMESPACE, &resource);
    let written_by_hand: DynamicObject =
        serde_json::from_value(refused_virtual_machine("hand-written")).unwrap();
    let error = api
        .create(&PostParams::default(), &written_by_hand)
        .await
        .expect_err("KubeVirt refuses a disk without a volume");
    let kube::Error::Api(status) = error else {
        panic!("not an API error: {error}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status
            .message
            .contains("admission webhook \"virtualmachine-validator.kubevirt.io\" denied"),
        "{}",
        status.message
    );
    assert!(status.message.contains("root"), "{}", status.message);
    assert!(
        api.get_opt("hand-written").await.unwrap().is_none(),
        "nothing was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vm_tenantry_renders_from_capk_templates_is_admitted() {
    let world = world().await;
    let client = world.client();
    let files = capk_templates();
    let mut count = 0;
    for (index, file) in files.iter().enumerate() {
        let origin = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(file).expect("read template");
        let text = substitute(&text, &test_variables(&format!("capk-{index}"), NAMESPACE))
            .unwrap_or_else(|e| panic!("{origin}: {e}"));
        let format = if origin.contains("talos") {
            BootstrapFormat::TalosConfig
        } else {
            BootstrapFormat::CloudConfig
        };
        for document in parse_documents(&text).expect("parse template") {
            if document["kind"] != "KubevirtMachineTemplate" {
                continue;
            }
            let template = document["metadata"]["name"].as_str().expect("name");
            let spec = &document["spec"]["template"]["spec"];
            let vm = rendered(&format!("{template}-0"), spec, format);
            if origin.contains("passt") {
                // CAPK's passt template binds its interface with `passt: {}`,
                // which KubeVirt dropped in v1.3 for the passt binding
                // plugin: the user's template is what KubeVirt refuses, and
                // the refusal names the field.
                let error = create(&client, &vm)
                    .await
                    .expect_err("KubeVirt v1.8 refuses the passt interface");
                assert!(
                    error
                        .to_string()
                        .contains("Passt network binding has been discontinued"),
                    "{origin}: {error}"
                );
                continue;
            }
            admitted(&client, &vm, &format!("{origin} {template}")).await;
            count += 1;
        }
    }
    assert!(
        count >= 30,
        "only {count} machine templates in CAPK's templates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vm_a_kubernetes_pool_renders_is_admitted() {
    let world = world().await;
    let client = world.client();
    // The instance types pools name are KubeVirt's common instance types,
    // deployed (here by the harness) as virt-operator deploys them.
    let instancetypes = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "instancetype.kubevirt.io",
            "v1beta1",
            "VirtualMachineClusterInstancetype",
        ),
        "virtualmachineclusterinstancetypes",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &instancetypes);
    for (name, cpus, memory) in [("u1.medium", 1, "4Gi"), ("u1.xlarge", 4, "16Gi")] {
        let instancetype = api.get(name).await.expect("a common instance type");
        assert_eq!(instancetype.data["spec"]["cpu"]["guest"], cpus, "{name}");
        assert_eq!(
            instancetype.data["spec"]["memory"]["guest"], memory,
            "{name}"
        );
    }

    let mut kubernetes = Kubernetes::new("demo", KubernetesSpec::default());
    kubernetes.metadata.namespace = Some(NAMESPACE.into());
    let pools: Vec<(&str, Value)> = vec![
        ("instance-type", json!({})),
        (
            "bigger",
            json!({ "instanceType": "u1.xlarge", "diskSize": "50Gi" }),
        ),
        (
            "resources",
            json!({ "resources": { "cpu": "3", "memory": "6Gi" } }),
        ),
        (
            "gpus",
            json!({
                "instanceType": "u1.xlarge",
                "gpus": [{ "name": "nvidia.com/AD102GL_L40S" }, { "name": "nvidia.com/AD102GL_L40S" }],
                "roles": ["ingress-nginx"],
            }),
        ),
    ];
    for (pool_name, overrides) in pools {
        let mut spec = serde_json::to_value(KubernetesNodesSpec::for_cluster("demo")).unwrap();
        for (key, value) in overrides.as_object().unwrap() {
            spec[key] = value.clone();
        }
        let mut pool = KubernetesNodes::new(
            &format!("demo-{pool_name}"),
            serde_json::from_value(spec).expect("pool spec"),
        );
        pool.metadata.namespace = Some(NAMESPACE.into());
        let names = PoolNames::of(&pool).expect("pool names");
        let template = machine_template(&kubernetes, &pool, &names, "http://factory.internal");
        let vm = rendered(
            &format!("{}-0", names.objects),
            &template["spec"]["template"]["spec"],
            BootstrapFormat::TalosConfig,
        );
        admitted(&client, &vm, &format!("pool {pool_name}")).await;
    }
}

/// KubeVirt's own virt-controller takes a VM tenantry renders from CAPK's
/// default template (a container disk) to Running; see [`run_with_kubevirt`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virt_controller_runs_a_vm_tenantry_renders() {
    let world = world().await;
    let mut controller = VirtController::start(world.control_plane(), world.virt_api())
        .await
        .expect("virt-controller starts and leads");
    let text = std::fs::read_to_string(
        capk_templates()
            .into_iter()
            .find(|f| f.file_name().is_some_and(|n| n == "cluster-template.yaml"))
            .expect("CAPK's default template"),
    )
    .expect("read template");
    let text = substitute(&text, &test_variables("demo", NAMESPACE)).expect("substitute");
    let spec = parse_documents(&text)
        .expect("parse template")
        .into_iter()
        .find(|d| {
            d["kind"] == "KubevirtMachineTemplate"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("md-0"))
        })
        .expect("the workers' KubevirtMachineTemplate")["spec"]["template"]["spec"]
        .clone();
    let vm = rendered("demo-md-0-abcde", &spec, BootstrapFormat::CloudConfig);
    let vmi = run_with_kubevirt(&world, &mut controller, &vm).await;
    assert_eq!(
        vmi.data["spec"]["domain"]["memory"]["guest"],
        json!(vm_memory(&vm)),
        "the VMI has the VM's memory"
    );
}

/// The same for a Talos worker pool's VM: its instance type (KubeVirt's
/// common `u1.medium`) applied by virt-controller, and its boot disk a DataVolume virt-controller makes
/// from the VM's template (CDI's import played here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virt_controller_runs_a_talos_pool_vm() {
    let world = world().await;
    let mut controller = VirtController::start(world.control_plane(), world.virt_api())
        .await
        .expect("virt-controller starts and leads");
    let mut kubernetes = Kubernetes::new("demo", KubernetesSpec::default());
    kubernetes.metadata.namespace = Some(NAMESPACE.into());
    let mut pool = KubernetesNodes::new("demo-workers", KubernetesNodesSpec::for_cluster("demo"));
    pool.metadata.namespace = Some(NAMESPACE.into());
    let names = PoolNames::of(&pool).expect("pool names");
    let template = machine_template(&kubernetes, &pool, &names, "http://factory.internal");
    let vm = rendered(
        &format!("{}-0", names.objects),
        &template["spec"]["template"]["spec"],
        BootstrapFormat::TalosConfig,
    );
    assert!(
        vm.spec
            .data_volume_templates
            .as_ref()
            .is_some_and(|t| !t.is_empty()),
        "the pool's VM boots from a DataVolume"
    );
    let vmi = run_with_kubevirt(&world, &mut controller, &vm).await;
    assert_eq!(
        vmi.data["spec"]["domain"]["memory"]["guest"], "4Gi",
        "virt-controller applied the instance type"
    );
}

/// Creates `vm` as tenantry does and takes it to Running with KubeVirt's own
/// virt-controller, the test playing the parts that cannot run here: CDI's
/// import (each DataVolume virt-controller makes is imported, its PVC
/// bound), the kubelet (the launcher pod bound to a node and running) and
/// virt-handler (the domain up, written as its ServiceAccount). Checks what
/// virt-controller does on the way — the VMI owned by the VM, the launcher
/// pod's node selector, image and memory, the VMI scheduled on the pod's
/// node, the VM Running and ready — and returns the running VMI.
async fn run_with_kubevirt(
    world: &World,
    controller: &mut VirtController,
    vm: &VirtualMachine,
) -> DynamicObject {
    let client = world.client();
    let node = "worker-1";
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": node, "labels": { "kubevirt.io/schedulable": "true" } },
            }))
            .unwrap(),
        )
        .await
        .expect("node");
    let name = vm.metadata.name.clone().unwrap();
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": format!("{name}-userdata") },
                "stringData": { "userdata": "#cloud-config\n" },
            }))
            .unwrap(),
        )
        .await
        .expect("userdata secret");
    admitted(&client, vm, &name).await;
    let fail = |what: &str, controller: &VirtController| {
        format!(
            "{what}\nvirt-controller log tail:\n{}",
            controller.log_tail(40)
        )
    };

    // CDI's part: each DataVolume virt-controller makes from the VM's
    // templates is imported and its PVC bound.
    let data_volumes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "DataVolume"),
            "datavolumes",
        ),
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    for template in vm.spec.data_volume_templates.as_deref().unwrap_or_default() {
        let dv_name = template
            .metadata
            .as_ref()
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .expect("DataVolume name");
        let dv = eventually(|| async { data_volumes.get_opt(&dv_name).await.ok().flatten() })
            .await
            .unwrap_or_else(|| panic!("{}", fail(&format!("no DataVolume {dv_name}"), controller)));
        let owners = dv.metadata.owner_references.clone().unwrap_or_default();
        assert!(
            owners
                .iter()
                .any(|o| o.kind == "VirtualMachine" && o.name == name),
            "the DataVolume is the VM's: {owners:?}"
        );
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": dv_name },
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": { "requests": { "storage": "10Gi" } },
                    },
                }))
                .unwrap(),
            )
            .await
            .expect("the DataVolume's PVC");
        claims
            .patch_status(
                &dv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "phase": "Bound",
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": { "storage": "10Gi" },
                }})),
            )
            .await
            .expect("the PVC is bound");
        data_volumes
            .patch_status(
                &dv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "phase": "Succeeded",
                    "progress": "100.0%",
                    "claimName": dv_name,
                    "conditions": [
                        { "type": "Bound", "status": "True", "reason": "Bound" },
                        { "type": "Ready", "status": "True", "reason": "" },
                        { "type": "Running", "status": "False", "reason": "Completed" },
                    ],
                }})),
            )
            .await
            .expect("the DataVolume is imported");
    }

    let vmis: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &resource("VirtualMachineInstance", "virtualmachineinstances"),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    // virt-controller makes the VMI, owned by the VM, and its launcher pod.
    let vmi = eventually(|| async { vmis.get_opt(&name).await.ok().flatten() })
        .await
        .unwrap_or_else(|| panic!("{}", fail("no VMI for the VM", controller)));
    let owner = vmi.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "VirtualMachine" && o.name == name && o.controller == Some(true)),
        "the VMI is the VM's: {owner:?}"
    );
    let vmi_uid = vmi.metadata.uid.clone().unwrap();
    let selector = format!("kubevirt.io=virt-launcher,kubevirt.io/created-by={vmi_uid}");
    let pod = eventually(|| async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .ok()
            .and_then(|l| l.items.into_iter().next())
    })
    .await
    .unwrap_or_else(|| panic!("{}", fail("no launcher pod for the VMI", controller)));
    let pod_spec = pod.spec.clone().unwrap();
    assert_eq!(
        pod_spec
            .node_selector
            .as_ref()
            .and_then(|s| s.get("kubevirt.io/schedulable"))
            .map(String::as_str),
        Some("true"),
        "launcher pods go to nodes virt-handler serves"
    );
    let compute = pod_spec
        .containers
        .iter()
        .find(|c| c.name == "compute")
        .expect("a compute container");
    assert_eq!(compute.image.as_deref(), Some(LAUNCHER_IMAGE));
    let guest_memory = vmi.data["spec"]["domain"]["memory"]["guest"]
        .as_str()
        .or_else(|| vmi.data["spec"]["domain"]["resources"]["requests"]["memory"].as_str())
        .expect("the VMI names its memory")
        .to_string();
    let requested = compute
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .map(|q| q.0.clone())
        .expect("the compute container asks for memory");
    assert!(
        quantity_bytes(&requested) > quantity_bytes(&guest_memory),
        "the launcher asks for the guest's {guest_memory} and its overhead, got {requested}"
    );

    // The kubelet's part: the pod bound to the node and running.
    let pod_name = pod.metadata.name.clone().unwrap();
    pods.create_subresource::<_, Value>(
        "binding",
        &pod_name,
        &PostParams::default(),
        &json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": pod_name },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node },
        }),
    )
    .await
    .expect("bind the launcher pod");
    let containers: Vec<Value> = pod_spec
        .containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": true,
                "restartCount": 0, "started": true,
                "state": { "running": { "startedAt": "2026-12-06T00:00:00Z" } },
            })
        })
        .collect();
    pods.patch_status(
        &pod_name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "phase": "Running",
            "podIP": "10.244.0.10",
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": containers,
        }})),
    )
    .await
    .expect("the launcher pod runs");

    // virt-controller schedules the VMI on the pod's node.
    let scheduled = eventually(|| async {
        vmis.get_opt(&name)
            .await
            .ok()
            .flatten()
            .filter(|v| v.data["status"]["phase"] == "Scheduled")
    })
    .await
    .unwrap_or_else(|| panic!("{}", fail("the VMI never got Scheduled", controller)));
    assert_eq!(scheduled.data["status"]["nodeName"], node);
    assert_eq!(
        scheduled
            .labels()
            .get("kubevirt.io/nodeName")
            .map(String::as_str),
        Some(node)
    );

    // virt-handler's part, as its ServiceAccount: the domain is up.
    let handler = world
        .control_plane()
        .user_client(VIRT_HANDLER_USER, &SERVICE_ACCOUNT_GROUPS)
        .await
        .expect("virt-handler's client");
    let handler_vmis: Api<DynamicObject> = Api::namespaced_with(
        handler,
        NAMESPACE,
        &resource("VirtualMachineInstance", "virtualmachineinstances"),
    );
    let mut running = scheduled.clone();
    running.data["status"]["phase"] = json!("Running");
    running.data["status"]["conditions"] = json!([{ "type": "Ready", "status": "True" }]);
    running.data["status"]["interfaces"] = json!([{
        "name": "default", "ipAddress": "10.244.0.10", "ipAddresses": ["10.244.0.10"],
    }]);
    let running = handler_vmis
        .replace(&name, &PostParams::default(), &running)
        .await
        .expect("virt-handler reports the domain running");

    // The VM's status, written by virt-controller, as tenantry reads it.
    let vms: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &resource("VirtualMachine", "virtualmachines"),
    );
    let ready = eventually(|| async {
        vms.get_opt(&name)
            .await
            .ok()
            .flatten()
            .filter(|v| v.data["status"]["ready"] == true)
    })
    .await
    .unwrap_or_else(|| panic!("{}", fail("the VM never became ready", controller)));
    assert_eq!(ready.data["status"]["printableStatus"], "Running");
    assert_eq!(
        controller.restarts(),
        0,
        "virt-controller never had to restart"
    );
    running
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubevirt.io", "v1", kind), plural)
}

/// Polls `probe` until it yields, for at most two minutes (an upper bound
/// for a busy machine, not a measure).
async fn eventually<T, F, Fut>(mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait::until("", std::time::Duration::from_secs(120), || {
        let found = probe();
        async move { Ok(found.await) }
    })
    .await
    .ok()
}

fn vm_memory(vm: &VirtualMachine) -> String {
    let value = serde_json::to_value(vm).unwrap();
    let domain = &value["spec"]["template"]["spec"]["domain"];
    domain["memory"]["guest"]
        .as_str()
        .or_else(|| domain["resources"]["requests"]["memory"].as_str())
        .expect("the VM names its memory")
        .to_string()
}

fn quantity_bytes(quantity: &str) -> i128 {
    quantity_milli_value(quantity).expect("a quantity")
}
