//! One reconcile of a ProxmoxCluster.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::contract::{CLUSTER_NAME_LABEL, ClusterInitialization, READY_CONDITION};
use tenantry_api::generated::ipam::in_cluster_ip_pool::InClusterIpPool;
use tenantry_api::proxmox::{
    GATEWAY_METRIC_ANNOTATION, IP_FAMILY_ANNOTATION, InClusterZoneRef, IpFamily,
    PROXMOX_ZONE_LABEL, ProxmoxCluster, ProxmoxClusterStatus, ProxmoxMachine,
};

use super::act::{hold_credentials, release_credentials};
use super::decide::{self, PRIVILEGES_SUFFICIENT, PROXMOX_AVAILABLE, TOKEN_SCOPED, reason};
use super::observe::{Preflight, preflight};
use crate::capi::conditions::{self, DesiredCondition, Status};
use crate::capi::{owner, pause};
use crate::proxmox::client::ProxmoxError;
use crate::proxmox::credentials::ClientCache;
use crate::reconciler::{self, Context, FIELD_MANAGER};

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
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
        .or_else(|| owner::cluster_name(&object.metadata).map(str::to_string))
}

/// The outcome a reconcile reports.
#[derive(Default)]
struct Report {
    conditions: Vec<DesiredCondition>,
    provisioned: Option<bool>,
}

impl Report {
    fn not_ready(reason: &str, message: impl Into<String>) -> Self {
        Self {
            conditions: vec![DesiredCondition::false_(READY_CONDITION, reason, message)],
            provisioned: None,
        }
    }
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
                reason::WAITING_FOR_OWNER_CLUSTER,
                "no Cluster owns this ProxmoxCluster yet",
            ),
        )
        .await?;
        return Ok(Action::await_change());
    };
    let cluster = owner::get_cluster(client, &namespace, &cluster_name).await?;
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
                Report::not_ready(reason::INVALID_ADDRESS_POOL, message.clone()),
            )
            .await?;
            let previous = object
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .and_then(|c| conditions::get(c, READY_CONDITION))
                .map(|c| c.reason.as_str());
            if previous != Some(reason::INVALID_ADDRESS_POOL) {
                ctx.base
                    .event(
                        object.as_ref(),
                        EventType::Warning,
                        reason::INVALID_ADDRESS_POOL,
                        message,
                    )
                    .await;
            }
            return Ok(Action::requeue(RESYNC));
        }
    };
    let pool_api: Api<InClusterIpPool> = Api::namespaced(client.clone(), &namespace);
    let mut default_refs = Vec::new();
    let mut zone_refs: BTreeMap<String, InClusterZoneRef> = BTreeMap::new();
    for pool in &pools {
        let mut labels = BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), cluster_name.clone())]);
        if let Some(zone) = &pool.zone {
            labels.insert(PROXMOX_ZONE_LABEL.to_string(), zone.clone());
        }
        let desired = InClusterIpPool {
            metadata: ObjectMeta {
                name: Some(pool.name.clone()),
                namespace: Some(namespace.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([
                    (
                        IP_FAMILY_ANNOTATION.to_string(),
                        pool.family.annotation_value().to_string(),
                    ),
                    (
                        GATEWAY_METRIC_ANNOTATION.to_string(),
                        pool.gateway_metric.to_string(),
                    ),
                ])),
                owner_references: object.controller_owner_ref(&()).map(|o| vec![o]),
                ..Default::default()
            },
            spec: pool.spec.clone(),
            status: None,
        };
        pool_api
            .patch(
                &pool.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await?;
        let reference = LocalObjectReference {
            name: pool.name.clone(),
        };
        match &pool.zone {
            None => default_refs.push(reference),
            Some(zone) => {
                let entry = zone_refs
                    .entry(zone.clone())
                    .or_insert_with(|| InClusterZoneRef {
                        zone: zone.clone(),
                        ..Default::default()
                    });
                match pool.family {
                    IpFamily::V4 => entry.in_cluster_ip_pool_ref_v4 = Some(reference),
                    IpFamily::V6 => entry.in_cluster_ip_pool_ref_v6 = Some(reference),
                }
            }
        }
    }
    status.in_cluster_ip_pool_ref = (!default_refs.is_empty()).then_some(default_refs);
    status.in_cluster_zone_ref = (!zone_refs.is_empty()).then(|| zone_refs.into_values().collect());

    // Where the machines run.
    let machines: Vec<ProxmoxMachine> =
        Api::<ProxmoxMachine>::namespaced(client.clone(), &namespace)
            .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster_name}")))
            .await?
            .items;
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
    let ready = if !available {
        let condition = &proxmox_conditions[0];
        DesiredCondition::false_(
            READY_CONDITION,
            condition.reason.clone(),
            condition.message.clone(),
        )
    } else if !endpoint_set && !external {
        DesiredCondition::false_(
            READY_CONDITION,
            reason::WAITING_FOR_ENDPOINT,
            "spec.controlPlaneEndpoint is not set (set it, or externalManagedControlPlane for a control plane provider that sets it)",
        )
    } else {
        DesiredCondition::true_(READY_CONDITION, reason::PROVISIONED)
    };
    let provisioned = ready.is_true();
    proxmox_conditions.push(ready);
    proxmox_conditions.push(pause::paused_condition(None));
    // Warn once per change, not once per reconcile.
    let before: Vec<(String, String)> = proxmox_conditions
        .iter()
        .map(|c| {
            let previous = status
                .conditions
                .as_deref()
                .and_then(|list| conditions::get(list, c.type_));
            (
                previous.map(|p| p.status.clone()).unwrap_or_default(),
                previous.map(|p| p.reason.clone()).unwrap_or_default(),
            )
        })
        .collect();
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
    for (condition, (status_before, reason_before)) in proxmox_conditions.iter().zip(before) {
        let warned_type = matches!(
            condition.type_,
            TOKEN_SCOPED | PRIVILEGES_SUFFICIENT | PROXMOX_AVAILABLE
        );
        let warn = warned_type
            && condition.status == Status::False
            && (status_before != "False" || reason_before != condition.reason);
        if warn {
            ctx.base
                .event(
                    object.as_ref(),
                    EventType::Warning,
                    &condition.reason,
                    condition.message.clone(),
                )
                .await;
        }
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
        let machines = Api::<ProxmoxMachine>::namespaced(client.clone(), &namespace)
            .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster_name}")))
            .await?;
        if !machines.items.is_empty() {
            let names: Vec<String> = machines
                .items
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
                Report::not_ready(reason::DELETING, message.clone()),
            )
            .await?;
            return Err(Error::Waiting(message, Duration::from_secs(2)));
        }
    }
    let pools: Api<InClusterIpPool> = Api::namespaced(client.clone(), &namespace);
    let uid = object.metadata.uid.clone().unwrap_or_default();
    let mut left = Vec::new();
    for pool in pools.list(&ListParams::default()).await? {
        let owned = pool
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid);
        if !owned {
            continue;
        }
        let pool_name = pool.metadata.name.clone().unwrap_or_default();
        if pool.metadata.deletion_timestamp.is_none() {
            match pools.delete(&pool_name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(error) => return Err(error.into()),
            }
        }
        left.push(pool_name);
    }
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

async fn report(
    api: &Api<ProxmoxCluster>,
    object: &ProxmoxCluster,
    mut status: ProxmoxClusterStatus,
    outcome: Report,
) -> Result<(), Error> {
    let now = Timestamp::now();
    let mut list = status.conditions.take().unwrap_or_default();
    for condition in &outcome.conditions {
        conditions::set(&mut list, condition, object.metadata.generation, &now);
    }
    status.conditions = Some(list);
    if outcome.provisioned == Some(true) {
        // Provisioning is recorded once and never taken back (v1beta2).
        status.ready = true;
        status.initialization = Some(ClusterInitialization {
            provisioned: Some(true),
        });
    } else if status.initialization.is_none() {
        status.initialization = Some(ClusterInitialization {
            provisioned: Some(false),
        });
    }
    reconciler::apply_status(api, object, object.status.as_ref(), &status).await?;
    Ok(())
}
