//! The companion's reconcile of one `Kubernetes` object: the namespace's
//! etcd (with the PKI tenantry issues) and its Kamaji DataStore, the Talos
//! trust pieces, the CAPI Cluster with its KamajiControlPlane and
//! infrastructure cluster, and a status that says where the cluster stands.
//! Deletion takes the cluster down in the safe order, etcd last.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::tenant::{
    CONTROL_PLANE_READY_CONDITION, Kubernetes, admin_kubeconfig_secret_name, cluster_name,
};
use tenantry_api::tenant_nodes::KubernetesNodes;

use super::act;
use super::decide;
use super::exposure;
use super::render;
use super::status::{self, Reason, Report};
use crate::capi::CapiKind;
use crate::capi::conditions::DesiredCondition;
use crate::reconciler::{self, Context};
use crate::tenant::pki;
use crate::tenant::served::{Served, ServedError};

/// How often a cluster on its way up is looked at again.
const POLL: Duration = Duration::from_secs(2);
/// How often a Ready cluster is looked at again.
const RESYNC: Duration = Duration::from_secs(300);

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error<pki::PkiError>;

impl reconciler::OwnError for pki::PkiError {}

impl From<pki::PkiError> for Error {
    fn from(error: pki::PkiError) -> Self {
        Error::Own(Box::new(error))
    }
}

pub async fn apply(kubernetes: Arc<Kubernetes>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let name = kubernetes.metadata.name.clone().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.clone().unwrap_or_default();
    let cluster = cluster_name(&name);

    let (data_store, etcd) = act::ensure_etcd(client, &namespace).await?;
    let etcd_condition = decide::etcd_condition(&namespace, &etcd);
    act::ensure_talos_secrets(client, &kubernetes).await?;
    act::ensure_oidc_secret(client, &kubernetes).await?;

    let served = Served::of(ctx).await?;
    let exposure = exposure::observe(client, &ctx.config, &kubernetes).await?;
    let controller_owner = act::owner_reference(&kubernetes, true);
    let owner = act::owner_reference(&kubernetes, false);
    let applied = async {
        act::apply_dynamic(
            client,
            Some(&namespace),
            &served.resource(CapiKind::Cluster),
            &act::with_owner(
                served.capi_object(CapiKind::Cluster, render::cluster(&kubernetes)),
                &controller_owner,
            ),
        )
        .await?;
        let infra = render::infrastructure_cluster(&kubernetes);
        let infra_kind = infra["kind"].as_str().unwrap_or_default().to_string();
        act::apply_dynamic(
            client,
            Some(&namespace),
            &act::infrastructure_resource(&infra_kind),
            &act::with_owner(infra, &owner),
        )
        .await?;
        act::apply_dynamic(
            client,
            Some(&namespace),
            &served.kamaji_control_plane_resource(),
            &act::with_owner(
                served.kamaji_control_plane(render::kamaji_control_plane(
                    &kubernetes,
                    &data_store,
                    &exposure,
                )),
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
                Reason::ApplyFailed.as_str(),
                message.clone(),
            )
            .await;
            status::write_status(
                ctx,
                &kubernetes,
                Report {
                    conditions: vec![
                        etcd_condition,
                        DesiredCondition::false_(
                            CONTROL_PLANE_READY_CONDITION,
                            Reason::ApplyFailed.as_str(),
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
    let (control_plane, workloads) =
        decide::control_plane_conditions(&kubernetes, &kcp, kubeconfig.as_ref(), &etcd_condition);
    if control_plane.is_true() {
        if let Err(error) = act::ensure_tenant_storage_classes(ctx, &kubernetes).await {
            tracing::warn!(%namespace, %name, %error, "the tenant's StorageClasses are not in place yet");
        }
        if kubernetes.spec.substrate == tenantry_api::tenant::Substrate::Proxmox {
            act::ensure_proxmox_controllers(ctx, &kubernetes, &controller_owner).await?;
        }
    }
    let endpoint = decide::endpoint_of(&kcp);
    let version = decide::version_of(&kcp);
    let ready = status::write_status(
        ctx,
        &kubernetes,
        Report {
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

    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ctx.capi.resource(CapiKind::Cluster),
    );
    if act::delete_if_present(&clusters, &cluster).await? {
        return Err(Error::Waiting(
            format!("Cluster {cluster} is being deleted"),
            POLL,
        ));
    }
    // Without a Cluster (never created, or CAPI gone), nothing deletes
    // these for us.
    let mut left = false;
    let mut resources = vec![act::infrastructure_resource(render::infrastructure_kind(
        kubernetes.spec.substrate,
    ))];
    // No KamajiControlPlane CRD, no KamajiControlPlane to delete.
    match Served::of(ctx).await {
        Ok(served) => resources.push(served.kamaji_control_plane_resource()),
        Err(ServedError::NoKamaji) => {}
        Err(ServedError::Kube(error)) => return Err(error.into()),
    }
    for resource in resources {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        left |= act::delete_if_present(&api, &cluster).await?;
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
        let stores: Api<DynamicObject> = Api::all_with(client.clone(), &act::data_store_resource());
        if let Some(store) = stores.get_opt(&namespace).await?
            && store
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(render::ETCD_LABEL))
        {
            act::delete_if_present(&stores, &namespace).await?;
        }
        let etcds: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &act::etcd_cluster_resource());
        if let Some(etcd) = etcds.get_opt(render::ETCD_NAME).await?
            && etcd
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(render::ETCD_LABEL))
        {
            act::delete_if_present(&etcds, render::ETCD_NAME).await?;
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
