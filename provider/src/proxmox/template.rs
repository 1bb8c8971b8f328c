//! ProxmoxMachineTemplate status for the cluster autoscaler's scale from
//! zero: `status.capacity` (cpu, memory) and `status.nodeInfo` of the nodes
//! the template makes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tenantry_api::contract::{MachineTemplateStatus, NodeInfo};
use tenantry_api::proxmox::ProxmoxMachineTemplate;

use crate::capi::template_capacity::CapacityTemplate;

/// What a node made from the template provides: `numSockets` × `numCores`
/// CPUs (a missing one counts as 1) and `memoryMiB`. Without either, the
/// clone keeps the VM template's value, which only Proxmox knows, so that
/// capacity is left out rather than guessed.
pub fn template_status(template: &ProxmoxMachineTemplate) -> MachineTemplateStatus {
    let spec = &template.spec.template.spec;
    let mut capacity = BTreeMap::new();
    if spec.num_sockets.is_some() || spec.num_cores.is_some() {
        let cpus = i64::from(spec.num_sockets.unwrap_or(1).max(1))
            * i64::from(spec.num_cores.unwrap_or(1).max(1));
        capacity.insert("cpu".to_string(), Quantity(cpus.to_string()));
    }
    if let Some(memory) = spec.memory_mib.filter(|m| *m > 0) {
        capacity.insert("memory".to_string(), Quantity(format!("{memory}Mi")));
    }
    MachineTemplateStatus {
        capacity: (!capacity.is_empty()).then_some(capacity),
        node_info: Some(NodeInfo {
            architecture: Some("amd64".into()),
            operating_system: Some("linux".into()),
        }),
    }
}

impl CapacityTemplate for ProxmoxMachineTemplate {
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

    fn template(spec: Value) -> ProxmoxMachineTemplate {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
            "kind": "ProxmoxMachineTemplate",
            "metadata": { "name": "t" },
            "spec": { "template": { "spec": spec } }
        }))
        .unwrap()
    }

    #[test]
    fn capacity_is_sockets_times_cores_and_memory() {
        let status = template_status(&template(json!({
            "sourceNode": "pve1", "templateID": 9000, "numSockets": 2, "numCores": 4, "memoryMiB": 8192,
            "network": { "networkDevices": [] }
        })));
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["cpu"].0, "8");
        assert_eq!(capacity["memory"].0, "8192Mi");
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
    fn cores_alone_count_one_socket_and_unknown_sizes_are_left_out() {
        let status = template_status(&template(
            json!({ "numCores": 2, "network": { "networkDevices": [] } }),
        ));
        let capacity = status.capacity.unwrap();
        assert_eq!(capacity["cpu"].0, "2");
        assert!(!capacity.contains_key("memory"));
        let none = template_status(&template(json!({ "network": { "networkDevices": [] } })));
        assert!(none.capacity.is_none());
    }
}
