//! One reconcile of a ProxmoxCluster.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::contract::READY_CONDITION;
use tenantry_api::generated::ipam::in_cluster_ip_pool::InClusterIpPool;
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine};

use super::act::{apply_pools, delete_owned_pools, hold_credentials, release_credentials};
use super::decide::{self, PROXMOX_AVAILABLE, Reason};
use super::observe::{Preflight, cluster_machines, preflight};
use super::status::{Report, report};
use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::{owner, pause};
use crate::proxmox::client::ProxmoxError;
use crate::proxmox::credentials::ClientCache;
use crate::reconciler::{self, Context};

/// How often a ProxmoxCluster is looked at without any event.
pub(super) const RESYNC: Duration = Duration::from_secs(60);
/// How long a preflight result stands while nothing it depends on changes.
pub(super) const PREFLIGHT_TTL: Duration = Duration::from_secs(60);

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error<ProxmoxError>;

/// The last preflight of each cluster: what it was computed from, when, and
/// the conditions it gave.
pub(super) type PreflightCache = HashMap<String, (u64, Instant, Vec<DesiredCondition>)>;

/// What ProxmoxCluster reconciles share.
pub struct ClusterContext {
    pub base: Arc<Context>,
    pub clients: ClientCache,
    pub(super) preflights: Mutex<PreflightCache>,
}

impl AsRef<Context> for ClusterContext {
    fn as_ref(&self) -> &Context {
        &self.base
    }
}

impl ClusterContext {
    pub fn new(base: Arc<Context>) -> Self {
        Self {
            base,
            clients: ClientCache::default(),
            preflights: Mutex::default(),
        }
    }
}

/// The name of the Cluster a ProxmoxCluster belongs to: its owner, else
/// CAPI's label.
pub fn owner_cluster_name(object: &ProxmoxCluster) -> Option<String> {
    owner::owning_cluster_name(&object.metadata)
}

pub async fn apply(object: Arc<ProxmoxCluster>, ctx: &ClusterContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let name = object.metadata.name.clone().unwrap_or_default();
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let api: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &namespace);
    let mut status = object.status.clone().unwrap_or_default();

    let Some(cluster_name) = owner_cluster_name(&object) else {
        report(
            &api,
            &object,
            status,
            Report::not_ready(
                Reason::WaitingForOwnerCluster.as_str(),
                "no Cluster owns this ProxmoxCluster yet",
            ),
        )
        .await?;
        return Ok(Action::await_change());
    };
    let cluster = owner::get_cluster(client, ctx.base.capi, &namespace, &cluster_name).await?;
    let paused = pause::paused_by(cluster.as_ref(), &object.metadata);
    if paused.is_some() {
        let mut list = status.conditions.take().unwrap_or_default();
        conditions::set(
            &mut list,
            &pause::paused_condition(paused),
            object.metadata.generation,
            &Timestamp::now(),
        );
        status.conditions = Some(list);
        reconciler::apply_status(&api, object.as_ref(), object.status.as_ref(), &status).await?;
        return Ok(Action::await_change());
    }

    // The machines' address pools.
    let pools = match decide::endpoint_outside_pools(&object.spec).and_then(|()| {
        object
            .spec
            .desired_ip_pools(&name)
            .map_err(|e| e.to_string())
    }) {
        Ok(pools) => pools,
        Err(message) => {
            report(
                &api,
                &object,
                status,
                Report::not_ready(Reason::InvalidAddressPool.as_str(), message.clone()),
            )
            .await?;
            let previous = object
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .and_then(|c| conditions::get(c, READY_CONDITION))
                .map(|c| c.reason.as_str());
            if previous != Some(Reason::InvalidAddressPool.as_str()) {
                ctx.base
                    .event(
                        object.as_ref(),
                        EventType::Warning,
                        Reason::InvalidAddressPool.as_str(),
                        message,
                    )
                    .await;
            }
            return Ok(Action::requeue(RESYNC));
        }
    };
    let owner = object.controller_owner_ref(&());
    let desired: Vec<InClusterIpPool> = pools
        .iter()
        .map(|pool| decide::pool_object(pool, &namespace, &cluster_name, owner.clone()))
        .collect();
    apply_pools(client, &namespace, &desired).await?;
    (status.in_cluster_ip_pool_ref, status.in_cluster_zone_ref) = decide::pool_references(&pools);

    // Where the machines run.
    let machines = cluster_machines(client, &namespace, &cluster_name).await?;
    let refs: Vec<&ProxmoxMachine> = machines.iter().collect();
    status.node_locations = decide::node_locations(&refs);

    // The credentials: kept while the cluster exists, so deleting the
    // namespace cannot strand machines without them.
    if let Ok(Some(secret)) = object.spec.credentials_secret_name(&namespace) {
        hold_credentials(client, &namespace, secret).await?;
    }

    let (available, mut proxmox_conditions) =
        match preflight(ctx, &object, &cluster_name, &machines).await {
            Ok(conditions) => (true, conditions),
            Err(Preflight::Unavailable(condition)) => (false, vec![condition]),
            Err(Preflight::Transient(error)) => {
                // Keep what the last preflight said; a flaky answer is no news.
                tracing::debug!(cluster = %name, %error, "preflight failed; retrying");
                let was_available = status
                    .conditions
                    .as_deref()
                    .is_some_and(|c| conditions::is_true(c, PROXMOX_AVAILABLE));
                if !was_available {
                    report(
                        &api,
                        &object,
                        status,
                        Report::not_ready(error.reason(), format!("Proxmox VE: {error}")),
                    )
                    .await?;
                    return Err(error.into());
                }
                (true, Vec::new())
            }
        };

    let endpoint_set = object
        .spec
        .control_plane_endpoint
        .as_ref()
        .is_some_and(|e| e.is_set());
    let external = object.spec.external_managed_control_plane.unwrap_or(false);
    let ready = decide::ready_condition(
        (!available).then(|| &proxmox_conditions[0]),
        endpoint_set,
        external,
    );
    let provisioned = ready.is_true();
    proxmox_conditions.push(ready);
    proxmox_conditions.push(pause::paused_condition(None));
    let previous = status.conditions.clone().unwrap_or_default();
    report(
        &api,
        &object,
        status,
        Report {
            conditions: proxmox_conditions.clone(),
            provisioned: provisioned.then_some(true),
        },
    )
    .await?;
    for condition in decide::new_warnings(&proxmox_conditions, &previous) {
        ctx.base
            .event(
                object.as_ref(),
                EventType::Warning,
                &condition.reason,
                condition.message.clone(),
            )
            .await;
    }
    Ok(Action::requeue(RESYNC))
}

/// Deletion waits for the cluster's ProxmoxMachines (they need the
/// credentials and the pools), then removes the InClusterIPPools and lets
/// go of the credentials Secret.
pub async fn cleanup(object: Arc<ProxmoxCluster>, ctx: &ClusterContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let api: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &namespace);
    if let Some(cluster_name) = owner_cluster_name(&object) {
        let machines = cluster_machines(client, &namespace, &cluster_name).await?;
        if !machines.is_empty() {
            let names: Vec<String> = machines
                .iter()
                .filter_map(|m| m.metadata.name.clone())
                .collect();
            let message = format!(
                "waiting for {} ProxmoxMachine(s) to be deleted: {}",
                names.len(),
                names.join(", ")
            );
            let status = object.status.clone().unwrap_or_default();
            report(
                &api,
                &object,
                status,
                Report::not_ready(Reason::Deleting.as_str(), message.clone()),
            )
            .await?;
            return Err(Error::Waiting(message, Duration::from_secs(2)));
        }
    }
    let uid = object.metadata.uid.clone().unwrap_or_default();
    let left = delete_owned_pools(client, &namespace, &uid).await?;
    if !left.is_empty() {
        let message = format!(
            "waiting for InClusterIPPools {} to be deleted",
            left.join(", ")
        );
        return Err(Error::Waiting(message, Duration::from_secs(2)));
    }
    release_credentials(client, &object).await?;
    tracing::info!(cluster = object.metadata.name.as_deref().unwrap_or_default(), %namespace, "ProxmoxCluster cleaned up");
    Ok(Action::await_change())
}
