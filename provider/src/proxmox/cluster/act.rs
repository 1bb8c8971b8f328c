//! What a ProxmoxCluster reconcile writes besides its status: the
//! finalizer that holds its credentials Secret while machines need it, and
//! the machines' InClusterIPPools.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tenantry_api::generated::ipam::in_cluster_ip_pool::InClusterIpPool;
use tenantry_api::proxmox::{PROXMOX_CREDENTIALS_FINALIZER, ProxmoxCluster};

use super::reconcile::*;
use crate::reconciler::FIELD_MANAGER;

/// Adds tenantry's finalizer to the credentials Secret.
pub(super) async fn hold_credentials(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(), Error> {
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
pub(super) async fn release_credentials(
    client: &kube::Client,
    object: &ProxmoxCluster,
) -> Result<(), Error> {
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

/// Server-side applies the cluster's InClusterIPPools.
pub(super) async fn apply_pools(
    client: &kube::Client,
    namespace: &str,
    pools: &[InClusterIpPool],
) -> Result<(), kube::Error> {
    let api: Api<InClusterIpPool> = Api::namespaced(client.clone(), namespace);
    for pool in pools {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(pool),
        )
        .await?;
    }
    Ok(())
}

/// Deletes the InClusterIPPools the ProxmoxCluster `owner_uid` owns; the
/// names of those not gone yet.
pub(super) async fn delete_owned_pools(
    client: &kube::Client,
    namespace: &str,
    owner_uid: &str,
) -> Result<Vec<String>, kube::Error> {
    let pools: Api<InClusterIpPool> = Api::namespaced(client.clone(), namespace);
    let mut left = Vec::new();
    for pool in pools.list(&ListParams::default()).await? {
        let owned = pool
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == owner_uid);
        if !owned {
            continue;
        }
        let pool_name = pool.metadata.name.clone().unwrap_or_default();
        if pool.metadata.deletion_timestamp.is_none() {
            match pools.delete(&pool_name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(error) => return Err(error),
            }
        }
        left.push(pool_name);
    }
    Ok(left)
}
