use std::collections::BTreeSet;

use super::rbac::{manager_role, own_resources};
use super::*;

fn kinds(documents: &[Value]) -> Vec<&str> {
    documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default())
        .collect()
}

#[test]
fn components_have_exactly_one_namespace_and_everything_namespaced_is_in_it() {
    let documents = infrastructure_components();
    assert_eq!(
        kinds(&documents)
            .iter()
            .filter(|k| **k == "Namespace")
            .count(),
        1
    );
    for document in &documents {
        if let Some(namespace) = document["metadata"]["namespace"].as_str() {
            assert_eq!(namespace, NAMESPACE, "{}", document["metadata"]["name"]);
        }
    }
}

#[test]
fn components_carry_no_secret() {
    // Credentials live in per-tenant Secrets, never in release manifests.
    assert!(!kinds(&infrastructure_components()).contains(&"Secret"));
}

#[test]
fn every_component_carries_the_provider_label() {
    for document in infrastructure_components() {
        assert_eq!(
            document["metadata"]["labels"]["cluster.x-k8s.io/provider"], PROVIDER_LABEL,
            "{} {}",
            document["kind"], document["metadata"]["name"]
        );
    }
}

#[test]
fn every_variable_has_a_default_and_every_declared_variable_is_used() {
    let yaml = infrastructure_components_yaml();
    let used: BTreeSet<&str> = yaml
        .match_indices("${")
        .map(|(start, _)| {
            let rest = &yaml[start + 2..];
            let end = rest.find('}').expect("closed variable");
            &rest[..end]
        })
        .collect();
    for expression in &used {
        assert!(expression.contains(":="), "{expression} has no default");
    }
    for v in VARIABLES {
        assert!(
            used.iter().any(|e| e.starts_with(&format!("{}:=", v.name))),
            "{} unused",
            v.name
        );
    }
}

#[test]
fn manager_may_write_status_and_finalizers_of_every_own_kind() {
    let role = manager_role();
    let rules = role["rules"].as_array().expect("rules");
    for plural in own_resources() {
        for (resource, verb) in [
            (plural.clone(), "patch"),
            (format!("{plural}/status"), "patch"),
            (format!("{plural}/finalizers"), "update"),
        ] {
            assert!(
                rules.iter().any(|r| {
                    r["resources"]
                        .as_array()
                        .unwrap()
                        .contains(&json!(resource))
                        && r["verbs"].as_array().unwrap().contains(&json!(verb))
                }),
                "no {verb} on {resource}"
            );
        }
    }
}

#[test]
fn webhooks_reach_the_service_and_take_their_ca_from_the_certificate() {
    for configuration in [
        validating_webhook_configuration(),
        mutating_webhook_configuration(),
    ] {
        assert_eq!(
            configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "tenantry-system/tenantry-serving-cert"
        );
        for webhook in configuration["webhooks"].as_array().expect("webhooks") {
            let service = &webhook["clientConfig"]["service"];
            assert_eq!(service["name"], WEBHOOK_SERVICE);
            assert_eq!(service["namespace"], NAMESPACE);
            assert!(webhook["clientConfig"]["url"].is_null());
            assert_eq!(webhook["failurePolicy"], "Fail");
        }
    }
}

#[test]
fn the_manager_runs_hardened_with_bounded_resources() {
    let deployment = deployment(DEFAULT_IMAGE);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][kind][resource].is_string(),
                "no {kind}.{resource}"
            );
        }
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
}

#[test]
fn the_image_factory_default_is_a_clusterctl_variable_passed_as_a_flag() {
    let deployment = deployment(DEFAULT_IMAGE);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(container["args"].as_array().expect("args").contains(&json!(
        "--talos-image-factory-url=$(TENANTRY_TALOS_IMAGE_FACTORY_URL)"
    )));
    assert!(container["env"].as_array().expect("env").contains(&json!({
        "name": "TENANTRY_TALOS_IMAGE_FACTORY_URL",
        "value": "${TALOS_IMAGE_FACTORY_URL:=https://factory.talos.dev}",
    })));
}

#[test]
fn metadata_declares_the_contract_clusterctl_1_10_and_1_14_both_accept() {
    let metadata: Value =
        serde_norway::from_str(metadata_yaml().trim_start_matches("---\n")).expect("metadata YAML");
    assert_eq!(
        metadata["apiVersion"],
        "clusterctl.cluster.x-k8s.io/v1alpha3"
    );
    assert_eq!(metadata["releaseSeries"][0]["contract"], "v1beta1");
}
