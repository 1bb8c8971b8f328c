//! What a KubevirtCluster reconcile writes besides its status and the
//! Service: the SSH key pair, and for an externally managed cluster the one
//! contract field it mirrors.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::kubevirt::{KUBEVIRT_CLUSTER_FINALIZER, KubevirtCluster};

use super::{CLUSTER_SECRET_TYPE, CONTRACT_BRIDGE_MANAGER, Error, ssh_keys_secret_name};
use crate::kubevirt::ssh::{self, SshKeyPair};

/// For an externally managed KubevirtCluster: mirror `status.ready` into
/// `status.initialization.provisioned` (and nothing else), and drop our
/// finalizer if the object got the annotation after we had added it.
pub(super) async fn bridge_external_contract(
    api: &Api<KubevirtCluster>,
    object: &KubevirtCluster,
) -> Result<Action, Error> {
    let name = object.metadata.name.clone().unwrap_or_default();
    if object
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == KUBEVIRT_CLUSTER_FINALIZER)
    {
        let finalizers: Vec<&String> = object
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != KUBEVIRT_CLUSTER_FINALIZER)
            .collect();
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": finalizers } })),
        )
        .await?;
    }
    if object.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let status = object.status.as_ref();
    let ready = status.is_some_and(|s| s.ready);
    let mirrored = status
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned);
    if mirrored != Some(ready) {
        let patch = json!({
            "apiVersion": KubevirtCluster::api_version(&()),
            "kind": KubevirtCluster::kind(&()),
            "status": { "initialization": { "provisioned": ready } },
        });
        api.patch_status(
            &name,
            &PatchParams::apply(CONTRACT_BRIDGE_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        tracing::info!(cluster = %name, provisioned = ready, "mirrored status.ready of an externally managed KubevirtCluster");
    }
    Ok(Action::await_change())
}

/// The cluster's SSH key pair, as CAPK keeps it: generated once into
/// `<kubevirtcluster>-ssh-keys` (keys `key` and `pub`, owned by the
/// KubevirtCluster, labelled with the cluster so `clusterctl move` takes it)
/// and never rotated, since guests already carry the public key. A Secret
/// named in `spec.sshKeys.dataSecretName` that holds a pair is used as it
/// is. Returns the Secret's name; the private key never leaves the Secret.
pub(super) async fn ensure_ssh_keys(
    client: &kube::Client,
    object: &KubevirtCluster,
    cluster_name: &str,
) -> Result<String, Error> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let secrets = Api::<Secret>::namespaced(client.clone(), &namespace);
    let holds_pair = |secret: &Secret| {
        secret.data.as_ref().is_some_and(|d| {
            d.contains_key(ssh::PRIVATE_KEY_KEY) && d.contains_key(ssh::PUBLIC_KEY_KEY)
        })
    };
    if let Some(named) = object
        .spec
        .ssh_keys
        .as_ref()
        .and_then(|k| k.data_secret_name.as_deref())
        && secrets
            .get_opt(named)
            .await?
            .is_some_and(|s| holds_pair(&s))
    {
        return Ok(named.to_string());
    }
    let secret_name = ssh_keys_secret_name(&name);
    let existing = secrets.get_opt(&secret_name).await?;
    if existing.as_ref().is_some_and(holds_pair) {
        return Ok(secret_name);
    }
    let pair = SshKeyPair::generate(&format!("tenantry:{namespace}/{name}"))?;
    let data = BTreeMap::from([
        (
            ssh::PRIVATE_KEY_KEY.to_string(),
            ByteString(pair.private_key_openssh()?),
        ),
        (
            ssh::PUBLIC_KEY_KEY.to_string(),
            ByteString(format!("{}\n", pair.authorized_key()).into_bytes()),
        ),
    ]);
    match existing {
        // Someone made the Secret without a pair: fill it in, as CAPK does,
        // unless it changed meanwhile (the resourceVersion guards that).
        Some(existing) => {
            let patch = json!({
                "metadata": { "resourceVersion": existing.metadata.resource_version },
                "data": data,
            });
            secrets
                .patch(&secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(secret_name.clone()),
                    namespace: Some(namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        CLUSTER_NAME_LABEL.to_string(),
                        cluster_name.to_string(),
                    )])),
                    owner_references: object.controller_owner_ref(&()).map(|o| vec![o]),
                    ..Default::default()
                },
                type_: Some(CLUSTER_SECRET_TYPE.into()),
                data: Some(data),
                ..Default::default()
            };
            match secrets.create(&Default::default(), &secret).await {
                Ok(_) => {}
                // Made meanwhile (a previous leader): the next reconcile reads it.
                Err(kube::Error::Api(status)) if status.code == 409 => return Ok(secret_name),
                Err(error) => return Err(error.into()),
            }
        }
    }
    tracing::info!(cluster = %name, %namespace, secret = %secret_name, "generated the cluster's SSH key pair");
    Ok(secret_name)
}
