//! What a KubevirtCluster reports: one [`Reason`] per state of its
//! conditions, and whether it is provisioned (v1beta1 `ready` and v1beta2
//! `initialization`).

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tenantry_api::contract::ClusterInitialization;
use tenantry_api::kubevirt::{KubevirtCluster, KubevirtClusterStatus};

use super::Error;
use crate::capi::conditions::{self, DesiredCondition};
pub use crate::kubevirt::reasons::Reason;
use crate::reconciler;

pub(super) async fn report(
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
