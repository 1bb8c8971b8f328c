//! Pure decisions for a `Kubernetes` object: what its etcd and
//! KamajiControlPlane say, as conditions, and the `Ready` summary. Nothing
//! here holds a client.

use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;
use tenantry_api::tenant::{
    CONTROL_PLANE_READY_CONDITION, ETCD_READY_CONDITION, Kubernetes, READY_CONDITION,
    WORKLOADS_READY_CONDITION, admin_kubeconfig_secret_name,
};

use super::render;
use crate::capi::conditions::DesiredCondition;

/// How often a cluster on its way up is looked at again.
use super::status::Reason;

/// Keys Kamaji writes into the admin kubeconfig Secret.
pub const ADMIN_KUBECONFIG_KEYS: [&str; 4] = [
    "admin.conf",
    "admin.svc",
    "super-admin.conf",
    "super-admin.svc",
];

pub(super) fn condition_true(object: &Value, type_: &str) -> Option<bool> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| c["status"] == "True")
}

pub(super) fn condition_message(object: &Value, type_: &str) -> String {
    object["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .map(|c| {
            format!(
                "{}: {}",
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_default()
}

/// The control plane's state as the KamajiControlPlane reports it, and
/// whether the admin kubeconfig Secret is there.
pub(super) fn control_plane_condition(
    kubernetes: &Kubernetes,
    kcp: &Value,
    kubeconfig: Option<&Secret>,
) -> DesiredCondition {
    let wanted = kubernetes.spec.version.pinned_patch();
    let status = &kcp["status"];
    // v1alpha2 (v1beta2 contract), or v1alpha1's `initialized`.
    let initialized = status["initialization"]["controlPlaneInitialized"] == true
        || status["initialized"] == true;
    let ready = status["ready"] == true || condition_true(kcp, "Available") == Some(true);
    let running = status["version"].as_str().unwrap_or_default();
    let name = kcp["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(reason) = status["failureReason"].as_str().filter(|r| !r.is_empty()) {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            Reason::ControlPlaneFailed.as_str(),
            format!(
                "KamajiControlPlane {name} failed ({reason}): {}",
                status["failureMessage"].as_str().unwrap_or_default()
            ),
        );
    }
    if !initialized || !ready {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            Reason::ControlPlaneProvisioning.as_str(),
            format!(
                "KamajiControlPlane {name} is not ready yet ({})",
                condition_message(kcp, "Available")
            ),
        );
    }
    if running != wanted {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            Reason::ControlPlaneUpgrading.as_str(),
            format!("the control plane runs {running}; rolling to {wanted}"),
        );
    }
    let complete = kubeconfig.is_some_and(|s| {
        ADMIN_KUBECONFIG_KEYS
            .iter()
            .all(|k| s.data.as_ref().is_some_and(|d| d.contains_key(*k)))
    });
    if !complete {
        return DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            Reason::KubeconfigMissing.as_str(),
            format!(
                "the control plane runs, but Secret {} does not hold {} yet (Kamaji writes it)",
                admin_kubeconfig_secret_name(
                    kubernetes.metadata.name.as_deref().unwrap_or_default()
                ),
                ADMIN_KUBECONFIG_KEYS.join(", ")
            ),
        );
    }
    DesiredCondition::true_(
        CONTROL_PLANE_READY_CONDITION,
        Reason::ControlPlaneReady.as_str(),
    )
}

pub(super) fn endpoint_of(kcp: &Value) -> Option<String> {
    let endpoint = &kcp["spec"]["controlPlaneEndpoint"];
    let host = endpoint["host"].as_str().filter(|h| !h.is_empty())?;
    let port = endpoint["port"].as_i64().unwrap_or(6443);
    Some(format!("https://{host}:{port}"))
}

/// `EtcdReady` from the EtcdCluster's `Available` condition.
pub(super) fn etcd_condition(namespace: &str, etcd: &Value) -> DesiredCondition {
    match condition_true(etcd, "Available") {
        Some(true) => DesiredCondition::true_(ETCD_READY_CONDITION, Reason::EtcdAvailable.as_str()),
        Some(false) => DesiredCondition::false_(
            ETCD_READY_CONDITION,
            Reason::EtcdNotAvailable.as_str(),
            format!(
                "EtcdCluster {namespace}/{} is not available ({}); see its conditions and member pods",
                render::ETCD_NAME,
                condition_message(etcd, "Available")
            ),
        ),
        None => DesiredCondition::false_(
            ETCD_READY_CONDITION,
            Reason::EtcdProvisioning.as_str(),
            format!("EtcdCluster {namespace}/{} is starting", render::ETCD_NAME),
        ),
    }
}

/// `ControlPlaneReady` and `WorkloadsReady`: while etcd is not available a
/// control plane that is not ready waits for it, whatever Kamaji says.
pub(super) fn control_plane_conditions(
    kubernetes: &Kubernetes,
    kcp: &Value,
    kubeconfig: Option<&Secret>,
    etcd: &DesiredCondition,
) -> (DesiredCondition, DesiredCondition) {
    let mut control_plane = control_plane_condition(kubernetes, kcp, kubeconfig);
    if !etcd.is_true() && !control_plane.is_true() {
        control_plane = DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            Reason::WaitingForEtcd.as_str(),
            format!(
                "the control plane waits for the namespace's etcd ({})",
                etcd.message
            ),
        );
    }
    let workloads = DesiredCondition::new(
        WORKLOADS_READY_CONDITION,
        control_plane.status,
        control_plane.reason.clone(),
        "worker health is reported on each KubernetesNodes pool; this covers the control plane"
            .to_string(),
    );
    (control_plane, workloads)
}

/// `Ready`: true when every other condition is, else the first that is not.
pub(super) fn ready_summary(conditions: &[DesiredCondition]) -> DesiredCondition {
    match conditions.iter().find(|c| !c.is_true()) {
        None => DesiredCondition::true_(READY_CONDITION, Reason::Ready.as_str()),
        Some(first) => {
            DesiredCondition::false_(READY_CONDITION, first.reason.clone(), first.message.clone())
        }
    }
}

/// The version the control plane runs, as Kamaji reports it.
pub(super) fn version_of(kcp: &Value) -> Option<String> {
    kcp["status"]["version"]
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tenantry_api::tenant::KubernetesSpec;

    fn kubernetes() -> Kubernetes {
        let mut kubernetes = Kubernetes::new(
            "demo",
            serde_json::from_value::<KubernetesSpec>(json!({})).expect("spec"),
        );
        kubernetes.metadata.namespace = Some("tenant-a".into());
        kubernetes
    }

    fn kubeconfig(keys: &[&str]) -> Secret {
        Secret {
            data: Some(
                keys.iter()
                    .map(|k| (k.to_string(), k8s_openapi::ByteString(vec![1])))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    fn available(status: &str) -> Value {
        json!({ "status": { "conditions": [
            { "type": "Available", "status": status, "reason": "Quorum", "message": "2 of 3 members" },
        ] } })
    }

    #[test]
    fn etcd_is_ready_when_available_and_says_why_not() {
        let cases = [
            (available("True"), true, "EtcdAvailable"),
            (available("False"), false, "EtcdNotAvailable"),
            (json!({}), false, "EtcdProvisioning"),
        ];
        for (etcd, ready, reason) in cases {
            let condition = etcd_condition("tenant-a", &etcd);
            assert_eq!(
                (condition.is_true(), condition.reason.as_str()),
                (ready, reason)
            );
        }
        let down = etcd_condition("tenant-a", &available("False"));
        assert!(
            down.message.contains("Quorum: 2 of 3 members"),
            "{}",
            down.message
        );
    }

    #[test]
    fn the_control_plane_is_ready_when_kamaji_is_and_its_kubeconfig_is_complete() {
        let k = kubernetes();
        let wanted = k.spec.version.pinned_patch();
        let running = |version: &str| {
            json!({
                "metadata": { "name": "kubernetes-demo" },
                "status": {
                    "initialization": { "controlPlaneInitialized": true },
                    "ready": true,
                    "version": version,
                },
            })
        };
        let complete = kubeconfig(&ADMIN_KUBECONFIG_KEYS);
        let etcd_up = etcd_condition("tenant-a", &available("True"));
        let etcd_down = etcd_condition("tenant-a", &available("False"));
        let failed = json!({ "metadata": { "name": "kubernetes-demo" }, "status": { "failureReason": "Bad", "failureMessage": "broken" } });
        let cases: [(&str, Value, Option<&Secret>, &DesiredCondition, &str); 6] = [
            (
                "ready",
                running(wanted),
                Some(&complete),
                &etcd_up,
                "ControlPlaneReady",
            ),
            (
                "starting",
                json!({}),
                Some(&complete),
                &etcd_up,
                "ControlPlaneProvisioning",
            ),
            (
                "older version",
                running("v1.0.0"),
                Some(&complete),
                &etcd_up,
                "ControlPlaneUpgrading",
            ),
            (
                "no kubeconfig yet",
                running(wanted),
                None,
                &etcd_up,
                "AdminKubeconfigMissing",
            ),
            (
                "failed",
                failed,
                Some(&complete),
                &etcd_up,
                "ControlPlaneFailed",
            ),
            (
                "etcd down",
                json!({}),
                Some(&complete),
                &etcd_down,
                "WaitingForEtcd",
            ),
        ];
        for (name, kcp, secret, etcd, reason) in cases {
            let (control_plane, workloads) = control_plane_conditions(&k, &kcp, secret, etcd);
            assert_eq!(
                control_plane.reason, reason,
                "{name}: {}",
                control_plane.message
            );
            assert_eq!(
                workloads.reason, reason,
                "{name}: workloads follow the control plane"
            );
            assert_eq!(
                control_plane.is_true(),
                reason == "ControlPlaneReady",
                "{name}"
            );
        }
        let partial = kubeconfig(&["admin.conf"]);
        let (control_plane, _) =
            control_plane_conditions(&k, &running(wanted), Some(&partial), &etcd_up);
        assert_eq!(control_plane.reason, "AdminKubeconfigMissing");
    }

    #[test]
    fn ready_names_the_first_condition_that_is_not() {
        let up = DesiredCondition::true_(ETCD_READY_CONDITION, "EtcdAvailable");
        let down = DesiredCondition::false_(
            CONTROL_PLANE_READY_CONDITION,
            "ControlPlaneProvisioning",
            "starting",
        );
        assert_eq!(ready_summary(std::slice::from_ref(&up)).reason, "Ready");
        let summary = ready_summary(&[up, down]);
        assert!(!summary.is_true());
        assert_eq!(
            (summary.reason.as_str(), summary.message.as_str()),
            ("ControlPlaneProvisioning", "starting")
        );
        assert_eq!(
            endpoint_of(&json!({ "spec": { "controlPlaneEndpoint": { "host": "10.0.0.1" } } }))
                .as_deref(),
            Some("https://10.0.0.1:6443")
        );
        assert_eq!(version_of(&json!({ "status": { "version": "" } })), None);
    }
}
