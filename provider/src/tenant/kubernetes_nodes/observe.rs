//! What a pool reconcile reads from the tenant cluster's management side:
//! the trust its workers need to join.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use tenantry_api::tenant::{Kubernetes, cluster_name};

use crate::tenant::kubernetes::act::secret_value;
use crate::tenant::kubernetes::render;
use crate::tenant::pki;

use super::reconcile::{Error, POLL};

/// What a worker config needs from the management namespace, or why it is
/// not there yet.
pub(super) struct Trust {
    pub(super) secrets: BTreeMap<String, String>,
    pub(super) talos_ca: String,
    pub(super) kubernetes_ca: String,
    pub(super) service_ip: Option<String>,
}

pub(super) async fn read_trust(
    client: &kube::Client,
    kubernetes: &Kubernetes,
) -> Result<Trust, Error> {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let waiting = |what: String| Error::Waiting(what, POLL);
    let talos_secrets = secrets
        .get_opt(&render::talos_secrets_name(name))
        .await?
        .ok_or_else(|| {
            waiting(format!(
                "Secret {} is not there yet",
                render::talos_secrets_name(name)
            ))
        })?;
    let talos_ca = secrets
        .get_opt(&render::talos_ca_name(name))
        .await?
        .and_then(|s| secret_value(&s, pki::TLS_CERT_KEY))
        .ok_or_else(|| {
            waiting(format!(
                "Secret {} is not there yet",
                render::talos_ca_name(name)
            ))
        })?;
    // Kamaji writes the cluster CA as CAPI's `<cluster>-ca` once the
    // control plane runs.
    let ca_name = format!("{}-ca", cluster_name(name));
    let kubernetes_ca = secrets
        .get_opt(&ca_name)
        .await?
        .and_then(|s| secret_value(&s, pki::TLS_CERT_KEY))
        .ok_or_else(|| {
            waiting(format!(
                "the control plane's CA (Secret {ca_name}) is not there yet"
            ))
        })?;
    let service_ip = Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(&cluster_name(name))
        .await?
        .and_then(|s| s.spec?.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None");
    let secrets = talos_secrets
        .data
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| Some((k, String::from_utf8(v.0).ok()?)))
        .collect();
    Ok(Trust {
        secrets,
        talos_ca,
        kubernetes_ca,
        service_ip,
    })
}
