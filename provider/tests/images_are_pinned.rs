//! Every image tenantry renders names a release: the manager image of the
//! components (as committed and as `hack/release.sh` pins it by digest),
//! the cluster templates, and what a default `Kubernetes` object becomes
//! (Kamaji control plane with its talos-csr-signer sidecar, etcd, the
//! Proxmox CSI controller and CCM). No `latest`, no missing tag, no
//! all-zero placeholder digest (`tenantry_api::image_reference`).

use std::path::Path;

use serde_json::{Value, json};
use tenantry_api::image_reference::{check_image_reference, images_in};
use tenantry_api::tenant::{Kubernetes, KubernetesSpec};
use tenantry_provider::components;
use tenantry_provider::tenant::kubernetes::{proxmox_controllers, render};

/// `${VAR:=default}` is what clusterctl substitutes; the default is what
/// runs when the variable is not set.
fn effective(reference: &str) -> &str {
    reference
        .strip_prefix("${")
        .and_then(|r| r.strip_suffix('}'))
        .and_then(|r| r.split_once(":="))
        .map_or(reference, |(_, default)| default)
}

fn check_all(source: &str, documents: &[Value]) -> usize {
    let mut checked = 0;
    for document in documents {
        for (path, reference) in images_in(document) {
            let reference = effective(&reference);
            if let Err(error) = check_image_reference(reference) {
                panic!("{source}: {} {path}: {error}", document["kind"]);
            }
            checked += 1;
        }
    }
    checked
}

fn yaml_documents(text: &str) -> Vec<Value> {
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document).expect("YAML document");
        if !value.is_null() {
            documents.push(value);
        }
    }
    documents
}

#[test]
fn the_components_name_the_manager_image_by_release() {
    let committed = yaml_documents(&components::infrastructure_components_yaml());
    assert_eq!(check_all("infrastructure-components.yaml", &committed), 1);
    let digest = "sha256:85b41e16e5e40398b1272fe0a69de72e205532c8034d0e6a9fc4a1d510f17818";
    let pinned = format!("{}@{digest}", components::DEFAULT_IMAGE);
    let released = yaml_documents(&components::infrastructure_components_yaml_for(&pinned));
    assert_eq!(check_all("release components", &released), 1);
    let images: Vec<String> = released
        .iter()
        .flat_map(images_in)
        .map(|(_, i)| i)
        .collect();
    assert_eq!(images, [format!("${{TENANTRY_IMAGE:={pinned}}}")]);
}

#[test]
fn the_cluster_templates_name_images_by_release() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/templates");
    for entry in std::fs::read_dir(&dir).expect("config/templates") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("template");
        check_all(&path.display().to_string(), &yaml_documents(&text));
    }
}

fn kubernetes(spec: Value) -> Kubernetes {
    let mut kubernetes = Kubernetes::new(
        "demo",
        serde_json::from_value::<KubernetesSpec>(spec).expect("spec"),
    );
    kubernetes.metadata.namespace = Some("tenant-a".into());
    kubernetes
}

#[test]
fn a_default_tenant_runs_only_released_images() {
    let kubevirt = kubernetes(json!({}));
    let proxmox = kubernetes(json!({
        "substrate": "proxmox",
        "proxmox": {
            "ipv4Config": { "addresses": ["10.0.0.10-10.0.0.20"], "prefix": 24, "gateway": "10.0.0.1" },
            "dnsServers": ["10.0.0.1"],
            "csi": { "storageClasses": [{ "name": "local", "storage": "local-lvm" }] },
        },
    }));
    let documents = vec![
        render::kamaji_control_plane(&kubevirt, "tenant-a", &Default::default()),
        render::etcd_cluster("tenant-a"),
        render::data_store("tenant-a"),
        render::kamaji_control_plane(&proxmox, "tenant-a", &Default::default()),
        proxmox_controllers::deployment(&proxmox, proxmox_controllers::ProxmoxController::Csi),
        proxmox_controllers::deployment(&proxmox, proxmox_controllers::ProxmoxController::Ccm),
    ];
    let checked = check_all("tenant", &documents);
    // The signer sidecar (twice) and the CSI and CCM containers.
    assert!(checked >= 6, "only {checked} images found");
    let signer: Vec<String> = images_in(&documents[0])
        .into_iter()
        .map(|(_, i)| i)
        .collect();
    assert_eq!(signer, [render::DEFAULT_TALOS_CSR_SIGNER_IMAGE]);
}
