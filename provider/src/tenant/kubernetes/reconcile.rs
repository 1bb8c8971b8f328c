//! The companion's reconcile of one `Kubernetes` object: the namespace's
//! etcd (with the PKI tenantry issues) and its Kamaji DataStore, the Talos
//! trust pieces, the CAPI Cluster with its KamajiControlPlane and
//! infrastructure cluster, and a status that says where the cluster stands.
//! Deletion takes the cluster down in the safe order, etcd last.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::{Value, json};
use tenantry_api::tenant::{
    CONTROL_PLANE_READY_CONDITION, ETCD_READY_CONDITION, Kubernetes, READY_CONDITION,
    WORKLOADS_READY_CONDITION, admin_kubeconfig_secret_name, cluster_name,
};
use tenantry_api::tenant_nodes::KubernetesNodes;

use super::render;
use super::storage;
use crate::capi::conditions::{self, DesiredCondition};
use crate::reconciler::{self, Context, FIELD_MANAGER, ReconcileError};
use crate::tenant::access;
use crate::tenant::pki;

/// How often a cluster on its way up is looked at again.
const POLL: Duration = Duration::from_secs(2);
/// How often a Ready cluster is looked at again.
const RESYNC: Duration = Duration::from_secs(300);

const TLS: &str = "kubernetes.io/tls";
const OPAQUE: &str = "Opaque";

/// Keys Kamaji writes into the admin kubeconfig Secret.
pub const ADMIN_KUBECONFIG_KEYS: [&str; 4] = [
    "admin.conf",
    "admin.svc",
    "super-admin.conf",
    "super-admin.svc",
];

/// Condition reasons.
pub mod reason {
    pub const ETCD_AVAILABLE: &str = "EtcdAvailable";
    pub const ETCD_NOT_AVAILABLE: &str = "EtcdNotAvailable";
    pub const ETCD_PROVISIONING: &str = "EtcdProvisioning";
    pub const CONTROL_PLANE_READY: &str = "ControlPlaneReady";
    pub const WAITING_FOR_ETCD: &str = "WaitingForEtcd";
    pub const CONTROL_PLANE_PROVISIONING: &str = "ControlPlaneProvisioning";
    pub const CONTROL_PLANE_UPGRADING: &str = "ControlPlaneUpgrading";
    pub const CONTROL_PLANE_FAILED: &str = "ControlPlaneFailed";
    pub const KUBECONFIG_MISSING: &str = "AdminKubeconfigMissing";
    pub const READY: &str = "Ready";
    pub const APPLY_FAILED: &str = "ApplyFailed";
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("certificates: {0}")]
    Pki(#[from] pki::PkiError),
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

pub(in crate::tenant) fn resource(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn etcd_cluster_resource() -> ApiResource {
    resource(
        "etcd-operator.cozystack.io",
        "v1alpha2",
        "EtcdCluster",
        "etcdclusters",
    )
}
pub fn data_store_resource() -> ApiResource {
    resource("kamaji.clastix.io", "v1alpha1", "DataStore", "datastores")
}
pub fn kamaji_control_plane_resource() -> ApiResource {
    resource(
        "controlplane.cluster.x-k8s.io",
        "v1alpha2",
        "KamajiControlPlane",
        "kamajicontrolplanes",
    )
}
pub fn cluster_resource() -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters")
}
fn infrastructure_resource(kind: &str) -> ApiResource {
    match kind {
        "ProxmoxCluster" => resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha2",
            kind,
            "proxmoxclusters",
        ),
        _ => resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            kind,
            "kubevirtclusters",
        ),
    }
}

/// Server-side apply under tenantry's field manager, strict about fields:
/// a rendered field the CRD does not know is a bug to hear about.
fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER)
        .force()
        .validation_strict()
}

fn owner_reference(kubernetes: &Kubernetes, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: Kubernetes::api_version(&()).into_owned(),
        kind: Kubernetes::kind(&()).into_owned(),
        name: kubernetes.metadata.name.clone().unwrap_or_default(),
        uid: kubernetes.metadata.uid.clone().unwrap_or_default(),
        controller: Some(controller),
        block_owner_deletion: Some(controller),
    }
}

fn with_owner(mut object: Value, owner: &OwnerReference) -> Value {
    object["metadata"]["ownerReferences"] = json!([owner]);
    object
}

async fn apply_dynamic(
    client: &kube::Client,
    namespace: Option<&str>,
    resource: &ApiResource,
    object: &Value,
) -> Result<DynamicObject, Error> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    };
    Ok(api
        .patch(name, &apply_params(), &Patch::Apply(object))
        .await?)
}

/// Creates a Secret unless it exists; never rewrites one (keys and
/// tokens must stay what the running parts already use).
async fn ensure_secret(
    secrets: &Api<Secret>,
    name: &str,
    type_: &str,
    data: BTreeMap<String, ByteString>,
    labels: BTreeMap<String, String>,
    owner: Option<OwnerReference>,
) -> Result<Secret, Error> {
    if let Some(existing) = secrets.get_opt(name).await? {
        return Ok(existing);
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(data),
        type_: Some(type_.into()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => Ok(created),
        // Another reconcile got there first: theirs stands.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(secrets.get(name).await?),
        Err(error) => Err(error.into()),
    }
}

pub(in crate::tenant) fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}

fn condition_true(object: &Value, type_: &str) -> Option<bool> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| c["status"] == "True")
}

fn condition_message(object: &Value, type_: &str) -> String {
    object["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .map(|c| {
            format!(
                "{}: {}",
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_default()
}

/// The etcd part: PKI Secrets, the EtcdCluster and the DataStore, unless
/// the namespace runs an etcd tenantry did not create (then it is used as
/// it is). Returns the DataStore name and the EtcdReady condition.
async fn ensure_etcd(
    client: &kube::Client,
    namespace: &str,
) -> Result<(String, DesiredCondition), Error> {
    let etcds: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &etcd_cluster_resource());
    let existing = etcds.get_opt(render::ETCD_NAME).await?;
    let ours = existing.as_ref().is_none_or(|e| {
        e.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(render::ETCD_LABEL))
    });
    let etcd = if ours {
        let etcd = apply_dynamic(
            client,
            Some(namespace),
            &etcd_cluster_resource(),
            &render::etcd_cluster(namespace),
        )
        .await?;
        ensure_etcd_secrets(client, namespace, &etcd).await?;
        apply_dynamic(
            client,
            None,
            &data_store_resource(),
            &render::data_store(namespace),
        )
        .await?;
        etcd
    } else {
        existing.expect("checked above")
    };
    let value = serde_json::to_value(&etcd).unwrap_or_default();
    let condition = match condition_true(&value, "Available") {
        Some(true) => DesiredCondition::true_(ETCD_READY_CONDITION, reason::ETCD_AVAILABLE),
        Some(false) => DesiredCondition::false_(
            ETCD_READY_CONDITION,
            reason::ETCD_NOT_AVAILABLE,
            format!(
                "EtcdCluster {namespace}/{} is not available ({}); see its conditions and member pods",
                render::ETCD_NAME,
                condition_message(&value, "Available")
            ),
        ),
        None => DesiredCondition::false_(
            ETCD_READY_CONDITION,
            reason::ETCD_PROVISIONING,
            format!("EtcdCluster {namespace}/{} is starting", render::ETCD_NAME),
        ),
    };
    Ok((namespace.to_string(), condition))
}

/// The etcd PKI, owned by the EtcdCluster (they go with it). A CA that
/// exists is kept; missing leaves are issued from it.
async fn ensure_etcd_secrets(
    client: &kube::Client,
    namespace: &str,
    etcd: &DynamicObject,
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let owner = OwnerReference {
        api_version: "etcd-operator.cozystack.io/v1alpha2".into(),
        kind: "EtcdCluster".into(),
        name: render::ETCD_NAME.into(),
        uid: etcd.metadata.uid.clone().unwrap_or_default(),
        controller: Some(false),
        block_owner_deletion: Some(false),
    };
    let labels = BTreeMap::from([(render::ETCD_LABEL.to_string(), "true".to_string())]);
    let mut present = Vec::new();
    for name in render::ETCD_SECRETS {
        present.push(secrets.get_opt(name).await?);
    }
    if present.iter().all(Option::is_some) {
        return Ok(());
    }
    let pki = match &present[0] {
        Some(ca) => {
            let cert = secret_value(ca, "tls.crt").unwrap_or_default();
            let key = secret_value(ca, "tls.key").unwrap_or_default();
            pki::etcd_pki_from(&cert, &key, namespace)?
        }
        None => pki::etcd_pki(namespace)?,
    };
    let ca_pem = pki.ca.cert_pem.clone();
    let pairs = [
        (render::ETCD_CA_SECRET, &pki.ca),
        (render::ETCD_SERVER_SECRET, &pki.server),
        (render::ETCD_PEER_SECRET, &pki.peer),
        (render::ETCD_CLIENT_SECRET, &pki.client),
    ];
    for (name, pair) in pairs {
        ensure_secret(
            &secrets,
            name,
            TLS,
            pki::tls_secret_data(&pair.cert_pem, &pair.key_pem, &ca_pem),
            labels.clone(),
            Some(owner.clone()),
        )
        .await?;
    }
    Ok(())
}

/// The Talos trust pieces of one cluster: machine token and cluster
/// secrets, the Talos CA, and trustd's serving certificate.
async fn ensure_talos_secrets(client: &kube::Client, kubernetes: &Kubernetes) -> Result<(), Error> {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let owner = owner_reference(kubernetes, true);
    let labels = BTreeMap::from([(render::KUBERNETES_LABEL.to_string(), name.to_string())]);
    if secrets
        .get_opt(&render::talos_secrets_name(name))
        .await?
        .is_none()
    {
        let data = pki::talos_secrets()
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
        ensure_secret(
            &secrets,
            &render::talos_secrets_name(name),
            OPAQUE,
            data,
            labels.clone(),
            Some(owner.clone()),
        )
        .await?;
    }
    let ca = match secrets.get_opt(&render::talos_ca_name(name)).await? {
        Some(ca) => ca,
        None => {
            let (cert, key) = pki::talos_ca()?;
            ensure_secret(
                &secrets,
                &render::talos_ca_name(name),
                TLS,
                pki::tls_secret_data(&cert, &key, &cert),
                labels.clone(),
                Some(owner.clone()),
            )
            .await?
        }
    };
    if secrets
        .get_opt(&render::talos_tls_cert_name(name))
        .await?
        .is_none()
    {
        let ca_cert = secret_value(&ca, "tls.crt").unwrap_or_default();
        let ca_key = secret_value(&ca, "tls.key").unwrap_or_default();
        let (cert, key) = pki::talos_server_cert(
            &ca_cert,
            &ca_key,
            &render::service_dns_names(name, namespace),
        )?;
        ensure_secret(
            &secrets,
            &render::talos_tls_cert_name(name),
            TLS,
            pki::tls_secret_data(&cert, &key, &ca_cert),
            labels,
            Some(owner),
        )
        .await?;
    }
    Ok(())
}

/// The AuthenticationConfiguration Secret tenantry writes from an inline
/// `oidc.customConfig.config`.
async fn ensure_oidc_secret(client: &kube::Client, kubernetes: &Kubernetes) -> Result<(), Error> {
    let Some(config) = kubernetes
        .spec
        .oidc
        .custom_config
        .as_ref()
        .and_then(|c| c.config.clone())
    else {
        return Ok(());
    };
    if render::oidc_secret(kubernetes).is_none() {
        return Ok(());
    }
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": render::oidc_config_name(name),
            "labels": { render::KUBERNETES_LABEL: name },
            "ownerReferences": [owner_reference(kubernetes, true)],
        },
        "type": "Opaque",
        "stringData": { "config.yaml": config },
    });
    secrets
        .patch(
            &render::oidc_config_name(name),
            &apply_params(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// The control plane's state as the KamajiControlPlane reports it, and
/// whether the admin kubeconfig Secret is there.
fn control_plane_condition(
    kubernetes: &Kubernetes,
    kcp: &Value,
    kubeconfig: Option<&Secret>,
) -> DesiredCondition {
    let wanted = kubernetes.spec.version.pinned_patch();
    let status = &kcp["status"];
    let initialized = status["initialization"]["controlPlaneInitialized"] == true;
    let ready = status["ready"] == true || condition_true(kcp, "Available") == Some(true);
    let running = status["version"].as_str().unwrap_or_default();
    let name = kcp["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(reason) = status["failureReason"].as_str().filter(|r| !r.is_empty()) {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            reason::CONTROL_PLANE_FAILED,
            format!(
                "KamajiControlPlane {name} failed ({reason}): {}",
                status["failureMessage"].as_str().unwrap_or_default()
            ),
        );
    }
    if !initialized || !ready {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            reason::CONTROL_PLANE_PROVISIONING,
            format!(
                "KamajiControlPlane {name} is not ready yet ({})",
                condition_message(kcp, "Available")
            ),
        );
    }
    if running != wanted {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            reason::CONTROL_PLANE_UPGRADING,
            format!("the control plane runs {running}; rolling to {wanted}"),
        );
    }
    let complete = kubeconfig.is_some_and(|s| {
        ADMIN_KUBECONFIG_KEYS
            .iter()
            .all(|k| s.data.as_ref().is_some_and(|d| d.contains_key(*k)))
    });
    if !complete {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            reason::KUBECONFIG_MISSING,
            format!(
                "the control plane runs, but Secret {} does not hold {} yet (Kamaji writes it)",
                admin_kubeconfig_secret_name(
                    kubernetes.metadata.name.as_deref().unwrap_or_default()
                ),
                ADMIN_KUBECONFIG_KEYS.join(", ")
            ),
        );
    }
    DesiredCondition::true_(CONTROL_PLANE_READY_CONDITION, reason::CONTROL_PLANE_READY)
}

fn endpoint_of(kcp: &Value) -> Option<String> {
    let endpoint = &kcp["spec"]["controlPlaneEndpoint"];
    let host = endpoint["host"].as_str().filter(|h| !h.is_empty())?;
    let port = endpoint["port"].as_i64().unwrap_or(6443);
    Some(format!("https://{host}:{port}"))
}

struct Observed {
    conditions: Vec<DesiredCondition>,
    endpoint: Option<String>,
    kubeconfig: Option<String>,
    version: Option<String>,
}

async fn write_status(
    ctx: &Context,
    kubernetes: &Kubernetes,
    observed: Observed,
) -> Result<bool, Error> {
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<Kubernetes> = Api::namespaced(ctx.client.clone(), namespace);
    let current = kubernetes.status.clone();
    let mut status = current.clone().unwrap_or_default();
    let mut list = status.conditions.take().unwrap_or_default();
    let now = Timestamp::now();
    let generation = kubernetes.metadata.generation;
    for condition in &observed.conditions {
        conditions::set(&mut list, condition, generation, &now);
    }
    let ready = observed.conditions.iter().all(DesiredCondition::is_true);
    let summary = if ready {
        DesiredCondition::true_(READY_CONDITION, reason::READY)
    } else {
        let first = observed
            .conditions
            .iter()
            .find(|c| !c.is_true())
            .expect("not ready means a false condition");
        DesiredCondition::false_(READY_CONDITION, first.reason.clone(), first.message.clone())
    };
    conditions::set(&mut list, &summary, generation, &now);
    status.conditions = Some(list);
    status.endpoint = observed.endpoint;
    status.admin_kubeconfig_secret_name = observed.kubeconfig;
    status.version = observed.version;
    status.observed_generation = generation;
    let was_ready = current
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| c.iter().find(|c| c.type_ == READY_CONDITION))
        .is_some_and(|c| c.status == "True");
    reconciler::apply_status(&api, kubernetes, current.as_ref(), &status).await?;
    if ready && !was_ready {
        ctx.event(
            kubernetes,
            EventType::Normal,
            reason::READY,
            format!(
                "the control plane runs {} and its admin kubeconfig is in Secret {}",
                status.version.clone().unwrap_or_default(),
                status
                    .admin_kubeconfig_secret_name
                    .clone()
                    .unwrap_or_default()
            ),
        )
        .await;
    }
    Ok(ready)
}

pub async fn apply(kubernetes: Arc<Kubernetes>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let name = kubernetes.metadata.name.clone().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.clone().unwrap_or_default();
    let cluster = cluster_name(&name);

    let (data_store, etcd_condition) = ensure_etcd(client, &namespace).await?;
    ensure_talos_secrets(client, &kubernetes).await?;
    ensure_oidc_secret(client, &kubernetes).await?;

    let controller_owner = owner_reference(&kubernetes, true);
    let owner = owner_reference(&kubernetes, false);
    let applied = async {
        apply_dynamic(
            client,
            Some(&namespace),
            &cluster_resource(),
            &with_owner(render::cluster(&kubernetes), &controller_owner),
        )
        .await?;
        let infra = render::infrastructure_cluster(&kubernetes);
        let infra_kind = infra["kind"].as_str().unwrap_or_default().to_string();
        apply_dynamic(
            client,
            Some(&namespace),
            &infrastructure_resource(&infra_kind),
            &with_owner(infra, &owner),
        )
        .await?;
        apply_dynamic(
            client,
            Some(&namespace),
            &kamaji_control_plane_resource(),
            &with_owner(
                render::kamaji_control_plane(&kubernetes, &data_store),
                &owner,
            ),
        )
        .await
    }
    .await;
    let kcp = match applied {
        Ok(kcp) => serde_json::to_value(kcp).unwrap_or_default(),
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 422 || status.code == 400 => {
            // Refused by a CRD or a webhook of the control plane provider:
            // tell the user which, with the apiserver's words.
            let message = format!("the control plane objects were refused: {}", status.message);
            ctx.event(
                kubernetes.as_ref(),
                EventType::Warning,
                reason::APPLY_FAILED,
                message.clone(),
            )
            .await;
            write_status(
                ctx,
                &kubernetes,
                Observed {
                    conditions: vec![
                        etcd_condition,
                        DesiredCondition::false_(
                            CONTROL_PLANE_READY_CONDITION,
                            reason::APPLY_FAILED,
                            message.clone(),
                        ),
                    ],
                    endpoint: None,
                    kubeconfig: None,
                    version: None,
                },
            )
            .await?;
            return Err(Error::Waiting(message, Duration::from_secs(60)));
        }
        Err(error) => return Err(error),
    };

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let kubeconfig_name = admin_kubeconfig_secret_name(&name);
    let kubeconfig = secrets.get_opt(&kubeconfig_name).await?;
    let mut control_plane = control_plane_condition(&kubernetes, &kcp, kubeconfig.as_ref());
    if !etcd_condition.is_true() && !control_plane.is_true() {
        control_plane = DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            reason::WAITING_FOR_ETCD,
            format!(
                "the control plane waits for the namespace's etcd ({})",
                etcd_condition.message
            ),
        );
    }
    let workloads = DesiredCondition::new(
        WORKLOADS_READY_CONDITION,
        control_plane.status,
        control_plane.reason.clone(),
        "worker health is reported on each KubernetesNodes pool; this covers the control plane"
            .to_string(),
    );
    if control_plane.is_true() {
        if let Err(error) = ensure_tenant_storage_classes(ctx, &kubernetes).await {
            tracing::warn!(%namespace, %name, %error, "the tenant's StorageClasses are not in place yet");
        }
        if kubernetes.spec.substrate == tenantry_api::tenant::Substrate::Proxmox {
            ensure_proxmox_controllers(ctx, &kubernetes, &controller_owner).await?;
        }
    }
    let endpoint = endpoint_of(&kcp);
    let version = kcp["status"]["version"]
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let ready = write_status(
        ctx,
        &kubernetes,
        Observed {
            conditions: vec![etcd_condition, control_plane, workloads],
            endpoint,
            kubeconfig: kubeconfig.map(|_| kubeconfig_name),
            version,
        },
    )
    .await?;
    tracing::debug!(%namespace, %name, %cluster, ready, "Kubernetes reconciled");
    Ok(Action::requeue(if ready { RESYNC } else { POLL }))
}

/// The tenant's StorageClasses (`storage.rs`), applied through the
/// tenant's admin kubeconfig; classes tenantry made that are no longer
/// offered are deleted.
async fn ensure_tenant_storage_classes(
    ctx: &Context,
    kubernetes: &Kubernetes,
) -> anyhow::Result<()> {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let infra = match kubernetes.spec.substrate {
        tenantry_api::tenant::Substrate::Kubevirt => {
            Api::<StorageClass>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await?
                .items
        }
        tenantry_api::tenant::Substrate::Proxmox => Vec::new(),
    };
    let wanted = storage::tenant_storage_classes(kubernetes, &infra);
    let tenant = access::tenant_client(&ctx.client, &ctx.config, namespace, name).await?;
    let classes: Api<StorageClass> = Api::all(tenant);
    let mut names = Vec::new();
    for class in &wanted {
        let class_name = class["metadata"]["name"].as_str().unwrap_or_default();
        names.push(class_name.to_string());
        classes
            .patch(class_name, &apply_params(), &Patch::Apply(class))
            .await?;
    }
    let managed = ListParams::default().labels(storage::MANAGED_LABEL);
    for class in classes.list(&managed).await?.items {
        let class_name = class.metadata.name.unwrap_or_default();
        if !names.contains(&class_name) {
            classes
                .delete(&class_name, &DeleteParams::default())
                .await?;
        }
    }
    Ok(())
}

/// The Proxmox CSI controller and CCM in the management namespace, with
/// their config Secrets composed here from the credentials Secrets. A
/// missing credentials Secret is reported with the field that names it.
async fn ensure_proxmox_controllers(
    ctx: &Context,
    kubernetes: &Kubernetes,
    owner: &OwnerReference,
) -> Result<(), Error> {
    use super::proxmox_controllers::{self as controllers, ProxmoxController};
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let deployments = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    );
    let mut wanted = vec![ProxmoxController::Ccm];
    if controllers::csi_settings(kubernetes).is_some() {
        wanted.push(ProxmoxController::Csi);
    }
    for controller in wanted {
        let credentials_name = controller.credentials_secret(kubernetes);
        let credentials = secrets.get_opt(&credentials_name).await?;
        let value = |key: &str| credentials.as_ref().and_then(|s| secret_value(s, key));
        let (Some(url), Some(token_id), Some(token_secret)) =
            (value("url"), value("token_id"), value("token_secret"))
        else {
            ctx.event(
                kubernetes,
                EventType::Warning,
                "ProxmoxCredentialsMissing",
                format!(
                    "{}: Secret {credentials_name} with keys url, token_id and token_secret is not there; the {} does not run until it is",
                    controller.credentials_field(),
                    controller.object_name(name)
                ),
            )
            .await;
            continue;
        };
        let config = controllers::cloud_config(
            kubernetes,
            &url,
            &token_id,
            &token_secret,
            value("region").as_deref(),
        );
        let secret = with_owner(
            controllers::config_secret(kubernetes, controller, &config),
            owner,
        );
        secrets
            .patch(
                &controller.object_name(name),
                &apply_params(),
                &Patch::Apply(&secret),
            )
            .await?;
        apply_dynamic(
            &ctx.client,
            Some(namespace),
            &deployments,
            &with_owner(controllers::deployment(kubernetes, controller), owner),
        )
        .await?;
    }
    Ok(())
}

/// Deletes an object in the background; whether it was there.
pub(in crate::tenant) async fn delete_if_present(
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<bool, kube::Error> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Deletion in the safe order: the cluster's `KubernetesNodes` pools (their
/// workers go while the tenant apiserver still answers), then the CAPI
/// Cluster (CAPI takes its control plane and infrastructure cluster down)
/// and its leftovers,
/// then the cluster's own Secrets, then — when it was the namespace's last
/// cluster — the etcd tenantry created and its DataStore.
pub async fn cleanup(kubernetes: Arc<Kubernetes>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let name = kubernetes.metadata.name.clone().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.clone().unwrap_or_default();
    let cluster = cluster_name(&name);

    let pools: Api<KubernetesNodes> = Api::namespaced(client.clone(), &namespace);
    let own_pools: Vec<KubernetesNodes> = pools
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.spec.cluster == name)
        .collect();
    if !own_pools.is_empty() {
        for pool in &own_pools {
            if pool.metadata.deletion_timestamp.is_none() {
                let pool_name = pool.metadata.name.clone().unwrap_or_default();
                match pools.delete(&pool_name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => return Err(error.into()),
                }
            }
        }
        return Err(Error::Waiting(
            format!(
                "{} worker pools of {name} are being deleted first",
                own_pools.len()
            ),
            POLL,
        ));
    }

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &cluster_resource());
    if delete_if_present(&clusters, &cluster).await? {
        return Err(Error::Waiting(
            format!("Cluster {cluster} is being deleted"),
            POLL,
        ));
    }
    // Without a Cluster (never created, or CAPI gone), nothing deletes
    // these for us.
    let mut left = false;
    for resource in [
        kamaji_control_plane_resource(),
        infrastructure_resource(render::infrastructure_kind(kubernetes.spec.substrate)),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        left |= delete_if_present(&api, &cluster).await?;
    }
    if left {
        return Err(Error::Waiting(
            format!("the control plane of {cluster} is being deleted"),
            POLL,
        ));
    }

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let own = ListParams::default().labels(&format!("{}={name}", render::KUBERNETES_LABEL));
    for secret in secrets.list(&own).await?.items {
        let _ = secrets
            .delete(
                &secret.metadata.name.unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await;
    }

    let others = Api::<Kubernetes>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|k| k.metadata.name.as_deref() != Some(name.as_str()));
    if !others {
        let stores: Api<DynamicObject> = Api::all_with(client.clone(), &data_store_resource());
        if let Some(store) = stores.get_opt(&namespace).await?
            && store
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(render::ETCD_LABEL))
        {
            delete_if_present(&stores, &namespace).await?;
        }
        let etcds: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &etcd_cluster_resource());
        if let Some(etcd) = etcds.get_opt(render::ETCD_NAME).await?
            && etcd
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(render::ETCD_LABEL))
        {
            delete_if_present(&etcds, render::ETCD_NAME).await?;
            let etcd_secrets = ListParams::default().labels(render::ETCD_LABEL);
            for secret in secrets.list(&etcd_secrets).await?.items {
                let _ = secrets
                    .delete(
                        &secret.metadata.name.unwrap_or_default(),
                        &DeleteParams::default(),
                    )
                    .await;
            }
        }
    }
    tracing::info!(%namespace, %name, "Kubernetes deleted");
    Ok(Action::await_change())
}
