//! The KubevirtCluster reconciler: the control-plane endpoint Service
//! `<cluster>-lb` (ClusterIP, NodePort or LoadBalancer), the endpoint taken
//! from it, the cluster's SSH key pair for the ssh bootstrap check, and the
//! v1beta2 contract status.
//!
//! Externally managed KubevirtClusters (annotation `cluster.x-k8s.io/managed-by`,
//! e.g. by the Kamaji control plane provider) are never reconciled as ours:
//! no finalizer, no Service, no spec change. Their manager writes
//! `spec.controlPlaneEndpoint` and `status.ready` (the v1beta1 contract); since
//! our CRD carries the v1beta2 contract label, CAPI reads
//! `status.initialization.provisioned` instead. So tenantry mirrors exactly
//! that one field from `status.ready`, under its own field manager, and
//! writes nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tenantry_api::contract::{
    ApiEndpoint, CLUSTER_NAME_LABEL, ClusterInitialization, MANAGED_BY_ANNOTATION, READY_CONDITION,
};
use tenantry_api::kubevirt::{KUBEVIRT_CLUSTER_FINALIZER, KubevirtCluster, KubevirtClusterStatus};
use tracing::Instrument;

use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::{Cluster, owner, pause};
use crate::kubevirt::infra::{InfraClients, InfraClusterError};
use crate::kubevirt::render::ROLE_LABEL;
use crate::kubevirt::ssh::{self, KeyError, SshKeyPair};
use crate::reconciler::{self, Context, FIELD_MANAGER};

/// Condition: the control-plane Service has an address (CAPK's name).
pub const LOAD_BALANCER_AVAILABLE: &str = "LoadBalancerAvailable";
/// Label on the Service naming its KubevirtCluster.
pub const KUBEVIRT_CLUSTER_LABEL: &str = "infrastructure.tenantry.dev/kubevirtcluster";
/// The API server port the Service exposes.
pub const API_SERVER_PORT: i32 = 6443;
/// Field manager for the one status field mirrored on externally managed clusters.
const CONTRACT_BRIDGE_MANAGER: &str = "tenantry-contract-bridge";

/// The Service fronting a cluster's control plane.
pub fn service_name(cluster_name: &str) -> String {
    format!("{cluster_name}-lb")
}

/// The Secret holding a KubevirtCluster's SSH key pair (CAPK's name).
pub fn ssh_keys_secret_name(kubevirt_cluster: &str) -> String {
    format!("{kubevirt_cluster}-ssh-keys")
}

/// The Secret type Cluster API gives the secrets it and its providers make.
const CLUSTER_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error<KeyError>;

impl reconciler::OwnError for KeyError {}

impl From<KeyError> for Error {
    fn from(error: KeyError) -> Self {
        Error::Own(Box::new(error))
    }
}

struct ClusterContext {
    base: Arc<Context>,
    infra: InfraClients,
}

/// Runs the controller until shutdown.
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let clusters: Api<KubevirtCluster> = config.api(&client);
    let ctx = Arc::new(ClusterContext {
        base,
        infra: InfraClients::default(),
    });
    let service_config = crate::reconciler::watch_config().labels(KUBEVIRT_CLUSTER_LABEL);
    let controller = Controller::new(clusters, config.watcher_config())
        .trigger_backoff(crate::reconciler::trigger_backoff())
        .with_config(config.controller_config());
    ctx.base.track_cache(controller.store());
    controller
        .owns(config.api::<Service>(&client), service_config)
        .watches(
            config.api::<Cluster>(&client),
            config.watcher_config(),
            |cluster| {
                let reference = cluster.spec.infrastructure_ref.as_ref()?;
                (reference.kind == "KubevirtCluster").then(|| {
                    ObjectRef::new(&reference.name)
                        .within(cluster.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "KubevirtCluster reconcile ended with an error");
            }
        })
        .await;
}

fn error_policy(object: Arc<KubevirtCluster>, error: &Error, ctx: Arc<ClusterContext>) -> Action {
    reconciler::error_policy(object, error, ctx.base.clone())
}

async fn reconcile(
    object: Arc<KubevirtCluster>,
    ctx: Arc<ClusterContext>,
) -> Result<Action, Error> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let api: Api<KubevirtCluster> = Api::namespaced(ctx.base.client.clone(), &namespace);
    let span = tracing::info_span!("reconcile", kind = "KubevirtCluster", %namespace, cluster = object.metadata.name.as_deref().unwrap_or_default());
    if is_externally_managed(&object) {
        return bridge_external_contract(&api, &object)
            .instrument(span)
            .await;
    }
    reconciler::reconcile_with_finalizer(
        &ctx.base,
        object,
        KUBEVIRT_CLUSTER_FINALIZER,
        |event| async {
            match event {
                Finalizer::Apply(object) => apply(object, &ctx).await,
                Finalizer::Cleanup(object) => cleanup(object, &ctx).await,
            }
        },
    )
    .await
}

fn is_externally_managed(object: &KubevirtCluster) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MANAGED_BY_ANNOTATION))
}

/// For an externally managed KubevirtCluster: mirror `status.ready` into
/// `status.initialization.provisioned` (and nothing else), and drop our
/// finalizer if the object got the annotation after we had added it.
async fn bridge_external_contract(
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
async fn ensure_ssh_keys(
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

/// The endpoint: a user-set one wins; else the LoadBalancer's address, or the
/// Service's cluster IP for ClusterIP and NodePort (as CAPK does).
pub fn endpoint_from(user: Option<&ApiEndpoint>, service: Option<&Service>) -> Option<ApiEndpoint> {
    if let Some(user) = user.filter(|e| !e.host.is_empty()) {
        return Some(ApiEndpoint {
            host: user.host.clone(),
            port: if user.port == 0 {
                API_SERVER_PORT
            } else {
                user.port
            },
        });
    }
    let service = service?;
    let spec = service.spec.as_ref()?;
    let host = if spec.type_.as_deref() == Some("LoadBalancer") {
        let ingress = service
            .status
            .as_ref()?
            .load_balancer
            .as_ref()?
            .ingress
            .as_ref()?
            .first()?;
        ingress.ip.clone().or_else(|| ingress.hostname.clone())?
    } else {
        spec.cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None")?
    };
    Some(ApiEndpoint {
        host,
        port: API_SERVER_PORT,
    })
}

async fn apply(object: Arc<KubevirtCluster>, ctx: &ClusterContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let name = object.metadata.name.clone().unwrap_or_default();
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let api: Api<KubevirtCluster> = Api::namespaced(client.clone(), &namespace);
    let cluster_name = object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
        .or_else(|| owner::cluster_name(&object.metadata).map(str::to_string));
    let Some(cluster_name) = cluster_name else {
        report(
            &api,
            &object,
            vec![DesiredCondition::false_(
                READY_CONDITION,
                "WaitingForOwnerCluster",
                "no Cluster owns this KubevirtCluster yet",
            )],
            None,
        )
        .await?;
        return Ok(Action::await_change());
    };
    let cluster = owner::get_cluster(client, &namespace, &cluster_name).await?;
    let paused = pause::paused_by(cluster.as_ref(), &object.metadata);
    if paused.is_some() {
        report(&api, &object, vec![pause::paused_condition(paused)], None).await?;
        return Ok(Action::await_change());
    }

    // Act: the SSH key pair machines' bootstrap checks log in with.
    let keys_secret = ensure_ssh_keys(client, &object, &cluster_name).await?;
    let named = object
        .spec
        .ssh_keys
        .as_ref()
        .and_then(|k| k.data_secret_name.as_deref());
    if named != Some(keys_secret.as_str()) {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "sshKeys": { "dataSecretName": keys_secret } } })),
        )
        .await?;
    }

    let template = object.spec.control_plane_service_template.as_ref();
    let service_namespace = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.namespace.clone());
    let infra = match ctx
        .infra
        .resolve(
            client,
            &namespace,
            object.spec.infra_cluster_secret_ref.as_ref(),
            service_namespace.as_deref(),
        )
        .await
    {
        Ok(infra) => infra,
        Err(InfraClusterError::Kube(error)) => return Err(error.into()),
        Err(error) => {
            report(
                &api,
                &object,
                vec![DesiredCondition::false_(
                    READY_CONDITION,
                    "InfraClusterUnavailable",
                    error.to_string(),
                )],
                None,
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };

    // Act: the control-plane Service.
    let mut labels: BTreeMap<String, String> = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(CLUSTER_NAME_LABEL.into(), cluster_name.clone());
    labels.insert(KUBEVIRT_CLUSTER_LABEL.into(), name.clone());
    let service_type = template
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.type_.clone())
        .unwrap_or_else(|| "ClusterIP".into());
    let service = Service {
        metadata: ObjectMeta {
            name: Some(service_name(&cluster_name)),
            namespace: Some(infra.namespace.clone()),
            labels: Some(labels),
            annotations: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.annotations.clone()),
            owner_references: (!infra.external)
                .then(|| object.controller_owner_ref(&()).into_iter().collect()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(service_type),
            selector: Some(BTreeMap::from([
                (ROLE_LABEL.to_string(), "control-plane".to_string()),
                (CLUSTER_NAME_LABEL.to_string(), cluster_name.clone()),
            ])),
            ports: Some(vec![ServicePort {
                port: API_SERVER_PORT,
                target_port: Some(IntOrString::Int(API_SERVER_PORT)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let services = Api::<Service>::namespaced(infra.client.clone(), &infra.namespace);
    let service = services
        .patch(
            &service_name(&cluster_name),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&service),
        )
        .await?;

    // Decide: the endpoint.
    let Some(endpoint) = endpoint_from(object.spec.control_plane_endpoint.as_ref(), Some(&service))
    else {
        report(
            &api,
            &object,
            vec![
                DesiredCondition::false_(
                    LOAD_BALANCER_AVAILABLE,
                    "WaitingForLoadBalancer",
                    format!(
                        "Service {}/{} has no address yet",
                        infra.namespace,
                        service_name(&cluster_name)
                    ),
                ),
                DesiredCondition::false_(
                    READY_CONDITION,
                    "WaitingForLoadBalancer",
                    "the control-plane Service has no address yet",
                ),
            ],
            None,
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(10)));
    };
    if object.spec.control_plane_endpoint.as_ref() != Some(&endpoint) {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "controlPlaneEndpoint": endpoint } })),
        )
        .await?;
    }
    report(
        &api,
        &object,
        vec![
            DesiredCondition::true_(LOAD_BALANCER_AVAILABLE, "LoadBalancerAvailable"),
            DesiredCondition::true_(READY_CONDITION, "Provisioned"),
            pause::paused_condition(None),
        ],
        Some(true),
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn cleanup(object: Arc<KubevirtCluster>, ctx: &ClusterContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let cluster_name = object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Cluster")
        .map(|o| o.name.clone())
        .or_else(|| owner::cluster_name(&object.metadata).map(str::to_string));
    let template_namespace = object
        .spec
        .control_plane_service_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.namespace.clone());
    let Some(cluster_name) = cluster_name else {
        return Ok(Action::await_change());
    };
    let infra = match ctx
        .infra
        .resolve(
            client,
            &namespace,
            object.spec.infra_cluster_secret_ref.as_ref(),
            template_namespace.as_deref(),
        )
        .await
    {
        Ok(infra) => infra,
        Err(InfraClusterError::Kube(error)) => return Err(error.into()),
        Err(error) => return Err(Error::Waiting(error.to_string(), Duration::from_secs(30))),
    };
    let services = Api::<Service>::namespaced(infra.client.clone(), &infra.namespace);
    match services
        .delete(&service_name(&cluster_name), &Default::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(error.into()),
    }
    Ok(Action::await_change())
}

async fn report(
    api: &Api<KubevirtCluster>,
    object: &KubevirtCluster,
    desired: Vec<DesiredCondition>,
    provisioned: Option<bool>,
) -> Result<(), Error> {
    let current = object.status.clone();
    let mut status: KubevirtClusterStatus = current.clone().unwrap_or_default();
    let now = Timestamp::now();
    let mut list = status.conditions.take().unwrap_or_default();
    for condition in &desired {
        conditions::set(&mut list, condition, object.metadata.generation, &now);
    }
    status.conditions = Some(list);
    if let Some(provisioned) = provisioned {
        status.ready = provisioned;
        status.initialization = Some(ClusterInitialization {
            provisioned: Some(provisioned),
        });
    }
    reconciler::apply_status(api, object, current.as_ref(), &status).await?;
    Ok(())
}

#[cfg(test)]
mod tests;
