//! What the VM, its instance and its DataVolumes say about provisioning,
//! the addresses a machine reports, and its `Ready` summary.

use tenantry_api::contract::{MachineAddress, MachineAddressType, READY_CONDITION};
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;

use crate::capi::conditions::DesiredCondition;
use crate::kubevirt::machine::status::{Reason, VM_PROVISIONED};

/// Label a user (or a test) puts on a VM or VMI to declare it broken for good (CAPK's key).
pub const VM_IS_TERMINAL_LABEL: &str = "capk.cluster.x-k8s.io/vm-is-terminal";

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
            Reason::VmTerminal.as_str(),
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
                Reason::VmStopped.as_str(),
                format!("VirtualMachine {name} has runStrategy Halted, so no instance runs"),
            );
        }
        if let Some(failure) = vm_status.and_then(|s| s.start_failure.as_ref()) {
            return VmState::not_provisioned(
                Reason::VmStartFailing.as_str(),
                format!(
                    "VirtualMachine {name} fails to start ({} consecutive failures, status {printable})",
                    failure.consecutive_fail_count.unwrap_or(0)
                ),
            );
        }
        return VmState::not_provisioned(
            Reason::WaitingForVmi.as_str(),
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
            Reason::VmiEvicted.as_str(),
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
            VmState::not_provisioned(Reason::VmiFailed.as_str(), message)
        } else {
            VmState::terminal(Reason::VmiFailed.as_str(), message)
        };
    }
    if let Some(scheduled) = find("PodScheduled").filter(|c| c.status == "False") {
        return VmState::not_provisioned(
            Reason::Unschedulable.as_str(),
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
            Reason::ImagePullFailed.as_str(),
            format!(
                "VirtualMachineInstance {name} cannot pull its image: {}",
                message_of(sync)
            ),
        );
    }
    if find("Ready").is_some_and(|c| c.status == "True") {
        return VmState {
            condition: DesiredCondition::true_(VM_PROVISIONED, Reason::Provisioned.as_str()),
            ready: true,
            terminal: false,
        };
    }
    let detail = find("Ready").map(message_of).filter(|m| !m.is_empty());
    VmState::not_provisioned(
        Reason::VmNotReady.as_str(),
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
            Reason::DataVolumeImportFailed.as_str(),
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
            Reason::DataVolumeImportFailed.as_str(),
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
        Reason::DataVolumeImporting.as_str(),
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
    DesiredCondition::true_(READY_CONDITION, Reason::Provisioned.as_str())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kubevirt::machine::status::BOOTSTRAP_EXEC_SUCCEEDED;
    use serde_json::{Value, json};

    fn vm(spec: Value, status: Value) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": { "name": "m1", "namespace": "ns" },
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    pub(in crate::kubevirt::machine::decide) fn vmi(status: Value) -> VirtualMachineInstance {
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
        assert_eq!(state.condition.reason, Reason::Provisioned.as_str());
    }

    #[test]
    fn import_404_is_reported_with_cdis_message() {
        let failing = dv(json!({
            "phase": "ImportInProgress", "restartCount": 2, "progress": "N/A",
            "conditions": [{ "type": "Running", "status": "False", "reason": "Error",
                "message": "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found" }]
        }));
        let state = virtual_machine_state(&always(), None, &[failing]);
        assert_eq!(
            state.condition.reason,
            Reason::DataVolumeImportFailed.as_str()
        );
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
        assert_eq!(state.condition.reason, Reason::DataVolumeImporting.as_str());
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
        assert_eq!(state.condition.reason, Reason::Unschedulable.as_str());
        assert!(state.condition.message.contains("insufficient memory"));

        let pull = vmi(json!({ "phase": "Scheduled", "conditions": [
            { "type": "Synchronized", "status": "False", "reason": "ErrImagePull", "message": "manifest unknown" }
        ]}));
        assert_eq!(
            virtual_machine_state(&always(), Some(&pull), &[])
                .condition
                .reason,
            Reason::ImagePullFailed.as_str()
        );
    }

    #[test]
    fn failed_instance_is_terminal_only_when_nothing_restarts_it() {
        let failed = vmi(json!({ "phase": "Failed", "reason": "guest crashed" }));
        let always_state = virtual_machine_state(&always(), Some(&failed), &[]);
        assert_eq!(always_state.condition.reason, Reason::VmiFailed.as_str());
        assert!(!always_state.terminal);
        let once = vm(json!({ "runStrategy": "Once", "template": {} }), json!({}));
        assert!(virtual_machine_state(&once, Some(&failed), &[]).terminal);
    }

    #[test]
    fn eviction_and_the_terminal_label_are_terminal() {
        let evacuating = vmi(json!({ "phase": "Running", "evacuationNodeName": "node-2",
            "conditions": [{ "type": "Ready", "status": "True" }] }));
        let state = virtual_machine_state(&always(), Some(&evacuating), &[]);
        assert_eq!(state.condition.reason, Reason::VmiEvicted.as_str());
        assert!(state.terminal);

        let mut labelled = always();
        labelled.metadata.labels =
            Some([(VM_IS_TERMINAL_LABEL.to_string(), "true".to_string())].into());
        assert_eq!(
            virtual_machine_state(&labelled, None, &[]).condition.reason,
            Reason::VmTerminal.as_str()
        );
    }

    #[test]
    fn halted_vm_is_reported_as_stopped() {
        let halted = vm(
            json!({ "runStrategy": "Halted", "template": {} }),
            json!({ "printableStatus": "Stopped" }),
        );
        let state = virtual_machine_state(&halted, None, &[]);
        assert_eq!(state.condition.reason, Reason::VmStopped.as_str());
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
        let provisioned = DesiredCondition::true_(VM_PROVISIONED, Reason::Provisioned.as_str());
        let bootstrap =
            DesiredCondition::false_(BOOTSTRAP_EXEC_SUCCEEDED, "WaitingForBootstrapSentinel", "…");
        let ready = ready_condition(&provisioned, &bootstrap);
        assert_eq!(ready.reason, "WaitingForBootstrapSentinel");
        assert!(!ready.is_true());
        let bootstrap = DesiredCondition::true_(
            BOOTSTRAP_EXEC_SUCCEEDED,
            Reason::BootstrapCheckDisabled.as_str(),
        );
        assert!(ready_condition(&provisioned, &bootstrap).is_true());
    }
}
