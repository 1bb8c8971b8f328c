//! Tenantry's own manager, run in-process against a harness control plane.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, Patch, PatchParams};
use tenantry_provider::reconciler::ManagerConfig;
use tenantry_provider::webhook::WebhookConfig;
use tenantry_provider::webhook::configuration::{
    MUTATING_CONFIGURATION_NAME, VALIDATING_CONFIGURATION_NAME, mutating_configuration,
    validating_configuration,
};
use tokio::task::JoinHandle;

use crate::control_plane::{ControlPlane, free_port};
use crate::manifests::FIELD_MANAGER;
use crate::wait;

/// A running tenantry manager. Dropping it (or [`TenantryManager::kill`])
/// aborts every controller at once, like a crashed process: nothing gets to
/// finish its current step.
pub struct TenantryManager {
    client: kube::Client,
    config: ManagerConfig,
    task: Option<JoinHandle<()>>,
}

/// The settings of a manager running outside the management cluster, as
/// here: tenant clusters are reached through their public endpoint
/// (`super-admin.conf`), since no cluster DNS resolves their Services.
pub fn out_of_cluster() -> ManagerConfig {
    ManagerConfig {
        tenant_kubeconfig_key: Some("super-admin.conf".into()),
        ..Default::default()
    }
}

impl TenantryManager {
    /// Starts all controllers with the given client.
    pub fn start(client: kube::Client) -> Self {
        Self::start_with(client, out_of_cluster())
    }

    /// Starts all controllers with the given settings.
    pub fn start_with(client: kube::Client, config: ManagerConfig) -> Self {
        let task = tokio::spawn(tenantry_provider::manager::run(
            client.clone(),
            config.clone(),
        ));
        Self {
            client,
            config,
            task: Some(task),
        }
    }

    /// Starts all controllers and the admission webhooks, with a serving
    /// certificate from the control plane's CA, and registers the webhooks
    /// with the apiserver by URL (as CAPI's harness does).
    pub async fn start_with_webhooks(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        Self::start_with_webhooks_and(control_plane, out_of_cluster()).await
    }

    /// [`Self::start_with_webhooks`] with other settings (its `webhook` is
    /// replaced by the served one).
    pub async fn start_with_webhooks_and(
        control_plane: &ControlPlane,
        config: ManagerConfig,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let cert_dir = control_plane.dir().join(format!("tenantry-webhook-{port}"));
        std::fs::create_dir_all(&cert_dir).context("create webhook certificate folder")?;
        control_plane
            .ca()
            .issue_server("tenantry-webhook", &["127.0.0.1", "localhost"])?
            .write(&cert_dir, "tls")?;
        let config = ManagerConfig {
            webhook: Some(WebhookConfig {
                bind: ([127, 0, 0, 1], port).into(),
                cert_dir,
            }),
            ..config
        };
        let manager = Self::start_with(control_plane.client(), config);
        wait::until(
            "tenantry's webhook server to listen",
            Duration::from_secs(30),
            || async move {
                Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()
                    .map(|_| ()))
            },
        )
        .await?;
        let ca_bundle = ByteString(control_plane.ca().cert_pem().into_bytes());
        let client_config = |path: &str| WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{port}{path}")),
            ca_bundle: Some(ca_bundle.clone()),
            service: None,
        };
        Api::<MutatingWebhookConfiguration>::all(control_plane.client())
            .patch(
                MUTATING_CONFIGURATION_NAME,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&mutating_configuration(client_config)),
            )
            .await
            .context("register tenantry's mutating webhooks")?;
        let configuration = validating_configuration(client_config);
        Api::<ValidatingWebhookConfiguration>::all(control_plane.client())
            .patch(
                VALIDATING_CONFIGURATION_NAME,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&configuration),
            )
            .await
            .context("register tenantry's validating webhooks")?;
        Ok(manager)
    }

    /// Whether the manager has stopped by itself (a controller failing
    /// for good, or asking to be restarted), as a process exits.
    pub fn has_stopped(&self) -> bool {
        self.task.as_ref().is_some_and(|task| task.is_finished())
    }

    /// Aborts the manager, as a crash would.
    pub fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Kills the manager and starts a fresh one: no state survives but what
    /// is in the apiserver.
    pub fn restart(&mut self) {
        self.kill();
        self.task = Some(tokio::spawn(tenantry_provider::manager::run(
            self.client.clone(),
            self.config.clone(),
        )));
    }
}

impl Drop for TenantryManager {
    fn drop(&mut self) {
        self.kill();
    }
}
