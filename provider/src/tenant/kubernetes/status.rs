//! What a `Kubernetes` object says about itself: one [`Reason`] per state
//! on its conditions, and the status write with its `Ready` summary.

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::EventType;
use tenantry_api::tenant::{Kubernetes, READY_CONDITION};

use crate::capi::conditions::{self, DesiredCondition};
use crate::reconciler::{self, Context};

use super::decide;
use super::reconcile::Error;
pub use crate::tenant::reasons::Reason;

/// What a reconcile found, for [`write_status`].
pub(super) struct Report {
    pub(super) conditions: Vec<DesiredCondition>,
    pub(super) endpoint: Option<String>,
    pub(super) kubeconfig: Option<String>,
    pub(super) version: Option<String>,
}

pub(super) async fn write_status(
    ctx: &Context,
    kubernetes: &Kubernetes,
    observed: Report,
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
    let summary = decide::ready_summary(&observed.conditions);
    let ready = summary.is_true();
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
            Reason::Ready.as_str(),
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
