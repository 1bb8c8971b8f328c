use super::*;
use crate::kubevirt::render::ROLE_LABEL;
use k8s_openapi::api::core::v1::ServiceSpec;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
use tenantry_api::contract::{ApiEndpoint, CLUSTER_NAME_LABEL};

fn service(type_: &str, cluster_ip: &str, ingress: Option<&str>) -> Service {
    Service {
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            cluster_ip: Some(cluster_ip.into()),
            ..Default::default()
        }),
        status: ingress.map(|ip| ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(ip.into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn user_endpoint_wins() {
    let user = ApiEndpoint {
        host: "api.example".into(),
        port: 443,
    };
    let found =
        endpoint_from(Some(&user), Some(&service("ClusterIP", "10.96.0.10", None))).unwrap();
    assert_eq!(found, user);
}

#[test]
fn cluster_ip_and_load_balancer_addresses() {
    let ip = endpoint_from(None, Some(&service("ClusterIP", "10.96.0.10", None))).unwrap();
    assert_eq!((ip.host.as_str(), ip.port), ("10.96.0.10", 6443));
    assert!(
        endpoint_from(None, Some(&service("LoadBalancer", "10.96.0.10", None))).is_none(),
        "no ingress yet"
    );
    let lb = endpoint_from(
        None,
        Some(&service("LoadBalancer", "10.96.0.10", Some("192.0.2.7"))),
    )
    .unwrap();
    assert_eq!(lb.host, "192.0.2.7");
}

fn kubevirt_cluster(template: serde_json::Value) -> KubevirtCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "KubevirtCluster",
        "metadata": { "name": "demo", "namespace": "tenant", "uid": "u-1" },
        "spec": { "controlPlaneServiceTemplate": template },
    }))
    .unwrap()
}

#[test]
fn the_control_plane_service_follows_the_template_and_owner_rules() {
    // (template, infrastructure cluster external, type, owned, annotation)
    let cases = [
        (serde_json::json!({}), false, "ClusterIP", true, None),
        (
            serde_json::json!({ "spec": { "type": "LoadBalancer" }, "metadata": { "annotations": { "lb": "internal" } } }),
            false,
            "LoadBalancer",
            true,
            Some("internal"),
        ),
        (
            serde_json::json!({ "spec": { "type": "NodePort" } }),
            true,
            "NodePort",
            false,
            None,
        ),
    ];
    for (template, external, type_, owned, annotation) in cases {
        let service = decide::control_plane_service(
            &kubevirt_cluster(template.clone()),
            "demo",
            "infra-ns",
            external,
        );
        let spec = service.spec.as_ref().unwrap();
        assert_eq!(spec.type_.as_deref(), Some(type_), "{template}");
        assert_eq!(service.metadata.name.as_deref(), Some("demo-lb"));
        assert_eq!(service.metadata.namespace.as_deref(), Some("infra-ns"));
        assert_eq!(
            service
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| !o.is_empty()),
            owned,
            "{template}, external {external}"
        );
        assert_eq!(
            service
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("lb"))
                .map(String::as_str),
            annotation
        );
        let selector = spec.selector.as_ref().unwrap();
        assert_eq!(selector[ROLE_LABEL], "control-plane");
        assert_eq!(selector[CLUSTER_NAME_LABEL], "demo");
        let labels = service.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[KUBEVIRT_CLUSTER_LABEL], "demo");
        assert_eq!(spec.ports.as_ref().unwrap()[0].port, API_SERVER_PORT);
    }
}
