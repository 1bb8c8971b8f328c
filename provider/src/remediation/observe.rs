//! What a remediation reconcile reads before it decides: its Machine (the
//! owner CAPI set, or the one of the same name), the Cluster, and pause.

use super::controller::RemediationObject;
use super::decide::{HEALTH_CHECK_SUCCEEDED, MachineState};
use super::reconcile::{Error, Run};
use crate::capi::{Machine, owner, pause};

/// The Machine under remediation, as observed.
pub(super) struct Observation {
    pub machine_name: String,
    pub machine: Option<Machine>,
    pub state: MachineState,
}

impl<K: RemediationObject> Run<'_, K> {
    /// The Machine and its state; `None` when paused (and reported).
    pub(super) async fn observe(&mut self) -> Result<Option<Observation>, Error> {
        let client = self.ctx.base.client.clone();
        // The Machine: the owner CAPI set, or the one of the same name.
        let (machine_name, owner_uid) = match owner::machine_owner(self.object.meta()) {
            Some(owner) => (owner.name.clone(), Some(owner.uid.clone())),
            None => (self.name.clone(), None),
        };
        let machine = crate::capi::access::get::<Machine>(
            &client,
            self.ctx.base.capi,
            &self.namespace,
            &machine_name,
        )
        .await?
        .filter(|m| owner_uid.is_none() || m.metadata.uid == owner_uid);

        // Pause, as the contract asks: the Cluster, this object, or (as
        // CAPI's MachineHealthCheck checks) the Machine.
        let cluster_name = owner::cluster_name(self.object.meta())
            .map(str::to_string)
            .or_else(|| machine.as_ref().map(|m| m.spec.cluster_name.clone()));
        let cluster = match &cluster_name {
            Some(cluster_name) => {
                owner::get_cluster(&client, self.ctx.base.capi, &self.namespace, cluster_name)
                    .await?
            }
            None => None,
        };
        let paused = pause::paused_by(cluster.as_ref(), self.object.meta()).or_else(|| {
            machine
                .as_ref()
                .and_then(|m| pause::paused_by(None, &m.metadata))
        });
        if paused.is_some() {
            self.set_condition(pause::paused_condition(paused));
            self.persist().await?;
            return Ok(None);
        }
        self.set_condition(pause::paused_condition(None));

        let state = match &machine {
            None => MachineState::Gone,
            Some(m) if m.metadata.deletion_timestamp.is_some() => MachineState::Deleting,
            Some(m) => MachineState::Present {
                healthy: health_check_succeeded(m),
            },
        };
        Ok(Some(Observation {
            machine_name,
            machine,
            state,
        }))
    }
}

/// Whether CAPI's MachineHealthCheck says the Machine is healthy.
fn health_check_succeeded(machine: &Machine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.r#type == HEALTH_CHECK_SUCCEEDED))
        .is_some_and(|c| {
            matches!(
                c.status,
                tenantry_api::generated::capi::machine::MachineStatusConditionsStatus::True
            )
        })
}
