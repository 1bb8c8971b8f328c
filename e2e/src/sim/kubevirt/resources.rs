//! What every part of the simulator shares: the API resources it works on,
//! its context, and small helpers over JSON objects and conditions.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::{Map, Value, json};

use super::KubevirtSimConfig;
use super::faults::Faults;
use super::guest::Guests;
use super::importer::Imports;
use super::ip_pool::IpPool;

pub(super) const KUBEVIRT_API_VERSION: &str = "kubevirt.io/v1";
pub(super) const CDI_API_VERSION: &str = "cdi.kubevirt.io/v1beta1";

/// Finalizer virt-controller's VM controller puts on the VM and on each VMI
/// it creates (`kubevirt.io/virtualMachineControllerFinalize`).
pub(super) const VM_CONTROLLER_FINALIZER: &str = "kubevirt.io/virtualMachineControllerFinalize";
/// Finalizer virt-controller's VMI controller keeps on a VMI until its
/// virt-launcher pod is gone.
pub(super) const VMI_FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";
/// Label virt-controller puts on a scheduled VMI.
pub(super) const NODE_NAME_LABEL: &str = "kubevirt.io/nodeName";

pub(super) fn vm_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    )
}

pub(super) fn vmi_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    )
}

pub(super) fn migration_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstanceMigration"),
        "virtualmachineinstancemigrations",
    )
}

pub(super) fn dv_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        "datavolumes",
    )
}

/// Shared by the simulator's controllers.
pub(super) struct Context {
    pub client: kube::Client,
    /// What VMI status goes through: virt-handler's own ServiceAccount when
    /// KubeVirt's virt-api and virt-controller run (virt-api reserves VMI
    /// status to KubeVirt's users), the admin otherwise.
    pub handler: kube::Client,
    /// KubeVirt's own virt-controller runs: the simulator leaves the VM, the
    /// VMI until `Scheduled`, the finalizers and the VMI's `Ready` condition
    /// to it, and plays the kubelet for launcher pods instead.
    pub real_controller: bool,
    pub config: KubevirtSimConfig,
    pub faults: Faults,
    pub ips: IpPool,
    pub imports: Imports,
    pub guests: Guests,
}

impl Context {
    pub fn new(
        client: kube::Client,
        handler: Option<kube::Client>,
        config: KubevirtSimConfig,
        ips: IpPool,
    ) -> Arc<Self> {
        let guests = Guests::new(config.ssh_guests.clone());
        Arc::new(Self {
            real_controller: handler.is_some(),
            handler: handler.unwrap_or_else(|| client.clone()),
            client,
            config,
            faults: Faults::default(),
            ips,
            imports: Imports::default(),
            guests,
        })
    }

    /// The field manager for one simulated component.
    pub fn manager(&self, component: &str) -> String {
        format!("{}-{component}", self.config.name)
    }
}

/// A reconcile error. Wraps anyhow so the controllers can use `?` freely;
/// kube-runtime wants a `std::error::Error`.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub(super) struct ReconcileError(pub anyhow::Error);

impl From<anyhow::Error> for ReconcileError {
    fn from(error: anyhow::Error) -> Self {
        Self(error)
    }
}

impl From<kube::Error> for ReconcileError {
    fn from(error: kube::Error) -> Self {
        Self(error.into())
    }
}

pub(super) type ReconcileResult = Result<kube::runtime::controller::Action, ReconcileError>;

/// The first retry after an error; conflicts with the code under test are
/// expected and resolve on the next read.
pub(super) fn error_requeue() -> kube::runtime::controller::Action {
    kube::runtime::controller::Action::requeue(Duration::from_millis(300))
}

/// A requeue no sooner than a few milliseconds, so a deadline that has just
/// passed does not spin.
pub(super) fn requeue_in(after: Duration) -> kube::runtime::controller::Action {
    kube::runtime::controller::Action::requeue(after.max(Duration::from_millis(20)))
}

pub(super) fn now() -> DateTime<Utc> {
    Utc::now()
}

/// A `metav1.Time` (k8s-openapi keeps it as a jiff timestamp) as chrono.
pub(super) fn from_k8s(
    time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(time.0.as_millisecond()).unwrap_or_else(now)
}

/// An API error with this HTTP status code.
pub(super) fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// RFC 3339 with second precision, as `metav1.Time` serializes.
pub(super) fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub(super) fn parse_time(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Time left until `at`, zero if it has passed.
pub(super) fn until(at: DateTime<Utc>) -> Duration {
    (at - now()).to_std().unwrap_or(Duration::ZERO)
}

pub(super) fn add(at: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    at + chrono::Duration::from_std(duration).unwrap_or_else(|_| chrono::Duration::days(365))
}

/// `5s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return None,
    };
    (seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// Bytes of a Kubernetes quantity such as `10Gi`, `200G`, `512Mi`, `1e9`.
pub(super) fn parse_quantity(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        s if s.starts_with('e') || s.starts_with('E') => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some((number * multiplier) as u64)
}

/// The object as one JSON value (`metadata` + its other fields).
pub(super) fn to_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

pub(super) fn name_of(object: &DynamicObject) -> &str {
    object.metadata.name.as_deref().unwrap_or_default()
}

pub(super) fn namespace_of(object: &DynamicObject) -> &str {
    object.metadata.namespace.as_deref().unwrap_or("default")
}

pub(super) fn uid_of(object: &DynamicObject) -> &str {
    object.metadata.uid.as_deref().unwrap_or_default()
}

pub(super) fn annotation<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub(super) fn has_finalizer(object: &DynamicObject, finalizer: &str) -> bool {
    object
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

pub(super) fn is_deleting(object: &DynamicObject) -> bool {
    object.metadata.deletion_timestamp.is_some()
}

/// The controller owner reference of `object`, if it is of `kind`.
pub(super) fn controller_of<'a>(object: &'a DynamicObject, kind: &str) -> Option<&'a str> {
    object
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| o.uid.as_str())
}

/// An owner reference as `metav1.NewControllerRef` builds it.
pub(super) fn controller_ref(api_version: &str, kind: &str, owner: &DynamicObject) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

pub(super) fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

pub(super) fn array_at<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A condition in a `status.conditions` list.
pub(super) fn condition<'a>(conditions: &'a [Value], kind: &str) -> Option<&'a Value> {
    conditions.iter().find(|c| c["type"] == kind)
}

pub(super) fn condition_is(conditions: &[Value], kind: &str, status: &str) -> bool {
    condition(conditions, kind).is_some_and(|c| c["status"] == status)
}

/// What a condition should say; `set` keeps `lastTransitionTime` (and
/// `lastProbeTime`) while the status does not change, as KubeVirt's and
/// CDI's condition managers do, so an unchanged status writes nothing.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Cond {
    pub kind: String,
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

impl Cond {
    pub fn new(kind: &str, status: &'static str, reason: &str, message: &str) -> Self {
        Self {
            kind: kind.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Sets `wanted` in `conditions`. `heartbeat` names the extra timestamp
/// field the API uses (`lastProbeTime` for KubeVirt, `lastHeartbeatTime` for
/// CDI).
pub(super) fn set_condition(conditions: &mut Vec<Value>, wanted: &Cond, heartbeat: &str) {
    let stamp = timestamp(now());
    let existing = conditions
        .iter_mut()
        .find(|c| c["type"] == wanted.kind.as_str());
    let mut fresh = Map::new();
    fresh.insert("type".into(), json!(wanted.kind));
    fresh.insert("status".into(), json!(wanted.status));
    if !wanted.reason.is_empty() {
        fresh.insert("reason".into(), json!(wanted.reason));
    }
    if !wanted.message.is_empty() {
        fresh.insert("message".into(), json!(wanted.message));
    }
    match existing {
        Some(current) => {
            let same_status = current["status"] == wanted.status;
            let same_text = current.get("reason").and_then(Value::as_str).unwrap_or("")
                == wanted.reason
                && current.get("message").and_then(Value::as_str).unwrap_or("") == wanted.message;
            if same_status && same_text {
                return;
            }
            let transition = if same_status {
                current
                    .get("lastTransitionTime")
                    .cloned()
                    .unwrap_or_else(|| json!(stamp))
            } else {
                json!(stamp)
            };
            fresh.insert("lastTransitionTime".into(), transition);
            fresh.insert(heartbeat.into(), json!(stamp));
            *current = Value::Object(fresh);
        }
        None => {
            fresh.insert("lastTransitionTime".into(), json!(stamp));
            fresh.insert(heartbeat.into(), json!(stamp));
            conditions.push(Value::Object(fresh));
        }
    }
}

pub(super) fn remove_condition(conditions: &mut Vec<Value>, kind: &str) {
    conditions.retain(|c| c["type"] != kind);
}

/// A stable small number from a string, to spread things (nodes, MACs)
/// deterministically: the same VMI lands on the same node after a restart of
/// the simulator.
pub(super) fn stable_hash(text: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(text.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_quantities_parse() {
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_quantity("10Gi"), Some(10 << 30));
        assert_eq!(parse_quantity("200G"), Some(200_000_000_000));
        assert_eq!(parse_quantity("512Mi"), Some(512 << 20));
        assert_eq!(parse_quantity("1e3"), Some(1000));
        assert_eq!(parse_quantity("lots"), None);
    }

    #[test]
    fn set_condition_keeps_transition_time_while_status_holds() {
        let mut conditions = vec![json!({
            "type": "Ready", "status": "False", "reason": "A",
            "lastTransitionTime": "2020-01-01T00:00:00Z", "lastProbeTime": "2020-01-01T00:00:00Z",
        })];
        set_condition(
            &mut conditions,
            &Cond::new("Ready", "False", "B", "m"),
            "lastProbeTime",
        );
        assert_eq!(conditions[0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert_eq!(conditions[0]["reason"], "B");
        set_condition(
            &mut conditions,
            &Cond::new("Ready", "True", "", ""),
            "lastProbeTime",
        );
        assert_ne!(conditions[0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert!(conditions[0].get("reason").is_none());
        let before = conditions.clone();
        set_condition(
            &mut conditions,
            &Cond::new("Ready", "True", "", ""),
            "lastProbeTime",
        );
        assert_eq!(
            before, conditions,
            "an unchanged condition is not rewritten"
        );
    }
}
