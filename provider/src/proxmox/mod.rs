//! The Proxmox VE substrate: the PVE API client, the ProxmoxCluster and
//! ProxmoxMachine reconcilers, the NoCloud seed, the node scheduler and
//! the ProxmoxMachineTemplate status.

pub mod client;
pub mod cluster;
pub mod credentials;
pub mod machine;
pub mod nocloud;
pub mod reasons;
pub mod scheduler;
pub mod template;

use std::time::Duration;

use client::ProxmoxError;

/// The longest pause between tries while PVE answers a transient error.
pub const TRANSIENT_BACKOFF_CAP: Duration = Duration::from_secs(30);

/// PVE being unavailable or unreachable passes by itself; once it has, a
/// reconciler should go on within half a minute, not after a backoff that
/// doubled to minutes during the outage.
impl crate::reconciler::OwnError for ProxmoxError {
    fn backoff_cap(&self) -> Option<Duration> {
        self.is_transient().then_some(TRANSIENT_BACKOFF_CAP)
    }
}

impl From<ProxmoxError> for crate::reconciler::Error<ProxmoxError> {
    fn from(error: ProxmoxError) -> Self {
        crate::reconciler::Error::Own(Box::new(error))
    }
}
