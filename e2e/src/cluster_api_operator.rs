//! The real Cluster API Operator (`sigs.k8s.io/cluster-api-operator`, built
//! by `hack/upstream/build.sh cluster-api-operator`), run out of cluster
//! against a harness control plane, and the objects the hosting platform
//! installs providers with.
//!
//! **What runs for real.** The operator's manager binary, with every
//! controller it starts in a real install: one provider controller per kind
//! (`CoreProvider`, `InfrastructureProvider`, `BootstrapProvider`, …) running
//! the operator's own phases (preflight checks, loading the provider's
//! ConfigMap, clusterctl's component processing, install, status) and its
//! provider health check, which copies the provider Deployment's `Available`
//! condition to the provider's `Ready`. Its CRDs come from the module's
//! `config/crd/bases`, and its defaulting and validating webhooks are wired
//! from `config/webhook/manifests.yaml` under the names the kustomize overlay
//! gives them (`capi-operator-…`), served with a certificate from the
//! control plane's CA, exactly as [`crate::cluster_api`] does for Cluster
//! API.
//!
//! **What is left out.** The operator's own Deployment, RBAC and webhook
//! Service (it runs as a process with the admin kubeconfig, reached by URL on
//! loopback); leader election (one replica); the `/config/clusterctl.yaml`
//! mount (absent in the Helm chart's defaults too). Nothing runs pods in the
//! default control plane, so the providers' Deployments the operator creates
//! never become Available and their `Ready` condition stays `False`.
//!
//! **The ConfigMap contract** (`internal/controller/phase_load.go`): the
//! operator lists the ConfigMaps in the provider's namespace that match
//! `spec.fetchConfig.selector`; each one's version is its
//! `provider.cluster.x-k8s.io/version` label, else its name, and must parse as
//! a semantic version; `data.metadata` holds `metadata.yaml` as plain text,
//! always; `components` is plain text in `data`, or, when the ConfigMap is
//! annotated `provider.cluster.x-k8s.io/compressed: "true"`, gzip in
//! `binaryData` (base64 on the wire, like any `binaryData`). Exactly one
//! ConfigMap may match a provider's selector: the operator hashes it to
//! decide whether to re-apply, and refuses more than one there.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;

use crate::cluster_api::http_status;
use crate::control_plane::{ControlPlane, free_port};
use crate::manifests::{FIELD_MANAGER, apply_crds, crds_of, read_documents};
use crate::process::ManagedProcess;
use crate::upstream::Upstream;
use crate::wait;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The file name under the cache's `bin/`, and the name of its manifests
/// folder (`crd/`, `webhook/`) in the cache.
const NAME: &str = "cluster-api-operator";

/// The operator's API group.
pub const GROUP: &str = "operator.cluster.x-k8s.io";
/// The version of the operator's API the providers are written in.
pub const VERSION: &str = "v1alpha2";
/// `apiVersion` of the provider objects.
pub const API_VERSION: &str = "operator.cluster.x-k8s.io/v1alpha2";

/// Marks a provider ConfigMap whose `binaryData.components` is gzip.
pub const COMPRESSED_ANNOTATION: &str = "provider.cluster.x-k8s.io/compressed";
/// A provider ConfigMap's version, when its name is not the version.
pub const VERSION_LABEL: &str = "provider.cluster.x-k8s.io/version";
/// The key holding the provider's components YAML.
pub const COMPONENTS_KEY: &str = "components";
/// The key holding the provider's clusterctl `metadata.yaml`.
pub const METADATA_KEY: &str = "metadata";
/// The label [`compressed_provider_config_map`] puts on the ConfigMap for
/// [`provider`]'s selector to match (the key of the operator's air-gapped
/// example; the hosting platform uses one key per provider type with the
/// same shape, e.g. `core-components: cozy`).
pub const PROVIDER_COMPONENTS_LABEL: &str = "provider-components";

/// The provider kinds the operator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Core,
    Infrastructure,
    Bootstrap,
    ControlPlane,
    Ipam,
    Addon,
    RuntimeExtension,
}

impl ProviderKind {
    /// The kind, e.g. `CoreProvider`.
    pub fn kind(self) -> &'static str {
        match self {
            ProviderKind::Core => "CoreProvider",
            ProviderKind::Infrastructure => "InfrastructureProvider",
            ProviderKind::Bootstrap => "BootstrapProvider",
            ProviderKind::ControlPlane => "ControlPlaneProvider",
            ProviderKind::Ipam => "IPAMProvider",
            ProviderKind::Addon => "AddonProvider",
            ProviderKind::RuntimeExtension => "RuntimeExtensionProvider",
        }
    }

    /// The resource's plural name, e.g. `coreproviders`.
    pub fn plural(self) -> String {
        format!("{}s", self.kind().to_ascii_lowercase())
    }

    /// The resource, for a dynamic [`Api`].
    pub fn api_resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, VERSION, self.kind()),
            &self.plural(),
        )
    }

    /// The providers of this kind in `namespace`.
    pub fn api(self, client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), namespace, &self.api_resource())
    }
}

/// A provider ConfigMap as the operator reads it with
/// `provider.cluster.x-k8s.io/compressed: "true"`: named `name` (the version,
/// e.g. `v1.14.2`), labelled `provider-components: <provider_label_value>`,
/// `components_yaml` gzipped into `binaryData.components` (base64 on the
/// wire), `metadata_yaml` as plain text in `data.metadata`, which the
/// operator never decompresses.
pub fn compressed_provider_config_map(
    namespace: &str,
    name: &str,
    provider_label_value: &str,
    components_yaml: &str,
    metadata_yaml: &str,
) -> serde_json::Value {
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(components_yaml.as_bytes())
        .expect("gzip into memory cannot fail");
    let components = gzip.finish().expect("gzip into memory cannot fail");
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { PROVIDER_COMPONENTS_LABEL: provider_label_value },
            "annotations": { COMPRESSED_ANNOTATION: "true" },
        },
        "data": { METADATA_KEY: metadata_yaml },
        "binaryData": { COMPONENTS_KEY: BASE64.encode(components) },
    })
}

/// The selector [`compressed_provider_config_map`]'s label answers to.
pub fn provider_components_selector(provider_label_value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        PROVIDER_COMPONENTS_LABEL.to_string(),
        provider_label_value.to_string(),
    )])
}

/// A provider object (`CoreProvider` must be named `cluster-api`) installing
/// `version` from the ConfigMap in its namespace that `selector_labels`
/// match.
pub fn provider(
    kind: ProviderKind,
    namespace: &str,
    name: &str,
    version: &str,
    selector_labels: &BTreeMap<String, String>,
) -> serde_json::Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": kind.kind(),
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "version": version,
            "fetchConfig": { "selector": { "matchLabels": selector_labels } },
        },
    })
}

/// The operator's manager, running out of cluster against a harness control
/// plane. Stopped when dropped.
pub struct ClusterApiOperator {
    process: ManagedProcess,
    health_port: u16,
    webhook_port: u16,
}

impl ClusterApiOperator {
    /// Installs the operator's CRDs and webhook configurations into
    /// `control_plane`, starts the manager and waits until it is ready and
    /// its webhook server listens.
    pub async fn start(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let binary = upstream.root().join("bin").join(NAME);
        let config = upstream.root().join(NAME);
        if !binary.exists() || !config.join("crd").is_dir() {
            bail!(
                "{NAME} not found at {} (manifests: {}): run hack/upstream/build.sh {NAME} first",
                binary.display(),
                config.display()
            );
        }

        let webhook_port = free_port()?;
        let health_port = free_port()?;
        let diagnostics_port = free_port()?;
        let dir = control_plane.dir().join(format!("{NAME}-{webhook_port}"));
        let cert_dir = dir.join("webhook-certs");
        std::fs::create_dir_all(&cert_dir).context("create webhook certificate folder")?;
        control_plane
            .ca()
            .issue_server("cluster-api-operator-webhook", &["127.0.0.1", "localhost"])?
            .write(&cert_dir, "tls")?;

        let webhook_base = format!("https://127.0.0.1:{webhook_port}");
        let ca_bundle = ByteString(control_plane.ca().cert_pem().into_bytes());
        install_crds(control_plane, &config.join("crd")).await?;
        install_webhook_configurations(
            control_plane,
            &config.join("webhook/manifests.yaml"),
            &webhook_base,
            &ca_bundle,
        )
        .await?;

        let mut command = Command::new(&binary);
        command.args([
            format!("--kubeconfig={}", control_plane.kubeconfig_path().display()),
            "--leader-elect=false".to_string(),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
            format!("--health-addr=127.0.0.1:{health_port}"),
            format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
            "--insecure-diagnostics=true".to_string(),
            // Its default, localhost:6060, would collide between parallel
            // tests; empty turns the profiler off.
            "--profiler-address=".to_string(),
            // The Helm chart's default log level.
            "--v=2".to_string(),
        ]);
        // clusterctl's configuration reader, which the operator uses, reads
        // clusterctl.yaml from $XDG_CONFIG_HOME/cluster-api and
        // $HOME/.cluster-api: keep the developer's own out.
        command
            .env("HOME", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"));
        let process = ManagedProcess::spawn(
            &format!("{}/{NAME}", control_plane.name()),
            command,
            &dir.join("manager.log"),
        )?;
        let mut operator = Self {
            process,
            health_port,
            webhook_port,
        };
        operator.wait_ready().await?;
        Ok(operator)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let health = format!("127.0.0.1:{}", self.health_port);
        let webhook = format!("127.0.0.1:{}", self.webhook_port);
        let process = &mut self.process;
        let ready = wait::until("cluster-api-operator /readyz", READY_TIMEOUT, || {
            let exited = process.exit_status();
            let health = health.clone();
            let webhook = webhook.clone();
            async move {
                if let Some(status) = exited {
                    return Ok(Some(Err(status)));
                }
                // /readyz is a plain ping; the webhook server listens only
                // once it has loaded its certificate.
                let ready = http_status(&health, "/readyz").await? == 200
                    && tokio::net::TcpStream::connect(&webhook).await.is_ok();
                Ok(ready.then_some(Ok(())))
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => Ok(()),
            Ok(Err(status)) => bail!(
                "cluster-api-operator exited with {status} during start:\n{}",
                self.process.log_tail(30)
            ),
            Err(error) => Err(error.context(format!(
                "cluster-api-operator log tail:\n{}",
                self.process.log_tail(30)
            ))),
        }
    }

    /// The operator's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The operator's log file (in the control plane's folder).
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The last lines of the operator's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The loopback port its webhook server listens on.
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// Stops the operator (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(mut self) {
        self.process.stop(Duration::from_secs(10));
    }
}

/// Installs the operator's CRDs. Each serves one version (v1alpha2), so the
/// conversion webhook the kustomize overlay names is never called and is not
/// wired.
async fn install_crds(control_plane: &ControlPlane, crd_dir: &Path) -> anyhow::Result<()> {
    let crds = crds_of(read_documents(crd_dir)?)?;
    if let Some(crd) = crds.iter().find(|crd| crd.spec.versions.len() > 1) {
        bail!(
            "CRD {} serves several versions: wire its conversion webhook in {}",
            crd.metadata.name.as_deref().unwrap_or("?"),
            file!()
        );
    }
    apply_crds(&control_plane.client(), crds).await?;
    Ok(())
}

/// Installs the operator's mutating and validating webhook configurations,
/// named as its kustomize overlay names them, each webhook pointed at
/// `webhook_base` + its path.
async fn install_webhook_configurations(
    control_plane: &ControlPlane,
    manifests: &Path,
    webhook_base: &str,
    ca_bundle: &ByteString,
) -> anyhow::Result<()> {
    let client = control_plane.client();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let to_url = |config: &mut WebhookClientConfig| -> anyhow::Result<()> {
        let path = config
            .service
            .as_ref()
            .and_then(|s| s.path.clone())
            .context("webhook without a service path")?;
        *config = WebhookClientConfig {
            url: Some(format!("{webhook_base}{path}")),
            ca_bundle: Some(ca_bundle.clone()),
            service: None,
        };
        Ok(())
    };
    let mut installed = 0;
    for document in read_documents(manifests)? {
        match document["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                let mut config: MutatingWebhookConfiguration = serde_json::from_value(document)?;
                let name = "capi-operator-mutating-webhook-configuration";
                config.metadata.name = Some(name.into());
                for webhook in config.webhooks.iter_mut().flatten() {
                    to_url(&mut webhook.client_config)?;
                }
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .patch(name, &params, &Patch::Apply(&config))
                    .await
                    .with_context(|| format!("apply {name}"))?;
                installed += 1;
            }
            Some("ValidatingWebhookConfiguration") => {
                let mut config: ValidatingWebhookConfiguration = serde_json::from_value(document)?;
                let name = "capi-operator-validating-webhook-configuration";
                config.metadata.name = Some(name.into());
                for webhook in config.webhooks.iter_mut().flatten() {
                    to_url(&mut webhook.client_config)?;
                }
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .patch(name, &params, &Patch::Apply(&config))
                    .await
                    .with_context(|| format!("apply {name}"))?;
                installed += 1;
            }
            _ => {}
        }
    }
    if installed != 2 {
        bail!(
            "expected a mutating and a validating webhook configuration in {}, found {installed}",
            manifests.display()
        );
    }
    Ok(())
}
