//! The management-cluster version matrix: tenantry's CRDs and webhooks, and
//! the KubeVirt and CDI CRDs it works with, install and serve on every
//! kube-apiserver minor a platform may run (`MANAGEMENT_APISERVER_MINORS`:
//! the pinned one and the newest). New apiservers refuse or prune schemas
//! older ones took; the rest of the suite runs on the pinned minor only.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use tenantry_e2e::upstream::{Binary, MANAGEMENT_APISERVER_MINORS};
use tenantry_e2e::{ControlPlaneOptions, World};

const NAMESPACE: &str = "platform";

fn binary_for(minor: u32) -> Binary {
    MANAGEMENT_APISERVER_MINORS
        .iter()
        .find(|(m, _)| *m == minor)
        .map(|(_, binary)| *binary)
        .unwrap_or_else(|| panic!("no management kube-apiserver build of v1.{minor}"))
}

fn dynamic_api(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)),
    )
}

async fn create(
    api: &Api<DynamicObject>,
    document: Value,
    dry_run: bool,
) -> kube::Result<DynamicObject> {
    let object: DynamicObject = serde_json::from_value(document).expect("object decodes");
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    api.create(&params, &object).await
}

async fn installs_and_serves_on(minor: u32) {
    // Installing tenantry's CRDs (the builder waits for each to be
    // Established) and serving its webhooks is what is checked here.
    let name = format!("management-v1-{minor}");
    let world = World::builder(&name)
        .control_plane(ControlPlaneOptions {
            name: name.clone(),
            apiserver_binary: binary_for(minor),
            ..Default::default()
        })
        .webhooks()
        .start()
        .await;
    let client = world.client();
    let version = client.apiserver_version().await.expect("server version");
    assert_eq!(
        version.minor,
        minor.to_string(),
        "the apiserver serves v1.{minor}"
    );

    // Every CRD is accepted, structural, and Established.
    let mut names: Vec<String> = tenantry_api::crds::all()
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect();
    names.extend(
        tenantry_e2e::sim::kubevirt::install_crds(&client)
            .await
            .expect("install the KubeVirt and CDI CRDs"),
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in &names {
        let crd = crds.get(name).await.expect("CRD");
        let refusals: Vec<_> = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ == "NonStructuralSchema" && c.status == "True")
            .map(|c| c.message.unwrap_or_default())
            .collect();
        assert!(refusals.is_empty(), "v1.{minor}: {name}: {refusals:?}");
    }

    world.create_namespace(NAMESPACE).await;

    // The mutating webhook answers: the manager's image factory default.
    let kubernetes = dynamic_api(&client, "apps.tenantry.dev", "v1alpha1", "Kubernetes");
    let defaulted = create(
        &kubernetes,
        json!({
            "apiVersion": "apps.tenantry.dev/v1alpha1",
            "kind": "Kubernetes",
            "metadata": { "name": "defaulted", "namespace": NAMESPACE },
            "spec": {}
        }),
        true,
    )
    .await
    .unwrap_or_else(|e| panic!("v1.{minor}: a default Kubernetes is admitted: {e}"));
    assert!(
        defaulted.data["spec"]["talos"]["imageFactoryURL"]
            .as_str()
            .is_some_and(|url| !url.is_empty()),
        "v1.{minor}: the defaulting webhook set the image factory: {}",
        defaulted.data["spec"]
    );
    // The validating webhook answers: Talos v1.10 cannot run Kubernetes v1.35.
    let refused = create(
        &kubernetes,
        json!({
            "apiVersion": "apps.tenantry.dev/v1alpha1",
            "kind": "Kubernetes",
            "metadata": { "name": "mismatched", "namespace": NAMESPACE },
            "spec": { "version": "v1.35", "talos": { "version": "v1.10.7" } }
        }),
        true,
    )
    .await
    .expect_err("the Talos support matrix refuses Talos v1.10 with Kubernetes v1.35");
    assert!(
        refused.to_string().contains("v1.10"),
        "v1.{minor}: {refused}"
    );

    // A CAPK-shaped template keeps its embedded metadata as stored.
    let vmi_metadata = json!({
        "labels": { "example.com/tier": "gold" },
        "annotations": { "k8s.v1.cni.cncf.io/networks": "default/storage-net" }
    });
    let templates = dynamic_api(
        &client,
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "KubevirtMachineTemplate",
    );
    let stored = create(
        &templates,
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachineTemplate",
            "metadata": { "name": "workers", "namespace": NAMESPACE },
            "spec": { "template": { "spec": { "virtualMachineTemplate": { "spec": {
                "runStrategy": "Always",
                "template": {
                    "metadata": vmi_metadata.clone(),
                    "spec": { "domain": { "devices": {} } }
                }
            }}}}}
        }),
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("v1.{minor}: KubevirtMachineTemplate: {e}"));
    assert_eq!(
        stored.data["spec"]["template"]["spec"]["virtualMachineTemplate"]["spec"]["template"]["metadata"],
        vmi_metadata,
        "v1.{minor}: the embedded metadata survives"
    );

    // KubeVirt's and CDI's CRDs serve objects.
    let vms = dynamic_api(&client, "kubevirt.io", "v1", "VirtualMachine");
    create(
        &vms,
        json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": { "name": "vm", "namespace": NAMESPACE },
            "spec": {
                "runStrategy": "Halted",
                "template": { "metadata": vmi_metadata, "spec": { "domain": { "devices": {} } } }
            }
        }),
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("v1.{minor}: VirtualMachine: {e}"));
    let data_volumes = dynamic_api(&client, "cdi.kubevirt.io", "v1beta1", "DataVolume");
    create(
        &data_volumes,
        json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": { "name": "dv", "namespace": NAMESPACE },
            "spec": {
                "source": { "blank": {} },
                "storage": { "resources": { "requests": { "storage": "1Gi" } } }
            }
        }),
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("v1.{minor}: DataVolume: {e}"));
}

#[tokio::test]
async fn tenantry_installs_and_serves_on_kubernetes_v1_35() {
    installs_and_serves_on(35).await;
}

#[tokio::test]
async fn tenantry_installs_and_serves_on_kubernetes_v1_36() {
    installs_and_serves_on(36).await;
}
