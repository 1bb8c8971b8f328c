//! The infrastructure cluster: where the virtual machines run. By default the
//! management cluster itself; with `infraClusterSecretRef`, another cluster
//! reached through the kubeconfig in that Secret (key `kubeconfig`, optional
//! key `namespace`), as CAPK does.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where a machine's VM lives.
#[derive(Clone)]
pub struct InfraCluster {
    /// A client for the infrastructure cluster.
    pub client: kube::Client,
    /// The namespace the VMs of this machine run in.
    pub namespace: String,
    /// Whether this is another cluster than the management cluster (then
    /// owner references cannot point from VMs to the KubevirtMachine, and no
    /// watch triggers reconciles: status is polled).
    pub external: bool,
}

/// Why the infrastructure cluster cannot be reached. Each needs a human.
#[derive(Debug, thiserror::Error)]
pub enum InfraClusterError {
    #[error("infraClusterSecretRef names Secret {namespace}/{name}, which does not exist")]
    SecretMissing { namespace: String, name: String },
    #[error("Secret {namespace}/{name} named by infraClusterSecretRef has no 'kubeconfig' key")]
    KubeconfigMissing { namespace: String, name: String },
    #[error("the kubeconfig in Secret {namespace}/{name} is not usable: {reason}")]
    KubeconfigInvalid {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("reading infraClusterSecretRef: {0}")]
    Kube(#[from] kube::Error),
}

/// A client built from one version of a kubeconfig Secret, and the namespace
/// of that kubeconfig's current context.
struct CachedClient {
    resource_version: String,
    client: kube::Client,
    context_namespace: Option<String>,
}

/// Caches clients per kubeconfig Secret version: building one parses the
/// kubeconfig and sets up TLS, which every reconcile need not repeat.
#[derive(Default)]
pub struct InfraClients {
    /// Keyed by the Secret's namespace and name.
    clients: Mutex<HashMap<(String, String), CachedClient>>,
}

impl InfraClients {
    /// Resolves the infrastructure cluster for an object in `namespace`.
    /// `vm_namespace` is the namespace the user asked for in the VM template.
    pub async fn resolve(
        &self,
        management: &kube::Client,
        namespace: &str,
        secret_ref: Option<&ObjectReference>,
        vm_namespace: Option<&str>,
    ) -> Result<InfraCluster, InfraClusterError> {
        let Some(secret_ref) =
            secret_ref.filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
        else {
            return Ok(InfraCluster {
                client: management.clone(),
                namespace: vm_namespace.unwrap_or(namespace).to_string(),
                external: false,
            });
        };
        let secret_namespace = secret_ref
            .namespace
            .clone()
            .unwrap_or_else(|| namespace.to_string());
        let secret_name = secret_ref.name.clone().unwrap_or_default();
        let key = (secret_namespace.clone(), secret_name.clone());
        let secret = Api::<Secret>::namespaced(management.clone(), &secret_namespace)
            .get_opt(&secret_name)
            .await?
            .ok_or_else(|| InfraClusterError::SecretMissing {
                namespace: secret_namespace.clone(),
                name: secret_name.clone(),
            })?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let data = secret.data.unwrap_or_default();
        let namespace_override = data
            .get("namespace")
            .map(|n| String::from_utf8_lossy(&n.0).trim().to_string())
            .filter(|n| !n.is_empty());

        let cached = self
            .clients
            .lock()
            .expect("infra clients lock")
            .get(&key)
            .filter(|cached| cached.resource_version == version)
            .map(|cached| (cached.client.clone(), cached.context_namespace.clone()));
        let (client, context_namespace) = match cached {
            Some(found) => found,
            None => {
                let invalid = |reason: String| InfraClusterError::KubeconfigInvalid {
                    namespace: secret_namespace.clone(),
                    name: secret_name.clone(),
                    reason,
                };
                let kubeconfig =
                    data.get("kubeconfig")
                        .ok_or_else(|| InfraClusterError::KubeconfigMissing {
                            namespace: secret_namespace.clone(),
                            name: secret_name.clone(),
                        })?;
                let kubeconfig = Kubeconfig::from_yaml(&String::from_utf8_lossy(&kubeconfig.0))
                    .map_err(|e| invalid(e.to_string()))?;
                let context_namespace = context_namespace(&kubeconfig);
                let config =
                    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                        .await
                        .map_err(|e| invalid(e.to_string()))?;
                let client = kube::Client::try_from(config).map_err(|e| invalid(e.to_string()))?;
                self.clients.lock().expect("infra clients lock").insert(
                    key,
                    CachedClient {
                        resource_version: version,
                        client: client.clone(),
                        context_namespace: context_namespace.clone(),
                    },
                );
                (client, context_namespace)
            }
        };
        // The VM template's namespace wins, then the Secret's `namespace`
        // key, then the kubeconfig context's, then the object's own.
        let vm_namespace = vm_namespace
            .map(str::to_string)
            .or(namespace_override)
            .or(context_namespace)
            .unwrap_or_else(|| namespace.to_string());
        Ok(InfraCluster {
            client,
            namespace: vm_namespace,
            external: true,
        })
    }
}

fn context_namespace(kubeconfig: &Kubeconfig) -> Option<String> {
    let current = kubeconfig.current_context.as_deref()?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == current)?
        .context
        .as_ref()?
        .namespace
        .clone()
}
