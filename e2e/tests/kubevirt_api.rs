//! Tenantry's KubeVirt kinds, served by a real kube-apiserver: CAPK's own
//! cluster templates apply unchanged, and bad input is refused at admission.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use tenantry_e2e::World;
use tenantry_e2e::clusterctl_template::{capk_templates, substitute, test_variables};
use tenantry_e2e::manifests::parse_documents;

const GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// A control plane with tenantry's CRDs, without kube-controller-manager.
async fn world() -> World {
    World::builder("harness")
        .without_controller_manager()
        .start()
        .await
}

fn api_for(
    client: &kube::Client,
    document: &serde_json::Value,
    namespace: &str,
) -> Api<DynamicObject> {
    let api_version = document["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').expect("group/version");
    let kind = document["kind"].as_str().expect("kind");
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = format!("{}s", kind.to_lowercase());
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

/// Creates the object by server-side apply with strict field validation: an
/// unknown field is an error, not silently pruned, so a field our schema
/// lacks cannot go unnoticed.
async fn create_strictly(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
) -> kube::Result<DynamicObject> {
    let name = object.metadata.name.as_deref().expect("object name");
    let params = PatchParams::apply("tenantry-e2e").validation_strict();
    api.patch(name, &params, &Patch::Apply(object)).await
}

#[tokio::test]
async fn every_capk_template_object_creates_against_tenantry_crds() {
    let world = world().await;
    let client = world.client();
    let files = capk_templates();
    let mut created = 0;
    for (index, file) in files.iter().enumerate() {
        // One cluster name per template, so objects of different templates
        // never collide.
        let cluster = format!("capk-{index}");
        let text = std::fs::read_to_string(file).expect("read template");
        let rendered = substitute(&text, &test_variables(&cluster, "default"))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for document in parse_documents(&rendered).expect("parse template") {
            let api_version = document["apiVersion"].as_str().unwrap_or_default();
            if !api_version.starts_with(&format!("{GROUP}/")) {
                continue;
            }
            let object: DynamicObject = serde_json::from_value(document.clone()).expect("object");
            create_strictly(&api_for(&client, &document, "default"), &object)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{}: {} {} refused: {e}",
                        file.file_name().unwrap().to_string_lossy(),
                        document["kind"],
                        document["metadata"]["name"]
                    )
                });
            created += 1;
        }
    }
    // 16 templates, each with a KubevirtCluster and one or two machine templates.
    assert!(
        created >= 40,
        "only {created} infrastructure objects found in the CAPK templates"
    );
}

#[tokio::test]
async fn talos_boot_disk_fields_are_validated_at_admission() {
    let world = world().await;
    let client = world.client();
    let machine = |name: &str, boot_disk: serde_json::Value| {
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachine",
            "metadata": { "name": name },
            "spec": {
                "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
                "bootDisk": boot_disk
            }
        })
    };
    let good = json!({
        "imageFactoryURL": "https://factory.talos.dev",
        "schematicID": "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
        "talosVersion": "v1.13.0",
        "diskSize": "20Gi"
    });
    let cases = [
        (
            "imageFactoryURL",
            "https://mirror.example/",
            "must not end with a slash",
        ),
        (
            "imageFactoryURL",
            "ftp://mirror.example",
            "http:// or https://",
        ),
        ("schematicID", "not-a-schematic", "64 lowercase hexadecimal"),
        ("talosVersion", "1.13", "must look like v1.13.0"),
        (
            "platformImage",
            "images/openstack-amd64.raw.xz",
            "without slashes",
        ),
    ];
    let document = machine("good", good.clone());
    let api = api_for(&client, &document, "default");
    let object: DynamicObject = serde_json::from_value(document).expect("object");
    create_strictly(&api, &object)
        .await
        .expect("valid bootDisk accepted");
    for (index, (field, value, expected)) in cases.into_iter().enumerate() {
        let mut boot_disk = good.clone();
        boot_disk[field] = json!(value);
        let object: DynamicObject =
            serde_json::from_value(machine(&format!("bad-{index}"), boot_disk)).expect("object");
        let error = create_strictly(&api, &object)
            .await
            .expect_err(&format!("{field}={value} must be refused"));
        let message = error.to_string();
        assert!(
            message.contains(&format!("spec.bootDisk.{field}")) && message.contains(expected),
            "{field}={value}: {message}"
        );
    }
}
