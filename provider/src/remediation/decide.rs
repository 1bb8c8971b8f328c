//! What a remediation does next, from what was observed: its recorded
//! status, its strategy and the Machine. Pure: no client, no clock (the
//! time is an input), so every rule is unit-tested here.
//!
//! The life of a remediation, one step per reconcile:
//!
//! ```text
//!  (new) --retryLimit > 0--> Rebooting --issued--> Waiting --healthy--> (deleted by the MHC)
//!    |                           |                    |
//!    |                           +--refused--> Failed-+--timeout, retries left--> Rebooting
//!    |                                                |
//!    +--retryLimit = 0----------------------------->  +--timeout, no retries left--> Replacing
//! ```
//!
//! Crash safety: the attempt (`retryCount`, `lastRemediated`, phase
//! `Rebooting`) is written before the restart is issued. A manager that
//! finds `Rebooting` on start finishes that attempt instead of starting a
//! new one: KubeVirt deletes the instance UID recorded with the attempt
//! (deleting it twice is harmless, and a newer instance is protected by the
//! UID precondition); Proxmox VE polls the reset task whose UPID was
//! recorded, or, when the manager died between recording the attempt and
//! PVE answering, treats the attempt as made: at most one reset per
//! attempt, never two, at the price of waiting one timeout for nothing in
//! that rare case.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tenantry_api::remediation::{RemediationPhase, RemediationStatus};

/// Event reasons.
pub mod event {
    /// A restart was issued.
    pub const REBOOTED: &str = "Rebooted";
    /// A restart could not be issued.
    pub const REBOOT_FAILED: &str = "RebootFailed";
    /// The Machine was deleted to be replaced.
    pub const MACHINE_DELETED: &str = "MachineDeleted";
}

/// The condition type CAPI's MachineHealthCheck sets on a Machine.
pub const HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";

/// The Machine being remediated, as observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineState {
    /// No such Machine, or one of the same name that is not the owner.
    Gone,
    /// Being deleted: replacement is under way, whoever started it.
    Deleting,
    /// There; `healthy` when its `HealthCheckSucceeded` condition is True.
    Present { healthy: bool },
}

/// What a reconcile knows when it decides.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    pub status: &'a RemediationStatus,
    pub retry_limit: u32,
    pub timeout: Duration,
    pub machine: MachineState,
    pub now: Timestamp,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// The Machine is gone or going: nothing to remediate.
    Idle,
    /// Record attempt `attempt` (the new `retryCount`), then restart.
    Restart { attempt: u32 },
    /// An attempt was recorded but not seen through (the manager stopped in
    /// between): finish that one, never start another.
    FinishRestart,
    /// Wait for the Machine to pass its health check; look again after
    /// `remaining` at the latest.
    Wait { remaining: Duration },
    /// The Machine passes its health check; CAPI deletes this remediation.
    Healthy,
    /// Delete the Machine so that its owner replaces it.
    Replace,
}

/// The next step of a remediation.
pub fn next(observed: &Observed<'_>) -> Next {
    let healthy = match observed.machine {
        MachineState::Gone | MachineState::Deleting => return Next::Idle,
        MachineState::Present { healthy } => healthy,
    };
    let retries = observed.status.retries();
    match observed.status.phase {
        // Deleting the Machine is idempotent: a manager that stopped after
        // recording the decision deletes it now.
        Some(RemediationPhase::Replacing) => Next::Replace,
        Some(RemediationPhase::Rebooting) => Next::FinishRestart,
        // A new remediation always acts once: CAPI created it because the
        // Machine failed its health check.
        None if retries == 0 => first_step(observed.retry_limit),
        Some(RemediationPhase::Waiting | RemediationPhase::Failed) | None => {
            if healthy {
                return Next::Healthy;
            }
            let elapsed = observed
                .status
                .last_remediated
                .as_ref()
                .map(|t| elapsed_since(&t.0, &observed.now));
            match elapsed {
                Some(elapsed) if elapsed < observed.timeout => Next::Wait {
                    remaining: observed.timeout - elapsed,
                },
                _ if retries < observed.retry_limit => Next::Restart {
                    attempt: retries + 1,
                },
                _ => Next::Replace,
            }
        }
    }
}

fn first_step(retry_limit: u32) -> Next {
    if retry_limit == 0 {
        Next::Replace
    } else {
        Next::Restart { attempt: 1 }
    }
}

/// Time from `since` to `now`; zero when the clock went backwards.
pub fn elapsed_since(since: &Timestamp, now: &Timestamp) -> Duration {
    Duration::try_from(now.duration_since(*since)).unwrap_or_default()
}

/// "restart 1 of 2", for messages.
pub fn attempt_text(attempt: u32, retry_limit: u32) -> String {
    format!("restart {attempt} of {}", retry_limit.max(attempt))
}

/// A duration as a person writes it: `5m`, `90s` → `1m30s`, `1h`.
pub fn human_duration(duration: Duration) -> String {
    let total = duration.as_secs();
    if total == 0 {
        return format!("{}ms", duration.as_millis());
    }
    let (hours, minutes, seconds) = (total / 3600, total % 3600 / 60, total % 60);
    let mut text = String::new();
    if hours > 0 {
        text.push_str(&format!("{hours}h"));
    }
    if minutes > 0 {
        text.push_str(&format!("{minutes}m"));
    }
    if seconds > 0 || text.is_empty() {
        text.push_str(&format!("{seconds}s"));
    }
    text
}

/// The `RetriesExhausted` message: why the Machine was deleted, and what
/// happens to it next.
pub fn replacement_message(
    machine: &str,
    retries: u32,
    retry_limit: u32,
    timeout: Duration,
    replaced_by: Option<&str>,
) -> String {
    let why = if retry_limit == 0 {
        format!("retryLimit is 0: deleted Machine {machine} without restarting it")
    } else {
        let restarts = if retries == 1 { "restart" } else { "restarts" };
        format!(
            "Machine {machine} did not pass its health check within {} after {retries} {restarts}; deleted it",
            human_duration(timeout)
        )
    };
    match replaced_by {
        Some(owner) => format!("{why} so that its {owner} replaces it"),
        None => {
            format!("{why}; it has no MachineSet or control plane owner, so nothing replaces it")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const TIMEOUT: Duration = Duration::from_secs(300);

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn status(phase: Option<RemediationPhase>, retries: i32, at_second: i64) -> RemediationStatus {
        RemediationStatus {
            phase,
            retry_count: (retries > 0).then_some(retries),
            last_remediated: (retries > 0).then(|| Time(at(at_second))),
            ..Default::default()
        }
    }

    fn decide(status: &RemediationStatus, limit: u32, machine: MachineState, now: i64) -> Next {
        next(&Observed {
            status,
            retry_limit: limit,
            timeout: TIMEOUT,
            machine,
            now: at(now),
        })
    }

    const UNHEALTHY: MachineState = MachineState::Present { healthy: false };
    const HEALTHY: MachineState = MachineState::Present { healthy: true };

    #[test]
    fn a_new_remediation_restarts_once() {
        let fresh = RemediationStatus::default();
        assert_eq!(
            decide(&fresh, 1, UNHEALTHY, 0),
            Next::Restart { attempt: 1 }
        );
        // Created for an unhealthy Machine, whatever it says by now.
        assert_eq!(decide(&fresh, 3, HEALTHY, 0), Next::Restart { attempt: 1 });
    }

    #[test]
    fn retry_limit_zero_replaces_right_away() {
        assert_eq!(
            decide(&RemediationStatus::default(), 0, UNHEALTHY, 0),
            Next::Replace
        );
    }

    #[test]
    fn after_a_restart_it_waits_out_the_timeout() {
        let waiting = status(Some(RemediationPhase::Waiting), 1, 0);
        assert_eq!(
            decide(&waiting, 2, UNHEALTHY, 60),
            Next::Wait {
                remaining: Duration::from_secs(240)
            }
        );
        // A clock that went backwards waits the whole timeout, no less.
        assert_eq!(
            decide(&waiting, 2, UNHEALTHY, -30),
            Next::Wait { remaining: TIMEOUT }
        );
    }

    #[test]
    fn a_healthy_machine_needs_nothing_more() {
        let waiting = status(Some(RemediationPhase::Waiting), 1, 0);
        assert_eq!(decide(&waiting, 2, HEALTHY, 60), Next::Healthy);
        assert_eq!(decide(&waiting, 1, HEALTHY, 900), Next::Healthy);
    }

    #[test]
    fn after_the_timeout_it_restarts_again_while_retries_remain() {
        let waiting = status(Some(RemediationPhase::Waiting), 1, 0);
        assert_eq!(
            decide(&waiting, 2, UNHEALTHY, 300),
            Next::Restart { attempt: 2 }
        );
        let failed = status(Some(RemediationPhase::Failed), 1, 0);
        assert_eq!(
            decide(&failed, 2, UNHEALTHY, 301),
            Next::Restart { attempt: 2 }
        );
    }

    #[test]
    fn exhausted_retries_replace_the_machine() {
        let waiting = status(Some(RemediationPhase::Waiting), 2, 0);
        assert_eq!(decide(&waiting, 2, UNHEALTHY, 300), Next::Replace);
        // Lowering the limit below what was done replaces too.
        assert_eq!(decide(&waiting, 1, UNHEALTHY, 300), Next::Replace);
    }

    #[test]
    fn a_recorded_attempt_is_finished_never_repeated() {
        let rebooting = status(Some(RemediationPhase::Rebooting), 1, 0);
        for now in [0, 10, 10_000] {
            assert_eq!(decide(&rebooting, 3, UNHEALTHY, now), Next::FinishRestart);
        }
    }

    #[test]
    fn replacing_deletes_the_machine_until_it_is_going() {
        let replacing = status(Some(RemediationPhase::Replacing), 1, 0);
        assert_eq!(decide(&replacing, 1, UNHEALTHY, 10), Next::Replace);
        assert_eq!(
            decide(&replacing, 1, MachineState::Deleting, 10),
            Next::Idle
        );
        assert_eq!(decide(&replacing, 1, MachineState::Gone, 10), Next::Idle);
    }

    #[test]
    fn nothing_happens_to_a_machine_that_is_gone_or_going() {
        for phase in [
            None,
            Some(RemediationPhase::Rebooting),
            Some(RemediationPhase::Waiting),
        ] {
            let status = status(phase, 1, 0);
            assert_eq!(decide(&status, 3, MachineState::Gone, 900), Next::Idle);
            assert_eq!(decide(&status, 3, MachineState::Deleting, 900), Next::Idle);
        }
    }

    #[test]
    fn messages_read_well() {
        assert_eq!(attempt_text(1, 2), "restart 1 of 2");
        assert_eq!(human_duration(Duration::from_secs(300)), "5m");
        assert_eq!(human_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(human_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(human_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(
            replacement_message("w-1", 2, 2, Duration::from_secs(3), Some("MachineSet")),
            "Machine w-1 did not pass its health check within 3s after 2 restarts; deleted it so that its MachineSet replaces it"
        );
        assert!(replacement_message("w-1", 0, 0, TIMEOUT, None).starts_with("retryLimit is 0"),);
    }
}
