//! What a KubevirtMachine says about itself: one [`Reason`] per state it
//! can report on `VMProvisioned`, `BootstrapExecSucceeded` and `Ready`,
//! with how serious each is (CAPK's names where CAPK has one).

use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::stores::NotYet;
pub use crate::reconciler::reasons::Severity;
use crate::reconciler::reasons::reasons;

/// Condition: the VirtualMachine exists and its instance is Ready (CAPK's name).
pub const VM_PROVISIONED: &str = "VMProvisioned";
/// Condition: the bootstrap check passed (CAPK's name).
pub const BOOTSTRAP_EXEC_SUCCEEDED: &str = "BootstrapExecSucceeded";

reasons! {
    WaitingForOwnerMachine = "WaitingForOwnerMachine", Progress;
    WaitingForCluster = "WaitingForCluster", Progress;
    WaitingForClusterInfrastructure = "WaitingForClusterInfrastructure", Progress;
    WaitingForControlPlane = "WaitingForControlPlaneInitialized", Progress;
    WaitingForBootstrapData = "WaitingForBootstrapData", Progress;
    BootstrapDataSecretMissing = "BootstrapDataSecretNotFound", Failure;
    InfraClusterUnavailable = "InfraClusterUnavailable", Failure;
    /// A request to the infrastructure cluster failed; retried with backoff.
    InfraClusterApiError = "InfraClusterAPIError", Progress;
    InvalidSpec = "InvalidSpec", Failure;
    VmCreateFailed = "VMCreateFailed", Failure;
    WaitingForVm = "WaitingForVirtualMachine", Progress;
    DataVolumeImporting = "DataVolumeImporting", Progress;
    DataVolumeImportFailed = "DataVolumeImportFailed", Failure;
    WaitingForVmi = "WaitingForVirtualMachineInstance", Progress;
    VmStopped = "VMStopped", Progress;
    VmStartFailing = "VMStartFailing", Failure;
    Unschedulable = "Unschedulable", Failure;
    ImagePullFailed = "ImagePullFailed", Failure;
    VmiFailed = "VMIFailed", Failure;
    VmiEvicted = "VMIEvicted", Failure;
    VmNotReady = "VMNotReady", Progress;
    VmTerminal = "VMTerminal", Failure;
    Provisioned = "Provisioned", Progress;
    Deleting = "Deleting", Progress;
    BootstrapCheckDisabled = "BootstrapCheckDisabled", Progress;
    BootstrapCheckNotSupported = "BootstrapCheckingNotSupported", Progress;
    WaitingForSshKeys = "WaitingForSSHKeys", Progress;
    SshKeysInvalid = "SSHKeysInvalid", Failure;
    InvalidBootstrapData = "InvalidBootstrapData", Failure;
    WaitingForIpAddress = "WaitingForIPAddress", Progress;
    WaitingForBootstrapSentinel = "WaitingForBootstrapSentinel", Progress;
    BootstrapSentinelUnexpected = "BootstrapSentinelUnexpected", Failure;
    SshConnectionFailed = "SSHConnectionFailed", Progress;
    SshAuthenticationFailed = "SSHAuthenticationFailed", Progress;
    BootstrapSentinelFound = "BootstrapSentinelFound", Progress;
}

impl Reason {
    /// The reason of a machine waiting for its owners (pause is not a
    /// wait: it is reported on `Paused`).
    pub fn waiting_for(not_yet: &NotYet) -> Reason {
        match not_yet {
            NotYet::NoOwnerMachine | NotYet::Paused(_) => Reason::WaitingForOwnerMachine,
            NotYet::NoCluster { .. } => Reason::WaitingForCluster,
            NotYet::InfrastructureNotProvisioned { .. } => Reason::WaitingForClusterInfrastructure,
        }
    }
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
        assert!(is_failure("DataVolumeImportFailed"));
        assert!(is_failure("VMCreateFailed"));
        assert!(!is_failure("WaitingForVirtualMachineInstance"));
        assert!(!is_failure("InfraClusterAPIError"), "passes by itself");
        assert!(!is_failure("Paused"));
    }
}
