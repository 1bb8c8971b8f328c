//! What a ProxmoxCluster reconcile reads: the token's permissions (the
//! preflight, cached while nothing it depends on changes) and the
//! templates its machines name.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use kube::api::{Api, ListParams};
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::generated::capi::machine_deployment::MachineDeployment;
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine, ProxmoxMachineTemplate};

use super::decide::{self, PROXMOX_AVAILABLE, Reason};
use crate::capi::conditions::DesiredCondition;
use crate::proxmox::client::{Permissions, ProxmoxClient, ProxmoxError, TaskWaitConfig};
use crate::reconciler::{self};

use super::reconcile::*;

pub(super) enum Preflight {
    /// The API cannot be used with these credentials: the condition says why.
    Unavailable(DesiredCondition),
    /// A passing failure.
    Transient(ProxmoxError),
}

/// Probes the API and checks the token's permissions against what the
/// cluster's machines need. Cached while inputs are unchanged, since every
/// machine change wakes the cluster.
pub(super) async fn preflight(
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
        template_specs(&ctx.base.client, ctx.base.capi, object, cluster_name)
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
        DesiredCondition::true_(PROXMOX_AVAILABLE, Reason::Available.as_str()).with_message(
            format!(
                "Proxmox VE {} at {} as {}",
                version.version,
                client.url(),
                client.token_id()
            ),
        ),
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
pub(super) async fn read_permissions(
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
pub(super) async fn template_specs(
    client: &kube::Client,
    generation: crate::capi::CapiGeneration,
    object: &ProxmoxCluster,
    cluster_name: &str,
) -> kube::Result<Vec<tenantry_api::proxmox::ProxmoxMachineSpec>> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let templates: Api<ProxmoxMachineTemplate> = Api::namespaced(client.clone(), &namespace);
    let deployments: Vec<MachineDeployment> =
        crate::capi::access::list(client, generation, &namespace, &ListParams::default()).await?;
    let mut names: Vec<String> = deployments
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

/// The ProxmoxMachines of the cluster `cluster_name`.
pub(super) async fn cluster_machines(
    client: &kube::Client,
    namespace: &str,
    cluster_name: &str,
) -> Result<Vec<ProxmoxMachine>, kube::Error> {
    Ok(Api::<ProxmoxMachine>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster_name}")))
        .await?
        .items)
}
