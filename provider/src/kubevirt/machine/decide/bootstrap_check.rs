//! How a machine's bootstrap is confirmed: which check it gets and what the
//! guest's sentinel says.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tenantry_api::contract::MANAGED_BY_ANNOTATION;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{BootstrapCheckStrategy, KubevirtCluster};

use crate::capi::bootstrap::BootstrapFormat;
use crate::capi::conditions::DesiredCondition;
use crate::kubevirt::machine::status::{BOOTSTRAP_EXEC_SUCCEEDED, Reason};
use crate::kubevirt::ssh::{
    BOOTSTRAP_SENTINEL, ProbeError, SENTINEL_SUCCESS, SSH_USER, SentinelReading,
};

/// How a machine's bootstrap is confirmed (CAPK's rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootstrapCheck {
    /// `checkStrategy: none`: the VM's readiness counts.
    Disabled,
    /// `ssh` cannot work for this machine (the message says why): the VM's
    /// readiness counts, as in CAPK.
    NotSupported(&'static str),
    /// Inject user `capk` into the cloud-config and read the sentinel over SSH.
    Ssh,
}

impl BootstrapCheck {
    /// The condition for the checks that need no guest.
    pub fn condition(&self) -> Option<DesiredCondition> {
        match self {
            BootstrapCheck::Disabled => Some(DesiredCondition::true_(
                BOOTSTRAP_EXEC_SUCCEEDED,
                Reason::BootstrapCheckDisabled.as_str(),
            )),
            BootstrapCheck::NotSupported(why) => Some(
                DesiredCondition::true_(
                    BOOTSTRAP_EXEC_SUCCEEDED,
                    Reason::BootstrapCheckNotSupported.as_str(),
                )
                .with_message(*why),
            ),
            BootstrapCheck::Ssh => None,
        }
    }
}

/// Which check a machine gets. Only cloud-config can carry the SSH user, and
/// the keys come from a KubevirtCluster tenantry reconciles: an externally
/// managed one (e.g. Kamaji's) has none, and CAPK then skips the check too.
pub fn bootstrap_check(
    strategy: BootstrapCheckStrategy,
    format: BootstrapFormat,
    kubevirt_cluster: Option<&KubevirtCluster>,
) -> BootstrapCheck {
    match strategy {
        BootstrapCheckStrategy::None => BootstrapCheck::Disabled,
        BootstrapCheckStrategy::Ssh if format != BootstrapFormat::CloudConfig => {
            BootstrapCheck::NotSupported(
                "the bootstrap data is not cloud-config, so no SSH user can be injected; the VM's readiness counts",
            )
        }
        BootstrapCheckStrategy::Ssh => match kubevirt_cluster {
            None => BootstrapCheck::NotSupported(
                "the Cluster's infrastructure is not a KubevirtCluster, so there are no SSH keys; the VM's readiness counts",
            ),
            Some(cluster)
                if cluster
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(MANAGED_BY_ANNOTATION)) =>
            {
                BootstrapCheck::NotSupported(
                    "the KubevirtCluster is externally managed, so tenantry made no SSH keys for it; the VM's readiness counts",
                )
            }
            Some(_) => BootstrapCheck::Ssh,
        },
    }
}

/// Whether an earlier reconcile read `success` from the sentinel. The check
/// then stands for good, as in CAPK: `/run` is a tmpfs, so the file is gone
/// after a reboot while the node stays bootstrapped. CAPK marks it True
/// without a reason, and only once it read the sentinel: a machine taken
/// over from CAPK is not checked again.
pub fn bootstrap_confirmed(conditions: &[Condition]) -> bool {
    conditions.iter().any(|c| {
        c.type_ == BOOTSTRAP_EXEC_SUCCEEDED
            && c.status == "True"
            && (c.reason == Reason::BootstrapSentinelFound.as_str() || c.reason.is_empty())
    })
}

/// The address the check connects to: the first IP of the VMI's interfaces.
pub fn first_ip_address(vmi: &VirtualMachineInstance) -> Option<IpAddr> {
    vmi.status
        .as_ref()?
        .interfaces
        .as_deref()?
        .iter()
        .flat_map(|i| i.ip_address.iter().chain(i.ip_addresses.iter().flatten()))
        .find_map(|ip| ip.parse().ok())
}

/// `BootstrapExecSucceeded` from reading the sentinel at `ip`. Every failure
/// is retried; the messages say what to look at.
pub fn sentinel_condition(
    ip: IpAddr,
    result: &Result<SentinelReading, ProbeError>,
) -> DesiredCondition {
    match result {
        Ok(SentinelReading::Success) => DesiredCondition::true_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            Reason::BootstrapSentinelFound.as_str(),
        ),
        Ok(SentinelReading::Absent) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            Reason::WaitingForBootstrapSentinel.as_str(),
            format!(
                "{BOOTSTRAP_SENTINEL} does not exist on {ip} yet: the node is still bootstrapping (progress in the guest's /var/log/cloud-init-output.log)"
            ),
        ),
        Ok(SentinelReading::Unexpected(content)) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            Reason::BootstrapSentinelUnexpected.as_str(),
            format!(
                "{BOOTSTRAP_SENTINEL} on {ip} says {content:?}, not {SENTINEL_SUCCESS:?}: bootstrap did not succeed; see the guest's /var/log/cloud-init-output.log"
            ),
        ),
        Err(error @ ProbeError::AuthenticationRejected { .. }) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            Reason::SshAuthenticationFailed.as_str(),
            format!(
                "{error}: cloud-init has not created user {SSH_USER} (yet), or the image has no cloud-init; retrying"
            ),
        ),
        Err(error) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            Reason::SshConnectionFailed.as_str(),
            format!(
                "{error}; retrying. The ssh check needs the management cluster to reach the VM on port 22; otherwise set spec.virtualMachineBootstrapCheck.checkStrategy to none"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubevirt::machine::decide::vm_state::tests::vmi;
    use serde_json::{Value, json};

    fn kubevirt_cluster(annotations: Value) -> KubevirtCluster {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtCluster",
            "metadata": { "name": "demo", "namespace": "ns", "annotations": annotations },
            "spec": {},
        }))
        .unwrap()
    }

    #[test]
    fn only_cloud_config_of_a_reconciled_cluster_gets_the_ssh_check() {
        let ours = kubevirt_cluster(json!({}));
        let kamaji = kubevirt_cluster(json!({ MANAGED_BY_ANNOTATION: "kamaji" }));
        let cloud = BootstrapFormat::CloudConfig;
        assert_eq!(
            bootstrap_check(BootstrapCheckStrategy::Ssh, cloud, Some(&ours)),
            BootstrapCheck::Ssh
        );
        assert_eq!(
            bootstrap_check(BootstrapCheckStrategy::None, cloud, Some(&ours)),
            BootstrapCheck::Disabled
        );
        for (format, cluster) in [
            (BootstrapFormat::TalosConfig, Some(&ours)),
            (BootstrapFormat::Other, Some(&ours)),
            (cloud, Some(&kamaji)),
            (cloud, None),
        ] {
            let check = bootstrap_check(BootstrapCheckStrategy::Ssh, format, cluster);
            assert!(
                matches!(check, BootstrapCheck::NotSupported(_)),
                "{format:?}: {check:?}"
            );
            let condition = check.condition().unwrap();
            assert!(condition.is_true());
            assert_eq!(
                condition.reason,
                Reason::BootstrapCheckNotSupported.as_str()
            );
        }
        assert!(BootstrapCheck::Ssh.condition().is_none());
    }

    #[test]
    fn a_sentinel_read_by_tenantry_or_capk_confirms_bootstrap() {
        // As stored by CAPK (a v1beta1 condition: True has no reason).
        let capk: Condition = serde_json::from_value(json!({
            "type": BOOTSTRAP_EXEC_SUCCEEDED, "status": "True",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }))
        .unwrap();
        assert!(bootstrap_confirmed(std::slice::from_ref(&capk)));
        let found = Condition {
            reason: Reason::BootstrapSentinelFound.as_str().into(),
            ..capk.clone()
        };
        assert!(bootstrap_confirmed(&[found]));
        let disabled = Condition {
            reason: Reason::BootstrapCheckDisabled.as_str().into(),
            ..capk
        };
        assert!(!bootstrap_confirmed(&[disabled]));
    }

    #[test]
    fn the_check_connects_to_the_first_ip() {
        let running = vmi(json!({ "interfaces": [
            { "name": "default", "ipAddresses": ["10.0.0.5", "fd00::5"] },
            { "name": "secondary", "ipAddress": "192.168.1.9" }
        ]}));
        assert_eq!(
            first_ip_address(&running),
            Some("10.0.0.5".parse().unwrap())
        );
        assert_eq!(
            first_ip_address(&vmi(json!({ "interfaces": [{ "name": "default" }] }))),
            None
        );
        assert_eq!(first_ip_address(&vmi(json!({}))), None);
    }

    #[test]
    fn sentinel_readings_become_actionable_conditions() {
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let address = std::net::SocketAddr::new(ip, 22);
        let found = sentinel_condition(ip, &Ok(SentinelReading::Success));
        assert!(found.is_true());
        assert_eq!(found.reason, Reason::BootstrapSentinelFound.as_str());
        let waiting = sentinel_condition(ip, &Ok(SentinelReading::Absent));
        assert_eq!(waiting.reason, Reason::WaitingForBootstrapSentinel.as_str());
        assert!(waiting.message.contains("10.0.0.5"), "{}", waiting.message);
        let odd = sentinel_condition(ip, &Ok(SentinelReading::Unexpected("failed".into())));
        assert_eq!(odd.reason, Reason::BootstrapSentinelUnexpected.as_str());
        assert!(odd.message.contains("\"failed\""), "{}", odd.message);
        let refused = sentinel_condition(
            ip,
            &Err(ProbeError::Connect {
                address,
                reason: "Connection refused (os error 111)".into(),
            }),
        );
        assert_eq!(refused.reason, Reason::SshConnectionFailed.as_str());
        assert!(
            refused.message.contains("10.0.0.5:22: Connection refused"),
            "{}",
            refused.message
        );
        let timeout = sentinel_condition(
            ip,
            &Err(ProbeError::Timeout {
                address,
                timeout: std::time::Duration::from_secs(5),
            }),
        );
        assert_eq!(timeout.reason, Reason::SshConnectionFailed.as_str());
        let rejected = sentinel_condition(ip, &Err(ProbeError::AuthenticationRejected { address }));
        assert_eq!(rejected.reason, Reason::SshAuthenticationFailed.as_str());
        assert!(
            [&waiting, &odd, &refused, &timeout, &rejected]
                .iter()
                .all(|c| !c.is_true())
        );
    }

    #[test]
    fn a_found_sentinel_stays_found() {
        let condition = |status: &str, reason: &str| Condition {
            type_: BOOTSTRAP_EXEC_SUCCEEDED.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        };
        assert!(bootstrap_confirmed(&[condition(
            "True",
            Reason::BootstrapSentinelFound.as_str()
        )]));
        assert!(!bootstrap_confirmed(&[condition(
            "True",
            Reason::BootstrapCheckDisabled.as_str()
        )]));
        assert!(!bootstrap_confirmed(&[condition(
            "False",
            Reason::WaitingForBootstrapSentinel.as_str()
        )]));
        assert!(!bootstrap_confirmed(&[]));
    }
}
