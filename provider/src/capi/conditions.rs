//! metav1 Conditions as the Cluster API v1beta2 contract uses them: one entry
//! per type, `lastTransitionTime` moving only when the status changes, and
//! reasons a human can act on.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    pub fn from_bool(value: bool) -> Self {
        if value { Status::True } else { Status::False }
    }
}

/// What a reconcile decided a condition should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    pub type_: &'static str,
    pub status: Status,
    pub reason: String,
    pub message: String,
}

impl DesiredCondition {
    pub fn new(
        type_: &'static str,
        status: Status,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn true_(type_: &'static str, reason: impl Into<String>) -> Self {
        Self::new(type_, Status::True, reason, "")
    }

    pub fn false_(
        type_: &'static str,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(type_, Status::False, reason, message)
    }

    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub fn is_true(&self) -> bool {
        self.status == Status::True
    }
}

/// Puts `desired` into `conditions`, replacing the entry of the same type.
/// The transition time is kept when the status did not change, so it tells
/// how long the condition has held (what MachineHealthCheck timeouts read).
/// Returns whether anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: &DesiredCondition,
    generation: Option<i64>,
    now: &Timestamp,
) -> bool {
    let existing = conditions.iter_mut().find(|c| c.type_ == desired.type_);
    match existing {
        Some(condition) => {
            let status_changed = condition.status != desired.status.as_str();
            let changed = status_changed
                || condition.reason != desired.reason
                || condition.message != desired.message
                || condition.observed_generation != generation;
            if status_changed {
                condition.last_transition_time = Time(*now);
            }
            condition.status = desired.status.as_str().to_string();
            condition.reason = desired.reason.clone();
            condition.message = desired.message.clone();
            condition.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_string(),
                status: desired.status.as_str().to_string(),
                reason: desired.reason.clone(),
                message: desired.message.clone(),
                observed_generation: generation,
                last_transition_time: Time(*now),
            });
            true
        }
    }
}

/// The condition of a type, if present.
/// The pair a machine reports while it is not provisioned: its own
/// provisioning condition (`provisioned_type`) and `Ready`, both False with
/// the same reason and message.
pub fn not_provisioned(
    provisioned_type: &'static str,
    reason: &str,
    message: impl Into<String>,
) -> [DesiredCondition; 2] {
    let message = message.into();
    [
        DesiredCondition::false_(provisioned_type, reason, message.clone()),
        DesiredCondition::false_(tenantry_api::contract::READY_CONDITION, reason, message),
    ]
}

pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of a type is present and True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn new_condition_is_added_with_its_transition_time() {
        let mut conditions = Vec::new();
        let changed = set(
            &mut conditions,
            &DesiredCondition::false_("Ready", "WaitingForBootstrapData", "no data yet"),
            Some(1),
            &at(100),
        );
        assert!(changed);
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time.0, at(100));
        assert_eq!(conditions[0].observed_generation, Some(1));
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            &DesiredCondition::false_("Ready", "A", "a"),
            None,
            &at(100),
        );
        let changed = set(
            &mut conditions,
            &DesiredCondition::false_("Ready", "B", "b"),
            None,
            &at(200),
        );
        assert!(changed, "reason changed");
        assert_eq!(conditions[0].last_transition_time.0, at(100));
        set(
            &mut conditions,
            &DesiredCondition::true_("Ready", "Provisioned"),
            None,
            &at(300),
        );
        assert_eq!(conditions[0].last_transition_time.0, at(300));
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn setting_the_same_condition_again_changes_nothing() {
        let mut conditions = Vec::new();
        let desired = DesiredCondition::true_("Ready", "Provisioned");
        set(&mut conditions, &desired, Some(2), &at(100));
        assert!(!set(&mut conditions, &desired, Some(2), &at(500)));
        assert_eq!(conditions[0].last_transition_time.0, at(100));
    }
}
