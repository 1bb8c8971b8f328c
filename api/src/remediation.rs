//! Reboot-first external remediation: `KubevirtRemediation` and
//! `KubevirtRemediationTemplate` (`infrastructure.cluster.x-k8s.io/v1alpha1`,
//! beside the other KubeVirt kinds), `ProxmoxRemediation` and
//! `ProxmoxRemediationTemplate` (`v1alpha2`, beside the other Proxmox kinds).
//!
//! A MachineHealthCheck names a template in `spec.remediation.templateRef`;
//! when a Machine fails its health check, CAPI creates a remediation object
//! from `spec.template` of that template, named after the Machine and owned
//! by it, and deletes it again once the Machine is healthy. Tenantry then
//! restarts the Machine's VM in place (its disks, and the Talos state on
//! them, stay) and, when that does not help, deletes the Machine so its
//! MachineSet replaces it. Spec and status names follow metal3's
//! `Metal3Remediation`, which operators of CAPI already know.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::contract::ObjectMetaTemplate;

/// How many restarts a remediation makes before it deletes the Machine,
/// when `spec.strategy.retryLimit` is not set.
pub const DEFAULT_RETRY_LIMIT: i32 = 1;
/// How long a remediation waits for the Machine to be healthy after a
/// restart, when `spec.strategy.timeout` is not set.
pub const DEFAULT_TIMEOUT: &str = "5m";
/// Condition type summarising where a remediation stands.
pub const REMEDIATED_CONDITION: &str = "Remediated";

/// Pattern of a duration: Go's `time.ParseDuration` syntax without sign
/// and without the `µs` unit, e.g. `90s`, `5m`, `1h30m`.
const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$";

/// The enums' own doc comments are for Rust readers: kube hoists an enum's
/// schema over its field's, so without this the field's description (what
/// `kubectl explain` shows) would be replaced by the enum's.
fn field_describes_enum(schema: &mut schemars::Schema) {
    schema.remove("description");
}

// ---------------------------------------------------------------------------
// Shared spec and status
// ---------------------------------------------------------------------------

/// How a remediation goes about healing a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStrategy {
    /// What to do to the Machine's VM. `Reboot` (the only strategy today)
    /// restarts it in place: the same VM with the same disks, so what the
    /// operating system keeps on its disk survives.
    #[serde(default, rename = "type")]
    pub type_: RemediationType,
    /// How many restarts to try before giving up and deleting the Machine so
    /// that its MachineSet replaces it. 0 deletes the Machine right away.
    /// Defaults to 1.
    #[serde(default = "default_retry_limit")]
    #[schemars(range(min = 0))]
    pub retry_limit: i32,
    /// How long to wait after a restart for the Machine to pass its health
    /// check again before the next restart (or, with no retries left, the
    /// replacement), as a duration such as `90s`, `5m` or `1h`. Leave the VM
    /// enough time to boot and its Node to report Ready. At least 1s;
    /// defaults to 5m.
    #[serde(default = "default_timeout")]
    #[schemars(length(min = 2, max = 32), pattern(DURATION_PATTERN))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s')").message("timeout must be at least 1s"))]
    pub timeout: String,
}

fn default_retry_limit() -> i32 {
    DEFAULT_RETRY_LIMIT
}

fn default_timeout() -> String {
    DEFAULT_TIMEOUT.to_string()
}

impl Default for RemediationStrategy {
    fn default() -> Self {
        Self {
            type_: RemediationType::default(),
            retry_limit: DEFAULT_RETRY_LIMIT,
            timeout: default_timeout(),
        }
    }
}

impl RemediationStrategy {
    /// The timeout as a duration; the schema already refuses what does not
    /// parse, so an error here means an object written around admission.
    pub fn timeout(&self) -> Result<Duration, String> {
        parse_duration(&self.timeout)
    }

    /// The retry limit, never below 0.
    pub fn retry_limit(&self) -> u32 {
        u32::try_from(self.retry_limit).unwrap_or(0)
    }
}

/// Remediation strategies.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[schemars(transform = field_describes_enum)]
pub enum RemediationType {
    /// Restart the VM in place, keeping its disks.
    #[default]
    Reboot,
}

/// Where a remediation stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[schemars(transform = field_describes_enum)]
pub enum RemediationPhase {
    /// A restart is recorded and being issued.
    Rebooting,
    /// The VM was restarted; waiting for the Machine to pass its health check.
    Waiting,
    /// The last restart could not be issued (the `Remediated` condition says
    /// why); after the timeout the next restart, or the replacement, follows.
    Failed,
    /// Retries are exhausted: the Machine was deleted so its owner replaces it.
    Replacing,
}

impl RemediationPhase {
    /// The phase as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rebooting => "Rebooting",
            Self::Waiting => "Waiting",
            Self::Failed => "Failed",
            Self::Replacing => "Replacing",
        }
    }
}

/// Observed state of a remediation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStatus {
    /// Where the remediation stands: `Rebooting` (a restart is being
    /// issued), `Waiting` (restarted, waiting for the Machine to be healthy),
    /// `Failed` (the last restart could not be issued; see the `Remediated`
    /// condition) or `Replacing` (retries exhausted, the Machine was deleted
    /// so its MachineSet replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RemediationPhase>,
    /// How many restarts were made. Recorded before each restart is issued,
    /// so a restarted manager never repeats one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i32>,
    /// When the latest restart was made; the timeout counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_remediated: Option<Time>,
    /// KubeVirt: the UID of the VirtualMachineInstance the latest restart
    /// deletes, recorded before deleting it, so that a restarted manager
    /// finishes that restart and never deletes the instance that replaced it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "virtualMachineInstanceUID"
    )]
    pub virtual_machine_instance_uid: Option<String>,
    /// Proxmox VE: the UPID of the task of the latest restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_ref: Option<String>,
    /// Conditions: `Remediated` (what is happening and what a human can do
    /// about it) and `Paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

impl RemediationStatus {
    /// The number of restarts made, never below 0.
    pub fn retries(&self) -> u32 {
        self.retry_count
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(0)
    }
}

/// Parses a duration in Go's `time.ParseDuration` syntax (unsigned, units
/// `ns`, `us`, `ms`, `s`, `m`, `h`), as `metav1.Duration` fields hold it.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("{text:?} is not a duration such as 90s, 5m or 1h30m");
    if text.is_empty() {
        return Err(invalid());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let well_formed = !number.is_empty()
            && !number.starts_with('.')
            && !number.ends_with('.')
            && number.matches('.').count() <= 1;
        if !well_formed {
            return Err(invalid());
        }
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let seconds = match unit {
            "ns" => 1e-9,
            "us" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += value * seconds;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

// ---------------------------------------------------------------------------
// KubeVirt
// ---------------------------------------------------------------------------

/// The desired state of a KubevirtRemediation: how to remediate its
/// Machine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KubevirtRemediation",
    doc = "KubevirtRemediation: restarts the KubeVirt VM of an unhealthy Machine in place (by deleting its VirtualMachineInstance, which the VirtualMachine recreates on the same disks), and deletes the Machine when restarts do not help. Created by a MachineHealthCheck from a KubevirtRemediationTemplate, named after the Machine.",
    plural = "kubevirtremediations",
    namespaced,
    status = "RemediationStatus",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Retries","type":"integer","jsonPath":".status.retryCount"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Remediated\")].reason"}"#,
    printcolumn = r#"{"name":"Last Remediated","type":"date","jsonPath":".status.lastRemediated"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtRemediationSpec {
    /// How to remediate: restart type, how many restarts, how long to wait
    /// after each.
    #[serde(default)]
    pub strategy: RemediationStrategy,
}

/// The desired state of a KubevirtRemediationTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KubevirtRemediationTemplate",
    doc = "KubevirtRemediationTemplate: what a MachineHealthCheck names in spec.remediation.templateRef to remediate KubeVirt machines. Immutable.",
    plural = "kubevirtremediationtemplates",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry")
)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtRemediationTemplateSpec {
    /// The KubevirtRemediation to create for an unhealthy Machine.
    pub template: KubevirtRemediationTemplateResource,
}

/// The object a KubevirtRemediationTemplate describes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtRemediationTemplateResource {
    /// Labels and annotations for the KubevirtRemediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The KubevirtRemediation's spec.
    #[serde(default)]
    pub spec: KubevirtRemediationSpec,
}

// ---------------------------------------------------------------------------
// Proxmox VE
// ---------------------------------------------------------------------------

/// The desired state of a ProxmoxRemediation: how to remediate its Machine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "ProxmoxRemediation",
    doc = "ProxmoxRemediation: resets the Proxmox VE VM of an unhealthy Machine in place (same VM, same disks), and deletes the Machine when resets do not help. Created by a MachineHealthCheck from a ProxmoxRemediationTemplate, named after the Machine.",
    plural = "proxmoxremediations",
    namespaced,
    status = "RemediationStatus",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha2"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Retries","type":"integer","jsonPath":".status.retryCount"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Remediated\")].reason"}"#,
    printcolumn = r#"{"name":"Last Remediated","type":"date","jsonPath":".status.lastRemediated"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxRemediationSpec {
    /// How to remediate: restart type, how many restarts, how long to wait
    /// after each.
    #[serde(default)]
    pub strategy: RemediationStrategy,
}

/// The desired state of a ProxmoxRemediationTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "ProxmoxRemediationTemplate",
    doc = "ProxmoxRemediationTemplate: what a MachineHealthCheck names in spec.remediation.templateRef to remediate Proxmox VE machines. Immutable.",
    plural = "proxmoxremediationtemplates",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha2"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxRemediationTemplateSpec {
    /// The ProxmoxRemediation to create for an unhealthy Machine.
    pub template: ProxmoxRemediationTemplateResource,
}

/// The object a ProxmoxRemediationTemplate describes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxRemediationTemplateResource {
    /// Labels and annotations for the ProxmoxRemediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The ProxmoxRemediation's spec.
    #[serde(default)]
    pub spec: ProxmoxRemediationSpec,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_go_writes_them() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m0s"), Ok(Duration::from_secs(300)));
        for bad in ["", "5", "m", "5 m", "-5m", "5d", ".5s", "5.s", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn an_empty_spec_means_one_reboot_and_five_minutes() {
        let spec: KubevirtRemediationSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(spec.strategy.type_, RemediationType::Reboot);
        assert_eq!(spec.strategy.retry_limit(), 1);
        assert_eq!(spec.strategy.timeout(), Ok(Duration::from_secs(300)));
        let negative = RemediationStrategy {
            retry_limit: -3,
            ..Default::default()
        };
        assert_eq!(negative.retry_limit(), 0);
    }
}
