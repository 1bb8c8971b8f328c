//! The admission webhooks of `Kubernetes` objects: the rules of
//! `tenant::kubernetes::admission` served over the AdmissionReview protocol, and the
//! defaults a new object takes from the manager's configuration.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;
use tenantry_api::tenant::Kubernetes;

use crate::reconciler::ManagerConfig;
use crate::tenant::kubernetes::admission;

/// What the mutating webhook fills into a new object from the manager's
/// configuration rather than from the CRD schema: a platform's own
/// settings, which one CRD cannot know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// `spec.talos.imageFactoryURL` of an object that names none.
    pub talos_image_factory_url: String,
}

impl Defaults {
    /// The defaults of a manager run with `config`.
    pub fn of(config: &ManagerConfig) -> Self {
        Self {
            talos_image_factory_url: config.default_image_factory_url().to_string(),
        }
    }
}

impl Default for Defaults {
    fn default() -> Self {
        Self::of(&ManagerConfig::default())
    }
}

/// Where the manager's image factory default goes.
const IMAGE_FACTORY_URL_PATH: [&str; 3] = ["spec", "talos", "imageFactoryURL"];

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

/// The JSON patch filling in what a new object leaves to the manager:
/// `spec.talos.imageFactoryURL`, so the stored object shows the factory its
/// workers boot from. Only on CREATE: a stored object keeps what it has,
/// and one stored without it (it bypassed this webhook) is left to the
/// reconcilers' fallback to the same default. Empty when there is nothing
/// to fill in, or the object is not shaped as the schema wants (the schema's
/// own error comes next).
pub fn default(
    request: &AdmissionRequest<DynamicObject>,
    defaults: &Defaults,
) -> json_patch::Patch {
    let nothing = json_patch::Patch(Vec::new());
    let Some(object) = request.object.as_ref() else {
        return nothing;
    };
    if request.operation != Operation::Create {
        return nothing;
    }
    let Ok(before) = serde_json::to_value(object) else {
        return nothing;
    };
    let spec = &before["spec"];
    let talos = &spec["talos"];
    let shaped = spec.is_object() && (talos.is_null() || talos.is_object());
    if !shaped || !talos["imageFactoryURL"].is_null() {
        return nothing;
    }
    let mut after = before.clone();
    set(
        &mut after,
        &IMAGE_FACTORY_URL_PATH,
        Value::String(defaults.talos_image_factory_url.clone()),
    );
    json_patch::diff(&before, &after)
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

    fn defaults() -> Defaults {
        Defaults {
            talos_image_factory_url: "http://factory.internal:8080".into(),
        }
    }

    fn patched(object: &Value, patch: &json_patch::Patch) -> Value {
        let mut patched = object.clone();
        json_patch::patch(&mut patched, patch).expect("patch applies");
        patched
    }

    #[test]
    fn a_new_object_without_a_factory_gets_the_managers() {
        // As the apiserver sends it: the schema has defaulted `talos`.
        let object = kubernetes(json!({ "talos": { "version": "v1.13.6" } }));
        let patch = default(&request("CREATE", object.clone(), None), &defaults());
        assert_eq!(
            patched(&object, &patch)["spec"]["talos"],
            json!({ "version": "v1.13.6", "imageFactoryURL": "http://factory.internal:8080" })
        );
        // Without `talos` at all (a client that skipped the schema).
        let object = kubernetes(json!({ "version": "v1.35" }));
        let patch = default(&request("CREATE", object.clone(), None), &defaults());
        assert_eq!(
            patched(&object, &patch)["spec"]["talos"],
            json!({ "imageFactoryURL": "http://factory.internal:8080" })
        );
        assert_eq!(
            Defaults::default().talos_image_factory_url,
            "https://factory.talos.dev"
        );
    }

    #[test]
    fn a_new_object_naming_its_factory_keeps_it() {
        let object =
            kubernetes(json!({ "talos": { "imageFactoryURL": "https://mirror.example.org" } }));
        let patch = default(&request("CREATE", object, None), &defaults());
        assert!(patch.0.is_empty(), "{patch:?}");
    }

    #[test]
    fn an_update_is_not_defaulted() {
        // Stored without the field (it bypassed the webhook): the
        // reconcilers fall back to the same default; nothing is written.
        let object = kubernetes(json!({ "talos": { "version": "v1.13.7" } }));
        let old = kubernetes(json!({ "talos": { "version": "v1.13.6" } }));
        let patch = default(&request("UPDATE", object, Some(old)), &defaults());
        assert!(patch.0.is_empty(), "{patch:?}");
    }

    #[test]
    fn a_misshapen_object_is_left_to_the_schema() {
        for spec in [json!("nonsense"), json!({ "talos": "nonsense" })] {
            let object = kubernetes(spec);
            let patch = default(&request("CREATE", object, None), &defaults());
            assert!(patch.0.is_empty(), "{patch:?}");
        }
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
