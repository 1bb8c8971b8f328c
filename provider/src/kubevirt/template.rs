//! KubevirtMachineTemplate status for the cluster autoscaler's scale from
//! zero: `status.capacity` (cpu, memory) and `status.nodeInfo` (architecture,
//! operating system) of the nodes the template makes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tenantry_api::contract::{MachineTemplateStatus, NodeInfo};
use tenantry_api::kubevirt::KubevirtMachineTemplate;

use crate::capi::template_capacity::CapacityTemplate;

/// What a node made from the template provides. CPU is
/// sockets × cores × threads of the domain (each defaulting to 1), else the
/// VM's requests, else its limits; memory is the guest memory, else requests,
/// else limits. A template that only names an instance type yields no
/// capacity (the instance type lives elsewhere), rather than a wrong one.
pub fn template_status(template: &KubevirtMachineTemplate) -> MachineTemplateStatus {
    let spec = serde_json::to_value(&template.spec.template.spec.virtual_machine_template.spec)
        .unwrap_or_default();
    let vmi = &spec["template"]["spec"];
    let domain = &vmi["domain"];
    let resource = |name: &str| {
        ["requests", "limits"]
            .iter()
            .find_map(|kind| domain["resources"][kind][name].as_str().map(str::to_string))
    };
    let cpu = if domain["cpu"].is_object() {
        let count = |key: &str| domain["cpu"][key].as_u64().unwrap_or(1).max(1);
        Some((count("sockets") * count("cores") * count("threads")).to_string())
    } else {
        resource("cpu")
    };
    let memory = domain["memory"]["guest"]
        .as_str()
        .map(str::to_string)
        .or_else(|| resource("memory"));
    let mut capacity = BTreeMap::new();
    if let Some(cpu) = cpu {
        capacity.insert("cpu".to_string(), Quantity(cpu));
    }
    if let Some(memory) = memory {
        capacity.insert("memory".to_string(), Quantity(memory));
    }
    let architecture = match vmi["architecture"].as_str() {
        Some("arm64" | "aarch64") => "arm64",
        Some("s390x") => "s390x",
        Some("ppc64le") => "ppc64le",
        _ => "amd64",
    };
    MachineTemplateStatus {
        capacity: (!capacity.is_empty()).then_some(capacity),
        node_info: Some(NodeInfo {
            architecture: Some(architecture.into()),
            operating_system: Some("linux".into()),
        }),
    }
}

impl CapacityTemplate for KubevirtMachineTemplate {
    fn status(&self) -> Option<&MachineTemplateStatus> {
        self.status.as_ref()
    }

    fn desired_status(&self) -> MachineTemplateStatus {
        template_status(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn template(vm_spec: Value) -> KubevirtMachineTemplate {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachineTemplate",
            "metadata": { "name": "t" },
            "spec": { "template": { "spec": { "virtualMachineTemplate": { "spec": vm_spec } } } }
        }))
        .unwrap()
    }

    #[test]
    fn capacity_from_cpu_topology_and_guest_memory() {
        let status = template_status(&template(json!({ "template": { "spec": { "domain": {
            "cpu": { "cores": 2, "sockets": 2 }, "memory": { "guest": "8Gi" }, "devices": {}
        }}}})));
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["cpu"].0, "4");
        assert_eq!(capacity["memory"].0, "8Gi");
        let info = status.node_info.unwrap();
        assert_eq!(
            (
                info.architecture.as_deref(),
                info.operating_system.as_deref()
            ),
            (Some("amd64"), Some("linux"))
        );
    }

    #[test]
    fn capacity_falls_back_to_requests_then_limits() {
        let status = template_status(&template(json!({ "template": { "spec": {
            "architecture": "arm64",
            "domain": { "resources": { "requests": { "memory": "2Gi" }, "limits": { "cpu": "3", "memory": "4Gi" } }, "devices": {} }
        }}})));
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["cpu"].0, "3");
        assert_eq!(capacity["memory"].0, "2Gi");
        assert_eq!(
            status.node_info.unwrap().architecture.as_deref(),
            Some("arm64")
        );
    }

    #[test]
    fn instance_type_only_template_has_no_capacity() {
        let status = template_status(&template(
            json!({ "instancetype": { "name": "u1.medium" }, "template": { "spec": { "domain": { "devices": {} } } } }),
        ));
        assert!(status.capacity.is_none());
    }
}
