//! Bootstrap data: the Secret CAPI's bootstrap provider writes and names in
//! `Machine.spec.bootstrap.dataSecretName`, key `value`.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::Machine;

/// The key holding the data in the bootstrap Secret.
pub const BOOTSTRAP_DATA_KEY: &str = "value";

/// Bootstrap data. It holds cluster secrets (Talos machine keys, tokens), so
/// `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapData(Vec<u8>);

impl std::fmt::Debug for BootstrapData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BootstrapData({} bytes, {:?})",
            self.0.len(),
            self.format()
        )
    }
}

/// What kind of bootstrap data a machine got; only cloud-config can carry the
/// SSH user that the ssh bootstrap check logs in with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapFormat {
    CloudConfig,
    TalosConfig,
    Other,
}

impl BootstrapFormat {
    /// The format's name, as written where it is remembered (a VM annotation).
    pub fn as_str(self) -> &'static str {
        match self {
            BootstrapFormat::CloudConfig => "cloud-config",
            BootstrapFormat::TalosConfig => "talos",
            BootstrapFormat::Other => "other",
        }
    }

    /// The format [`as_str`](Self::as_str) names; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        [
            BootstrapFormat::CloudConfig,
            BootstrapFormat::TalosConfig,
            BootstrapFormat::Other,
        ]
        .into_iter()
        .find(|format| format.as_str() == name)
    }
}

impl BootstrapData {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Cloud-config starts with `#cloud-config`, possibly after cloud-init's
    /// `## template: jinja` line (CABPK's kubeadm data always has it); a
    /// Talos machine config is YAML with `version: v1alpha1` and a `machine:`
    /// section.
    pub fn format(&self) -> BootstrapFormat {
        let text = String::from_utf8_lossy(&self.0[..self.0.len().min(4096)]);
        let first = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with("## template:"))
            .unwrap_or("");
        if first.starts_with("#cloud-config") {
            BootstrapFormat::CloudConfig
        } else if text.lines().any(|l| l.trim_end() == "version: v1alpha1")
            && text.lines().any(|l| l.trim_end() == "machine:")
        {
            BootstrapFormat::TalosConfig
        } else {
            BootstrapFormat::Other
        }
    }
}

/// Where bootstrap data stands for a machine.
#[derive(Debug)]
pub enum BootstrapState {
    /// `dataSecretName` is not set yet.
    NotReady,
    /// The named Secret does not exist.
    SecretMissing(String),
    /// The Secret exists but has no `value` key.
    KeyMissing(String),
    /// The data.
    Ready(BootstrapData),
}

/// Reads a Machine's bootstrap data.
pub async fn read(client: &kube::Client, machine: &Machine) -> kube::Result<BootstrapState> {
    let Some(name) = machine.spec.bootstrap.data_secret_name.as_deref() else {
        return Ok(BootstrapState::NotReady);
    };
    let namespace = machine.metadata.namespace.as_deref().unwrap_or("default");
    let Some(secret) = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(BootstrapState::SecretMissing(name.to_string()));
    };
    match secret.data.and_then(|mut d| d.remove(BOOTSTRAP_DATA_KEY)) {
        Some(value) => Ok(BootstrapState::Ready(BootstrapData::new(value.0))),
        None => Ok(BootstrapState::KeyMissing(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names_round_trip() {
        for format in [
            BootstrapFormat::CloudConfig,
            BootstrapFormat::TalosConfig,
            BootstrapFormat::Other,
        ] {
            assert_eq!(BootstrapFormat::parse(format.as_str()), Some(format));
        }
        assert_eq!(BootstrapFormat::parse("Cloud-Config"), None);
    }

    #[test]
    fn formats_are_recognised() {
        let talos = "version: v1alpha1\ndebug: false\nmachine:\n  type: worker\n";
        assert_eq!(
            BootstrapData::new(talos.into()).format(),
            BootstrapFormat::TalosConfig
        );
        let cloud = "\n#cloud-config\nruncmd: []\n";
        assert_eq!(
            BootstrapData::new(cloud.into()).format(),
            BootstrapFormat::CloudConfig
        );
        let kubeadm = "## template: jinja\n#cloud-config\nruncmd: []\n";
        assert_eq!(
            BootstrapData::new(kubeadm.into()).format(),
            BootstrapFormat::CloudConfig
        );
        assert_eq!(
            BootstrapData::new(b"{\"ignition\":{}}".to_vec()).format(),
            BootstrapFormat::Other
        );
    }

    #[test]
    fn debug_never_prints_the_data() {
        let data = BootstrapData::new(b"#cloud-config\npassword: hunter2\n".to_vec());
        assert!(!format!("{data:?}").contains("hunter2"));
    }
}
