//! Cluster API v1beta1 objects in the v1beta2 shape tenantry works with, as
//! Cluster API's own conversion (≥ 1.11) maps them, for the fields tenantry
//! reads: references by API group instead of API version, the ready flags
//! as `status.initialization`, the v1beta2 conditions (which Cluster API
//! 1.10 keeps under `status.v1beta2`) as `status.conditions` and the old
//! ones under `status.deprecated.v1beta1`. Fields the v1beta2 types do not
//! have are left for serde to skip.

use serde_json::{Map, Value, json};

/// A Machine read as `cluster.x-k8s.io/v1beta1`, in the v1beta2 shape.
pub fn machine(mut object: Value) -> Value {
    set_api_version(&mut object);
    if let Some(spec) = object.get_mut("spec") {
        to_contract_reference(spec.get_mut("infrastructureRef"));
        to_contract_reference(spec.pointer_mut("/bootstrap/configRef"));
    }
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        let initialization = [
            ("infrastructureReady", "infrastructureProvisioned"),
            ("bootstrapReady", "bootstrapDataSecretCreated"),
        ];
        move_to_initialization(status, &initialization);
        move_conditions(status);
    }
    object
}

/// A MachineDeployment read as `cluster.x-k8s.io/v1beta1`, in the v1beta2
/// shape.
pub fn machine_deployment(mut object: Value) -> Value {
    set_api_version(&mut object);
    if let Some(spec) = object.pointer_mut("/spec/template/spec") {
        to_contract_reference(spec.get_mut("infrastructureRef"));
        to_contract_reference(spec.pointer_mut("/bootstrap/configRef"));
    }
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        // The v1beta1 counters mean other things than v1beta2's of the same
        // name; Cluster API 1.10 keeps the v1beta2 ones under `v1beta2`.
        let mut deprecated = Map::new();
        for key in [
            "readyReplicas",
            "availableReplicas",
            "updatedReplicas",
            "unavailableReplicas",
        ] {
            if let Some(value) = status.remove(key) {
                deprecated.insert(key.into(), value);
            }
        }
        copy_from_v1beta2(
            status,
            &["readyReplicas", "availableReplicas", "upToDateReplicas"],
        );
        move_conditions(status);
        if let Some(Value::Object(old)) = status
            .get_mut("deprecated")
            .and_then(|d| d.get_mut("v1beta1"))
        {
            old.extend(deprecated);
        } else if !deprecated.is_empty() {
            status.insert("deprecated".into(), json!({ "v1beta1": deprecated }));
        }
    }
    object
}

/// A Cluster read as `cluster.x-k8s.io/v1beta1`, in the v1beta2 shape.
pub fn cluster(mut object: Value) -> Value {
    set_api_version(&mut object);
    if let Some(spec) = object.get_mut("spec") {
        to_contract_reference(spec.get_mut("infrastructureRef"));
        to_contract_reference(spec.get_mut("controlPlaneRef"));
        if let Some(topology) = spec.get_mut("topology").and_then(Value::as_object_mut) {
            let class = topology.remove("class");
            let namespace = topology.remove("classNamespace");
            let mut class_ref = json!({ "name": class.unwrap_or_default() });
            if let Some(namespace) = namespace {
                class_ref["namespace"] = namespace;
            }
            topology.insert("classRef".into(), class_ref);
        }
    }
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        let initialization = [
            ("infrastructureReady", "infrastructureProvisioned"),
            ("controlPlaneReady", "controlPlaneInitialized"),
        ];
        move_to_initialization(status, &initialization);
        // v1beta1 keys failure domains by name; v1beta2 lists them.
        if let Some(Value::Object(domains)) = status.remove("failureDomains") {
            let list = domains
                .into_iter()
                .map(|(name, mut domain)| {
                    domain["name"] = Value::String(name);
                    domain
                })
                .collect();
            status.insert("failureDomains".into(), Value::Array(list));
        }
        copy_from_v1beta2(status, &["controlPlane", "workers"]);
        move_conditions(status);
    }
    object
}

fn set_api_version(object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert(
            "apiVersion".into(),
            Value::String("cluster.x-k8s.io/v1beta2".into()),
        );
    }
}

/// `{apiVersion: group/version, kind, name, namespace}` →
/// `{apiGroup: group, kind, name}`.
fn to_contract_reference(reference: Option<&mut Value>) {
    let Some(Value::Object(map)) = reference else {
        return;
    };
    let api_group = map
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(|api_version| match api_version.split_once('/') {
            Some((group, _)) => group.to_string(),
            None => String::new(),
        })
        .unwrap_or_default();
    let mut converted = Map::new();
    converted.insert("apiGroup".into(), Value::String(api_group));
    for key in ["kind", "name"] {
        converted.insert(key.into(), map.remove(key).unwrap_or_default());
    }
    *map = converted;
}

/// Copies `keys` of `status.v1beta2` (Cluster API 1.10's preview of the
/// v1beta2 status) to the top of `status`.
fn copy_from_v1beta2(status: &mut Map<String, Value>, keys: &[&str]) {
    let Some(Value::Object(v1beta2)) = status.get("v1beta2") else {
        return;
    };
    let copied: Vec<(String, Value)> = keys
        .iter()
        .filter_map(|key| Some((key.to_string(), v1beta2.get(*key)?.clone())))
        .collect();
    status.extend(copied);
}

fn move_to_initialization(status: &mut Map<String, Value>, fields: &[(&str, &str)]) {
    let mut initialization = Map::new();
    for (from, to) in fields {
        if let Some(value) = status.remove(*from) {
            initialization.insert((*to).into(), value);
        }
    }
    if !initialization.is_empty() {
        status.insert("initialization".into(), Value::Object(initialization));
    }
}

/// v1beta1 conditions and failure fields go to `deprecated.v1beta1`; the
/// v1beta2 conditions become `conditions`.
fn move_conditions(status: &mut Map<String, Value>) {
    let mut deprecated = Map::new();
    for key in ["conditions", "failureReason", "failureMessage"] {
        if let Some(value) = status.remove(key) {
            deprecated.insert(key.into(), value);
        }
    }
    if !deprecated.is_empty() {
        status.insert("deprecated".into(), json!({ "v1beta1": deprecated }));
    }
    if let Some(Value::Object(mut v1beta2)) = status.remove("v1beta2")
        && let Some(conditions) = v1beta2.remove("conditions")
    {
        status.insert("conditions".into(), conditions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::{Cluster, Machine};
    use tenantry_api::generated::capi::machine_deployment::MachineDeployment;

    /// A worker Machine as Cluster API v1.10 writes it once its node joined.
    fn v1beta1_machine() -> Value {
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Machine",
            "metadata": { "name": "w-1", "namespace": "tenant", "uid": "u-1" },
            "spec": {
                "clusterName": "demo",
                "bootstrap": {
                    "configRef": { "apiVersion": "bootstrap.cluster.x-k8s.io/v1alpha3", "kind": "TalosConfig", "name": "w-1", "namespace": "tenant" },
                    "dataSecretName": "w-1-bootstrap"
                },
                "infrastructureRef": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtMachine", "name": "w-1", "namespace": "tenant", "uid": "u-2" },
                "nodeDrainTimeout": "10s",
                "providerID": "kubevirt://w-1",
                "version": "v1.35.0"
            },
            "status": {
                "bootstrapReady": true,
                "infrastructureReady": true,
                "nodeRef": { "apiVersion": "v1", "kind": "Node", "name": "w-1", "uid": "n-1" },
                "phase": "Running",
                "failureReason": "UpdateError",
                "conditions": [
                    { "type": "Ready", "status": "True", "lastTransitionTime": "2026-12-07T10:00:00Z" },
                    { "type": "HealthCheckSucceeded", "status": "False", "severity": "Warning", "reason": "UnhealthyNode", "lastTransitionTime": "2026-12-07T10:00:00Z" }
                ],
                "v1beta2": {
                    "conditions": [
                        { "type": "HealthCheckSucceeded", "status": "False", "reason": "UnhealthyNode", "message": "Condition Ready on Node is reporting status Unknown for more than 5s", "lastTransitionTime": "2026-12-07T10:00:00Z" }
                    ]
                }
            }
        })
    }

    #[test]
    fn a_v1beta1_machine_reads_as_cluster_api_converts_it() {
        let machine: Machine = serde_json::from_value(machine(v1beta1_machine())).unwrap();
        let reference = &machine.spec.infrastructure_ref;
        assert_eq!(
            (
                reference.api_group.as_str(),
                reference.kind.as_str(),
                reference.name.as_str()
            ),
            ("infrastructure.cluster.x-k8s.io", "KubevirtMachine", "w-1")
        );
        let config = machine.spec.bootstrap.config_ref.as_ref().unwrap();
        assert_eq!(config.api_group, "bootstrap.cluster.x-k8s.io");
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("w-1-bootstrap")
        );
        let status = machine.status.unwrap();
        let initialization = status.initialization.unwrap();
        assert_eq!(initialization.infrastructure_provisioned, Some(true));
        assert_eq!(initialization.bootstrap_data_secret_created, Some(true));
        assert_eq!(status.node_ref.unwrap().name, "w-1");
        let conditions = status.conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].r#type, "HealthCheckSucceeded");
        assert_eq!(conditions[0].reason, "UnhealthyNode");
        let old = status.deprecated.unwrap().v1beta1.unwrap();
        assert_eq!(old.conditions.unwrap().len(), 2);
        assert_eq!(old.failure_reason.as_deref(), Some("UpdateError"));
    }

    #[test]
    fn a_new_machine_without_status_converts() {
        let mut object = v1beta1_machine();
        object.as_object_mut().unwrap().remove("status");
        let machine: Machine = serde_json::from_value(machine(object)).unwrap();
        assert!(machine.status.is_none());
    }

    #[test]
    fn a_v1beta1_machine_deployment_names_its_template_by_group() {
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "MachineDeployment",
            "metadata": { "name": "md", "namespace": "tenant" },
            "spec": {
                "clusterName": "demo",
                "replicas": 3,
                "selector": { "matchLabels": { "pool": "a" } },
                "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1 } },
                "template": {
                    "metadata": { "labels": { "pool": "a" } },
                    "spec": {
                        "clusterName": "demo",
                        "bootstrap": { "dataSecretName": "boot" },
                        "infrastructureRef": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2", "kind": "ProxmoxMachineTemplate", "name": "workers" }
                    }
                }
            },
            "status": {
                "replicas": 3,
                "readyReplicas": 2,
                "updatedReplicas": 3,
                "v1beta2": { "readyReplicas": 1, "upToDateReplicas": 3 }
            }
        });
        let deployment: MachineDeployment =
            serde_json::from_value(machine_deployment(object)).unwrap();
        let reference = &deployment.spec.template.spec.infrastructure_ref;
        assert_eq!(reference.api_group, "infrastructure.cluster.x-k8s.io");
        assert_eq!(reference.name, "workers");
        let status = deployment.status.unwrap();
        assert_eq!(status.ready_replicas, Some(1));
        assert_eq!(status.up_to_date_replicas, Some(3));
    }

    #[test]
    fn a_v1beta1_cluster_reads_as_cluster_api_converts_it() {
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Cluster",
            "metadata": { "name": "demo", "namespace": "tenant" },
            "spec": {
                "paused": true,
                "clusterNetwork": { "apiServerPort": 6443, "pods": { "cidrBlocks": ["10.244.0.0/16"] } },
                "controlPlaneEndpoint": { "host": "demo.tenant.svc", "port": 6443 },
                "controlPlaneRef": { "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha1", "kind": "KamajiControlPlane", "name": "demo" },
                "infrastructureRef": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtCluster", "name": "demo" },
                "topology": { "class": "kamaji", "classNamespace": "platform", "version": "v1.35.0" }
            },
            "status": {
                "infrastructureReady": true,
                "controlPlaneReady": false,
                "phase": "Provisioned",
                "failureDomains": { "zone-a": { "controlPlane": true }, "zone-b": { "attributes": { "rack": "2" } } },
                "conditions": [ { "type": "Ready", "status": "False", "severity": "Info", "lastTransitionTime": "2026-12-07T10:00:00Z" } ],
                "v1beta2": {
                    "conditions": [ { "type": "Available", "status": "False", "reason": "NotAvailable", "message": "", "lastTransitionTime": "2026-12-07T10:00:00Z" } ],
                    "workers": { "desiredReplicas": 3, "replicas": 3 }
                }
            }
        });
        let cluster: Cluster = serde_json::from_value(cluster(object)).unwrap();
        assert_eq!(cluster.spec.paused, Some(true));
        let infrastructure = cluster.spec.infrastructure_ref.as_ref().unwrap();
        assert_eq!(infrastructure.api_group, "infrastructure.cluster.x-k8s.io");
        assert_eq!(infrastructure.kind, "KubevirtCluster");
        let control_plane = cluster.spec.control_plane_ref.as_ref().unwrap();
        assert_eq!(control_plane.api_group, "controlplane.cluster.x-k8s.io");
        let topology = cluster.spec.topology.as_ref().unwrap();
        assert_eq!(topology.class_ref.name, "kamaji");
        assert_eq!(topology.class_ref.namespace.as_deref(), Some("platform"));
        assert!(crate::capi::owner::infrastructure_provisioned(&cluster));
        assert!(!crate::capi::owner::control_plane_initialized(&cluster));
        let status = cluster.status.unwrap();
        let domains = status.failure_domains.unwrap();
        let names: Vec<_> = domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["zone-a", "zone-b"]);
        assert_eq!(status.conditions.unwrap()[0].r#type, "Available");
        assert_eq!(status.workers.unwrap().replicas, Some(3));
    }
}
