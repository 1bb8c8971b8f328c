//! Pure decisions for a KubevirtMachine, by concept: what its VM, VMI and
//! DataVolumes say (`vm_state`), how its bootstrap is confirmed
//! (`bootstrap_check`), what it waits for before a VM exists, and when it
//! is looked at next. Nothing here holds a client.

pub mod bootstrap_check;
pub mod vm_state;

use std::time::Duration;

pub use bootstrap_check::*;
pub use vm_state::*;

use tenantry_api::kubevirt::KubevirtMachineStatus;

use super::status::Reason;
use crate::capi::{Cluster, Machine, owner};
use crate::kubevirt::render::MachineRole;

/// How often a provisioned machine is looked at without any event.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often a machine whose VM lives in an external infrastructure cluster
/// (no watches there) is polled while provisioning.
pub const EXTERNAL_POLL: Duration = Duration::from_secs(10);
/// How often the ssh bootstrap check reads the sentinel until it says
/// `success` (CAPK: 10 s).
pub const BOOTSTRAP_CHECK_POLL: Duration = Duration::from_secs(10);
/// The safety net while a machine in the management cluster provisions:
/// its VM's, VMI's and DataVolumes' changes wake it.
pub const PROVISIONING_RESYNC: Duration = Duration::from_secs(60);
/// How long to wait before retrying what a human has to fix.
pub const HUMAN_RETRY: Duration = Duration::from_secs(60);

/// A state the machine reports while it waits; `retry: None` waits for an
/// event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub reason: Reason,
    pub message: String,
    pub retry: Option<Duration>,
}

impl Wait {
    pub fn new(reason: Reason, message: impl Into<String>, retry: Option<Duration>) -> Self {
        Wait {
            reason,
            message: message.into(),
            retry,
        }
    }
}

/// What a machine waits for while its Machine has no bootstrap data: a
/// worker first waits for its control plane, as CAPI's bootstrap providers
/// do.
pub fn waiting_for_bootstrap_data(
    role: MachineRole,
    cluster: &Cluster,
    owner_machine: &Machine,
) -> Wait {
    let cluster_name = cluster.metadata.name.as_deref().unwrap_or_default();
    if role == MachineRole::Worker && !owner::control_plane_initialized(cluster) {
        Wait::new(
            Reason::WaitingForControlPlane,
            format!("workers wait for Cluster {cluster_name}'s control plane to be initialized"),
            Some(RESYNC),
        )
    } else {
        Wait::new(
            Reason::WaitingForBootstrapData,
            format!(
                "Machine {} has no bootstrap data yet (spec.bootstrap.dataSecretName)",
                owner_machine.metadata.name.as_deref().unwrap_or_default()
            ),
            Some(RESYNC),
        )
    }
}

/// When a machine whose VM exists is looked at next. A Ready guest changes
/// nothing in the API while it bootstraps, so no event would wake the
/// check up: it polls; so does a machine whose VM lives where no watch of
/// ours looks.
pub fn next_look(provisioned: bool, checking_guest: bool, external: bool) -> Duration {
    match (provisioned, checking_guest, external) {
        (true, _, _) => RESYNC,
        (false, true, _) => BOOTSTRAP_CHECK_POLL,
        (false, false, true) => EXTERNAL_POLL,
        (false, false, false) => PROVISIONING_RESYNC,
    }
}

/// Whether the machine was provisioned once (the v1beta2 contract's
/// `initialization.provisioned`, which never goes back to false). CAPK
/// writes no `initialization`; it sets the providerID once its VM is
/// ready (and bootstrapped), so a machine taken over from CAPK with one
/// counts as provisioned.
pub fn initially_provisioned(
    status: Option<&KubevirtMachineStatus>,
    provider_id: Option<&str>,
) -> bool {
    match status
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
    {
        Some(provisioned) => provisioned,
        None => provider_id.is_some_and(|id| !id.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn cluster(initialized: bool) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": "demo", "namespace": "default" },
            "spec": {},
            "status": { "initialization": { "controlPlaneInitialized": initialized } },
        }))
        .unwrap()
    }

    fn machine() -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": { "name": "worker-1", "namespace": "default" },
            "spec": { "clusterName": "demo", "bootstrap": {}, "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachine", "name": "worker-1" } },
        }))
        .unwrap()
    }

    #[test]
    fn workers_wait_for_the_control_plane_then_everyone_for_the_data() {
        let cases = [
            (MachineRole::Worker, false, Reason::WaitingForControlPlane),
            (MachineRole::Worker, true, Reason::WaitingForBootstrapData),
            (
                MachineRole::ControlPlane,
                false,
                Reason::WaitingForBootstrapData,
            ),
        ];
        for (role, initialized, expected) in cases {
            let wait = waiting_for_bootstrap_data(role, &cluster(initialized), &machine());
            assert_eq!(wait.reason, expected, "{role:?}, initialized {initialized}");
            assert_eq!(wait.retry, Some(RESYNC));
        }
    }

    #[test]
    fn a_machine_capk_provisioned_counts_as_provisioned() {
        let status = |value: Value| serde_json::from_value::<KubevirtMachineStatus>(value).unwrap();
        // CAPK's: v1beta1 fields only, and the providerID.
        let capk = status(json!({ "ready": true }));
        assert!(initially_provisioned(
            Some(&capk),
            Some("kubevirt://worker-1")
        ));
        assert!(!initially_provisioned(Some(&capk), None));
        assert!(!initially_provisioned(None, None));
        // Tenantry's record wins.
        let ours = status(json!({ "ready": false, "initialization": { "provisioned": false } }));
        assert!(!initially_provisioned(
            Some(&ours),
            Some("kubevirt://worker-1")
        ));
        let ours = status(json!({ "ready": true, "initialization": { "provisioned": true } }));
        assert!(initially_provisioned(Some(&ours), None));
    }

    #[test]
    fn a_machine_polls_only_where_no_event_would_wake_it() {
        let cases = [
            ((true, false, true), RESYNC),
            ((false, true, false), BOOTSTRAP_CHECK_POLL),
            ((false, false, true), EXTERNAL_POLL),
            ((false, false, false), PROVISIONING_RESYNC),
        ];
        for ((provisioned, checking, external), expected) in cases {
            assert_eq!(next_look(provisioned, checking, external), expected);
        }
    }
}
