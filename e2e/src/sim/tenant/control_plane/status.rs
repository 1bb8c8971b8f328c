//! The control plane contract status the provider reports, in either
//! KamajiControlPlane API.

use super::*;

/// A metav1 Condition, keeping `lastTransitionTime` from the current one
/// while the status does not change.
pub(super) fn condition(
    current: &Value,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: i64,
) -> Value {
    let status = if status { "True" } else { "False" };
    let since = current
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .filter(|c| c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .map(str::to_string)
        .unwrap_or_else(now);
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    })
}

/// The control plane contract status of `api`, as Kamaji's provider reports
/// it: the same conditions in both APIs, the contract's other fields as
/// each release writes them.
pub(super) fn desired_status(object: &DynamicObject, observed: &Observed, api: KamajiApi) -> Value {
    let conditions = desired_conditions(object, observed);
    match api {
        KamajiApi::V1alpha2 => v1beta2_contract_status(object, observed, conditions),
        KamajiApi::V1alpha1 => v1beta1_contract_status(object, observed, conditions),
    }
}

/// The provider's conditions, keeping each one's `lastTransitionTime`.
pub(super) fn desired_conditions(object: &DynamicObject, observed: &Observed) -> Vec<Value> {
    let generation = object.metadata.generation.unwrap_or_default();
    let current = &object.data["status"]["conditions"];
    let step = |type_: &str, failure: Option<&str>| match failure {
        None => condition(current, type_, true, "Succeeded", "", generation),
        Some(message) => condition(current, type_, false, "Failed", message, generation),
    };
    let available = |up: bool| {
        let reason = if up { "Available" } else { "NotAvailable" };
        condition(current, "Available", up, reason, "", generation)
    };
    match observed {
        Observed::Serving { refused, .. } => vec![
            step("TenantControlPlaneCreated", refused.as_deref()),
            step("TenantControlPlaneAddressReady", None),
            step("ControlPlaneEndpointPatched", None),
            step("KamajiControlPlaneIsInitialized", None),
            step("KubeadmResourcesCreated", None),
            step("KamajiControlPlaneIsReady", None),
            available(true),
        ],
        Observed::Refused { message } => vec![
            step("TenantControlPlaneCreated", Some(message)),
            available(false),
        ],
        Observed::WaitingForDataStore { message } => vec![
            step("TenantControlPlaneCreated", None),
            step(
                "TenantControlPlaneAddressReady",
                Some(&format!(
                    "Control Plane Endpoint is not yet available since unprocessed by Kamaji ({message})"
                )),
            ),
            available(false),
        ],
    }
}

/// The v1beta2 control plane contract (`v1alpha2`).
pub(super) fn v1beta2_contract_status(
    object: &DynamicObject,
    observed: &Observed,
    conditions: Vec<Value>,
) -> Value {
    let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(2);
    match observed {
        Observed::Serving { version, .. } => json!({
            "externalManagedControlPlane": true,
            "initialization": { "controlPlaneInitialized": true },
            "ready": true,
            "version": version,
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "upToDateReplicas": replicas,
            "conditions": conditions,
        }),
        // The CRD requires `ready` and `version` in any status; the
        // provider's Go struct writes them as `false` and `""` until the TCP
        // is ready.
        Observed::Refused { .. } | Observed::WaitingForDataStore { .. } => json!({
            "externalManagedControlPlane": true,
            "ready": false,
            "version": "",
            "conditions": conditions,
        }),
    }
}

/// The v1beta1 control plane contract (`v1alpha1`, provider v0.19.0):
/// `initialized` where v1beta2 has `initialization`, `updatedReplicas` and
/// `unavailableReplicas` where it has `upToDateReplicas` and
/// `availableReplicas`, and a `selector`. The CRD requires all of them but
/// the conditions; the provider's Go struct writes zero values until the
/// TCP is ready.
pub(super) fn v1beta1_contract_status(
    object: &DynamicObject,
    observed: &Observed,
    conditions: Vec<Value>,
) -> Value {
    let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(2);
    match observed {
        Observed::Serving { version, .. } => json!({
            "externalManagedControlPlane": true,
            "initialized": true,
            "ready": true,
            "version": version,
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
            "unavailableReplicas": 0,
            "selector": label_selector(object),
            "conditions": conditions,
        }),
        Observed::Refused { .. } | Observed::WaitingForDataStore { .. } => json!({
            "externalManagedControlPlane": true,
            // The provider sets it once the TCP first reports its version
            // ready, and never clears it.
            "initialized": object.data["status"]["initialized"] == true,
            "ready": false,
            "version": "",
            "replicas": 0,
            "readyReplicas": 0,
            "updatedReplicas": 0,
            "unavailableReplicas": 0,
            "selector": "",
            "conditions": conditions,
        }),
    }
}

/// `status.selector` as provider v0.19.0 writes it (for the scale
/// subresource): the KamajiControlPlane's own labels, formatted as
/// `metav1.FormatLabelSelector` does, `<none>` when it has none.
pub(super) fn label_selector(object: &DynamicObject) -> String {
    match &object.metadata.labels {
        Some(labels) if !labels.is_empty() => labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".into(),
    }
}

pub(super) fn status_matches(current: &Value, desired: &Value) -> bool {
    desired
        .as_object()
        .is_some_and(|fields| fields.iter().all(|(k, v)| &current[k] == v))
}

pub(super) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
