//! What a ProxmoxCluster reports: one [`Reason`] per fixed state of its
//! conditions (the hypervisor's refusals carry the client's own reasons),
//! and provisioning, which is recorded once and never taken back (v1beta2).

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tenantry_api::contract::{ClusterInitialization, READY_CONDITION};
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxClusterStatus};

use super::reconcile::Error;
use crate::capi::conditions::{self, DesiredCondition};
pub use crate::proxmox::reasons::Reason;
use crate::reconciler;

/// The outcome a reconcile reports.
#[derive(Default)]
pub(super) struct Report {
    pub conditions: Vec<DesiredCondition>,
    pub provisioned: Option<bool>,
}

impl Report {
    pub(super) fn not_ready(reason: &str, message: impl Into<String>) -> Self {
        Self {
            conditions: vec![DesiredCondition::false_(READY_CONDITION, reason, message)],
            provisioned: None,
        }
    }
}

pub(super) async fn report(
    api: &Api<ProxmoxCluster>,
    object: &ProxmoxCluster,
    mut status: ProxmoxClusterStatus,
    outcome: Report,
) -> Result<(), Error> {
    let now = Timestamp::now();
    let mut list = status.conditions.take().unwrap_or_default();
    for condition in &outcome.conditions {
        conditions::set(&mut list, condition, object.metadata.generation, &now);
    }
    status.conditions = Some(list);
    if outcome.provisioned == Some(true) {
        // Provisioning is recorded once and never taken back (v1beta2).
        status.ready = true;
        status.initialization = Some(ClusterInitialization {
            provisioned: Some(true),
        });
    } else if status.initialization.is_none() {
        status.initialization = Some(ClusterInitialization {
            provisioned: Some(false),
        });
    }
    reconciler::apply_status(api, object, object.status.as_ref(), &status).await?;
    Ok(())
}
