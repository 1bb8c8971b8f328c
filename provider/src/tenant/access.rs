//! Reaching a tenant cluster's apiserver from the management cluster, with
//! the super-admin kubeconfig Kamaji writes into `<cluster>-admin-kubeconfig`
//! (the `super-admin.svc` key by default: the control plane's Service, as the
//! platform's other management-side consumers use it). The kubeconfig is
//! read from the Secret each time, so a rotated certificate is picked up,
//! and never logged.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tenantry_api::tenant::admin_kubeconfig_secret_name;

use crate::reconciler::ManagerConfig;

/// The admin kubeconfig key used when the manager is not told otherwise.
pub const DEFAULT_TENANT_KUBECONFIG_KEY: &str = "super-admin.svc";

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret or its key is not there yet (Kamaji writes it once the
    /// control plane runs).
    #[error("Secret {secret} has no key {key} yet")]
    Missing { secret: String, key: String },
    /// The kubeconfig is there but cannot be used. The message never
    /// carries its content.
    #[error("the kubeconfig in Secret {secret} (key {key}) cannot be used: {reason}")]
    Invalid {
        secret: String,
        key: String,
        reason: String,
    },
}

/// A client of the tenant cluster of the `Kubernetes` object `name`.
pub async fn tenant_client(
    client: &kube::Client,
    config: &ManagerConfig,
    namespace: &str,
    name: &str,
) -> Result<kube::Client, AccessError> {
    let key = config
        .tenant_kubeconfig_key
        .as_deref()
        .unwrap_or(DEFAULT_TENANT_KUBECONFIG_KEY);
    let secret_name = admin_kubeconfig_secret_name(name);
    let missing = || AccessError::Missing {
        secret: format!("{namespace}/{secret_name}"),
        key: key.to_string(),
    };
    let invalid = |reason: String| AccessError::Invalid {
        secret: format!("{namespace}/{secret_name}"),
        key: key.to_string(),
        reason,
    };
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&secret_name)
        .await?
        .ok_or_else(missing)?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(missing)?;
    let text = std::str::from_utf8(&bytes.0).map_err(|_| invalid("not UTF-8".into()))?;
    // Parse errors of serde_yaml may quote the input: keep only the kind.
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|_| invalid("not a kubeconfig".into()))?;
    let tenant_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|_| invalid("its cluster, user or context is incomplete".into()))?;
    kube::Client::try_from(tenant_config).map_err(|e| invalid(format!("no client: {e}")))
}
