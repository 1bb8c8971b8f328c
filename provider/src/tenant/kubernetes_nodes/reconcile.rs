//! The reconcile of one `KubernetesNodes` pool: its machine template,
//! Talos bootstrap template, MachineDeployment and MachineHealthCheck in the
//! management namespace; the bootstrap token and the RBAC joining workers
//! need inside the tenant cluster; the pool's size kept within
//! min/maxReplicas; and a status saying how many workers are Ready.
//! Deletion takes the workers down first, then the pool's objects.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::{Value, json};
use tenantry_api::tenant::{Kubernetes, cluster_name};
use tenantry_api::tenant_nodes::{
    KubernetesNodes, KubernetesNodesStatus, READY_CONDITION, WORKERS_READY_CONDITION,
};

use super::render::{self as pool, POOL_LABEL, PoolNames};
use crate::capi::conditions::{self, DesiredCondition};
use crate::reconciler::{self, Context, FIELD_MANAGER, ReconcileError};
use crate::tenant::access::{self, AccessError};
use crate::tenant::kubernetes::act::{delete_if_present, resource, secret_value};
use crate::tenant::kubernetes::render;
use crate::tenant::pki;
use crate::tenant::talos::{self, WorkerTrust};

/// How often a pool on its way up is looked at again.
const POLL: Duration = Duration::from_secs(5);
/// How often a Ready pool is looked at again.
const RESYNC: Duration = Duration::from_secs(300);

/// Condition reasons.
pub mod reason {
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    pub const CLUSTER_DELETING: &str = "ClusterDeleting";
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlane";
    pub const TENANT_UNREACHABLE: &str = "TenantUnreachable";
    pub const APPLY_FAILED: &str = "ApplyFailed";
    pub const SCALING: &str = "Scaling";
    pub const ROLLING_OUT: &str = "RollingOut";
    pub const WORKERS_NOT_READY: &str = "WorkersNotReady";
    pub const WORKERS_READY: &str = "WorkersReady";
    pub const NO_WORKERS: &str = "NoWorkersWanted";
    pub const READY: &str = "Ready";
}

/// Tenant-side names.
const BOOTSTRAP_TOKEN_NAMESPACE: &str = "kube-system";
const BOOTSTRAP_TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group kubeadm gives node bootstrap tokens; Kamaji's (kubeadm's) RBAC
/// lets it create and auto-approve kubelet CSRs.
const NODE_BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("waiting: {0}")]
    Waiting(String, Duration),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl ReconcileError for Error {
    fn wait(&self) -> Option<Duration> {
        match self {
            Error::Waiting(_, delay) => Some(*delay),
            Error::Finalizer(inner) => reconciler::finalizer_wait(inner),
            _ => None,
        }
    }
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(error: kube::runtime::finalizer::Error<Error>) -> Self {
        Error::Finalizer(Box::new(error))
    }
}

pub fn machine_deployment_resource() -> ApiResource {
    resource(
        "cluster.x-k8s.io",
        "v1beta2",
        "MachineDeployment",
        "machinedeployments",
    )
}
fn machine_health_check_resource() -> ApiResource {
    resource(
        "cluster.x-k8s.io",
        "v1beta2",
        "MachineHealthCheck",
        "machinehealthchecks",
    )
}
fn machine_set_resource() -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", "MachineSet", "machinesets")
}
fn machine_resource() -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
}
fn talos_config_template_resource() -> ApiResource {
    resource(
        "bootstrap.cluster.x-k8s.io",
        "v1alpha3",
        "TalosConfigTemplate",
        "talosconfigtemplates",
    )
}
fn machine_template_resource(kind: &str) -> ApiResource {
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

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

fn owner_reference(pool: &KubernetesNodes) -> OwnerReference {
    OwnerReference {
        api_version: KubernetesNodes::api_version(&()).into_owned(),
        kind: KubernetesNodes::kind(&()).into_owned(),
        name: pool.metadata.name.clone().unwrap_or_default(),
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

async fn apply(
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

/// What a worker config needs from the management namespace, or why it is
/// not there yet.
struct Trust {
    secrets: BTreeMap<String, String>,
    talos_ca: String,
    kubernetes_ca: String,
    service_ip: Option<String>,
}

async fn read_trust(client: &kube::Client, kubernetes: &Kubernetes) -> Result<Trust, Error> {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let waiting = |what: String| Error::Waiting(what, POLL);
    let talos_secrets = secrets
        .get_opt(&render::talos_secrets_name(name))
        .await?
        .ok_or_else(|| {
            waiting(format!(
                "Secret {} is not there yet",
                render::talos_secrets_name(name)
            ))
        })?;
    let talos_ca = secrets
        .get_opt(&render::talos_ca_name(name))
        .await?
        .and_then(|s| secret_value(&s, pki::TLS_CERT_KEY))
        .ok_or_else(|| {
            waiting(format!(
                "Secret {} is not there yet",
                render::talos_ca_name(name)
            ))
        })?;
    // Kamaji writes the cluster CA as CAPI's `<cluster>-ca` once the
    // control plane runs.
    let ca_name = format!("{}-ca", cluster_name(name));
    let kubernetes_ca = secrets
        .get_opt(&ca_name)
        .await?
        .and_then(|s| secret_value(&s, pki::TLS_CERT_KEY))
        .ok_or_else(|| {
            waiting(format!(
                "the control plane's CA (Secret {ca_name}) is not there yet"
            ))
        })?;
    let service_ip = Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(&cluster_name(name))
        .await?
        .and_then(|s| s.spec?.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None");
    let secrets = talos_secrets
        .data
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| Some((k, String::from_utf8(v.0).ok()?)))
        .collect();
    Ok(Trust {
        secrets,
        talos_ca,
        kubernetes_ca,
        service_ip,
    })
}

/// The bootstrap token and the RBAC that let a worker's kubelet join, in
/// the tenant cluster: the token Secret kubeadm's format defines, CSR
/// creation and auto-approval for the token's group, certificate rotation
/// for nodes, and read access to endpoints for system:nodes.
fn tenant_join_objects(
    token_id: &str,
    token_secret: &str,
) -> Vec<(ApiResource, Option<&'static str>, Value)> {
    let b64 = |s: &str| ByteString(s.as_bytes().to_vec());
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("bootstrap-token-{token_id}"),
            "namespace": BOOTSTRAP_TOKEN_NAMESPACE,
            "labels": { "app.kubernetes.io/managed-by": "tenantry" },
        },
        "type": BOOTSTRAP_TOKEN_TYPE,
        "data": {
            "description": b64("Talos worker join token, managed by tenantry"),
            "token-id": b64(token_id),
            "token-secret": b64(token_secret),
            "usage-bootstrap-authentication": b64("true"),
            "usage-bootstrap-signing": b64("true"),
            "auth-extra-groups": b64(NODE_BOOTSTRAP_GROUP),
        },
    });
    let binding = |name: &str, role: &str, group: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group }],
        })
    };
    let cluster_role_binding = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
        "clusterrolebindings",
    );
    let role = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "Role"),
        "roles",
    );
    let role_binding = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "RoleBinding"),
        "rolebindings",
    );
    let secret_resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets");
    vec![
        (secret_resource, Some(BOOTSTRAP_TOKEN_NAMESPACE), secret),
        (
            cluster_role_binding.clone(),
            None,
            binding(
                "tenantry:kubelet-bootstrap",
                "system:node-bootstrapper",
                NODE_BOOTSTRAP_GROUP,
            ),
        ),
        (
            cluster_role_binding.clone(),
            None,
            binding(
                "tenantry:node-autoapprove-bootstrap",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                NODE_BOOTSTRAP_GROUP,
            ),
        ),
        (
            cluster_role_binding,
            None,
            binding(
                "tenantry:node-autoapprove-certificate-rotation",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                "system:nodes",
            ),
        ),
        (
            role,
            Some("default"),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": { "name": "tenantry:nodes-read-endpoints", "namespace": "default" },
                "rules": [
                    { "apiGroups": [""], "resources": ["endpoints"], "verbs": ["get", "list", "watch"] },
                    { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] },
                ],
            }),
        ),
        (
            role_binding,
            Some("default"),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": { "name": "tenantry:nodes-read-endpoints", "namespace": "default" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenantry:nodes-read-endpoints" },
                "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes" }],
            }),
        ),
    ]
}

async fn ensure_tenant_join(
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
async fn clamp_replicas(
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
async fn collect_old_templates(
    client: &kube::Client,
    namespace: &str,
    names: &PoolNames,
    resource: &ApiResource,
    reference: &str,
    current: &str,
) -> Result<(), Error> {
    let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let sets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &machine_set_resource());
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

/// The WorkersReady condition from the MachineDeployment's status.
fn workers_condition(deployment: &Value, desired: Option<i64>) -> (DesiredCondition, i32, i32) {
    let status = &deployment["status"];
    let desired = desired.unwrap_or(0);
    let replicas = status["replicas"].as_i64().unwrap_or(0);
    let ready = status["readyReplicas"].as_i64().unwrap_or(0);
    let up_to_date = status["upToDateReplicas"].as_i64().unwrap_or(replicas);
    let counts = format!("{ready} of {desired} workers Ready");
    let condition = if desired == 0 && replicas == 0 {
        DesiredCondition::true_(WORKERS_READY_CONDITION, reason::NO_WORKERS)
            .with_message("the pool wants no workers now (minReplicas 0); the autoscaler adds them when pods need them")
    } else if replicas != desired {
        DesiredCondition::false_(
            WORKERS_READY_CONDITION,
            reason::SCALING,
            format!("{counts}; scaling from {replicas} to {desired}"),
        )
    } else if up_to_date < desired {
        DesiredCondition::false_(
            WORKERS_READY_CONDITION,
            reason::ROLLING_OUT,
            format!("{counts}; {up_to_date} of {desired} run the current template"),
        )
    } else if ready < desired {
        DesiredCondition::false_(
            WORKERS_READY_CONDITION,
            reason::WORKERS_NOT_READY,
            format!(
                "{counts}; see the pool's Machines (kubectl get machines -l {}=<deployment>)",
                pool::DEPLOYMENT_NAME_LABEL
            ),
        )
    } else {
        DesiredCondition::true_(WORKERS_READY_CONDITION, reason::WORKERS_READY).with_message(counts)
    };
    let as_i32 = |v: i64| i32::try_from(v).unwrap_or(i32::MAX);
    (condition, as_i32(replicas), as_i32(ready))
}

async fn write_status(
    ctx: &Context,
    pool: &KubernetesNodes,
    workers: DesiredCondition,
    replicas: Option<i32>,
    ready_replicas: Option<i32>,
) -> Result<bool, Error> {
    let namespace = pool.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<KubernetesNodes> = Api::namespaced(ctx.client.clone(), namespace);
    let current = pool.status.clone();
    let mut status: KubernetesNodesStatus = current.clone().unwrap_or_default();
    let mut list = status.conditions.take().unwrap_or_default();
    let now = Timestamp::now();
    let generation = pool.metadata.generation;
    let ready = workers.is_true();
    let summary = if ready {
        DesiredCondition::true_(READY_CONDITION, reason::READY)
            .with_message(workers.message.clone())
    } else {
        DesiredCondition::false_(
            READY_CONDITION,
            workers.reason.clone(),
            workers.message.clone(),
        )
    };
    let was_ready = current
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .is_some_and(|c| conditions::is_true(c, READY_CONDITION));
    conditions::set(&mut list, &workers, generation, &now);
    conditions::set(&mut list, &summary, generation, &now);
    status.conditions = Some(list);
    status.replicas = replicas;
    status.ready_replicas = ready_replicas;
    status.observed_generation = generation;
    reconciler::apply_status(&api, pool, current.as_ref(), &status).await?;
    if ready && !was_ready {
        ctx.event(pool, EventType::Normal, reason::READY, summary.message)
            .await;
    }
    Ok(ready)
}

/// Reports a pool that cannot go on, with the reason a human acts on.
async fn blocked(
    ctx: &Context,
    pool: &KubernetesNodes,
    reason: &str,
    message: String,
    retry: Duration,
) -> Result<Action, Error> {
    let condition =
        DesiredCondition::false_(WORKERS_READY_CONDITION, reason.to_string(), message.clone());
    let (replicas, ready) = pool
        .status
        .as_ref()
        .map(|s| (s.replicas, s.ready_replicas))
        .unwrap_or_default();
    write_status(ctx, pool, condition, replicas, ready).await?;
    Err(Error::Waiting(message, retry))
}

pub async fn apply_pool(pool: Arc<KubernetesNodes>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let Some(names) = PoolNames::of(&pool) else {
        // The CRD refuses such names; an object from before that rule waits.
        return blocked(
            ctx,
            &pool,
            reason::CLUSTER_NOT_FOUND,
            format!("metadata.name must be {}-<pool>", pool.spec.cluster),
            RESYNC,
        )
        .await;
    };
    let Some(kubernetes) = Api::<Kubernetes>::namespaced(client.clone(), &namespace)
        .get_opt(&pool.spec.cluster)
        .await?
    else {
        return blocked(
            ctx,
            &pool,
            reason::CLUSTER_NOT_FOUND,
            format!(
                "spec.cluster: there is no Kubernetes {} in namespace {namespace}; create it, or delete this pool",
                pool.spec.cluster
            ),
            Duration::from_secs(30),
        )
        .await;
    };
    if kubernetes.metadata.deletion_timestamp.is_some() {
        return blocked(
            ctx,
            &pool,
            reason::CLUSTER_DELETING,
            format!(
                "the Kubernetes {} is being deleted, and its pools with it",
                pool.spec.cluster
            ),
            POLL,
        )
        .await;
    }

    let trust = match read_trust(client, &kubernetes).await {
        Ok(trust) => trust,
        Err(Error::Waiting(message, _)) => {
            return blocked(ctx, &pool, reason::WAITING_FOR_CONTROL_PLANE, message, POLL).await;
        }
        Err(error) => return Err(error),
    };
    if let Err(error) = ensure_tenant_join(ctx, &kubernetes, &trust).await {
        let message = format!(
            "the join token cannot be written into the tenant cluster ({error}); workers wait for it"
        );
        return blocked(ctx, &pool, reason::TENANT_UNREACHABLE, message, POLL).await;
    }
    let secret = |key: &str| {
        trust
            .secrets
            .get(key)
            .map(String::as_str)
            .unwrap_or_default()
    };
    let worker_config = talos::worker_config(
        &kubernetes,
        &pool,
        &WorkerTrust {
            machine_token: secret(pki::TALOS_TOKEN_KEY),
            talos_ca_pem: &trust.talos_ca,
            cluster_id: secret(pki::TALOS_CLUSTER_ID_KEY),
            cluster_secret: secret(pki::TALOS_CLUSTER_SECRET_KEY),
            bootstrap_token: secret(pki::TALOS_BOOTSTRAP_TOKEN_KEY),
            kubernetes_ca_pem: &trust.kubernetes_ca,
        },
        trust.service_ip.as_deref(),
    );

    let owner = owner_reference(&pool);
    let template = pool::machine_template(
        &kubernetes,
        &pool,
        &names,
        ctx.config.default_image_factory_url(),
    );
    let template_kind = template["kind"].as_str().unwrap_or_default().to_string();
    let template_name = template["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let bootstrap_template = pool::talos_config_template(&kubernetes, &names, &worker_config);
    let bootstrap_template_name = bootstrap_template["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let bootstrap_templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &talos_config_template_resource(),
    );
    let deployments: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &machine_deployment_resource());
    let applied = async {
        // Machine templates are immutable and named by their content: one
        // that exists is already what we want (and re-applying it would
        // only trip over fields the CRD prunes).
        let templates: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &machine_template_resource(&template_kind),
        );
        if templates.get_opt(&template_name).await?.is_none() {
            apply(&templates, template, &owner).await?;
        }
        // So is the bootstrap template (CABPT's webhook refuses changes).
        if bootstrap_templates
            .get_opt(&bootstrap_template_name)
            .await?
            .is_none()
        {
            apply(&bootstrap_templates, bootstrap_template, &owner).await?;
        }
        let deployment = apply(
            &deployments,
            pool::machine_deployment(
                &kubernetes,
                &pool,
                &names,
                &template_name,
                &bootstrap_template_name,
            ),
            &owner,
        )
        .await?;
        apply(
            &Api::namespaced_with(client.clone(), &namespace, &machine_health_check_resource()),
            pool::machine_health_check(&pool, &names),
            &owner,
        )
        .await?;
        Ok::<_, Error>(deployment)
    }
    .await;
    let deployment = match applied {
        Ok(deployment) => deployment,
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 422 || status.code == 400 => {
            let message = format!("the pool's objects were refused: {}", status.message);
            ctx.event(
                pool.as_ref(),
                EventType::Warning,
                reason::APPLY_FAILED,
                message.clone(),
            )
            .await;
            return blocked(
                ctx,
                &pool,
                reason::APPLY_FAILED,
                message,
                Duration::from_secs(60),
            )
            .await;
        }
        Err(error) => return Err(error),
    };
    let desired = clamp_replicas(&deployments, &deployment, &pool).await?;
    collect_old_templates(
        client,
        &namespace,
        &names,
        &machine_template_resource(&template_kind),
        "/spec/template/spec/infrastructureRef/name",
        &template_name,
    )
    .await?;
    collect_old_templates(
        client,
        &namespace,
        &names,
        &talos_config_template_resource(),
        "/spec/template/spec/bootstrap/configRef/name",
        &bootstrap_template_name,
    )
    .await?;

    let (workers, replicas, ready) = workers_condition(
        &serde_json::to_value(&deployment).unwrap_or_default(),
        desired,
    );
    let is_ready = write_status(ctx, &pool, workers, Some(replicas), Some(ready)).await?;
    tracing::debug!(%namespace, pool = %names.pool_object, ready = is_ready, "KubernetesNodes reconciled");
    Ok(Action::requeue(if is_ready { RESYNC } else { POLL }))
}

/// Deletion: the MachineDeployment first (CAPI drains and deletes its
/// Machines, the substrate deletes their VMs), waiting until no Machine of
/// the pool is left; then the health check, the bootstrap template and
/// every machine template of the pool.
pub async fn cleanup_pool(pool: Arc<KubernetesNodes>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let Some(names) = PoolNames::of(&pool) else {
        return Ok(Action::await_change());
    };
    let deployments: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &machine_deployment_resource());
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &machine_resource());
    let deployment_gone = !delete_if_present(&deployments, &names.objects).await?;
    let selector = format!("{}={}", pool::DEPLOYMENT_NAME_LABEL, names.objects);
    let left = machines
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .len();
    if !deployment_gone || left > 0 {
        return Err(Error::Waiting(
            format!("{left} workers of {} are being deleted", names.objects),
            POLL,
        ));
    }
    delete_if_present(
        &Api::namespaced_with(client.clone(), &namespace, &machine_health_check_resource()),
        &names.objects,
    )
    .await?;
    let own = ListParams::default().labels(&format!("{POOL_LABEL}={}", names.pool_object));
    let bootstrap_templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &talos_config_template_resource(),
    );
    let listed = match bootstrap_templates.list(&own).await {
        Ok(list) => list.items,
        // CABPT may not be installed.
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    for template in listed {
        delete_if_present(
            &bootstrap_templates,
            &template.metadata.name.unwrap_or_default(),
        )
        .await?;
    }
    for kind in ["KubevirtMachineTemplate", "ProxmoxMachineTemplate"] {
        let templates: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &machine_template_resource(kind));
        let listed = match templates.list(&own).await {
            Ok(list) => list.items,
            // The substrate's kinds may not be installed.
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(error) => return Err(error.into()),
        };
        for template in listed {
            delete_if_present(&templates, &template.metadata.name.unwrap_or_default()).await?;
        }
    }
    tracing::info!(%namespace, pool = %names.pool_object, "KubernetesNodes deleted");
    Ok(Action::await_change())
}
