//! What a `KubernetesNodes` pool says about itself: one [`Reason`] per
//! state on its conditions, and the status write.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tenantry_api::tenant_nodes::{
    KubernetesNodes, KubernetesNodesStatus, READY_CONDITION, WORKERS_READY_CONDITION,
};

use crate::capi::conditions::{self, DesiredCondition};
use crate::reconciler::{self, Context};

use super::decide;
use super::reconcile::Error;
pub use crate::tenant::reasons::Reason;

pub(super) async fn write_status(
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
    let summary = decide::ready_summary(&workers);
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
        ctx.event(
            pool,
            EventType::Normal,
            Reason::Ready.as_str(),
            summary.message,
        )
        .await;
    }
    Ok(ready)
}

/// Reports a pool that cannot go on, with the reason a human acts on.
pub(super) async fn blocked(
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
