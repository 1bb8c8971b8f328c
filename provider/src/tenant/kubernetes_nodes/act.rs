//! What a pool reconcile writes: the CAPI objects of its workers, the
//! tenant-side join objects, replica clamps, and the templates no
//! MachineSet uses any more.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource as _;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tenantry_api::tenant::Kubernetes;
use tenantry_api::tenant_nodes::KubernetesNodes;

use super::render::{self as pool, POOL_LABEL, PoolNames};
use crate::capi::{CapiGeneration, CapiKind};
use crate::reconciler::{Context, FIELD_MANAGER};
use crate::tenant::access::{self, AccessError};
use crate::tenant::kubernetes::act::{delete_if_present, resource};
use crate::tenant::pki;

use super::decide::tenant_join_objects;
use super::observe::Trust;
use super::reconcile::Error;

pub(super) fn talos_config_template_resource() -> ApiResource {
    resource(
        "bootstrap.cluster.x-k8s.io",
        "v1alpha3",
        "TalosConfigTemplate",
        "talosconfigtemplates",
    )
}

pub(super) fn machine_template_resource(kind: &str) -> ApiResource {
    match kind {
        "ProxmoxMachineTemplate" => resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha2",
            kind,
            "proxmoxmachinetemplates",
        ),
        _ => resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            kind,
            "kubevirtmachinetemplates",
        ),
    }
}

pub(super) fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

pub(super) fn owner_reference(pool: &KubernetesNodes) -> OwnerReference {
    OwnerReference {
        api_version: KubernetesNodes::api_version(&()).into_owned(),
        kind: KubernetesNodes::kind(&()).into_owned(),
        name: pool.metadata.name.clone().unwrap_or_default(),
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub(super) async fn apply(
    api: &Api<DynamicObject>,
    mut object: Value,
    owner: &OwnerReference,
) -> Result<DynamicObject, Error> {
    object["metadata"]["ownerReferences"] = json!([owner]);
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(api
        .patch(&name, &apply_params(), &Patch::Apply(&object))
        .await?)
}

pub(super) async fn ensure_tenant_join(
    ctx: &Context,
    kubernetes: &Kubernetes,
    trust: &Trust,
) -> Result<(), AccessError> {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let tenant = access::tenant_client(&ctx.client, &ctx.config, namespace, name).await?;
    let id = trust
        .secrets
        .get(pki::TALOS_BOOTSTRAP_TOKEN_ID_KEY)
        .cloned()
        .unwrap_or_default();
    let secret = trust
        .secrets
        .get(pki::TALOS_BOOTSTRAP_TOKEN_SECRET_KEY)
        .cloned()
        .unwrap_or_default();
    for (resource, namespace, object) in tenant_join_objects(&id, &secret) {
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => Api::namespaced_with(tenant.clone(), namespace, &resource),
            None => Api::all_with(tenant.clone(), &resource),
        };
        let object_name = object["metadata"]["name"].as_str().unwrap_or_default();
        api.patch(object_name, &apply_params(), &Patch::Apply(&object))
            .await?;
    }
    Ok(())
}

/// Keeps the MachineDeployment's replicas within min/maxReplicas: what the
/// cluster autoscaler's `--enforce-node-group-min-size` does, so that
/// raising minReplicas adds workers with or without an autoscaler. The
/// replicas field is patched, never applied, so the autoscaler keeps
/// owning it between the bounds.
pub(super) async fn clamp_replicas(
    deployments: &Api<DynamicObject>,
    deployment: &DynamicObject,
    pool: &KubernetesNodes,
) -> Result<Option<i64>, Error> {
    let Some(current) = deployment.data["spec"]["replicas"].as_i64() else {
        return Ok(None);
    };
    let wanted = current.clamp(
        i64::from(pool.spec.min_replicas),
        i64::from(pool.spec.max_replicas),
    );
    if wanted != current {
        let name = deployment.metadata.name.clone().unwrap_or_default();
        deployments
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "replicas": wanted } })),
            )
            .await?;
    }
    Ok(Some(wanted))
}

/// Deletes the pool's templates of one kind (machine or bootstrap, the
/// MachineSets naming them at `reference`) that are neither current nor still
/// used by a MachineSet (a rollout in progress, or old workers kept).
pub(super) async fn collect_old_templates(
    client: &kube::Client,
    generation: CapiGeneration,
    namespace: &str,
    names: &PoolNames,
    resource: &ApiResource,
    reference: &str,
    current: &str,
) -> Result<(), Error> {
    let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let sets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &generation.resource(CapiKind::MachineSet),
    );
    let selector = format!("{}={}", pool::DEPLOYMENT_NAME_LABEL, names.objects);
    let in_use: BTreeSet<String> = sets
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .filter_map(|s| s.data.pointer(reference)?.as_str().map(str::to_string))
        .collect();
    let own = ListParams::default().labels(&format!("{POOL_LABEL}={}", names.pool_object));
    for template in templates.list(&own).await?.items {
        let name = template.metadata.name.clone().unwrap_or_default();
        if name != current
            && !in_use.contains(&name)
            && template.metadata.deletion_timestamp.is_none()
        {
            tracing::info!(%namespace, template = %name, kind = %resource.kind, "deleting a template no MachineSet uses");
            delete_if_present(&templates, &name).await?;
        }
    }
    Ok(())
}
