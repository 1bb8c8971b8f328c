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
            controllers(&client, &config).await;
            return Ok(());
        };
        let leading = crate::metrics::global();
        leading.set_leader(&election.name, false);
        let lease = election.name.clone();
        let mut leadership = leader::acquire(client.clone(), election).await?;
        leading.set_leader(&lease, true);
        let lost = tokio::select! {
            _ = controllers(&client, &config) => None,
            lost = leadership.lost() => Some(lost),
        };
        match lost {
            // Shutdown: hand over at once instead of after the Lease expires.
            None => {
                leadership.release().await;
                Ok(())
            }
            Some(lost) => Err(anyhow::anyhow!("leader election lost: {lost}")),
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
/// templates); the rest once Cluster API is served, in its version.
async fn controllers(client: &kube::Client, config: &ManagerConfig) {
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
        tokio::join!(
            crate::kubevirt::cluster::run(context("kubevirtcluster")),
            crate::kubevirt::machine::run(context("kubevirtmachine")),
            crate::proxmox::cluster::run(context("proxmoxcluster")),
            crate::proxmox::machine::run(context("proxmoxmachine")),
            crate::remediation::run_kubevirt(context("kubevirtremediation")),
            crate::remediation::run_proxmox(context("proxmoxremediation")),
            crate::tenant::run(context("kubernetes")),
            crate::tenant::kubernetes_nodes::controller::run(context("kubernetesnodes")),
        );
    };
    tokio::join!(
        template_capacity::run::<KubevirtMachineTemplate>(templates("kubevirtmachinetemplate")),
        template_capacity::run::<ProxmoxMachineTemplate>(templates("proxmoxmachinetemplate")),
        capi_controllers,
    );
}
