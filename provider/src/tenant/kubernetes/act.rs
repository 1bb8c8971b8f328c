//! What the companion writes for a `Kubernetes` object: the namespace's
//! etcd (with the PKI tenantry issues) and its Kamaji DataStore, the Talos
//! trust and OIDC Secrets, the CAPI objects, the tenant's StorageClasses
//! and Proxmox controllers, and their deletion.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::runtime::events::EventType;
use serde_json::{Value, json};
use tenantry_api::tenant::Kubernetes;

use super::render;
use super::storage;
use crate::reconciler::{Context, FIELD_MANAGER};
use crate::tenant::access;
use crate::tenant::pki;

use super::reconcile::Error;

pub(super) const TLS: &str = "kubernetes.io/tls";

pub(super) const OPAQUE: &str = "Opaque";

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

pub(super) fn infrastructure_resource(kind: &str) -> ApiResource {
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
pub(super) fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER)
        .force()
        .validation_strict()
}

pub(super) fn owner_reference(kubernetes: &Kubernetes, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: Kubernetes::api_version(&()).into_owned(),
        kind: Kubernetes::kind(&()).into_owned(),
        name: kubernetes.metadata.name.clone().unwrap_or_default(),
        uid: kubernetes.metadata.uid.clone().unwrap_or_default(),
        controller: Some(controller),
        block_owner_deletion: Some(controller),
    }
}

pub(super) fn with_owner(mut object: Value, owner: &OwnerReference) -> Value {
    object["metadata"]["ownerReferences"] = json!([owner]);
    object
}

pub(super) async fn apply_dynamic(
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
pub(super) async fn ensure_secret(
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

/// The etcd part: PKI Secrets, the EtcdCluster and the DataStore, unless
/// the namespace runs an etcd tenantry did not create (then it is used as
/// it is). Returns the DataStore name and the EtcdCluster as it stands.
pub(super) async fn ensure_etcd(
    client: &kube::Client,
    namespace: &str,
) -> Result<(String, Value), Error> {
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
    Ok((
        namespace.to_string(),
        serde_json::to_value(&etcd).unwrap_or_default(),
    ))
}

/// The etcd PKI, owned by the EtcdCluster (they go with it). A CA that
/// exists is kept; missing leaves are issued from it.
pub(super) async fn ensure_etcd_secrets(
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
pub(super) async fn ensure_talos_secrets(
    client: &kube::Client,
    kubernetes: &Kubernetes,
) -> Result<(), Error> {
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
pub(super) async fn ensure_oidc_secret(
    client: &kube::Client,
    kubernetes: &Kubernetes,
) -> Result<(), Error> {
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

/// The tenant's StorageClasses (`storage.rs`), applied through the
/// tenant's admin kubeconfig; classes tenantry made that are no longer
/// offered are deleted.
pub(super) async fn ensure_tenant_storage_classes(
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
pub(super) async fn ensure_proxmox_controllers(
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
