//! One reconcile of a ProxmoxCluster.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{LocalObjectReference, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tenantry_api::contract::{CLUSTER_NAME_LABEL, ClusterInitialization, READY_CONDITION};
use tenantry_api::generated::capi::machine_deployment::MachineDeployment;
use tenantry_api::generated::ipam::in_cluster_ip_pool::InClusterIpPool;
use tenantry_api::proxmox::{
    GATEWAY_METRIC_ANNOTATION, IP_FAMILY_ANNOTATION, InClusterZoneRef, IpFamily,
    PROXMOX_CREDENTIALS_FINALIZER, PROXMOX_ZONE_LABEL, ProxmoxCluster, ProxmoxClusterStatus,
    ProxmoxMachine, ProxmoxMachineTemplate,
};

use super::decide::{self, PRIVILEGES_SUFFICIENT, PROXMOX_AVAILABLE, TOKEN_SCOPED, reason};
use crate::capi::conditions::{self, DesiredCondition, Status};
use crate::capi::{owner, pause};
use crate::proxmox::client::{Permissions, ProxmoxClient, ProxmoxError, TaskWaitConfig};
use crate::proxmox::credentials::ClientCache;
use crate::reconciler::{self, Context, FIELD_MANAGER};

/// How often a ProxmoxCluster is looked at without any event.
const RESYNC: Duration = Duration::from_secs(60);
/// How long a preflight result stands while nothing it depends on changes.
const PREFLIGHT_TTL: Duration = Duration::from_secs(60);

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error<ProxmoxError>;

/// The last preflight of each cluster: what it was computed from, when, and
/// the conditions it gave.
type PreflightCache = HashMap<String, (u64, Instant, Vec<DesiredCondition>)>;

/// What ProxmoxCluster reconciles share.
pub struct ClusterContext {
    pub base: Arc<Context>,
    pub clients: ClientCache,
    preflights: Mutex<PreflightCache>,
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

enum Preflight {
    /// The API cannot be used with these credentials: the condition says why.
    Unavailable(DesiredCondition),
    /// A passing failure.
    Transient(ProxmoxError),
}

/// Probes the API and checks the token's permissions against what the
/// cluster's machines need. Cached while inputs are unchanged, since every
/// machine change wakes the cluster.
async fn preflight(
    ctx: &ClusterContext,
    object: &ProxmoxCluster,
    cluster_name: &str,
    machines: &[ProxmoxMachine],
) -> Result<Vec<DesiredCondition>, Preflight> {
    let client = match ctx
        .clients
        .client_for(&ctx.base.client, object, &TaskWaitConfig::default())
        .await
    {
        Ok(client) => client,
        Err(error) => {
            return Err(Preflight::Unavailable(DesiredCondition::false_(
                PROXMOX_AVAILABLE,
                error.reason(),
                error.to_string(),
            )));
        }
    };
    let mut specs: Vec<tenantry_api::proxmox::ProxmoxMachineSpec> =
        machines.iter().map(|m| m.spec.clone()).collect();
    specs.extend(
        template_specs(&ctx.base.client, object, cluster_name)
            .await
            .unwrap_or_default(),
    );
    let requirements = decide::requirements(&object.spec, specs.iter());
    let key = reconciler::object_key(object);
    let mut hasher = DefaultHasher::new();
    requirements.hash(&mut hasher);
    format!("{}{}", client.url(), client.token_id()).hash(&mut hasher);
    let fingerprint = hasher.finish();
    if let Some((cached, at, conditions)) =
        ctx.preflights.lock().expect("preflight cache").get(&key)
        && *cached == fingerprint
        && at.elapsed() < PREFLIGHT_TTL
    {
        return Ok(conditions.clone());
    }

    let version = match client.version().await {
        Ok(version) => version,
        Err(error) if error.is_transient() => return Err(Preflight::Transient(error)),
        Err(error) => {
            return Err(Preflight::Unavailable(DesiredCondition::false_(
                PROXMOX_AVAILABLE,
                error.reason(),
                format!("{}: {error}", client.url()),
            )));
        }
    };
    let permissions = read_permissions(&client, &decide::paths(&requirements))
        .await
        .map_err(Preflight::Transient)?;
    let missing = decide::missing(&requirements, &permissions);
    if !missing.is_empty() {
        tracing::info!(cluster = %object.metadata.name.as_deref().unwrap_or_default(), missing = missing.len(), "the Proxmox token lacks privileges the machines need");
    }
    let conditions = vec![
        DesiredCondition::true_(PROXMOX_AVAILABLE, reason::AVAILABLE).with_message(format!(
            "Proxmox VE {} at {} as {}",
            version.version,
            client.url(),
            client.token_id()
        )),
        decide::privileges_condition(&missing),
        decide::scope_condition(&permissions),
    ];
    ctx.preflights
        .lock()
        .expect("preflight cache")
        .insert(key, (fingerprint, Instant::now(), conditions.clone()));
    Ok(conditions)
}

/// The token's own effective privileges on each path.
async fn read_permissions(
    client: &ProxmoxClient,
    paths: &std::collections::BTreeSet<String>,
) -> Result<Permissions, ProxmoxError> {
    let mut all = Permissions::default();
    for path in paths {
        let answer = client.access().permissions(Some(path), None).await?;
        all.0
            .insert(path.clone(), answer.at(path).cloned().unwrap_or_default());
    }
    Ok(all)
}

/// The ProxmoxMachineTemplates the cluster's MachineDeployments stamp
/// machines from (and those labelled with the cluster, as ClusterClass
/// labels them): their machines do not exist yet but will need the same.
async fn template_specs(
    client: &kube::Client,
    object: &ProxmoxCluster,
    cluster_name: &str,
) -> kube::Result<Vec<tenantry_api::proxmox::ProxmoxMachineSpec>> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let templates: Api<ProxmoxMachineTemplate> = Api::namespaced(client.clone(), &namespace);
    let mut names: Vec<String> = Api::<MachineDeployment>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|md| md.spec.cluster_name == cluster_name)
        .map(|md| md.spec.template.spec.infrastructure_ref)
        .filter(|r| r.kind == "ProxmoxMachineTemplate")
        .map(|r| r.name)
        .collect();
    for template in templates
        .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster_name}")))
        .await?
    {
        names.extend(template.metadata.name);
    }
    names.sort();
    names.dedup();
    let mut specs = Vec::new();
    for name in names {
        if let Some(template) = templates.get_opt(&name).await? {
            specs.push(template.spec.template.spec);
        }
    }
    Ok(specs)
}

/// Adds tenantry's finalizer to the credentials Secret.
async fn hold_credentials(client: &kube::Client, namespace: &str, name: &str) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Some(secret) = secrets.get_opt(name).await? else {
        return Ok(());
    };
    let mut finalizers = secret.metadata.finalizers.clone().unwrap_or_default();
    if finalizers
        .iter()
        .any(|f| f == PROXMOX_CREDENTIALS_FINALIZER)
        || secret.metadata.deletion_timestamp.is_some()
    {
        return Ok(());
    }
    finalizers.push(PROXMOX_CREDENTIALS_FINALIZER.to_string());
    let patch = json!({ "metadata": { "resourceVersion": secret.metadata.resource_version, "finalizers": finalizers } });
    match secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Changed meanwhile: the next reconcile tries again.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Removes tenantry's finalizer from the credentials Secret unless another
/// ProxmoxCluster of the namespace still uses it.
async fn release_credentials(client: &kube::Client, object: &ProxmoxCluster) -> Result<(), Error> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let Ok(Some(name)) = object.spec.credentials_secret_name(&namespace) else {
        return Ok(());
    };
    let others = Api::<ProxmoxCluster>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| {
            c.metadata.uid != object.metadata.uid && c.metadata.deletion_timestamp.is_none()
        })
        .any(|c| c.spec.credentials_secret_name(&namespace).ok().flatten() == Some(name));
    if others {
        return Ok(());
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let Some(secret) = secrets.get_opt(name).await? else {
        return Ok(());
    };
    let finalizers: Vec<String> = secret.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers
        .iter()
        .any(|f| f == PROXMOX_CREDENTIALS_FINALIZER)
    {
        return Ok(());
    }
    let kept: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != PROXMOX_CREDENTIALS_FINALIZER)
        .collect();
    let patch = json!({ "metadata": { "resourceVersion": secret.metadata.resource_version, "finalizers": kept } });
    secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
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
