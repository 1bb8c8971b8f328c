//! What a ProxmoxMachine says about itself: one [`Reason`] per state it can
//! report on `VirtualMachineProvisioned` and `Ready`, with how serious each
//! is. Events, the failure lists of the tests and metric labels all read
//! them from here.

use crate::capi::conditions::{self, DesiredCondition};
use crate::capi::stores::OwnerWaits;
use crate::proxmox::client::ProxmoxError;

/// Condition: the VM exists, is configured, runs and reported its address
/// (capmox's name).
pub const VM_PROVISIONED: &str = "VirtualMachineProvisioned";

pub use crate::proxmox::reasons::Reason;

impl Reason {
    /// What a task of a type is doing while it runs, and what its failure
    /// is called.
    pub fn of_task(task_type: &str) -> (Reason, Reason) {
        match task_type {
            "qmclone" => (Reason::Cloning, Reason::CloningFailed),
            "qmconfig" => (Reason::Configuring, Reason::ConfigurationFailed),
            "resize" => (Reason::ResizingDisk, Reason::DiskResizeFailed),
            "imgcopy" | "imgdel" => (Reason::UploadingBootstrapData, Reason::BootstrapDataFailed),
            "qmstart" => (Reason::PoweringOn, Reason::PoweringOnFailed),
            "qmstop" | "qmdestroy" => (Reason::Deleting, Reason::DeletionFailed),
            _ => (Reason::Configuring, Reason::TaskFailed),
        }
    }

    /// The `Ready` reason of a machine backing off after a PVE error that no
    /// step turned into a reason of its own: the API being unavailable (what
    /// settles by itself, and a bare 5xx), or a request it refused.
    pub fn of_backoff(error: &ProxmoxError) -> Reason {
        match error {
            ProxmoxError::Rejected { status, .. } if *status >= 500 => Reason::ProxmoxUnavailable,
            error if error.is_transient() => Reason::ProxmoxUnavailable,
            _ => Reason::ProxmoxRequestFailed,
        }
    }

    /// A PVE refusal of a step: the credentials' own trouble keeps PVE's
    /// name for it, anything else is the step's failure.
    pub fn of_refusal(error: &ProxmoxError, step_failed: Reason) -> Reason {
        match error {
            ProxmoxError::PermissionDenied { .. } => Reason::PermissionDenied,
            ProxmoxError::Unauthorized { .. } => Reason::Unauthorized,
            ProxmoxError::Tls { .. } => Reason::TlsHandshakeFailed,
            _ => step_failed,
        }
    }

    /// A reason named elsewhere (credentials, client settings, placement),
    /// falling back to `otherwise` for one this list does not know.
    pub fn named(text: &str, otherwise: Reason) -> Reason {
        Reason::parse(text).unwrap_or(otherwise)
    }
}

impl OwnerWaits for Reason {
    const OWNER_MACHINE: Reason = Reason::WaitingForOwnerMachine;
    const CLUSTER: Reason = Reason::WaitingForCluster;
    const CLUSTER_INFRASTRUCTURE: Reason = Reason::WaitingForClusterInfrastructure;
}

/// The pair of conditions a machine reports while not provisioned.
pub fn waiting(reason: Reason, message: impl Into<String>) -> [DesiredCondition; 2] {
    conditions::not_provisioned(VM_PROVISIONED, reason.as_str(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_names_an_unavailable_api_or_the_refused_request() {
        let bare_500 = ProxmoxError::Rejected {
            status: 500,
            message: "Internal Server Error".into(),
        };
        let unavailable = ProxmoxError::Unavailable {
            status: 503,
            message: "Service Unavailable".into(),
        };
        let refused = ProxmoxError::Rejected {
            status: 400,
            message: "shrinking disks is not supported".into(),
        };
        let missing = ProxmoxError::NotFound {
            message: "no such pool".into(),
        };
        assert_eq!(Reason::of_backoff(&bare_500), Reason::ProxmoxUnavailable);
        assert_eq!(Reason::of_backoff(&unavailable), Reason::ProxmoxUnavailable);
        assert_eq!(Reason::of_backoff(&refused), Reason::ProxmoxRequestFailed);
        assert_eq!(Reason::of_backoff(&missing), Reason::ProxmoxRequestFailed);
        assert!(Reason::parse("ProxmoxRequestFailed").is_some_and(Reason::is_failure));
        assert!(!Reason::parse("ProxmoxUnavailable").is_some_and(Reason::is_failure));
        assert!(!Reason::parse("WaitingForProvisioningTurn").is_some_and(Reason::is_failure));
        assert!(!Reason::parse("SomethingElse").is_some_and(Reason::is_failure));
    }

    #[test]
    fn every_reason_reads_back_as_itself() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
            assert!(reason.as_str().chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn the_reasons_named_elsewhere_are_all_known() {
        use crate::proxmox::client::ConfigError;
        use crate::proxmox::credentials::CredentialsError;
        let credentials = [
            CredentialsError::SecretNotFound {
                namespace: "n".into(),
                name: "s".into(),
            },
            CredentialsError::NoCredentials,
            CredentialsError::Invalid {
                source_name: "s".into(),
                error: ConfigError::InvalidUrl {
                    url: "x".into(),
                    reason: "y".into(),
                },
            },
        ];
        for error in credentials {
            assert!(
                Reason::parse(error.reason()).is_some(),
                "{}",
                error.reason()
            );
        }
        for name in [
            "CredentialsRefInvalid",
            "CredentialsUnreadable",
            "InvalidCredentials",
            "InvalidCertificateAuthority",
            "ClientSetupFailed",
            "InsufficientResources",
            "NoNodeAvailable",
        ] {
            assert!(
                Reason::parse(name).is_some_and(Reason::is_failure),
                "{name}"
            );
        }
    }
}
