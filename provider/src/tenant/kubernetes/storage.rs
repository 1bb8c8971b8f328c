//! The StorageClasses a tenant cluster offers its users.
//!
//! On KubeVirt, the tenant's volumes are volumes of the management cluster
//! (kubevirt-csi, provisioner `csi.kubevirt.io`, hot-plugged into the
//! worker VM): each LINSTOR class of the management cluster whose parameter
//! `linstor.csi.linbit.com/allowRemoteVolumeAccess` is not `"false"` (a
//! volume attached to a VM that may run on any node must allow remote
//! access) appears in the tenant under the same name. With no such class,
//! `replicated` is offered. On Proxmox VE, the classes are
//! `proxmox.csi.storageClasses` (the Proxmox CSI driver), when the CSI is
//! enabled. Exactly one class is the default: the cluster's `storageClass`
//! when offered, else `replicated`, else the first by name.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};
use tenantry_api::tenant::{Filesystem, Kubernetes, ReclaimPolicy, Substrate};

/// LINSTOR's CSI provisioner.
pub const LINSTOR_PROVISIONER: &str = "linstor.csi.linbit.com";
/// The LINSTOR parameter that keeps a volume local to its node.
pub const ALLOW_REMOTE_PARAMETER: &str = "linstor.csi.linbit.com/allowRemoteVolumeAccess";
/// kubevirt-csi's provisioner, inside the tenant.
pub const KUBEVIRT_CSI_PROVISIONER: &str = "csi.kubevirt.io";
/// The Proxmox CSI driver's provisioner, inside the tenant.
pub const PROXMOX_CSI_PROVISIONER: &str = "csi.proxmox.sinextra.dev";
/// The class offered when the management cluster has none to offer.
pub const FALLBACK_CLASS: &str = "replicated";
const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// Label on the classes tenantry manages in a tenant.
pub const MANAGED_LABEL: &str = "apps.tenantry.dev/managed";

/// The management cluster's classes a KubeVirt tenant may use.
pub fn offered_infra_classes(classes: &[StorageClass]) -> Vec<String> {
    let mut names: Vec<String> = classes
        .iter()
        .filter(|c| c.provisioner == LINSTOR_PROVISIONER)
        .filter(|c| {
            c.parameters
                .as_ref()
                .and_then(|p| p.get(ALLOW_REMOTE_PARAMETER))
                .is_none_or(|v| v != "false")
        })
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    names.sort();
    names
}

fn default_of<'a>(names: &'a [String], preferred: &str) -> Option<&'a str> {
    names
        .iter()
        .find(|n| *n == preferred)
        .or_else(|| names.iter().find(|n| *n == FALLBACK_CLASS))
        .or_else(|| names.first())
        .map(String::as_str)
}

fn class(
    name: &str,
    default: bool,
    provisioner: &str,
    parameters: BTreeMap<String, String>,
    reclaim: &str,
) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "labels": { MANAGED_LABEL: "true" },
            "annotations": { DEFAULT_CLASS_ANNOTATION: if default { "true" } else { "false" } },
        },
        "provisioner": provisioner,
        "parameters": parameters,
        "allowVolumeExpansion": true,
        "reclaimPolicy": reclaim,
        "volumeBindingMode": "WaitForFirstConsumer",
    })
}

/// The tenant's StorageClasses, given the management cluster's.
pub fn tenant_storage_classes(kubernetes: &Kubernetes, infra: &[StorageClass]) -> Vec<Value> {
    match kubernetes.spec.substrate {
        Substrate::Kubevirt => {
            let mut names = offered_infra_classes(infra);
            if names.is_empty() {
                names.push(FALLBACK_CLASS.to_string());
            }
            let default = default_of(&names, &kubernetes.spec.storage_class).map(str::to_string);
            names
                .iter()
                .map(|name| {
                    let parameters = BTreeMap::from([
                        ("infraStorageClassName".to_string(), name.clone()),
                        ("bus".to_string(), "scsi".to_string()),
                    ]);
                    class(
                        name,
                        default.as_deref() == Some(name.as_str()),
                        KUBEVIRT_CSI_PROVISIONER,
                        parameters,
                        "Delete",
                    )
                })
                .collect()
        }
        Substrate::Proxmox => {
            let Some(csi) = super::proxmox_controllers::csi_settings(kubernetes) else {
                return Vec::new();
            };
            let mut names: Vec<String> =
                csi.storage_classes.iter().map(|c| c.name.clone()).collect();
            names.sort();
            let default = default_of(&names, &kubernetes.spec.storage_class).map(str::to_string);
            csi.storage_classes
                .iter()
                .map(|c| {
                    let mut parameters =
                        BTreeMap::from([("storage".to_string(), c.storage.clone())]);
                    if let Some(fstype) = c.fstype {
                        let fstype = match fstype {
                            Filesystem::Ext4 => "ext4",
                            Filesystem::Xfs => "xfs",
                        };
                        parameters.insert("csi.storage.k8s.io/fstype".into(), fstype.into());
                    }
                    if c.ssd {
                        parameters.insert("ssd".into(), "true".into());
                    }
                    let reclaim = match c.reclaim_policy {
                        Some(ReclaimPolicy::Retain) => "Retain",
                        _ => "Delete",
                    };
                    class(
                        &c.name,
                        default.as_deref() == Some(c.name.as_str()),
                        PROXMOX_CSI_PROVISIONER,
                        parameters,
                        reclaim,
                    )
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use tenantry_api::tenant::KubernetesSpec;

    fn infra(name: &str, provisioner: &str, remote: Option<&str>) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            parameters: remote
                .map(|r| BTreeMap::from([(ALLOW_REMOTE_PARAMETER.to_string(), r.to_string())])),
            ..Default::default()
        }
    }

    fn defaults(classes: &[Value]) -> Vec<&str> {
        classes
            .iter()
            .filter(|c| c["metadata"]["annotations"][DEFAULT_CLASS_ANNOTATION] == "true")
            .map(|c| c["metadata"]["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn kubevirt_tenants_get_the_remote_capable_linstor_classes() {
        let k = Kubernetes::new("demo", KubernetesSpec::default());
        let classes = tenant_storage_classes(
            &k,
            &[
                infra("replicated", LINSTOR_PROVISIONER, Some("true")),
                infra("local", LINSTOR_PROVISIONER, Some("false")),
                infra("fast", LINSTOR_PROVISIONER, None),
                infra("nfs", "nfs.csi.k8s.io", None),
            ],
        );
        let names: Vec<_> = classes
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["fast", "replicated"]);
        assert_eq!(defaults(&classes), ["replicated"]);
        assert!(
            classes
                .iter()
                .all(|c| c["provisioner"] == KUBEVIRT_CSI_PROVISIONER)
        );
        assert_eq!(classes[0]["parameters"]["infraStorageClassName"], "fast");
    }

    #[test]
    fn exactly_one_default_whatever_is_offered() {
        let mut k = Kubernetes::new("demo", KubernetesSpec::default());
        k.spec.storage_class = "fast".into();
        let classes = tenant_storage_classes(
            &k,
            &[
                infra("fast", LINSTOR_PROVISIONER, None),
                infra("b", LINSTOR_PROVISIONER, None),
            ],
        );
        assert_eq!(defaults(&classes), ["fast"]);
        k.spec.storage_class = "gone".into();
        let classes = tenant_storage_classes(
            &k,
            &[
                infra("b", LINSTOR_PROVISIONER, None),
                infra("a", LINSTOR_PROVISIONER, None),
            ],
        );
        assert_eq!(defaults(&classes), ["a"]);
        let classes = tenant_storage_classes(&k, &[]);
        assert_eq!(defaults(&classes), [FALLBACK_CLASS]);
    }
}
