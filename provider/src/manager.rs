//! The manager: every controller of one tenantry process, the webhook
//! server and the metrics endpoint, run together; with leader election, the controllers only while
//! this replica leads.

use crate::capi::{CapiGeneration, template_capacity};
use crate::leader::{self, LeaderElectionConfig};
use crate::reconciler::{Context, ManagerConfig};
use tenantry_api::kubevirt::KubevirtMachineTemplate;
use tenantry_api::proxmox::ProxmoxMachineTemplate;

/// Runs every controller and the admission webhooks until shutdown, without
/// leader election (one replica).
pub async fn run(client: kube::Client, config: ManagerConfig) {
    if let Err(error) = run_elected(client, config, None).await {
        tracing::error!(error = format!("{error:#}"), "manager stopped");
    }
}

/// Runs the admission webhooks, and the controllers while this replica
/// leads (always, without `election`). Returns an error when leadership is
/// lost: the controllers have stopped writing then, and the process should
/// exit so that it starts over as a follower.
pub async fn run_elected(
    client: kube::Client,
    config: ManagerConfig,
    election: Option<LeaderElectionConfig>,
) -> anyhow::Result<()> {
    // Every replica serves webhooks: they decide on one object, alone.
    if config.webhook.is_some() {
        config.readiness.expect_webhooks();
    }
    let webhook = async {
        if let Some(webhook) = config.webhook.clone()
            && let Err(error) = crate::webhook::serve(
                webhook,
                Some(client.clone()),
                crate::webhook::kubernetes::Defaults::of(&config),
                config.readiness.clone(),
            )
            .await
        {
            tracing::error!(
                error = format!("{error:#}"),
                "admission webhooks are not served"
            );
        }
        futures::future::pending::<()>().await
    };
    let metrics = async {
        if let Some(metrics) = config.metrics.clone()
            && let Err(error) = crate::metrics::serve(metrics, client.clone()).await
        {
            tracing::error!(error = format!("{error:#}"), "metrics are not served");
        }
        futures::future::pending::<()>().await
    };
    let lead = async {
        let Some(election) = election else {
            return controllers(&client, &config).await;
        };
        let leading = crate::metrics::global();
        leading.set_leader(&election.name, false);
        let lease = election.name.clone();
        let mut leadership = leader::acquire(client.clone(), election).await?;
        leading.set_leader(&lease, true);
        let outcome = tokio::select! {
            stopped = controllers(&client, &config) => Ok(stopped),
            lost = leadership.lost() => Err(lost),
        };
        match outcome {
            // Shutdown, or a restart asked for: hand over at once instead
            // of after the Lease expires.
            Ok(stopped) => {
                leadership.release().await;
                stopped
            }
            Err(lost) => Err(anyhow::anyhow!("leader election lost: {lost}")),
        }
    };
    tokio::select! {
        result = lead => result,
        _ = webhook => Ok(()),
        _ = metrics => Ok(()),
    }
}

/// Every controller; completes on shutdown. The template capacity
/// controllers start at once (they read and write only tenantry's
/// templates); the rest once Cluster API is served, in its version. Fails
/// when Cluster API starts serving another generation: every cache and
/// watch is in the old one, so the process exits and its restart (the
/// Deployment's) reads the new one.
async fn controllers(client: &kube::Client, config: &ManagerConfig) -> anyhow::Result<()> {
    let templates = |controller: &str| {
        // Never reads Cluster API kinds: the generation is not looked at.
        Context::new(
            client.clone(),
            config.clone(),
            CapiGeneration::V1beta2,
            controller,
        )
    };
    let capi_controllers = async {
        let capi = CapiGeneration::wait_until_served(client).await;
        let context =
            |controller: &str| Context::new(client.clone(), config.clone(), capi, controller);
        let running = async {
            tokio::join!(
                crate::kubevirt::cluster::run(context("kubevirtcluster")),
                crate::kubevirt::machine::run(context("kubevirtmachine")),
                crate::proxmox::cluster::run(context("proxmoxcluster")),
                crate::proxmox::machine::run(context("proxmoxmachine")),
                crate::remediation::run_kubevirt(context("kubevirtremediation")),
                crate::remediation::run_proxmox(context("proxmoxremediation")),
                crate::tenant::run(context("kubernetes")),
                crate::tenant::kubernetes_nodes::controller::run(context("kubernetesnodes")),
            )
        };
        tokio::select! {
            _ = running => Ok(()),
            served = CapiGeneration::changed_from(client, capi) => Err(anyhow::anyhow!(
                "Cluster API now serves {} instead of {}: restarting to read it",
                served.version(),
                capi.version()
            )),
        }
    };
    let templates_running = async {
        tokio::join!(
            template_capacity::run::<KubevirtMachineTemplate>(templates("kubevirtmachinetemplate")),
            template_capacity::run::<ProxmoxMachineTemplate>(templates("proxmoxmachinetemplate")),
        );
    };
    tokio::select! {
        stopped = capi_controllers => stopped,
        _ = templates_running => Ok(()),
    }
}
