//! KubeVirt's own admission (virt-api of the release Cozystack runs,
//! `hack/upstream/kubevirt`) on what tenantry writes. A VirtualMachine
//! KubeVirt refuses is refused here too — the webhooks are live — and every
//! VirtualMachine tenantry renders is admitted: from each of CAPK's cluster
//! templates (but the one whose interface binding KubeVirt dropped), and
//! from `Kubernetes` worker pools (Talos disk from the image factory, an
//! instance type or explicit resources, GPUs, the eviction strategy).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::kubevirt::KubevirtMachine;
use tenantry_api::tenant::{Kubernetes, KubernetesSpec};
use tenantry_api::tenant_nodes::{KubernetesNodes, KubernetesNodesSpec};
use tenantry_e2e::clusterctl_template::{capk_templates, substitute, test_variables};
use tenantry_e2e::kubevirt_upstream::{VirtApi, refused_virtual_machine};
use tenantry_e2e::manifests::{FIELD_MANAGER, parse_documents};
use tenantry_e2e::{ControlPlane, ControlPlaneOptions};
use tenantry_provider::capi::bootstrap::BootstrapFormat;
use tenantry_provider::kubevirt::render::{MachineRole, VmPlacement, desired_virtual_machine};
use tenantry_provider::tenant::pool::{PoolNames, machine_template};

const NAMESPACE: &str = "tenant-a";

async fn world() -> (ControlPlane, VirtApi) {
    let control_plane = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: false,
        ..Default::default()
    })
    .await
    .expect("start control plane");
    let virt_api = VirtApi::start(&control_plane)
        .await
        .expect("virt-api starts and its webhooks answer");
    Api::<Namespace>::all(control_plane.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": NAMESPACE } })).unwrap(),
        )
        .await
        .expect("namespace");
    (control_plane, virt_api)
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
    let (control_plane, _virt_api) = world().await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    let api: Api<DynamicObject> =
        Api::namespaced_with(control_plane.client(), NAMESPACE, &resource);
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
    let (control_plane, _virt_api) = world().await;
    let client = control_plane.client();
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
    let (control_plane, _virt_api) = world().await;
    let client = control_plane.client();
    // The instance types a platform offers (KubeVirt's common instance
    // types); KubeVirt refuses a VM naming one that does not exist.
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
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineClusterInstancetype",
            "metadata": { "name": name },
            "spec": { "cpu": { "guest": cpus }, "memory": { "guest": memory } },
        }))
        .unwrap();
        api.create(&PostParams::default(), &object)
            .await
            .expect("instance type");
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
