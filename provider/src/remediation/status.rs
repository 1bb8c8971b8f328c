//! What a remediation says on its `Remediated` condition: one [`Reason`]
//! per state, with how serious each is.

pub use crate::reconciler::reasons::Severity;
use crate::reconciler::reasons::reasons;

reasons! {
    /// A restart is being issued.
    Rebooting = "Rebooting", Progress;
    /// Restarted; waiting for the Machine to pass its health check.
    WaitingForNodeHealthy = "WaitingForNodeHealthy", Progress;
    /// The restart could not be issued; the message carries the API's answer.
    RebootFailed = "RebootFailed", Failure;
    /// No retries left: the Machine was deleted so that it is replaced.
    RetriesExhausted = "RetriesExhausted", Progress;
    /// The Machine could not be deleted.
    MachineDeleteFailed = "MachineDeleteFailed", Failure;
    /// The Machine passes its health check again.
    MachineHealthy = "MachineHealthy", Progress;
    /// The Machine does not exist (any more).
    MachineNotFound = "MachineNotFound", Progress;
    /// The Machine is being deleted.
    MachineDeleting = "MachineDeleting", Progress;
    /// The spec cannot be acted on.
    InvalidSpec = "InvalidSpec", Failure;
}
