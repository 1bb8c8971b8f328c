//! Upstream controller-runtime managers (the real Cluster API core manager,
//! of the pinned release or of v1.10, the in-cluster IPAM provider), run out
//! of cluster against a harness control plane, with their webhooks wired the
//! way their kustomize overlays wire them in a real management cluster (CRD
//! conversion and admission webhooks), except that the apiserver reaches the
//! manager by URL on loopback instead of through a Service.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, WebhookClientConfig as CrdWebhookClientConfig, WebhookConversion,
};
use kube::api::{Api, Patch, PatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::control_plane::{ControlPlane, free_port};
use crate::manifests::{FIELD_MANAGER, apply_crds, crds_of, read_documents};
use crate::process::ManagedProcess;
use crate::upstream::{Binary, Upstream};
use crate::wait;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// An upstream controller-runtime manager (Cluster API core, the in-cluster
/// IPAM provider), running out of cluster against a harness control plane.
pub struct UpstreamManager {
    process: ManagedProcess,
    health_port: u16,
    webhook_port: u16,
    label: &'static str,
}

/// What differs between the upstream managers the harness runs.
struct ManagerSpec {
    label: &'static str,
    binary: Binary,
    config: PathBuf,
    health_flag: &'static str,
    extra_args: Vec<String>,
    /// The `cluster.x-k8s.io/provider` label `clusterctl init` puts on the
    /// provider's components (with `clusterctl.cluster.x-k8s.io`): without
    /// them `clusterctl move` does not see the provider's kinds.
    clusterctl_provider: &'static str,
    /// Labels the provider's kustomize overlay puts on its CRDs besides
    /// clusterctl's (a bootstrap provider's contract labels, say).
    crd_labels: &'static [(&'static str, &'static str)],
    /// CRDs with several versions that the provider's kustomize overlay
    /// leaves without a conversion webhook (strategy `None`): the manager
    /// cannot convert them.
    crds_without_conversion: &'static [&'static str],
}

/// Which release of the Cluster API core manager runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterApiRelease {
    /// The pinned release (`hack/upstream/cluster-api`, v1.14): stores
    /// `cluster.x-k8s.io/v1beta2` and still serves `v1beta1`.
    #[default]
    Pinned,
    /// v1.10 (`hack/upstream/cluster-api-1.10`), the last minor that serves
    /// `cluster.x-k8s.io/v1beta1` only.
    V1_10,
}

impl ClusterApiRelease {
    /// The release's version, as its wrapper module pins it (`v1.10.1`).
    pub fn version(self) -> anyhow::Result<String> {
        let wrapper = match self {
            ClusterApiRelease::Pinned => "cluster-api",
            ClusterApiRelease::V1_10 => "cluster-api-1.10",
        };
        crate::upstream::pinned_version(wrapper, "sigs.k8s.io/cluster-api")
    }

    /// The newest `cluster.x-k8s.io` version the release serves, the one it
    /// stores objects in.
    pub fn api_version(self) -> &'static str {
        match self {
            ClusterApiRelease::Pinned => "v1beta2",
            ClusterApiRelease::V1_10 => "v1beta1",
        }
    }

    /// The manager's binary.
    pub fn binary(self) -> Binary {
        match self {
            ClusterApiRelease::Pinned => Binary::ClusterApiManager,
            ClusterApiRelease::V1_10 => Binary::ClusterApiManagerV1_10,
        }
    }
}

/// Cluster API v1.10's IPAM CRDs serve `v1alpha1` and `v1beta1` with no
/// conversion webhook (its `config/crd/kustomization.yaml` patches none in),
/// and its manager's scheme lacks IPAM `v1alpha1`, so `/convert` would fail.
const CLUSTER_API_V1_10_UNCONVERTED_CRDS: &[&str] = &[
    "ipaddresses.ipam.cluster.x-k8s.io",
    "ipaddressclaims.ipam.cluster.x-k8s.io",
];

/// CABPT's contract labels (`config/crd/kustomization.yaml` `commonLabels`
/// of v0.6.12): its `v1alpha3` implements the v1beta1 contract.
const CABPT_CONTRACT_LABELS: &[(&str, &str)] = &[
    ("cluster.x-k8s.io/v1alpha3", "v1alpha3"),
    ("cluster.x-k8s.io/v1alpha4", "v1alpha3"),
    ("cluster.x-k8s.io/v1beta1", "v1alpha3"),
];

/// The real Cluster API core manager (`sigs.k8s.io/cluster-api/core`; in
/// v1.10, the module root).
pub type ClusterApiManager = UpstreamManager;

impl UpstreamManager {
    /// Installs the Cluster API CRDs and webhook configurations of the
    /// pinned release into `control_plane`, starts the manager and waits
    /// until it is ready and its webhooks answer.
    pub async fn start(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        Self::start_release(control_plane, ClusterApiRelease::Pinned).await
    }

    /// [`Self::start`] with the CRDs, webhooks and manager of `release`.
    /// Both releases take the same flags here (v1.10 has the diagnostics
    /// flags too); each runs with its own default feature gates.
    pub async fn start_release(
        control_plane: &ControlPlane,
        release: ClusterApiRelease,
    ) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let diagnostics_port = free_port()?;
        let (label, config, crds_without_conversion) = match release {
            ClusterApiRelease::Pinned => (
                "Cluster API manager",
                upstream.cluster_api_config()?,
                &[][..],
            ),
            ClusterApiRelease::V1_10 => (
                "Cluster API manager v1.10",
                upstream.cluster_api_v1_10_config()?,
                CLUSTER_API_V1_10_UNCONVERTED_CRDS,
            ),
        };
        Self::start_spec(
            control_plane,
            ManagerSpec {
                label,
                binary: release.binary(),
                config,
                health_flag: "--health-addr",
                extra_args: vec![
                    format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
                    "--insecure-diagnostics=true".to_string(),
                    "--leader-elect=false".to_string(),
                ],
                clusterctl_provider: "cluster-api",
                crd_labels: &[],
                crds_without_conversion,
            },
        )
        .await
    }

    /// Installs the in-cluster IPAM provider's CRDs and webhooks and starts
    /// it (`sigs.k8s.io/cluster-api-ipam-provider-in-cluster`). It serves
    /// `InClusterIPPool`s and fulfils CAPI `IPAddressClaim`s from them.
    pub async fn start_ipam_in_cluster(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let diagnostics_port = free_port()?;
        Self::start_spec(
            control_plane,
            ManagerSpec {
                label: "in-cluster IPAM provider",
                binary: Binary::IpamInCluster,
                config: upstream.ipam_in_cluster_config()?,
                health_flag: "--health-probe-bind-address",
                extra_args: vec![
                    format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
                    "--insecure-diagnostics=true".to_string(),
                ],
                clusterctl_provider: "ipam-in-cluster",
                crd_labels: &[],
                crds_without_conversion: &[],
            },
        )
        .await
    }

    /// Installs CABPT's CRDs (with its contract labels and conversion
    /// webhook) and admission webhooks and starts it
    /// (`github.com/siderolabs/cluster-api-bootstrap-provider-talos`): it
    /// renders the bootstrap data Secret of every TalosConfig a Machine owns.
    pub async fn start_cabpt(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let diagnostics_port = free_port()?;
        Self::start_spec(
            control_plane,
            ManagerSpec {
                label: "CABPT",
                binary: Binary::Cabpt,
                config: upstream.cabpt_config()?,
                health_flag: "--health-addr",
                extra_args: vec![
                    format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
                    "--insecure-diagnostics=true".to_string(),
                ],
                clusterctl_provider: "bootstrap-talos",
                crd_labels: CABPT_CONTRACT_LABELS,
                crds_without_conversion: &[],
            },
        )
        .await
    }

    async fn start_spec(control_plane: &ControlPlane, spec: ManagerSpec) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let webhook_port = free_port()?;
        let health_port = free_port()?;
        let dir = control_plane
            .dir()
            .join(format!("{}-{webhook_port}", spec.binary.file_name()));
        let cert_dir = dir.join("webhook-certs");
        std::fs::create_dir_all(&cert_dir).context("create webhook certificate folder")?;
        control_plane
            .ca()
            .issue_server("upstream-webhook", &["127.0.0.1", "localhost"])?
            .write(&cert_dir, "tls")?;

        let webhook_base = format!("https://127.0.0.1:{webhook_port}");
        let ca_bundle = ByteString(control_plane.ca().cert_pem().into_bytes());
        install_crds(
            control_plane,
            &spec.config.join("crd"),
            &webhook_base,
            &ca_bundle,
            spec.clusterctl_provider,
            spec.crd_labels,
            spec.crds_without_conversion,
        )
        .await?;
        install_webhook_configurations(
            control_plane,
            spec.binary.file_name(),
            &spec.config.join("webhook"),
            &webhook_base,
            &ca_bundle,
        )
        .await?;

        let mut command = Command::new(upstream.binary(spec.binary)?);
        command.args([
            format!("--kubeconfig={}", control_plane.kubeconfig_path().display()),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
            format!("{}=127.0.0.1:{health_port}", spec.health_flag),
        ]);
        command.args(&spec.extra_args);
        let process = ManagedProcess::spawn(
            &format!("{}/{}", control_plane.name(), spec.binary.file_name()),
            command,
            &dir.join("manager.log"),
        )?;
        let mut manager = Self {
            process,
            health_port,
            webhook_port,
            label: spec.label,
        };
        manager.wait_ready().await?;
        Ok(manager)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let health = format!("127.0.0.1:{}", self.health_port);
        let label = self.label;
        let process = &mut self.process;
        let ready = wait::until(format!("{label} /readyz"), READY_TIMEOUT, || {
            let exited = process.exit_status();
            let health = health.clone();
            async move {
                if let Some(status) = exited {
                    return Ok(Some(Err(status)));
                }
                Ok((http_status(&health, "/readyz").await? == 200).then_some(Ok(())))
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => Ok(()),
            Ok(Err(status)) => bail!(
                "{label} exited with {status} during start:\n{}",
                self.process.log_tail(30)
            ),
            Err(error) => {
                Err(error.context(format!("{label} log tail:\n{}", self.process.log_tail(30))))
            }
        }
    }

    /// The manager's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The manager's log file.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The last lines of the manager's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The loopback port its webhook server listens on.
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// Stops the manager (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(mut self) {
        self.process.stop(Duration::from_secs(10));
    }
}

/// Installs a manager's CRDs with their conversion webhook pointed at
/// `webhook_base`, as the `webhook_in_*.yaml` patches and CA injection do
/// (for every CRD with several versions but those named in
/// `without_conversion`).
async fn install_crds(
    control_plane: &ControlPlane,
    crd_dir: &Path,
    webhook_base: &str,
    ca_bundle: &ByteString,
    clusterctl_provider: &str,
    extra_labels: &[(&str, &str)],
    without_conversion: &[&str],
) -> anyhow::Result<()> {
    let mut crds = crds_of(read_documents(crd_dir)?)?;
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        for (key, value) in extra_labels {
            labels.insert((*key).into(), (*value).into());
        }
        labels.insert("clusterctl.cluster.x-k8s.io".into(), String::new());
        labels.insert(
            "cluster.x-k8s.io/provider".into(),
            clusterctl_provider.into(),
        );
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        if crd.spec.versions.len() > 1 && !without_conversion.contains(&name) {
            crd.spec.conversion = Some(CustomResourceConversion {
                strategy: "Webhook".into(),
                webhook: Some(WebhookConversion {
                    conversion_review_versions: vec!["v1".into()],
                    client_config: Some(CrdWebhookClientConfig {
                        url: Some(format!("{webhook_base}/convert")),
                        ca_bundle: Some(ca_bundle.clone()),
                        service: None,
                    }),
                }),
            });
        }
    }
    apply_crds(&control_plane.client(), crds).await?;
    Ok(())
}

/// Installs a manager's mutating and validating webhook configurations
/// (named `<prefix>-…`), each webhook pointed at `webhook_base` + its path.
async fn install_webhook_configurations(
    control_plane: &ControlPlane,
    prefix: &str,
    webhook_dir: &Path,
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
    let manifests: PathBuf = webhook_dir.join("manifests.yaml");
    for document in read_documents(&manifests)? {
        match document["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                let mut config: MutatingWebhookConfiguration = serde_json::from_value(document)?;
                let name = format!("{prefix}-mutating-webhook-configuration");
                config.metadata.name = Some(name.clone());
                for webhook in config.webhooks.iter_mut().flatten() {
                    to_url(&mut webhook.client_config)?;
                }
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .patch(&name, &params, &Patch::Apply(&config))
                    .await
                    .with_context(|| format!("apply {name}"))?;
            }
            Some("ValidatingWebhookConfiguration") => {
                let mut config: ValidatingWebhookConfiguration = serde_json::from_value(document)?;
                let name = format!("{prefix}-validating-webhook-configuration");
                config.metadata.name = Some(name.clone());
                for webhook in config.webhooks.iter_mut().flatten() {
                    to_url(&mut webhook.client_config)?;
                }
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .patch(&name, &params, &Patch::Apply(&config))
                    .await
                    .with_context(|| format!("apply {name}"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The HTTP status of a plain-HTTP GET on a loopback address. Kept to a raw
/// request: health endpoints are all this harness reads over plain HTTP.
pub async fn http_status(address: &str, path: &str) -> anyhow::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut head = [0u8; 16];
    let read = stream.read(&mut head).await?;
    let line = std::str::from_utf8(&head[..read]).unwrap_or("");
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no HTTP status line from {address}{path}"))
}
