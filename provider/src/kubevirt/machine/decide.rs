//! Pure decisions for a KubevirtMachine: what its VM, VMI and DataVolumes
//! say about provisioning, and the status that follows.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tenantry_api::contract::{
    MANAGED_BY_ANNOTATION, MachineAddress, MachineAddressType, READY_CONDITION,
};
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{BootstrapCheckStrategy, KubevirtCluster};

use crate::capi::bootstrap::BootstrapFormat;
use crate::capi::conditions::DesiredCondition;
use crate::kubevirt::ssh::{
    BOOTSTRAP_SENTINEL, ProbeError, SENTINEL_SUCCESS, SSH_USER, SentinelReading,
};

/// Condition: the VirtualMachine exists and its instance is Ready (CAPK's name).
pub const VM_PROVISIONED: &str = "VMProvisioned";
/// Condition: the bootstrap check passed (CAPK's name).
pub const BOOTSTRAP_EXEC_SUCCEEDED: &str = "BootstrapExecSucceeded";
/// Label a user (or a test) puts on a VM or VMI to declare it broken for good (CAPK's key).
pub const VM_IS_TERMINAL_LABEL: &str = "capk.cluster.x-k8s.io/vm-is-terminal";

/// Reasons on `VMProvisioned` and `Ready`. Each says what the machine waits
/// for or what went wrong, in words an operator can act on.
pub mod reason {
    pub const WAITING_FOR_OWNER_MACHINE: &str = "WaitingForOwnerMachine";
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructure";
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlaneInitialized";
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    pub const BOOTSTRAP_DATA_SECRET_MISSING: &str = "BootstrapDataSecretNotFound";
    pub const INFRA_CLUSTER_UNAVAILABLE: &str = "InfraClusterUnavailable";
    /// A request to the infrastructure cluster failed; retried with backoff.
    pub const INFRA_CLUSTER_API_ERROR: &str = "InfraClusterAPIError";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const VM_CREATE_FAILED: &str = "VMCreateFailed";
    pub const WAITING_FOR_VM: &str = "WaitingForVirtualMachine";
    pub const DATA_VOLUME_IMPORTING: &str = "DataVolumeImporting";
    pub const DATA_VOLUME_IMPORT_FAILED: &str = "DataVolumeImportFailed";
    pub const WAITING_FOR_VMI: &str = "WaitingForVirtualMachineInstance";
    pub const VM_STOPPED: &str = "VMStopped";
    pub const VM_START_FAILING: &str = "VMStartFailing";
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    pub const IMAGE_PULL_FAILED: &str = "ImagePullFailed";
    pub const VMI_FAILED: &str = "VMIFailed";
    pub const VMI_EVICTED: &str = "VMIEvicted";
    pub const VM_NOT_READY: &str = "VMNotReady";
    pub const VM_TERMINAL: &str = "VMTerminal";
    pub const PROVISIONED: &str = "Provisioned";
    pub const DELETING: &str = "Deleting";
    pub const BOOTSTRAP_CHECK_DISABLED: &str = "BootstrapCheckDisabled";
    pub const BOOTSTRAP_CHECK_NOT_SUPPORTED: &str = "BootstrapCheckingNotSupported";
    pub const WAITING_FOR_SSH_KEYS: &str = "WaitingForSSHKeys";
    pub const SSH_KEYS_INVALID: &str = "SSHKeysInvalid";
    pub const INVALID_BOOTSTRAP_DATA: &str = "InvalidBootstrapData";
    pub const WAITING_FOR_IP_ADDRESS: &str = "WaitingForIPAddress";
    pub const WAITING_FOR_BOOTSTRAP_SENTINEL: &str = "WaitingForBootstrapSentinel";
    pub const BOOTSTRAP_SENTINEL_UNEXPECTED: &str = "BootstrapSentinelUnexpected";
    pub const SSH_CONNECTION_FAILED: &str = "SSHConnectionFailed";
    pub const SSH_AUTHENTICATION_FAILED: &str = "SSHAuthenticationFailed";
    pub const BOOTSTRAP_SENTINEL_FOUND: &str = "BootstrapSentinelFound";
}

/// What the VM's objects say.
#[derive(Clone, Debug, PartialEq)]
pub struct VmState {
    /// The `VMProvisioned` condition.
    pub condition: DesiredCondition,
    /// Whether the VMI is Ready.
    pub ready: bool,
    /// A failure that will not heal by itself (reported as failureReason too,
    /// so v1beta1 readers see it; v1beta2 CAPI reads the conditions).
    pub terminal: bool,
}

impl VmState {
    fn not_provisioned(reason: &str, message: impl Into<String>) -> Self {
        Self {
            condition: DesiredCondition::false_(VM_PROVISIONED, reason, message),
            ready: false,
            terminal: false,
        }
    }

    fn terminal(reason: &str, message: impl Into<String>) -> Self {
        Self {
            terminal: true,
            ..Self::not_provisioned(reason, message)
        }
    }
}

fn has_terminal_label(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| l.get(VM_IS_TERMINAL_LABEL).is_some_and(|v| v == "true"))
}

/// Reads the VM, its instance and its DataVolumes into a provisioning state.
/// Order matters: the most specific, actionable cause wins.
pub fn virtual_machine_state(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    data_volumes: &[DataVolume],
) -> VmState {
    let name = vm.metadata.name.as_deref().unwrap_or_default();
    if has_terminal_label(vm.metadata.labels.as_ref())
        || vmi.is_some_and(|v| has_terminal_label(v.metadata.labels.as_ref()))
    {
        return VmState::terminal(
            reason::VM_TERMINAL,
            format!("VirtualMachine {name} is labelled {VM_IS_TERMINAL_LABEL}=true"),
        );
    }
    for dv in data_volumes {
        if let Some(state) = data_volume_state(dv) {
            return state;
        }
    }
    let run_strategy = vm
        .spec
        .run_strategy
        .clone()
        .or_else(|| {
            vm.spec
                .running
                .map(|r| if r { "Always" } else { "Halted" }.to_string())
        })
        .unwrap_or_else(|| "Always".into());
    let vm_status = vm.status.as_ref();
    let printable = vm_status
        .and_then(|s| s.printable_status.clone())
        .unwrap_or_default();

    let Some(vmi) = vmi else {
        if run_strategy == "Halted" {
            return VmState::terminal(
                reason::VM_STOPPED,
                format!("VirtualMachine {name} has runStrategy Halted, so no instance runs"),
            );
        }
        if let Some(failure) = vm_status.and_then(|s| s.start_failure.as_ref()) {
            return VmState::not_provisioned(
                reason::VM_START_FAILING,
                format!(
                    "VirtualMachine {name} fails to start ({} consecutive failures, status {printable})",
                    failure.consecutive_fail_count.unwrap_or(0)
                ),
            );
        }
        return VmState::not_provisioned(
            reason::WAITING_FOR_VMI,
            format!("VirtualMachine {name} has no instance yet (status {printable})"),
        );
    };

    let status = vmi.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let find = |type_: &str| conditions.iter().find(|c| c.r#type == type_);
    let message_of = |c: &tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstanceStatusConditions| {
        c.message.clone().or_else(|| c.reason.clone()).unwrap_or_default()
    };
    let phase = status
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into());

    if let Some(node) = status.and_then(|s| s.evacuation_node_name.as_deref()) {
        return VmState::terminal(
            reason::VMI_EVICTED,
            format!(
                "node {node} is being drained and VirtualMachineInstance {name} cannot move away by itself"
            ),
        );
    }
    if phase == "Failed" || (phase == "Succeeded" && run_strategy != "Always") {
        // With Always, KubeVirt starts a new instance; anything else stays down.
        let restarts =
            run_strategy == "Always" || (run_strategy == "RerunOnFailure" && phase == "Failed");
        let message = format!(
            "VirtualMachineInstance {name} is {phase}{}",
            status
                .and_then(|s| s.reason.as_deref())
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        return if restarts {
            VmState::not_provisioned(reason::VMI_FAILED, message)
        } else {
            VmState::terminal(reason::VMI_FAILED, message)
        };
    }
    if let Some(scheduled) = find("PodScheduled").filter(|c| c.status == "False") {
        return VmState::not_provisioned(
            reason::UNSCHEDULABLE,
            format!(
                "VirtualMachineInstance {name} cannot be scheduled: {}",
                message_of(scheduled)
            ),
        );
    }
    if let Some(sync) = find("Synchronized").filter(|c| {
        c.status == "False"
            && matches!(
                c.reason.as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
    }) {
        return VmState::not_provisioned(
            reason::IMAGE_PULL_FAILED,
            format!(
                "VirtualMachineInstance {name} cannot pull its image: {}",
                message_of(sync)
            ),
        );
    }
    if find("Ready").is_some_and(|c| c.status == "True") {
        return VmState {
            condition: DesiredCondition::true_(VM_PROVISIONED, reason::PROVISIONED),
            ready: true,
            terminal: false,
        };
    }
    let detail = find("Ready").map(message_of).filter(|m| !m.is_empty());
    VmState::not_provisioned(
        reason::VM_NOT_READY,
        match detail {
            Some(detail) => {
                format!("VirtualMachineInstance {name} is {phase}, not Ready: {detail}")
            }
            None => format!("VirtualMachineInstance {name} is {phase}, not Ready yet"),
        },
    )
}

/// The state a DataVolume forces on the machine, if it is not done.
fn data_volume_state(dv: &DataVolume) -> Option<VmState> {
    let name = dv.metadata.name.as_deref().unwrap_or_default();
    let status = dv.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase == "Succeeded" {
        return None;
    }
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let failing = conditions
        .iter()
        .find(|c| {
            c.r#type == "Running"
                && c.status == "False"
                && c.reason
                    .as_deref()
                    .is_some_and(|r| r != "Completed" && r != "Pending")
        })
        .and_then(|c| c.message.clone().filter(|m| !m.is_empty()));
    if phase == "Failed" {
        return Some(VmState::terminal(
            reason::DATA_VOLUME_IMPORT_FAILED,
            format!(
                "DataVolume {name} failed: {}",
                failing.unwrap_or_else(|| "no message from CDI".into())
            ),
        ));
    }
    let restarts = status.and_then(|s| s.restart_count).unwrap_or(0);
    if let Some(message) = failing.filter(|_| restarts > 0) {
        // CDI keeps retrying the import; say why it fails meanwhile.
        return Some(VmState::not_provisioned(
            reason::DATA_VOLUME_IMPORT_FAILED,
            format!(
                "DataVolume {name} import failing (attempt {}): {message}",
                restarts + 1
            ),
        ));
    }
    let progress = status
        .and_then(|s| s.progress.as_deref())
        .filter(|p| !p.is_empty() && *p != "N/A")
        .map(|p| format!(" {p}"))
        .unwrap_or_default();
    Some(VmState::not_provisioned(
        reason::DATA_VOLUME_IMPORTING,
        format!("DataVolume {name} is {phase}{progress}"),
    ))
}

/// The machine's addresses, as CAPK reports them: its name as Hostname and
/// InternalDNS, and every IP of every interface as InternalIP and ExternalIP.
pub fn machine_addresses(name: &str, vmi: &VirtualMachineInstance) -> Vec<MachineAddress> {
    let mut addresses = vec![
        MachineAddress {
            type_: MachineAddressType::Hostname,
            address: name.to_string(),
        },
        MachineAddress {
            type_: MachineAddressType::InternalDNS,
            address: name.to_string(),
        },
    ];
    let mut ips: Vec<String> = Vec::new();
    for interface in vmi
        .status
        .as_ref()
        .and_then(|s| s.interfaces.as_deref())
        .unwrap_or_default()
    {
        let listed = interface.ip_addresses.clone().unwrap_or_default();
        for ip in interface.ip_address.iter().chain(listed.iter()) {
            if !ip.is_empty() && !ips.contains(ip) {
                ips.push(ip.clone());
            }
        }
    }
    for ip in ips {
        for type_ in [
            MachineAddressType::InternalIP,
            MachineAddressType::ExternalIP,
        ] {
            addresses.push(MachineAddress {
                type_,
                address: ip.clone(),
            });
        }
    }
    addresses
}

/// The `Ready` summary: provisioned and bootstrapped, else the first cause.
pub fn ready_condition(
    vm_provisioned: &DesiredCondition,
    bootstrap: &DesiredCondition,
) -> DesiredCondition {
    for condition in [vm_provisioned, bootstrap] {
        if !condition.is_true() {
            return DesiredCondition::new(
                READY_CONDITION,
                condition.status,
                condition.reason.clone(),
                condition.message.clone(),
            );
        }
    }
    DesiredCondition::true_(READY_CONDITION, reason::PROVISIONED)
}

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
                reason::BOOTSTRAP_CHECK_DISABLED,
            )),
            BootstrapCheck::NotSupported(why) => Some(
                DesiredCondition::true_(
                    BOOTSTRAP_EXEC_SUCCEEDED,
                    reason::BOOTSTRAP_CHECK_NOT_SUPPORTED,
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
/// after a reboot while the node stays bootstrapped.
pub fn bootstrap_confirmed(conditions: &[Condition]) -> bool {
    conditions.iter().any(|c| {
        c.type_ == BOOTSTRAP_EXEC_SUCCEEDED
            && c.status == "True"
            && c.reason == reason::BOOTSTRAP_SENTINEL_FOUND
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
        Ok(SentinelReading::Success) => {
            DesiredCondition::true_(BOOTSTRAP_EXEC_SUCCEEDED, reason::BOOTSTRAP_SENTINEL_FOUND)
        }
        Ok(SentinelReading::Absent) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::WAITING_FOR_BOOTSTRAP_SENTINEL,
            format!(
                "{BOOTSTRAP_SENTINEL} does not exist on {ip} yet: the node is still bootstrapping (progress in the guest's /var/log/cloud-init-output.log)"
            ),
        ),
        Ok(SentinelReading::Unexpected(content)) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::BOOTSTRAP_SENTINEL_UNEXPECTED,
            format!(
                "{BOOTSTRAP_SENTINEL} on {ip} says {content:?}, not {SENTINEL_SUCCESS:?}: bootstrap did not succeed; see the guest's /var/log/cloud-init-output.log"
            ),
        ),
        Err(error @ ProbeError::AuthenticationRejected { .. }) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::SSH_AUTHENTICATION_FAILED,
            format!(
                "{error}: cloud-init has not created user {SSH_USER} (yet), or the image has no cloud-init; retrying"
            ),
        ),
        Err(error) => DesiredCondition::false_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            reason::SSH_CONNECTION_FAILED,
            format!(
                "{error}; retrying. The ssh check needs the management cluster to reach the VM on port 22; otherwise set spec.virtualMachineBootstrapCheck.checkStrategy to none"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn vm(spec: Value, status: Value) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": { "name": "m1", "namespace": "ns" },
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn vmi(status: Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": { "name": "m1", "namespace": "ns" },
            "spec": { "domain": { "devices": {} } },
            "status": status,
        }))
        .unwrap()
    }

    fn dv(status: Value) -> DataVolume {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": { "name": "m1-boot", "namespace": "ns" },
            "spec": { "source": { "http": { "url": "http://x/y" } } },
            "status": status,
        }))
        .unwrap()
    }

    fn always() -> VirtualMachine {
        vm(
            json!({ "runStrategy": "Always", "template": {} }),
            json!({}),
        )
    }

    #[test]
    fn ready_vmi_means_provisioned() {
        let state = virtual_machine_state(
            &always(),
            Some(&vmi(
                json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] }),
            )),
            &[],
        );
        assert!(state.ready);
        assert_eq!(state.condition.reason, reason::PROVISIONED);
    }

    #[test]
    fn import_404_is_reported_with_cdis_message() {
        let failing = dv(json!({
            "phase": "ImportInProgress", "restartCount": 2, "progress": "N/A",
            "conditions": [{ "type": "Running", "status": "False", "reason": "Error",
                "message": "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found" }]
        }));
        let state = virtual_machine_state(&always(), None, &[failing]);
        assert_eq!(state.condition.reason, reason::DATA_VOLUME_IMPORT_FAILED);
        assert!(
            state.condition.message.contains("got 404"),
            "{}",
            state.condition.message
        );
        assert!(!state.terminal, "CDI retries");
    }

    #[test]
    fn failed_data_volume_is_terminal() {
        let failed = dv(
            json!({ "phase": "Failed", "conditions": [{ "type": "Running", "status": "False", "reason": "ChecksumError", "message": "checksum mismatch" }] }),
        );
        let state = virtual_machine_state(&always(), None, &[failed]);
        assert!(state.terminal);
        assert!(state.condition.message.contains("checksum mismatch"));
    }

    #[test]
    fn importing_shows_progress() {
        let importing = dv(json!({ "phase": "ImportInProgress", "progress": "45.00%" }));
        let state = virtual_machine_state(&always(), None, &[importing]);
        assert_eq!(state.condition.reason, reason::DATA_VOLUME_IMPORTING);
        assert_eq!(
            state.condition.message,
            "DataVolume m1-boot is ImportInProgress 45.00%"
        );
    }

    #[test]
    fn unschedulable_and_image_pull_are_named() {
        let unschedulable = vmi(json!({ "phase": "Scheduling", "conditions": [
            { "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: insufficient memory" }
        ]}));
        let state = virtual_machine_state(&always(), Some(&unschedulable), &[]);
        assert_eq!(state.condition.reason, reason::UNSCHEDULABLE);
        assert!(state.condition.message.contains("insufficient memory"));

        let pull = vmi(json!({ "phase": "Scheduled", "conditions": [
            { "type": "Synchronized", "status": "False", "reason": "ErrImagePull", "message": "manifest unknown" }
        ]}));
        assert_eq!(
            virtual_machine_state(&always(), Some(&pull), &[])
                .condition
                .reason,
            reason::IMAGE_PULL_FAILED
        );
    }

    #[test]
    fn failed_instance_is_terminal_only_when_nothing_restarts_it() {
        let failed = vmi(json!({ "phase": "Failed", "reason": "guest crashed" }));
        let always_state = virtual_machine_state(&always(), Some(&failed), &[]);
        assert_eq!(always_state.condition.reason, reason::VMI_FAILED);
        assert!(!always_state.terminal);
        let once = vm(json!({ "runStrategy": "Once", "template": {} }), json!({}));
        assert!(virtual_machine_state(&once, Some(&failed), &[]).terminal);
    }

    #[test]
    fn eviction_and_the_terminal_label_are_terminal() {
        let evacuating = vmi(json!({ "phase": "Running", "evacuationNodeName": "node-2",
            "conditions": [{ "type": "Ready", "status": "True" }] }));
        let state = virtual_machine_state(&always(), Some(&evacuating), &[]);
        assert_eq!(state.condition.reason, reason::VMI_EVICTED);
        assert!(state.terminal);

        let mut labelled = always();
        labelled.metadata.labels =
            Some([(VM_IS_TERMINAL_LABEL.to_string(), "true".to_string())].into());
        assert_eq!(
            virtual_machine_state(&labelled, None, &[]).condition.reason,
            reason::VM_TERMINAL
        );
    }

    #[test]
    fn halted_vm_is_reported_as_stopped() {
        let halted = vm(
            json!({ "runStrategy": "Halted", "template": {} }),
            json!({ "printableStatus": "Stopped" }),
        );
        let state = virtual_machine_state(&halted, None, &[]);
        assert_eq!(state.condition.reason, reason::VM_STOPPED);
    }

    #[test]
    fn addresses_list_every_ip_of_every_interface_once() {
        let running = vmi(json!({ "interfaces": [
            { "name": "default", "ipAddress": "10.0.0.5", "ipAddresses": ["10.0.0.5", "fd00::5"] },
            { "name": "secondary", "ipAddresses": ["192.168.1.9"] }
        ]}));
        let addresses = machine_addresses("m1", &running);
        let internal: Vec<&str> = addresses
            .iter()
            .filter(|a| a.type_ == MachineAddressType::InternalIP)
            .map(|a| a.address.as_str())
            .collect();
        assert_eq!(internal, ["10.0.0.5", "fd00::5", "192.168.1.9"]);
        assert_eq!(addresses[0].type_, MachineAddressType::Hostname);
        assert_eq!(addresses.len(), 2 + 3 * 2);
    }

    #[test]
    fn ready_summarises_the_first_unmet_condition() {
        let provisioned = DesiredCondition::true_(VM_PROVISIONED, reason::PROVISIONED);
        let bootstrap =
            DesiredCondition::false_(BOOTSTRAP_EXEC_SUCCEEDED, "WaitingForBootstrapSentinel", "…");
        let ready = ready_condition(&provisioned, &bootstrap);
        assert_eq!(ready.reason, "WaitingForBootstrapSentinel");
        assert!(!ready.is_true());
        let bootstrap =
            DesiredCondition::true_(BOOTSTRAP_EXEC_SUCCEEDED, reason::BOOTSTRAP_CHECK_DISABLED);
        assert!(ready_condition(&provisioned, &bootstrap).is_true());
    }

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
            assert_eq!(condition.reason, reason::BOOTSTRAP_CHECK_NOT_SUPPORTED);
        }
        assert!(BootstrapCheck::Ssh.condition().is_none());
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
        assert_eq!(found.reason, reason::BOOTSTRAP_SENTINEL_FOUND);
        let waiting = sentinel_condition(ip, &Ok(SentinelReading::Absent));
        assert_eq!(waiting.reason, reason::WAITING_FOR_BOOTSTRAP_SENTINEL);
        assert!(waiting.message.contains("10.0.0.5"), "{}", waiting.message);
        let odd = sentinel_condition(ip, &Ok(SentinelReading::Unexpected("failed".into())));
        assert_eq!(odd.reason, reason::BOOTSTRAP_SENTINEL_UNEXPECTED);
        assert!(odd.message.contains("\"failed\""), "{}", odd.message);
        let refused = sentinel_condition(
            ip,
            &Err(ProbeError::Connect {
                address,
                reason: "Connection refused (os error 111)".into(),
            }),
        );
        assert_eq!(refused.reason, reason::SSH_CONNECTION_FAILED);
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
        assert_eq!(timeout.reason, reason::SSH_CONNECTION_FAILED);
        let rejected = sentinel_condition(ip, &Err(ProbeError::AuthenticationRejected { address }));
        assert_eq!(rejected.reason, reason::SSH_AUTHENTICATION_FAILED);
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
            reason::BOOTSTRAP_SENTINEL_FOUND
        )]));
        assert!(!bootstrap_confirmed(&[condition(
            "True",
            reason::BOOTSTRAP_CHECK_DISABLED
        )]));
        assert!(!bootstrap_confirmed(&[condition(
            "False",
            reason::WAITING_FOR_BOOTSTRAP_SENTINEL
        )]));
        assert!(!bootstrap_confirmed(&[]));
    }
}
