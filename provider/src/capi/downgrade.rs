//! Objects tenantry renders in the v1beta2 shape, written as
//! `cluster.x-k8s.io/v1beta1` when the management cluster serves only that
//! (Cluster API 1.10): the same meaning in the older field names, as Cluster
//! API's own conversion maps them.

use serde_json::{Map, Value, json};

/// The API version (`group/version`) of a kind a reference names: v1beta1
/// references carry a version, v1beta2 ones only the group.
pub type VersionOf<'a> = &'a dyn Fn(&str, &str) -> String;

/// A Cluster rendered as v1beta2, as v1beta1.
pub fn cluster(mut object: Value, version_of: VersionOf) -> Value {
    set_api_version(&mut object);
    if let Some(spec) = object.get_mut("spec") {
        to_object_reference(spec.get_mut("infrastructureRef"), version_of);
        to_object_reference(spec.get_mut("controlPlaneRef"), version_of);
    }
    object
}

/// A MachineDeployment rendered as v1beta2, as v1beta1.
pub fn machine_deployment(mut object: Value, version_of: VersionOf) -> Value {
    set_api_version(&mut object);
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return object;
    };
    if let Some(Value::Object(mut rollout)) = spec.remove("rollout")
        && let Some(strategy) = rollout.remove("strategy")
    {
        spec.insert("strategy".into(), strategy);
    }
    if let Some(template) = spec.get_mut("template").and_then(|t| t.get_mut("spec")) {
        to_object_reference(template.get_mut("infrastructureRef"), version_of);
        to_object_reference(template.pointer_mut("/bootstrap/configRef"), version_of);
    }
    object
}

/// A MachineHealthCheck rendered as v1beta2, as v1beta1: timeouts as
/// durations, the remediation trigger as `maxUnhealthy`/`unhealthyRange`.
pub fn machine_health_check(mut object: Value, version_of: VersionOf) -> Value {
    set_api_version(&mut object);
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return object;
    };
    if let Some(Value::Object(mut checks)) = spec.remove("checks") {
        if let Some(seconds) = checks.remove("nodeStartupTimeoutSeconds") {
            spec.insert("nodeStartupTimeout".into(), duration(&seconds));
        }
        if let Some(Value::Array(conditions)) = checks.remove("unhealthyNodeConditions") {
            let conditions = conditions
                .into_iter()
                .map(|mut condition| {
                    if let Some(map) = condition.as_object_mut()
                        && let Some(seconds) = map.remove("timeoutSeconds")
                    {
                        map.insert("timeout".into(), duration(&seconds));
                    }
                    condition
                })
                .collect();
            spec.insert("unhealthyConditions".into(), Value::Array(conditions));
        }
    }
    if let Some(Value::Object(mut remediation)) = spec.remove("remediation") {
        if let Some(Value::Object(mut trigger)) = remediation.remove("triggerIf") {
            if let Some(limit) = trigger.remove("unhealthyLessThanOrEqualTo") {
                spec.insert("maxUnhealthy".into(), limit);
            }
            if let Some(range) = trigger.remove("unhealthyInRange") {
                spec.insert("unhealthyRange".into(), range);
            }
        }
        if let Some(mut template) = remediation.remove("templateRef") {
            // v1beta2 already names the template's apiVersion.
            if let Some(map) = template.as_object_mut()
                && let Some(Value::String(group)) = map.remove("apiGroup")
            {
                let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
                map.insert("apiVersion".into(), Value::String(version_of(&group, kind)));
            }
            spec.insert("remediationTemplate".into(), template);
        }
    }
    object
}

fn set_api_version(object: &mut Value) {
    object["apiVersion"] = json!("cluster.x-k8s.io/v1beta1");
}

/// `{apiGroup, kind, name}` → `{apiVersion, kind, name}`.
fn to_object_reference(reference: Option<&mut Value>, version_of: VersionOf) {
    let Some(Value::Object(map)) = reference else {
        return;
    };
    let group = match map.remove("apiGroup") {
        Some(Value::String(group)) => group,
        _ => return,
    };
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
    let mut converted = Map::new();
    converted.insert("apiVersion".into(), Value::String(version_of(&group, kind)));
    converted.extend(std::mem::take(map));
    *map = converted;
}

/// `300` seconds → `"300s"`, a Go duration.
fn duration(seconds: &Value) -> Value {
    Value::String(format!("{}s", seconds.as_i64().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(group: &str, kind: &str) -> String {
        let version = match kind {
            "KamajiControlPlane" => "v1alpha1",
            "TalosConfigTemplate" => "v1alpha3",
            _ => "v1alpha1",
        };
        format!("{group}/{version}")
    }

    #[test]
    fn cluster_references_name_their_versions() {
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": "kubernetes-demo" },
            "spec": {
                "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] } },
                "controlPlaneRef": { "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KamajiControlPlane", "name": "kubernetes-demo" },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": "kubernetes-demo" }
            }
        });
        let converted = cluster(object, &versions);
        assert_eq!(converted["apiVersion"], "cluster.x-k8s.io/v1beta1");
        assert_eq!(
            converted["spec"]["controlPlaneRef"],
            json!({ "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha1", "kind": "KamajiControlPlane", "name": "kubernetes-demo" })
        );
        assert_eq!(
            converted["spec"]["infrastructureRef"]["apiVersion"],
            "infrastructure.cluster.x-k8s.io/v1alpha1"
        );
        assert_eq!(
            converted["spec"]["clusterNetwork"]["pods"]["cidrBlocks"][0],
            "10.243.0.0/16"
        );
    }

    #[test]
    fn machine_deployment_strategy_and_template_references() {
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineDeployment",
            "spec": {
                "clusterName": "kubernetes-demo",
                "rollout": { "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 3, "maxUnavailable": 0 } } },
                "template": { "spec": {
                    "clusterName": "kubernetes-demo",
                    "version": "v1.35.0",
                    "bootstrap": { "configRef": { "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "TalosConfigTemplate", "name": "boot" } },
                    "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachineTemplate", "name": "md-1" }
                }}
            }
        });
        let converted = machine_deployment(object, &versions);
        let spec = &converted["spec"];
        assert!(spec.get("rollout").is_none());
        assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 3);
        assert_eq!(
            spec["template"]["spec"]["bootstrap"]["configRef"]["apiVersion"],
            "bootstrap.cluster.x-k8s.io/v1alpha3"
        );
        assert_eq!(
            spec["template"]["spec"]["infrastructureRef"]["name"],
            "md-1"
        );
    }

    #[test]
    fn health_check_timeouts_become_durations() {
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineHealthCheck",
            "spec": {
                "clusterName": "kubernetes-demo",
                "selector": { "matchLabels": { "pool": "a" } },
                "checks": {
                    "nodeStartupTimeoutSeconds": 1200,
                    "unhealthyNodeConditions": [ { "type": "Ready", "status": "Unknown", "timeoutSeconds": 300 } ]
                },
                "remediation": {
                    "triggerIf": { "unhealthyLessThanOrEqualTo": "50%" },
                    "templateRef": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtRemediationTemplate", "name": "reboot" }
                }
            }
        });
        let spec = machine_health_check(object, &versions)["spec"].clone();
        assert_eq!(
            spec,
            json!({
                "clusterName": "kubernetes-demo",
                "selector": { "matchLabels": { "pool": "a" } },
                "nodeStartupTimeout": "1200s",
                "unhealthyConditions": [ { "type": "Ready", "status": "Unknown", "timeout": "300s" } ],
                "maxUnhealthy": "50%",
                "remediationTemplate": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KubevirtRemediationTemplate", "name": "reboot" }
            })
        );
    }
}
