//! Infrastructure templates are immutable: CAPI stamps machines (and
//! remediations) out of them, so a changed template must be a new template
//! (which is how a MachineDeployment rolls). The exception is the server-side-apply dry run
//! CAPI's topology controller sends with the
//! `topology.cluster.x-k8s.io/dry-run` annotation to compute diffs.

use serde_json::Value;
use tenantry_api::contract::TOPOLOGY_DRY_RUN_ANNOTATION;

/// The template kinds whose spec is immutable.
pub const IMMUTABLE_TEMPLATE_KINDS: &[&str] = &[
    "KubevirtMachineTemplate",
    "KubevirtClusterTemplate",
    "ProxmoxMachineTemplate",
    "ProxmoxClusterTemplate",
    "KubevirtRemediationTemplate",
    "ProxmoxRemediationTemplate",
];

/// How many changed fields an error message lists.
const LISTED_CHANGES: usize = 5;

/// Decides an UPDATE of a template. `Err` carries the message for the user.
pub fn validate_template_update(
    kind: &str,
    old: &Value,
    new: &Value,
    dry_run: bool,
) -> Result<(), String> {
    let (old_spec, new_spec) = (&old["spec"], &new["spec"]);
    if old_spec == new_spec {
        return Ok(());
    }
    let topology_dry_run = new
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(TOPOLOGY_DRY_RUN_ANNOTATION));
    if dry_run && topology_dry_run {
        return Ok(());
    }
    let mut changed = Vec::new();
    changed_paths("spec", old_spec, new_spec, &mut changed);
    let more = changed.len().saturating_sub(LISTED_CHANGES);
    changed.truncate(LISTED_CHANGES);
    let mut fields = changed.join(", ");
    if more > 0 {
        fields.push_str(&format!(" and {more} more"));
    }
    Err(format!(
        "{kind} spec is immutable (changed: {fields}); create a new {kind} and point {} at it",
        referrers(kind)
    ))
}

/// What refers to templates of a kind, for the error message.
fn referrers(kind: &str) -> &'static str {
    if kind.ends_with("RemediationTemplate") {
        "the MachineHealthCheck's spec.remediation.templateRef"
    } else {
        "the MachineDeployment, MachineSet or Cluster"
    }
}

/// The dotted paths where two JSON values differ (list indices in brackets).
fn changed_paths(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                if x != y {
                    changed_paths(&format!("{path}.{key}"), x, y, out);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                if x != y {
                    changed_paths(&format!("{path}[{index}]"), x, y, out);
                }
            }
        }
        _ => out.push(path.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(cores: u32, annotations: Value) -> Value {
        json!({
            "metadata": { "name": "t", "annotations": annotations },
            "spec": { "template": { "spec": { "virtualMachineTemplate": { "spec": { "template": { "spec": {
                "domain": { "cpu": { "cores": cores } }
            }}}}}}}
        })
    }

    #[test]
    fn unchanged_spec_is_allowed_even_with_metadata_changes() {
        let old = template(2, json!({}));
        let new = template(2, json!({ "team": "a" }));
        assert!(validate_template_update("KubevirtMachineTemplate", &old, &new, false).is_ok());
    }

    #[test]
    fn spec_change_is_refused_naming_the_field() {
        let message = validate_template_update(
            "KubevirtMachineTemplate",
            &template(2, json!({})),
            &template(4, json!({})),
            false,
        )
        .unwrap_err();
        assert!(
            message.contains(
                "spec.template.spec.virtualMachineTemplate.spec.template.spec.domain.cpu.cores"
            ),
            "{message}"
        );
        assert!(message.starts_with("KubevirtMachineTemplate spec is immutable"));
    }

    #[test]
    fn remediation_templates_point_at_the_machine_health_check() {
        let old =
            json!({ "spec": { "template": { "spec": { "strategy": { "retryLimit": 1 } } } } });
        let new =
            json!({ "spec": { "template": { "spec": { "strategy": { "retryLimit": 3 } } } } });
        let message =
            validate_template_update("KubevirtRemediationTemplate", &old, &new, false).unwrap_err();
        assert!(
            message.contains("spec.template.spec.strategy.retryLimit")
                && message.contains("spec.remediation.templateRef"),
            "{message}"
        );
    }

    #[test]
    fn only_topology_dry_runs_may_change_the_spec() {
        let dry = json!({ TOPOLOGY_DRY_RUN_ANNOTATION: "" });
        let old = template(2, json!({}));
        assert!(validate_template_update("K", &old, &template(4, dry.clone()), true).is_ok());
        assert!(
            validate_template_update("K", &old, &template(4, dry), false).is_err(),
            "annotation without dry run"
        );
        assert!(
            validate_template_update("K", &old, &template(4, json!({})), true).is_err(),
            "dry run without annotation"
        );
    }
}
