//! Pure decisions for a KubevirtCluster: whether it is ours, the
//! control-plane Service, and the endpoint.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use kube::api::ObjectMeta;
use tenantry_api::contract::{ApiEndpoint, CLUSTER_NAME_LABEL, MANAGED_BY_ANNOTATION};
use tenantry_api::kubevirt::KubevirtCluster;

use super::{API_SERVER_PORT, KUBEVIRT_CLUSTER_LABEL, service_name};
use crate::kubevirt::render::ROLE_LABEL;

/// Externally managed clusters (e.g. by Kamaji's control plane provider)
/// are never reconciled as ours.
pub fn is_externally_managed(object: &KubevirtCluster) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MANAGED_BY_ANNOTATION))
}

/// The control-plane Service `<cluster>-lb` in the infrastructure cluster:
/// the template's type, labels and annotations, selecting the cluster's
/// control-plane VMs on the API server port; owned by the KubevirtCluster
/// unless it lives in an external infrastructure cluster.
pub fn control_plane_service(
    object: &KubevirtCluster,
    cluster_name: &str,
    infra_namespace: &str,
    infra_external: bool,
) -> Service {
    let template = object.spec.control_plane_service_template.as_ref();
    let name = object.metadata.name.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(CLUSTER_NAME_LABEL.into(), cluster_name.to_string());
    labels.insert(KUBEVIRT_CLUSTER_LABEL.into(), name);
    let service_type = template
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.type_.clone())
        .unwrap_or_else(|| "ClusterIP".into());
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(cluster_name)),
            namespace: Some(infra_namespace.to_string()),
            labels: Some(labels),
            annotations: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.annotations.clone()),
            owner_references: (!infra_external)
                .then(|| object.controller_owner_ref(&()).into_iter().collect()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(service_type),
            selector: Some(BTreeMap::from([
                (ROLE_LABEL.to_string(), "control-plane".to_string()),
                (CLUSTER_NAME_LABEL.to_string(), cluster_name.to_string()),
            ])),
            ports: Some(vec![ServicePort {
                port: API_SERVER_PORT,
                target_port: Some(IntOrString::Int(API_SERVER_PORT)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The endpoint: a user-set one wins; else the LoadBalancer's address, or the
/// Service's cluster IP for ClusterIP and NodePort (as CAPK does).
pub fn endpoint_from(user: Option<&ApiEndpoint>, service: Option<&Service>) -> Option<ApiEndpoint> {
    if let Some(user) = user.filter(|e| !e.host.is_empty()) {
        return Some(ApiEndpoint {
            host: user.host.clone(),
            port: if user.port == 0 {
                API_SERVER_PORT
            } else {
                user.port
            },
        });
    }
    let service = service?;
    let spec = service.spec.as_ref()?;
    let host = if spec.type_.as_deref() == Some("LoadBalancer") {
        let ingress = service
            .status
            .as_ref()?
            .load_balancer
            .as_ref()?
            .ingress
            .as_ref()?
            .first()?;
        ingress.ip.clone().or_else(|| ingress.hostname.clone())?
    } else {
        spec.cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None")?
    };
    Some(ApiEndpoint {
        host,
        port: API_SERVER_PORT,
    })
}
