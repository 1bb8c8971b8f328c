//! How a tenant apiserver is reached from outside the management cluster,
//! as the platform exposes it: Kamaji's Service stays `ClusterIP`, and an
//! Ingress with SSL passthrough routes `host` (set on the object, or
//! `<cluster>.<tenant host>`) to it, so TLS ends at the tenant apiserver.
//! Its certificate then names the host, the Service's cluster DNS names and
//! its ClusterIP (what workers dial through their hosts entry).
//!
//! The tenant host and the ingress class come from the tenant namespace's
//! annotations, where the platform records them for every app of the
//! tenant; the class falls back to the manager's `--tenant-ingress-class`,
//! then to the cluster's default IngressClass.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::Api;
use serde_json::{Value, json};
use tenantry_api::tenant::{Kubernetes, cluster_name};

use crate::reconciler::ManagerConfig;

/// The tenant namespace's annotation naming the tenant's domain.
pub const NAMESPACE_HOST_ANNOTATION: &str = "namespace.cozystack.io/host";
/// The tenant namespace's annotation naming the tenant's ingress class.
pub const NAMESPACE_INGRESS_ANNOTATION: &str = "namespace.cozystack.io/ingress";
/// Asks ingress-nginx to pass TLS through to the backend.
pub const SSL_PASSTHROUGH_ANNOTATION: &str = "nginx.ingress.kubernetes.io/ssl-passthrough";
/// The port the ingress serves the host on.
pub const INGRESS_PORT: u16 = 443;

/// Where a tenant apiserver is published.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exposure {
    /// The external host name; no Ingress without one.
    pub host: Option<String>,
    /// The Ingress class; the cluster's default when `None`.
    pub ingress_class: Option<String>,
    /// The ClusterIP of the control plane's Service, once allocated.
    pub service_ip: Option<String>,
}

impl Exposure {
    /// Decides from the object, its namespace's annotations, the manager's
    /// default class and the Service's ClusterIP.
    pub fn decide(
        kubernetes: &Kubernetes,
        namespace_annotations: &BTreeMap<String, String>,
        default_ingress_class: Option<&str>,
        service_ip: Option<String>,
    ) -> Self {
        let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
        let annotation = |key: &str| {
            namespace_annotations
                .get(key)
                .map(|v| v.trim().trim_end_matches('.'))
                .filter(|v| !v.is_empty())
        };
        let host = match kubernetes.spec.host.as_deref().filter(|h| !h.is_empty()) {
            Some(host) => Some(host.to_string()),
            None => annotation(NAMESPACE_HOST_ANNOTATION)
                .map(|tenant_host| format!("{}.{tenant_host}", cluster_name(name))),
        };
        let ingress_class = annotation(NAMESPACE_INGRESS_ANNOTATION)
            .or(default_ingress_class.filter(|c| !c.is_empty()))
            .map(str::to_string);
        Self {
            host,
            ingress_class,
            service_ip: service_ip.filter(|ip| !ip.is_empty() && ip != "None"),
        }
    }

    /// `spec.network.ingress` of the KamajiControlPlane, with a host.
    pub fn network_ingress(&self) -> Option<Value> {
        let host = self.host.as_deref()?;
        let mut ingress = json!({
            "hostname": format!("{host}:{INGRESS_PORT}"),
            "extraAnnotations": { SSL_PASSTHROUGH_ANNOTATION: "true" },
        });
        if let Some(class) = &self.ingress_class {
            ingress["className"] = json!(class);
        }
        Some(ingress)
    }

    /// The SANs the apiserver certificate must carry besides its Service's
    /// DNS names: the host and the ClusterIP.
    pub fn extra_sans(&self) -> impl Iterator<Item = &str> {
        self.host.iter().chain(&self.service_ip).map(String::as_str)
    }
}

/// Reads what [`Exposure::decide`] needs from the cluster.
pub async fn observe(
    client: &kube::Client,
    config: &ManagerConfig,
    kubernetes: &Kubernetes,
) -> Result<Exposure, kube::Error> {
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let annotations = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await?
        .and_then(|n| n.metadata.annotations)
        .unwrap_or_default();
    let service_ip = Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(&cluster_name(name))
        .await?
        .and_then(|s| s.spec?.cluster_ip);
    Ok(Exposure::decide(
        kubernetes,
        &annotations,
        config.tenant_ingress_class.as_deref(),
        service_ip,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubernetes(spec: Value) -> Kubernetes {
        serde_json::from_value(json!({
            "apiVersion": "apps.tenantry.dev/v1alpha1",
            "kind": "Kubernetes",
            "metadata": { "name": "demo", "namespace": "tenant-a" },
            "spec": spec,
        }))
        .unwrap()
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_host_derives_from_the_tenant_domain() {
        let exposure = Exposure::decide(
            &kubernetes(json!({})),
            &annotations(&[
                (NAMESPACE_HOST_ANNOTATION, "a.example.org"),
                (NAMESPACE_INGRESS_ANNOTATION, "tenant-a"),
            ]),
            Some("nginx"),
            Some("10.96.0.17".into()),
        );
        assert_eq!(
            exposure.host.as_deref(),
            Some("kubernetes-demo.a.example.org")
        );
        assert_eq!(
            exposure.network_ingress().unwrap(),
            json!({
                "hostname": "kubernetes-demo.a.example.org:443",
                "className": "tenant-a",
                "extraAnnotations": { "nginx.ingress.kubernetes.io/ssl-passthrough": "true" },
            })
        );
        assert_eq!(
            exposure.extra_sans().collect::<Vec<_>>(),
            ["kubernetes-demo.a.example.org", "10.96.0.17"]
        );
    }

    #[test]
    fn a_host_on_the_object_wins_and_the_class_falls_back_to_the_managers() {
        let exposure = Exposure::decide(
            &kubernetes(json!({ "host": "k8s.example.com" })),
            &annotations(&[(NAMESPACE_HOST_ANNOTATION, "a.example.org")]),
            Some("nginx"),
            None,
        );
        assert_eq!(exposure.host.as_deref(), Some("k8s.example.com"));
        assert_eq!(exposure.ingress_class.as_deref(), Some("nginx"));
        assert_eq!(
            exposure.extra_sans().collect::<Vec<_>>(),
            ["k8s.example.com"]
        );
    }

    #[test]
    fn without_a_host_nothing_is_published() {
        let exposure = Exposure::decide(
            &kubernetes(json!({})),
            &BTreeMap::new(),
            None,
            Some("None".into()),
        );
        assert_eq!(exposure, Exposure::default());
        assert_eq!(exposure.network_ingress(), None);
    }

    #[test]
    fn without_any_class_the_default_class_serves() {
        let exposure = Exposure::decide(
            &kubernetes(json!({ "host": "k8s.example.com" })),
            &BTreeMap::new(),
            None,
            None,
        );
        assert!(
            exposure
                .network_ingress()
                .unwrap()
                .get("className")
                .is_none()
        );
    }
}
