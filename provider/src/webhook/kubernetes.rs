//! The admission webhooks of `Kubernetes` objects: the rules of
//! `tenant::admission` served over the AdmissionReview protocol.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;
use tenantry_api::tenant::Kubernetes;

use crate::tenant::admission;

/// What the validating webhook answers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Why the request is refused, if it is.
    pub denied: Option<String>,
    /// Admission warnings for the client.
    pub warnings: Vec<String>,
}

fn typed(object: &Option<DynamicObject>) -> Result<Option<Kubernetes>, String> {
    object
        .as_ref()
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value::<Kubernetes>))
        .transpose()
        .map_err(|e| format!("not a readable Kubernetes object: {e}"))
}

/// The validating webhook's decision on a CREATE or UPDATE.
pub fn validate(request: &AdmissionRequest<DynamicObject>) -> Decision {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Decision::default();
    }
    let (new, old) = match (typed(&request.object), typed(&request.old_object)) {
        (Ok(Some(new)), Ok(old)) => (new, old),
        (Err(error), _) | (_, Err(error)) => {
            return Decision {
                denied: Some(error),
                warnings: Vec::new(),
            };
        }
        (Ok(None), _) => return Decision::default(),
    };
    let old = old.filter(|_| request.operation == Operation::Update);
    let verdict = admission::validate(&new, old.as_ref());
    let denied = (!verdict.allowed()).then(|| {
        verdict
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    });
    Decision {
        denied,
        warnings: verdict.warnings,
    }
}

/// The mutating webhook's JSON patch (empty when nothing moves) and the
/// notes to return as warnings.
pub fn mutate(
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(json_patch::Patch, Vec<String>), String> {
    let Some(object) = request.object.as_ref() else {
        return Ok((json_patch::Patch(Vec::new()), Vec::new()));
    };
    let before = serde_json::to_value(object).map_err(|e| e.to_string())?;
    let mut kubernetes: Kubernetes = serde_json::from_value(before.clone())
        .map_err(|e| format!("not a readable Kubernetes object: {e}"))?;
    let notes = admission::mutate(&mut kubernetes);
    if notes.is_empty() {
        return Ok((json_patch::Patch(Vec::new()), notes));
    }
    // Only the fields `mutate` touches are written back into the object as
    // sent, so the patch holds nothing but the moves (no defaults, no
    // re-serialisation noise).
    let mut after = before.clone();
    let control_plane = &kubernetes.spec.control_plane;
    set(
        &mut after,
        &["spec", "controlPlane", "apiServer", "extraArgs"],
        serde_json::to_value(&control_plane.api_server.extra_args).map_err(|e| e.to_string())?,
    );
    set(
        &mut after,
        &["spec", "controlPlane", "apiServer", "admissionControllers"],
        serde_json::to_value(&control_plane.api_server.admission_controllers)
            .map_err(|e| e.to_string())?,
    );
    set(
        &mut after,
        &["spec", "controlPlane", "kubelet", "preferredAddressTypes"],
        serde_json::to_value(&control_plane.kubelet.preferred_address_types)
            .map_err(|e| e.to_string())?,
    );
    Ok((json_patch::diff(&before, &after), notes))
}

/// Sets `path` in `value` to `new`, creating objects on the way; an empty
/// list is left out when the field is absent, as the client sent it.
fn set(value: &mut Value, path: &[&str], new: Value) {
    let present = path
        .iter()
        .try_fold(&*value, |here, key| here.get(*key))
        .is_some();
    if !present && new.as_array().is_some_and(Vec::is_empty) {
        return;
    }
    let mut here = value;
    for key in &path[..path.len() - 1] {
        if !here[*key].is_object() {
            here[*key] = Value::Object(Default::default());
        }
        here = &mut here[*key];
    }
    here[path[path.len() - 1]] = new;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionReview;
    use serde_json::json;

    fn request(
        operation: &str,
        object: Value,
        old: Option<Value>,
    ) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "00000000-0000-0000-0000-000000000001",
                "kind": { "group": "apps.tenantry.dev", "version": "v1alpha1", "kind": "Kubernetes" },
                "resource": { "group": "apps.tenantry.dev", "version": "v1alpha1", "resource": "kuberneteses" },
                "name": "demo",
                "namespace": "tenant-a",
                "operation": operation,
                "userInfo": {},
                "object": object,
                "oldObject": old,
                "dryRun": false,
            }
        }))
        .expect("review");
        review.try_into().expect("request")
    }

    fn kubernetes(spec: Value) -> Value {
        json!({
            "apiVersion": "apps.tenantry.dev/v1alpha1",
            "kind": "Kubernetes",
            "metadata": { "name": "demo", "namespace": "tenant-a" },
            "spec": spec,
        })
    }

    #[test]
    fn admission_plugins_move_out_of_extra_args_by_patch() {
        let object = kubernetes(json!({ "controlPlane": { "apiServer": { "extraArgs": [
            "--enable-admission-plugins=NodeRestriction,AlwaysPullImages",
            "--audit-log-maxage=7",
        ] } } }));
        let (patch, notes) = mutate(&request("CREATE", object.clone(), None)).expect("mutate");
        assert_eq!(notes.len(), 1, "{notes:?}");
        let mut patched = object;
        json_patch::patch(&mut patched, &patch).expect("patch applies");
        assert_eq!(
            patched["spec"]["controlPlane"]["apiServer"],
            json!({
                "extraArgs": ["--audit-log-maxage=7"],
                "admissionControllers": ["NodeRestriction", "AlwaysPullImages"],
            })
        );
        assert!(patched["spec"]["controlPlane"].get("kubelet").is_none());
    }

    #[test]
    fn nothing_to_move_means_an_empty_patch() {
        let object = kubernetes(json!({ "version": "v1.35" }));
        let (patch, notes) = mutate(&request("CREATE", object, None)).expect("mutate");
        assert!(patch.0.is_empty());
        assert!(notes.is_empty());
    }

    #[test]
    fn an_owned_flag_is_denied_with_its_field() {
        let object = kubernetes(json!({ "controlPlane": { "apiServer": { "extraArgs": [
            "--etcd-servers=https://elsewhere:2379",
        ] } } }));
        let decision = validate(&request("CREATE", object, None));
        let denied = decision.denied.expect("denied");
        assert!(
            denied.contains("spec.controlPlane.apiServer.extraArgs[0]"),
            "{denied}"
        );
    }

    #[test]
    fn removed_fields_are_admitted_with_a_warning() {
        let object = kubernetes(json!({ "nodeGroups": { "md0": { "minReplicas": 1 } } }));
        let decision = validate(&request("CREATE", object, None));
        assert_eq!(decision.denied, None);
        assert!(
            decision
                .warnings
                .iter()
                .any(|w| w.contains("KubernetesNodes")),
            "{:?}",
            decision.warnings
        );
    }
}
