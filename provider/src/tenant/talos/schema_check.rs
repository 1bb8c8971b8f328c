//! The Talos v1alpha1 fields the worker config may use, from Talos's
//! configuration reference, and a check of a rendered config against them.

use serde_json::Value;

/// JSON types of the Talos v1alpha1 config, as the configuration
/// reference gives them (string, bool, object, list).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Str,
    Bool,
    Object,
    List,
}
use Kind::{Bool, List, Object, Str};

/// The v1alpha1 fields this renderer may emit, from the Talos
/// configuration reference (Config, MachineConfig, ClusterConfig and the
/// types under them). Paths join keys with `/`; `*` stands for a key the
/// user chooses (a label, a registry host), `[]` for a list item.
/// `machine/kubelet/extraConfig` is a KubeletConfiguration fragment: its
/// keys are the kubelet's (kubelet.config.k8s.io/v1beta1).
const TALOS_FIELDS: &[(&str, Kind)] = &[
    ("", Object),
    ("version", Str),
    ("debug", Bool),
    ("persist", Bool),
    ("machine", Object),
    ("machine/type", Str),
    ("machine/token", Str),
    ("machine/ca", Object),
    ("machine/ca/crt", Str),
    ("machine/ca/key", Str),
    ("machine/kubelet", Object),
    ("machine/kubelet/image", Str),
    ("machine/kubelet/extraConfig", Object),
    ("machine/kubelet/extraConfig/systemReserved", Object),
    ("machine/kubelet/extraConfig/systemReserved/cpu", Str),
    ("machine/kubelet/extraConfig/systemReserved/memory", Str),
    ("machine/kubelet/extraConfig/kubeReserved", Object),
    ("machine/kubelet/extraConfig/kubeReserved/cpu", Str),
    ("machine/kubelet/extraConfig/kubeReserved/memory", Str),
    ("machine/kubelet/extraConfig/evictionHard", Object),
    (
        "machine/kubelet/extraConfig/evictionHard/memory.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionHard/nodefs.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionHard/imagefs.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionHard/nodefs.inodesFree",
        Str,
    ),
    ("machine/kubelet/extraConfig/evictionSoft", Object),
    (
        "machine/kubelet/extraConfig/evictionSoft/memory.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionSoft/nodefs.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionSoft/imagefs.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionSoftGracePeriod",
        Object,
    ),
    (
        "machine/kubelet/extraConfig/evictionSoftGracePeriod/memory.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionSoftGracePeriod/nodefs.available",
        Str,
    ),
    (
        "machine/kubelet/extraConfig/evictionSoftGracePeriod/imagefs.available",
        Str,
    ),
    ("machine/kubelet/extraConfig/evictionMinimumReclaim", Object),
    (
        "machine/kubelet/extraConfig/evictionMinimumReclaim/memory.available",
        Str,
    ),
    ("machine/nodeLabels", Object),
    ("machine/nodeLabels/*", Str),
    ("machine/network", Object),
    ("machine/network/extraHostEntries", List),
    ("machine/network/extraHostEntries/[]", Object),
    ("machine/network/extraHostEntries/[]/ip", Str),
    ("machine/network/extraHostEntries/[]/aliases", List),
    ("machine/network/extraHostEntries/[]/aliases/[]", Str),
    ("machine/install", Object),
    ("machine/install/disk", Str),
    ("machine/install/image", Str),
    ("machine/install/wipe", Bool),
    ("machine/features", Object),
    ("machine/features/rbac", Bool),
    ("machine/features/kubePrism", Object),
    ("machine/features/kubePrism/enabled", Bool),
    ("machine/registries", Object),
    ("machine/registries/mirrors", Object),
    ("machine/registries/mirrors/*", Object),
    ("machine/registries/mirrors/*/endpoints", List),
    ("machine/registries/mirrors/*/endpoints/[]", Str),
    ("machine/registries/mirrors/*/overridePath", Bool),
    ("machine/registries/mirrors/*/skipFallback", Bool),
    ("cluster", Object),
    ("cluster/id", Str),
    ("cluster/secret", Str),
    ("cluster/controlPlane", Object),
    ("cluster/controlPlane/endpoint", Str),
    ("cluster/clusterName", Str),
    ("cluster/network", Object),
    ("cluster/network/dnsDomain", Str),
    ("cluster/network/podSubnets", List),
    ("cluster/network/podSubnets/[]", Str),
    ("cluster/network/serviceSubnets", List),
    ("cluster/network/serviceSubnets/[]", Str),
    ("cluster/token", Str),
    ("cluster/ca", Object),
    ("cluster/ca/crt", Str),
    ("cluster/ca/key", Str),
    ("cluster/discovery", Object),
    ("cluster/discovery/enabled", Bool),
    ("cluster/discovery/registries", Object),
    ("cluster/discovery/registries/kubernetes", Object),
    ("cluster/discovery/registries/kubernetes/disabled", Bool),
    ("cluster/discovery/registries/service", Object),
    ("cluster/discovery/registries/service/disabled", Bool),
];

fn field_kind(pattern: &str) -> Option<Kind> {
    TALOS_FIELDS
        .iter()
        .find(|(path, _)| *path == pattern)
        .map(|(_, kind)| *kind)
}

fn kind_of(value: &Value) -> Option<Kind> {
    match value {
        Value::String(_) => Some(Str),
        Value::Bool(_) => Some(Bool),
        Value::Object(_) => Some(Object),
        Value::Array(_) => Some(List),
        Value::Null | Value::Number(_) => None,
    }
}

fn child(pattern: &str, segment: &str) -> String {
    if pattern.is_empty() {
        segment.to_string()
    } else {
        format!("{pattern}/{segment}")
    }
}

/// Every field of `value` that the table does not know, or that has
/// another type than the table's: `(where, what is wrong)`.
pub(super) fn schema_violations(value: &Value, at: &str, pattern: &str, out: &mut Vec<String>) {
    let Some(expected) = field_kind(pattern) else {
        out.push(format!(
            "{at}: not a Talos v1alpha1 field this renderer may emit"
        ));
        return;
    };
    if kind_of(value) != Some(expected) {
        out.push(format!("{at}: expected {expected:?}, got {value}"));
        return;
    }
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                let named = child(pattern, key);
                let pattern = if field_kind(&named).is_some() {
                    named
                } else {
                    child(pattern, "*")
                };
                schema_violations(field, &child(at, key), &pattern, out);
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                schema_violations(item, &format!("{at}[{index}]"), &child(pattern, "[]"), out);
            }
        }
        _ => {}
    }
}
