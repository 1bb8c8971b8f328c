//! What a KubevirtMachine says about itself: one [`Reason`] per state it
//! can report on `VMProvisioned`, `BootstrapExecSucceeded` and `Ready`,
//! with how serious each is (CAPK's names where CAPK has one).

use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::stores::OwnerWaits;
pub use crate::kubevirt::reasons::Reason;

/// Condition: the VirtualMachine exists and its instance is Ready (CAPK's name).
pub const VM_PROVISIONED: &str = "VMProvisioned";
/// Condition: the bootstrap check passed (CAPK's name).
pub const BOOTSTRAP_EXEC_SUCCEEDED: &str = "BootstrapExecSucceeded";

impl OwnerWaits for Reason {
    const OWNER_MACHINE: Reason = Reason::WaitingForOwnerMachine;
    const CLUSTER: Reason = Reason::WaitingForCluster;
    const CLUSTER_INFRASTRUCTURE: Reason = Reason::WaitingForClusterInfrastructure;
}

/// The pair of conditions a machine reports while no VM speaks for it.
pub fn waiting(reason: Reason, message: impl Into<String>) -> [DesiredCondition; 2] {
    conditions::not_provisioned(VM_PROVISIONED, reason.as_str(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_operator_must_fix_is_a_failure() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
        }
        assert!(Reason::parse("DataVolumeImportFailed").is_some_and(Reason::is_failure));
        assert!(Reason::parse("VMCreateFailed").is_some_and(Reason::is_failure));
        assert!(!Reason::parse("WaitingForVirtualMachineInstance").is_some_and(Reason::is_failure));
        assert!(
            !Reason::parse("InfraClusterAPIError").is_some_and(Reason::is_failure),
            "passes by itself"
        );
        assert!(!Reason::parse("Paused").is_some_and(Reason::is_failure));
    }
}
