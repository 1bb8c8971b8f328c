//! The real Cluster API core manager, run out of cluster against a harness
//! control plane, with its webhooks wired the way CAPI's kustomize overlay
//! wires them in a real management cluster (CRD conversion and admission
//! webhooks), except that the apiserver reaches the manager by URL on
//! loopback instead of through a Service.

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

/// A running Cluster API core manager (`sigs.k8s.io/cluster-api/core`).
pub struct ClusterApiManager {
    process: ManagedProcess,
    health_port: u16,
    webhook_port: u16,
}

impl ClusterApiManager {
    /// Installs the Cluster API CRDs and webhook configurations into
    /// `control_plane`, starts the manager and waits until it is ready and
    /// its webhooks answer.
    pub async fn start(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let config = upstream.cluster_api_config()?;
        let webhook_port = free_port()?;
        let health_port = free_port()?;
        let diagnostics_port = free_port()?;
        let dir = control_plane
            .dir()
            .join(format!("cluster-api-{webhook_port}"));
        let cert_dir = dir.join("webhook-certs");
        std::fs::create_dir_all(&cert_dir).context("create webhook certificate folder")?;
        control_plane
            .ca()
            .issue_server("cluster-api-webhook", &["127.0.0.1", "localhost"])?
            .write(&cert_dir, "tls")?;

        let webhook_base = format!("https://127.0.0.1:{webhook_port}");
        let ca_bundle = ByteString(control_plane.ca().cert_pem().into_bytes());
        install_crds(
            control_plane,
            &config.join("crd"),
            &webhook_base,
            &ca_bundle,
        )
        .await?;
        install_webhook_configurations(
            control_plane,
            &config.join("webhook"),
            &webhook_base,
            &ca_bundle,
        )
        .await?;

        let mut command = Command::new(upstream.binary(Binary::ClusterApiManager)?);
        command.args([
            format!("--kubeconfig={}", control_plane.kubeconfig_path().display()),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", cert_dir.display()),
            format!("--health-addr=127.0.0.1:{health_port}"),
            format!("--diagnostics-address=127.0.0.1:{diagnostics_port}"),
            "--insecure-diagnostics=true".to_string(),
            "--leader-elect=false".to_string(),
        ]);
        let process = ManagedProcess::spawn(
            &format!("{}/cluster-api-manager", control_plane.name()),
            command,
            &dir.join("manager.log"),
        )?;
        let mut manager = Self {
            process,
            health_port,
            webhook_port,
        };
        manager.wait_ready().await?;
        Ok(manager)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let health = format!("127.0.0.1:{}", self.health_port);
        let process = &mut self.process;
        let ready = wait::until("Cluster API manager /readyz", READY_TIMEOUT, || {
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
                "Cluster API manager exited with {status} during start:\n{}",
                self.process.log_tail(30)
            ),
            Err(error) => Err(error.context(format!(
                "Cluster API manager log tail:\n{}",
                self.process.log_tail(30)
            ))),
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

/// Installs the Cluster API CRDs with their conversion webhook pointed at
/// `webhook_base`, as CAPI's `webhook_in_*.yaml` patches and CA injection do.
async fn install_crds(
    control_plane: &ControlPlane,
    crd_dir: &Path,
    webhook_base: &str,
    ca_bundle: &ByteString,
) -> anyhow::Result<()> {
    let mut crds = crds_of(read_documents(crd_dir)?)?;
    for crd in &mut crds {
        if crd.spec.versions.len() > 1 {
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

/// Installs CAPI's mutating and validating webhook configurations, each
/// webhook pointed at `webhook_base` + its service path.
async fn install_webhook_configurations(
    control_plane: &ControlPlane,
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
                config.metadata.name = Some("capi-mutating-webhook-configuration".into());
                for webhook in config.webhooks.iter_mut().flatten() {
                    to_url(&mut webhook.client_config)?;
                }
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .patch(
                        "capi-mutating-webhook-configuration",
                        &params,
                        &Patch::Apply(&config),
                    )
                    .await
                    .context("apply Cluster API mutating webhook configuration")?;
            }
            Some("ValidatingWebhookConfiguration") => {
                let mut config: ValidatingWebhookConfiguration = serde_json::from_value(document)?;
                config.metadata.name = Some("capi-validating-webhook-configuration".into());
                for webhook in config.webhooks.iter_mut().flatten() {
                    to_url(&mut webhook.client_config)?;
                }
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .patch(
                        "capi-validating-webhook-configuration",
                        &params,
                        &Patch::Apply(&config),
                    )
                    .await
                    .context("apply Cluster API validating webhook configuration")?;
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
