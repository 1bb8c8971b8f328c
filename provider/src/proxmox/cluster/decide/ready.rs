//! Whether a ProxmoxCluster is ready, and which conditions an operator is
//! told about by an event.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tenantry_api::contract::READY_CONDITION;

use super::{PRIVILEGES_SUFFICIENT, PROXMOX_AVAILABLE, Reason, TOKEN_SCOPED};
use crate::capi::conditions::{self, DesiredCondition, Status};

/// `Ready`: the hypervisor's refusal when it is unavailable (`unavailable`
/// is its condition), else waiting for an endpoint unless a control plane
/// provider sets it, else provisioned.
pub fn ready_condition(
    unavailable: Option<&DesiredCondition>,
    endpoint_set: bool,
    externally_managed: bool,
) -> DesiredCondition {
    if let Some(condition) = unavailable {
        DesiredCondition::false_(
            READY_CONDITION,
            condition.reason.clone(),
            condition.message.clone(),
        )
    } else if !endpoint_set && !externally_managed {
        DesiredCondition::false_(
            READY_CONDITION,
            Reason::WaitingForEndpoint.as_str(),
            "spec.controlPlaneEndpoint is not set (set it, or externalManagedControlPlane for a control plane provider that sets it)",
        )
    } else {
        DesiredCondition::true_(READY_CONDITION, Reason::Provisioned.as_str())
    }
}

/// The failing hypervisor conditions an operator has not been warned of:
/// once per change of status or reason, not once per reconcile.
pub fn new_warnings<'a>(
    desired: &'a [DesiredCondition],
    previous: &[Condition],
) -> Vec<&'a DesiredCondition> {
    desired
        .iter()
        .filter(|c| {
            matches!(
                c.type_,
                TOKEN_SCOPED | PRIVILEGES_SUFFICIENT | PROXMOX_AVAILABLE
            )
        })
        .filter(|c| c.status == Status::False)
        .filter(|c| {
            conditions::get(previous, c.type_)
                .is_none_or(|before| before.status != "False" || before.reason != c.reason)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        }
    }

    #[test]
    fn ready_follows_availability_then_the_endpoint() {
        let refused = DesiredCondition::false_(PROXMOX_AVAILABLE, "Unauthorized", "token refused");
        let cases = [
            (Some(&refused), true, false, Status::False, "Unauthorized"),
            (Some(&refused), false, true, Status::False, "Unauthorized"),
            (
                None,
                false,
                false,
                Status::False,
                Reason::WaitingForEndpoint.as_str(),
            ),
            (
                None,
                false,
                true,
                Status::True,
                Reason::Provisioned.as_str(),
            ),
            (
                None,
                true,
                false,
                Status::True,
                Reason::Provisioned.as_str(),
            ),
        ];
        for (unavailable, endpoint, external, status, why) in cases {
            let ready = ready_condition(unavailable, endpoint, external);
            assert_eq!(ready.type_, READY_CONDITION);
            assert_eq!(
                (ready.status, ready.reason.as_str()),
                (status, why),
                "unavailable {:?}, endpoint {endpoint}, external {external}",
                unavailable.map(|c| &c.reason)
            );
        }
    }

    #[test]
    fn a_failing_hypervisor_condition_is_warned_of_once_per_change() {
        let missing = DesiredCondition::false_(
            PRIVILEGES_SUFFICIENT,
            Reason::MissingPrivileges.as_str(),
            "VM.Clone on /vms/9000",
        );
        let cases: &[(&str, Vec<Condition>, bool)] = &[
            ("first report", vec![], true),
            (
                "was true",
                vec![stored(
                    PRIVILEGES_SUFFICIENT,
                    "True",
                    Reason::AllPrivilegesHeld.as_str(),
                )],
                true,
            ),
            (
                "same failure again",
                vec![stored(
                    PRIVILEGES_SUFFICIENT,
                    "False",
                    Reason::MissingPrivileges.as_str(),
                )],
                false,
            ),
            (
                "another failure before",
                vec![stored(PRIVILEGES_SUFFICIENT, "False", "Unauthorized")],
                true,
            ),
        ];
        for (case, previous, warned) in cases {
            let desired = [missing.clone()];
            assert_eq!(
                !new_warnings(&desired, previous).is_empty(),
                *warned,
                "{case}"
            );
        }
        // Ready and Paused are reported, never warned of here.
        let desired = [
            DesiredCondition::false_(
                READY_CONDITION,
                Reason::WaitingForEndpoint.as_str(),
                "no endpoint",
            ),
            DesiredCondition::true_(TOKEN_SCOPED, Reason::Scoped.as_str()),
        ];
        assert!(new_warnings(&desired, &[]).is_empty());
    }
}
