//! How the Kamaji simulator exposes a tenant apiserver outside the
//! management cluster, from the KamajiControlPlane's `spec.network`, as
//! Kamaji and its Cluster API provider do:
//!
//! - **Certificate SANs.** The apiserver's serving certificate carries
//!   `network.certSANs` (DNS names and IP addresses) and the ingress
//!   hostname without its port (the provider appends it to the TCP's
//!   `networkProfile.certSANs`), besides the Service names Kamaji always
//!   adds. When they change, Kamaji re-issues the certificate and rolls the
//!   apiserver pods without downtime; the simulator rewrites the tenant
//!   apiserver's certificate files, which kube-apiserver reloads while it
//!   serves.
//! - **The Ingress.** `network.ingress {className, hostname, extraLabels,
//!   extraAnnotations}` becomes an Ingress named after the TCP in its
//!   namespace, routing the hostname (port stripped) to the TCP Service's
//!   apiserver port; Cozystack asks ingress-nginx for SSL passthrough in
//!   `extraAnnotations`, so TLS ends at the tenant apiserver.
//! - **The endpoint.** With an ingress hostname, `spec.controlPlaneEndpoint`
//!   is that host and its port (443 when the hostname names none), and the
//!   public admin kubeconfigs (`admin.conf`, `super-admin.conf`) name it.
//!
//! Left out: `network.gateway` (Gateway API), `loadBalancerConfig`, and the
//! certificate rotation Kamaji does on its own schedule. As in Kamaji
//! (clastix/kamaji#734), the kubeconfigs keep the hostname the tenant
//! started with.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::control_plane::KamajiApi;

/// The port of an ingress hostname that names none (HTTPS).
pub const INGRESS_PORT: u16 = 443;

/// `spec.network.ingress` of a KamajiControlPlane, when set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressSpec {
    pub class_name: Option<String>,
    /// The host, without the port.
    pub host: String,
    pub port: u16,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl IngressSpec {
    /// Reads `spec.network.ingress` (`None` without a hostname).
    pub fn of(kcp: &Value) -> Option<Self> {
        let ingress = &kcp["spec"]["network"]["ingress"];
        let hostname = ingress["hostname"].as_str().filter(|h| !h.is_empty())?;
        let (host, port) = match hostname.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (hostname, INGRESS_PORT),
        };
        let strings = |value: &Value| -> BTreeMap<String, String> {
            value
                .as_object()
                .map(|map| {
                    map.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default()
        };
        Some(Self {
            class_name: ingress["className"]
                .as_str()
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            host: host.to_string(),
            port,
            labels: strings(&ingress["extraLabels"]),
            annotations: strings(&ingress["extraAnnotations"]),
        })
    }

    /// The public URL the admin kubeconfigs name.
    pub fn server(&self) -> String {
        format!("https://{}:{}", self.host, self.port)
    }
}

/// The SANs a tenant's serving certificate carries besides the Service
/// names: `network.certSANs`, then the ingress host, each once, in order.
pub fn cert_sans(kcp: &Value) -> Vec<String> {
    let mut sans: Vec<String> = Vec::new();
    let listed = kcp["spec"]["network"]["certSANs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string);
    for san in listed.chain(IngressSpec::of(kcp).map(|i| i.host)) {
        if !san.is_empty() && !sans.contains(&san) {
            sans.push(san);
        }
    }
    sans
}

/// The Ingress Kamaji writes for a TCP (`<kcp>` in its namespace), owned by
/// the KamajiControlPlane standing in for the TCP.
pub fn desired_ingress(
    kcp: &DynamicObject,
    ingress: &IngressSpec,
    service_port: u16,
    api: KamajiApi,
) -> Value {
    let name = kcp.metadata.name.clone().unwrap_or_default();
    let namespace = kcp.metadata.namespace.clone().unwrap_or_default();
    let mut labels = ingress.labels.clone();
    labels.insert("kamaji.clastix.io/name".into(), name.clone());
    labels.insert("kamaji.clastix.io/component".into(), "ingress".into());
    let mut spec = json!({
        "rules": [{
            "host": ingress.host,
            "http": { "paths": [{
                "path": "/",
                "pathType": "Prefix",
                "backend": { "service": { "name": name, "port": { "number": service_port } } },
            }]},
        }],
    });
    if let Some(class) = &ingress.class_name {
        spec["ingressClassName"] = json!(class);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": ingress.annotations,
            "ownerReferences": [{
                "apiVersion": api.api_version(),
                "kind": super::control_plane::KAMAJI_CONTROL_PLANE_KIND,
                "name": name,
                "uid": kcp.metadata.uid,
            }],
        },
        "spec": spec,
    })
}

/// Applies the TCP's Ingress, or deletes it when `spec.network.ingress` is
/// gone.
pub async fn reconcile_ingress(
    client: &kube::Client,
    api: KamajiApi,
    kcp: &DynamicObject,
    service_port: u16,
    field_manager: &str,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let namespace = kcp.metadata.namespace.clone().unwrap_or_default();
    let name = kcp.metadata.name.clone().unwrap_or_default();
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let Some(ingress) = IngressSpec::of(&serde_json::to_value(kcp)?) else {
        return match ingresses.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error).with_context(|| format!("delete Ingress {namespace}/{name}")),
        };
    };
    let desired = desired_ingress(kcp, &ingress, service_port, api);
    if let Some(current) = ingresses.get_opt(&name).await? {
        let current = serde_json::to_value(&current)?;
        if current["spec"] == desired["spec"]
            && current["metadata"]["annotations"] == desired["metadata"]["annotations"]
        {
            return Ok(());
        }
    }
    ingresses
        .patch(
            &name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&desired),
        )
        .await
        .with_context(|| format!("apply Ingress {namespace}/{name}"))?;
    tracing::info!(%namespace, kcp = %name, host = %ingress.host, "tenant control plane Ingress applied");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kcp(network: Value) -> Value {
        json!({ "spec": { "network": network } })
    }

    #[test]
    fn an_ingress_hostname_without_port_means_443() {
        let spec = IngressSpec::of(&kcp(json!({
            "ingress": { "hostname": "kubernetes-demo.tenant-a.example.org", "className": "tenant-a" }
        })))
        .unwrap();
        assert_eq!(spec.host, "kubernetes-demo.tenant-a.example.org");
        assert_eq!(spec.port, 443);
        assert_eq!(spec.class_name.as_deref(), Some("tenant-a"));
        assert_eq!(
            spec.server(),
            "https://kubernetes-demo.tenant-a.example.org:443"
        );
    }

    #[test]
    fn the_platforms_hostname_with_its_port_is_split() {
        let spec = IngressSpec::of(&kcp(json!({
            "ingress": {
                "hostname": "k8s.example.org:443",
                "extraAnnotations": { "nginx.ingress.kubernetes.io/ssl-passthrough": "true" },
            }
        })))
        .unwrap();
        assert_eq!((spec.host.as_str(), spec.port), ("k8s.example.org", 443));
        assert_eq!(spec.class_name, None);
        assert_eq!(
            spec.annotations["nginx.ingress.kubernetes.io/ssl-passthrough"],
            "true"
        );
    }

    #[test]
    fn no_hostname_no_ingress() {
        assert_eq!(
            IngressSpec::of(&kcp(json!({ "serviceType": "ClusterIP" }))),
            None
        );
        assert_eq!(
            IngressSpec::of(&kcp(json!({ "ingress": { "hostname": "" } }))),
            None
        );
    }

    #[test]
    fn sans_are_the_listed_ones_then_the_ingress_host_once() {
        let sans = cert_sans(&kcp(json!({
            "certSANs": ["kubernetes-demo.tenant-a.svc", "10.96.0.17", "k8s.example.org"],
            "ingress": { "hostname": "k8s.example.org:443" },
        })));
        assert_eq!(
            sans,
            [
                "kubernetes-demo.tenant-a.svc",
                "10.96.0.17",
                "k8s.example.org"
            ]
        );
        let sans = cert_sans(&kcp(
            json!({ "ingress": { "hostname": "k8s.example.org" } }),
        ));
        assert_eq!(sans, ["k8s.example.org"]);
    }
}
