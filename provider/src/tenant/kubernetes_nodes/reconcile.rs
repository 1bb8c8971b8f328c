//! The reconcile of one `KubernetesNodes` pool: its machine template,
//! Talos bootstrap template, MachineDeployment and MachineHealthCheck in the
//! management namespace; the bootstrap token and the RBAC joining workers
//! need inside the tenant cluster; the pool's size kept within
//! min/maxReplicas; and a status saying how many workers are Ready.
//! Deletion takes the workers down first, then the pool's objects.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::tenant::Kubernetes;
use tenantry_api::tenant_nodes::KubernetesNodes;

use super::act;
use super::decide;
use super::observe;
use super::render::{self as pool, POOL_LABEL, PoolNames};
use super::status::{self, Reason};
use crate::capi::CapiKind;
use crate::reconciler::{self, Context};
use crate::tenant::kubernetes::act::delete_if_present;
use crate::tenant::pki;
use crate::tenant::served::Served;
use crate::tenant::talos::{self, WorkerTrust};

/// How often a pool on its way up is looked at again.
pub(super) const POLL: Duration = Duration::from_secs(5);
/// How often a Ready pool is looked at again.
const RESYNC: Duration = Duration::from_secs(300);

/// Reconcile errors: waits are deliberate, the rest back off.
pub type Error = reconciler::Error;

pub async fn apply_pool(pool: Arc<KubernetesNodes>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let Some(names) = PoolNames::of(&pool) else {
        // The CRD refuses such names; an object from before that rule waits.
        return status::blocked(
            ctx,
            &pool,
            Reason::ClusterNotFound.as_str(),
            format!("metadata.name must be {}-<pool>", pool.spec.cluster),
            RESYNC,
        )
        .await;
    };
    let Some(kubernetes) = Api::<Kubernetes>::namespaced(client.clone(), &namespace)
        .get_opt(&pool.spec.cluster)
        .await?
    else {
        return status::blocked(
            ctx,
            &pool,
            Reason::ClusterNotFound.as_str(),
            format!(
                "spec.cluster: there is no Kubernetes {} in namespace {namespace}; create it, or delete this pool",
                pool.spec.cluster
            ),
            Duration::from_secs(30),
        )
        .await;
    };
    let served = Served::of(ctx).await?;
    if kubernetes.metadata.deletion_timestamp.is_some() {
        return status::blocked(
            ctx,
            &pool,
            Reason::ClusterDeleting.as_str(),
            format!(
                "the Kubernetes {} is being deleted, and its pools with it",
                pool.spec.cluster
            ),
            POLL,
        )
        .await;
    }

    let trust = match observe::read_trust(client, &kubernetes).await {
        Ok(trust) => trust,
        Err(Error::Waiting(message, _)) => {
            return status::blocked(
                ctx,
                &pool,
                Reason::WaitingForControlPlane.as_str(),
                message,
                POLL,
            )
            .await;
        }
        Err(error) => return Err(error),
    };
    if let Err(error) = act::ensure_tenant_join(ctx, &kubernetes, &trust).await {
        let message = format!(
            "the join token cannot be written into the tenant cluster ({error}); workers wait for it"
        );
        return status::blocked(
            ctx,
            &pool,
            Reason::TenantUnreachable.as_str(),
            message,
            POLL,
        )
        .await;
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

    let owner = act::owner_reference(&pool);
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
        &act::talos_config_template_resource(),
    );
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ctx.capi.resource(CapiKind::MachineDeployment),
    );
    let applied = async {
        // Machine templates are immutable and named by their content: one
        // that exists is already what we want (and re-applying it would
        // only trip over fields the CRD prunes).
        let templates: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &act::machine_template_resource(&template_kind),
        );
        if templates.get_opt(&template_name).await?.is_none() {
            act::apply(&templates, template, &owner).await?;
        }
        // So is the bootstrap template (CABPT's webhook refuses changes).
        if bootstrap_templates
            .get_opt(&bootstrap_template_name)
            .await?
            .is_none()
        {
            act::apply(&bootstrap_templates, bootstrap_template, &owner).await?;
        }
        let deployment = act::apply(
            &deployments,
            served.capi_object(
                CapiKind::MachineDeployment,
                pool::machine_deployment(
                    &kubernetes,
                    &pool,
                    &names,
                    &template_name,
                    &bootstrap_template_name,
                ),
            ),
            &owner,
        )
        .await?;
        act::apply(
            &Api::namespaced_with(
                client.clone(),
                &namespace,
                &ctx.capi.resource(CapiKind::MachineHealthCheck),
            ),
            served.capi_object(
                CapiKind::MachineHealthCheck,
                pool::machine_health_check(&pool, &names),
            ),
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
                Reason::ApplyFailed.as_str(),
                message.clone(),
            )
            .await;
            return status::blocked(
                ctx,
                &pool,
                Reason::ApplyFailed.as_str(),
                message,
                Duration::from_secs(60),
            )
            .await;
        }
        Err(error) => return Err(error),
    };
    let desired = act::clamp_replicas(&deployments, &deployment, &pool).await?;
    act::collect_old_templates(
        client,
        ctx.capi,
        &namespace,
        &names,
        &act::machine_template_resource(&template_kind),
        "/spec/template/spec/infrastructureRef/name",
        &template_name,
    )
    .await?;
    act::collect_old_templates(
        client,
        ctx.capi,
        &namespace,
        &names,
        &act::talos_config_template_resource(),
        "/spec/template/spec/bootstrap/configRef/name",
        &bootstrap_template_name,
    )
    .await?;

    let (workers, replicas, ready) = decide::workers_condition(
        &served.read_machine_deployment(serde_json::to_value(&deployment).unwrap_or_default()),
        desired,
    );
    let is_ready = status::write_status(ctx, &pool, workers, Some(replicas), Some(ready)).await?;
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
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ctx.capi.resource(CapiKind::MachineDeployment),
    );
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ctx.capi.resource(CapiKind::Machine),
    );
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
        &Api::namespaced_with(
            client.clone(),
            &namespace,
            &ctx.capi.resource(CapiKind::MachineHealthCheck),
        ),
        &names.objects,
    )
    .await?;
    let own = ListParams::default().labels(&format!("{POOL_LABEL}={}", names.pool_object));
    let bootstrap_templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &act::talos_config_template_resource(),
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
        let templates: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &act::machine_template_resource(kind),
        );
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
