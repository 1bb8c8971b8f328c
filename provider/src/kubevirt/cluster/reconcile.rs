//! One reconcile of a KubevirtCluster: the SSH key pair, the control-plane
//! Service and the endpoint taken from it; deletion removes the Service.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as Finalizer;
use serde_json::json;
use tenantry_api::contract::READY_CONDITION;
use tenantry_api::kubevirt::{KUBEVIRT_CLUSTER_FINALIZER, KubevirtCluster};
use tracing::Instrument;

use super::act::{bridge_external_contract, ensure_ssh_keys};
use super::decide::{self, endpoint_from};
use super::status::{Reason, report};
use super::{ClusterContext, Error, LOAD_BALANCER_AVAILABLE, service_name};
use crate::capi::conditions::DesiredCondition;
use crate::capi::{owner, pause};
use crate::kubevirt::infra::{InfraCluster, InfraClusterError};
use crate::reconciler::{self, FIELD_MANAGER};

pub(super) async fn reconcile(
    object: Arc<KubevirtCluster>,
    ctx: Arc<ClusterContext>,
) -> Result<Action, Error> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let api: Api<KubevirtCluster> = Api::namespaced(ctx.base.client.clone(), &namespace);
    let span = tracing::info_span!("reconcile", kind = "KubevirtCluster", %namespace, cluster = object.metadata.name.as_deref().unwrap_or_default());
    if decide::is_externally_managed(&object) {
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

async fn apply(object: Arc<KubevirtCluster>, ctx: &ClusterContext) -> Result<Action, Error> {
    let client = &ctx.base.client;
    let name = object.metadata.name.clone().unwrap_or_default();
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let api: Api<KubevirtCluster> = Api::namespaced(client.clone(), &namespace);
    let Some(cluster_name) = owner::owning_cluster_name(&object.metadata) else {
        report(
            &api,
            &object,
            vec![DesiredCondition::false_(
                READY_CONDITION,
                Reason::WaitingForOwnerCluster.as_str(),
                "no Cluster owns this KubevirtCluster yet",
            )],
            None,
        )
        .await?;
        return Ok(Action::await_change());
    };
    let cluster = owner::get_cluster(client, ctx.base.capi, &namespace, &cluster_name).await?;
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

    let infra = match infra_cluster(ctx, &object).await {
        Ok(infra) => infra,
        Err(InfraClusterError::Kube(error)) => return Err(error.into()),
        Err(error) => {
            report(
                &api,
                &object,
                vec![DesiredCondition::false_(
                    READY_CONDITION,
                    Reason::InfraClusterUnavailable.as_str(),
                    error.to_string(),
                )],
                None,
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };

    // Act: the control-plane Service.
    let desired =
        decide::control_plane_service(&object, &cluster_name, &infra.namespace, infra.external);
    let services = Api::<Service>::namespaced(infra.client.clone(), &infra.namespace);
    let service = services
        .patch(
            &service_name(&cluster_name),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&desired),
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
                    Reason::WaitingForLoadBalancer.as_str(),
                    format!(
                        "Service {}/{} has no address yet",
                        infra.namespace,
                        service_name(&cluster_name)
                    ),
                ),
                DesiredCondition::false_(
                    READY_CONDITION,
                    Reason::WaitingForLoadBalancer.as_str(),
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
            DesiredCondition::true_(
                LOAD_BALANCER_AVAILABLE,
                Reason::LoadBalancerAvailable.as_str(),
            ),
            DesiredCondition::true_(READY_CONDITION, Reason::Provisioned.as_str()),
            pause::paused_condition(None),
        ],
        Some(true),
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn cleanup(object: Arc<KubevirtCluster>, ctx: &ClusterContext) -> Result<Action, Error> {
    let cluster_name = owner::owning_cluster_name(&object.metadata);
    let Some(cluster_name) = cluster_name else {
        return Ok(Action::await_change());
    };
    let infra = match infra_cluster(ctx, &object).await {
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

/// Where the control-plane Service lives: the infrastructure cluster the
/// KubevirtCluster names (else the management cluster), in the template's
/// namespace (else the cluster's).
async fn infra_cluster(
    ctx: &ClusterContext,
    object: &KubevirtCluster,
) -> Result<InfraCluster, InfraClusterError> {
    let service_namespace = object
        .spec
        .control_plane_service_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.namespace.as_deref());
    ctx.infra
        .resolve(
            &ctx.base.client,
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.spec.infra_cluster_secret_ref.as_ref(),
            service_namespace,
        )
        .await
}
