//! Where a ProxmoxCluster's PVE API client comes from: the credentials
//! Secret in the cluster's own namespace (or, without `credentialsRef`, the
//! manager's environment), turned into a [`ProxmoxClient`] and kept while
//! the Secret does not change.
//!
//! The Secret's values never leave this module except inside the client:
//! errors name keys, never values.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tenantry_api::proxmox::{CredentialsRefError, ProxmoxCluster};

use super::client::{
    ApiUrl, ClientConfig, ConfigError, Credentials, ProxmoxClient, TaskWaitConfig, TlsVerification,
};

/// Key of the API URL (`https://pve.example:8006`).
pub const URL_KEY: &str = "url";
/// Keys of the token id, tenantry's (the Proxmox CSI/CCM spelling) first.
pub const TOKEN_ID_KEYS: [&str; 2] = ["token_id", "token"];
/// Keys of the token secret.
pub const TOKEN_SECRET_KEYS: [&str; 2] = ["token_secret", "secret"];
/// Keys of the hypervisor's CA certificate (PEM).
pub const CA_KEYS: [&str; 2] = ["root_ca", "ca.crt"];
/// Key turning certificate verification off (`"true"`).
pub const INSECURE_KEY: &str = "insecure";

/// Environment variables holding the manager's own credentials, used by
/// ProxmoxClusters without `credentialsRef` (capmox's names).
const ENV_URL: &str = "PROXMOX_URL";
const ENV_TOKEN: &str = "PROXMOX_TOKEN";
const ENV_SECRET: &str = "PROXMOX_SECRET";
const ENV_INSECURE: &str = "PROXMOX_INSECURE";
const ENV_ROOT_CA: &str = "PROXMOX_ROOT_CA";

/// Why no client could be built. Messages name the Secret and its keys,
/// never their values.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{0}")]
    Reference(#[from] CredentialsRefError),
    #[error("credentials Secret {namespace}/{name} does not exist")]
    SecretNotFound { namespace: String, name: String },
    #[error("credentials Secret {source_name} has no '{key}' key")]
    KeyMissing { source_name: String, key: String },
    #[error("credentials Secret {source_name}: key '{key}' is not UTF-8 text")]
    NotText { source_name: String, key: String },
    #[error("credentials Secret {source_name}: {error}")]
    Invalid {
        source_name: String,
        #[source]
        error: ConfigError,
    },
    #[error(
        "the ProxmoxCluster has no spec.credentialsRef and the manager has no {ENV_URL}/{ENV_TOKEN}/{ENV_SECRET}"
    )]
    NoCredentials,
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl CredentialsError {
    /// Only API trouble passes by itself; everything else needs someone to
    /// fix the Secret or the reference.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Kube(_))
    }

    /// CamelCase reason for conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Reference(_) => "CredentialsRefInvalid",
            Self::SecretNotFound { .. } => "CredentialsSecretNotFound",
            Self::KeyMissing { .. } | Self::NotText { .. } | Self::NoCredentials => {
                "CredentialsInvalid"
            }
            Self::Invalid { error, .. } => error.reason(),
            Self::Kube(_) => "CredentialsUnreadable",
        }
    }
}

/// A client configuration from the keys of a credentials Secret (or the
/// environment), named `source_name` in errors.
pub fn client_config(
    source_name: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<ClientConfig, CredentialsError> {
    let text = |key: &str| -> Result<Option<String>, CredentialsError> {
        match data.get(key) {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes.clone())
                .map(|s| Some(s.trim().to_string()).filter(|s| !s.is_empty()))
                .map_err(|_| CredentialsError::NotText {
                    source_name: source_name.to_string(),
                    key: key.to_string(),
                }),
        }
    };
    let first_of = |keys: &[&str]| -> Result<Option<String>, CredentialsError> {
        for key in keys {
            if let Some(value) = text(key)? {
                return Ok(Some(value));
            }
        }
        Ok(None)
    };
    let missing = |key: &str| CredentialsError::KeyMissing {
        source_name: source_name.to_string(),
        key: key.to_string(),
    };
    let invalid = |error: ConfigError| CredentialsError::Invalid {
        source_name: source_name.to_string(),
        error,
    };
    let url = text(URL_KEY)?.ok_or_else(|| missing(URL_KEY))?;
    let token_id = first_of(&TOKEN_ID_KEYS)?.ok_or_else(|| missing(TOKEN_ID_KEYS[0]))?;
    let secret = first_of(&TOKEN_SECRET_KEYS)?.ok_or_else(|| missing(TOKEN_SECRET_KEYS[0]))?;
    let credentials =
        Credentials::parse(&token_id, &secret).map_err(|e| invalid(ConfigError::from(e)))?;
    let url = ApiUrl::parse(&url).map_err(invalid)?;
    let insecure = text(INSECURE_KEY)?
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"));
    // Verified unless asked otherwise (capmox defaults to insecure when the
    // key is absent; the reference platform verifies by default).
    let tls = match (first_of(&CA_KEYS)?, insecure) {
        (_, true) => TlsVerification::Insecure,
        (Some(pem), false) => TlsVerification::HypervisorCa { pem },
        (None, false) => TlsVerification::SystemRoots,
    };
    Ok(ClientConfig::new(url, credentials).with_tls(tls))
}

/// The manager's own credentials, from the environment (capmox's variable
/// names), as Secret-shaped data.
fn environment_credentials() -> Option<BTreeMap<String, Vec<u8>>> {
    let read = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut data = BTreeMap::new();
    data.insert(URL_KEY.to_string(), read(ENV_URL)?.into_bytes());
    data.insert(TOKEN_ID_KEYS[0].to_string(), read(ENV_TOKEN)?.into_bytes());
    data.insert(
        TOKEN_SECRET_KEYS[0].to_string(),
        read(ENV_SECRET)?.into_bytes(),
    );
    if let Some(insecure) = read(ENV_INSECURE) {
        data.insert(INSECURE_KEY.to_string(), insecure.into_bytes());
    }
    if let Some(ca) = read(ENV_ROOT_CA) {
        data.insert(CA_KEYS[0].to_string(), ca.into_bytes());
    }
    Some(data)
}

fn secret_data(data: Option<BTreeMap<String, ByteString>>) -> BTreeMap<String, Vec<u8>> {
    data.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// Clients by credentials source, rebuilt when the Secret changes. Keeping
/// them keeps their connection pools: a TLS handshake per reconcile would
/// cost the hypervisor more than the calls themselves. The Secret is read
/// again at most every [`SECRET_RECHECK`]: a rotated or deleted token is
/// noticed within that, without a read per reconcile.
#[derive(Default)]
pub struct ClientCache {
    clients: Mutex<HashMap<String, CachedClient>>,
}

/// A client, the Secret version it was built from, and when that was read.
struct CachedClient {
    version: String,
    client: ProxmoxClient,
    checked: std::time::Instant,
}

/// How long a client is used without reading its Secret again.
pub const SECRET_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

impl ClientCache {
    /// The client of a ProxmoxCluster, polling tasks with `tasks`.
    pub async fn client_for(
        &self,
        kube: &kube::Client,
        cluster: &ProxmoxCluster,
        tasks: &TaskWaitConfig,
    ) -> Result<ProxmoxClient, CredentialsError> {
        let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
        let secret_name = cluster.spec.credentials_secret_name(&namespace)?;
        if let Some(name) = secret_name
            && let Some(cached) = self.lock().get(&format!("secret/{namespace}/{name}"))
            && cached.checked.elapsed() < SECRET_RECHECK
        {
            return Ok(cached.client.clone());
        }
        let (key, version, source_name, data) = match secret_name {
            Some(name) => {
                let secret = Api::<Secret>::namespaced(kube.clone(), &namespace)
                    .get_opt(name)
                    .await?
                    .ok_or_else(|| CredentialsError::SecretNotFound {
                        namespace: namespace.clone(),
                        name: name.to_string(),
                    })?;
                let version = secret.metadata.resource_version.clone().unwrap_or_default();
                (
                    format!("secret/{namespace}/{name}"),
                    version,
                    format!("{namespace}/{name}"),
                    secret_data(secret.data),
                )
            }
            None => {
                let data = environment_credentials().ok_or(CredentialsError::NoCredentials)?;
                (
                    "environment".to_string(),
                    String::new(),
                    "(manager environment)".to_string(),
                    data,
                )
            }
        };
        if let Some(cached) = self.lock().get_mut(&key)
            && cached.version == version
        {
            cached.checked = std::time::Instant::now();
            return Ok(cached.client.clone());
        }
        let config = client_config(&source_name, &data)?.with_task_wait(tasks.clone());
        let client = ProxmoxClient::new(config)
            .map_err(|error| CredentialsError::Invalid { source_name, error })?;
        self.lock().insert(
            key,
            CachedClient {
                version,
                client: client.clone(),
                checked: std::time::Instant::now(),
            },
        );
        Ok(client)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedClient>> {
        self.clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "5e1c7a56-3b0c-4f0e-9a1d-2f6c8b9d0e11";

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn tenantry_and_capmox_key_names_are_both_read() {
        for (id_key, secret_key) in [("token_id", "token_secret"), ("token", "secret")] {
            let config = client_config(
                "ns/creds",
                &data(&[
                    ("url", "https://pve.example:8006"),
                    (id_key, "tenantry@pve!capi"),
                    (secret_key, SECRET),
                ]),
            )
            .unwrap();
            assert_eq!(config.credentials.token_id.to_string(), "tenantry@pve!capi");
            assert_eq!(config.url.as_str(), "https://pve.example:8006/api2/json");
            assert_eq!(
                config.tls,
                TlsVerification::SystemRoots,
                "verified by default"
            );
        }
    }

    #[test]
    fn ca_and_insecure_choose_the_verification() {
        let base = [
            ("url", "https://pve.example:8006"),
            ("token_id", "tenantry@pve!capi"),
            ("token_secret", SECRET),
        ];
        let mut with_ca = data(&base);
        with_ca.insert("ca.crt".into(), b"-----BEGIN CERTIFICATE-----".to_vec());
        assert!(matches!(
            client_config("s", &with_ca).unwrap().tls,
            TlsVerification::HypervisorCa { .. }
        ));
        let mut insecure = with_ca.clone();
        insecure.insert("insecure".into(), b"true".to_vec());
        assert_eq!(
            client_config("s", &insecure).unwrap().tls,
            TlsVerification::Insecure
        );
        insecure.insert("insecure".into(), b"false".to_vec());
        assert!(matches!(
            client_config("s", &insecure).unwrap().tls,
            TlsVerification::HypervisorCa { .. }
        ));
    }

    #[test]
    fn errors_name_keys_never_values() {
        let missing = client_config("ns/creds", &data(&[("url", "https://pve:8006")])).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "credentials Secret ns/creds has no 'token_id' key"
        );
        assert_eq!(missing.reason(), "CredentialsInvalid");
        let bad_secret = client_config(
            "ns/creds",
            &data(&[
                ("url", "https://pve:8006"),
                ("token_id", "tenantry@pve!capi"),
                ("token_secret", "top secret;value"),
            ]),
        )
        .unwrap_err();
        assert!(
            !bad_secret.to_string().contains("top secret"),
            "{bad_secret}"
        );
        let bad_url = client_config(
            "ns/creds",
            &data(&[
                ("url", "http://pve:8006"),
                ("token_id", "a@pve!capi"),
                ("token_secret", SECRET),
            ]),
        )
        .unwrap_err();
        assert_eq!(bad_url.reason(), "InvalidURL");
        assert!(!bad_url.is_transient());
    }
}
