//! The manager: every controller of one tenantry process, and the webhook
//! server, run together.

use crate::runtime::{Context, ManagerConfig};

/// Runs all controllers until each has shut down (on SIGTERM/SIGINT, or when
/// the future is dropped — tests abort it to simulate a crash). The webhook
/// server, when configured, runs alongside; if it cannot start, that is
/// logged and the controllers keep running.
pub async fn run(client: kube::Client, config: ManagerConfig) {
    let context = |controller: &str| Context::new(client.clone(), config.clone(), controller);
    // Never completes: the manager's lifetime is the controllers'.
    let webhook = async {
        if let Some(webhook) = config.webhook.clone()
            && let Err(error) = crate::webhook::serve(webhook, Some(client.clone())).await
        {
            tracing::error!(
                error = format!("{error:#}"),
                "admission webhooks are not served"
            );
        }
        futures::future::pending::<()>().await
    };
    let controllers = async {
        tokio::join!(
            crate::kubevirt::cluster::run(context("kubevirtcluster")),
            crate::kubevirt::machine::run(context("kubevirtmachine")),
            crate::kubevirt::template::run(context("kubevirtmachinetemplate")),
            crate::proxmox::cluster::run(context("proxmoxcluster")),
            crate::proxmox::machine::run(context("proxmoxmachine")),
            crate::proxmox::template::run(context("proxmoxmachinetemplate")),
            crate::remediation::run_kubevirt(context("kubevirtremediation")),
            crate::remediation::run_proxmox(context("proxmoxremediation")),
            crate::tenant::run(context("kubernetes")),
            crate::tenant::pool_controller::run(context("kubernetesnodes")),
        );
    };
    tokio::select! {
        _ = controllers => {}
        _ = webhook => {}
    }
}
