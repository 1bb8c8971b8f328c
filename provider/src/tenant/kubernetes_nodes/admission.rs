//! Admission of `KubernetesNodes` pools beyond the CRD: the rules that need
//! the parent `Kubernetes` object, the instance-type table or arithmetic on
//! quantities, which CEL cannot express. The name shape
//! (`<cluster>-<pool>`, at most 36 characters), the immutability of `cluster`
//! and `storageClass`, minReplicas ≤ maxReplicas, resources set together, the
//! Proxmox clone source, the duration shapes, `maxUnhealthy` and the removed
//! `ephemeralStorage` are CEL rules in `tenantry_api::tenant_nodes`.
//!
//! [`validate`] decides a CREATE (`old` is None) or UPDATE of a pool, given
//! its parent as the webhook found it: the `Kubernetes` object named in
//! `spec.cluster`, in the pool's namespace, or None when there is none.
//!
//! What `<pool>` is: the object is named `<cluster>-<pool>`, as the
//! Cozystack `kubernetes-nodes` chart names its releases and as its pool
//! adoption names the pools it creates, so `<pool>` is the object's name
//! without the `<cluster>-` prefix and the derived name
//! `kubernetes-nodes-<cluster>-<pool>` is `kubernetes-nodes-<name>`. Taking
//! the whole name as `<pool>` would let `demo-md0` and `md0` of the cluster
//! demo claim the same objects.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tenantry_api::tenant::{Kubernetes, Substrate};
use tenantry_api::tenant_nodes::{
    KubernetesNodes, MAX_DERIVED_NAME_LENGTH, NODES_NAME_PREFIX, default_reserved_memory_bytes,
    default_reserved_millicpu, instance_type, instance_type_series, quantity_milli_value,
};

use crate::tenant::kubernetes::admission::{FieldError, Verdict};

mod kubelet;
use kubelet::check_kubelet;

const NAME: &str = "metadata.name";
const CLUSTER: &str = "spec.cluster";
const STORAGE_CLASS: &str = "spec.storageClass";
const VERSION: &str = "spec.version";
const INSTANCE_TYPE: &str = "spec.instanceType";
const DISK_SIZE: &str = "spec.diskSize";
const RESOURCES_CPU: &str = "spec.resources.cpu";
const RESOURCES_MEMORY: &str = "spec.resources.memory";
const GPUS: &str = "spec.gpus";
const KUBELET: &str = "spec.kubelet";
const PROXMOX: &str = "spec.proxmox";

/// How many minors a pool's kubelets may lag its control plane: Kubernetes'
/// version skew policy lets a kubelet be up to three minors older than the
/// kube-apiserver, never newer.
const MAX_KUBELET_MINOR_LAG: u32 = 3;

/// Memory the NVIDIA driver needs on a worker with GPUs (the reference
/// chart's note on `gpus`), in bytes.
const GPU_DRIVER_MEMORY_BYTES: i128 = 4 << 30;

/// Thousandths of a byte in one byte, of a core in one core.
const MILLI: i128 = 1_000;
const MEBIBYTE_MILLI: i128 = (1 << 20) * MILLI;
const GIBIBYTE_MILLI: i128 = (1 << 30) * MILLI;

/// Decides a CREATE (`old` is None) or UPDATE of the pool `pool`, whose
/// parent `Kubernetes` is `parent` (None: no such object in the pool's
/// namespace).
///
/// An UPDATE that leaves the spec as it was (finalizers, labels,
/// annotations), or of a pool being deleted, is always admitted: neither a
/// parent deleted first nor a rule added in a later release may keep the
/// pool's finalizer from being removed.
pub fn validate(
    pool: &KubernetesNodes,
    old: Option<&KubernetesNodes>,
    parent: Option<&Kubernetes>,
) -> Verdict {
    let mut verdict = Verdict::default();
    if let Some(old) = old
        && (pool.metadata.deletion_timestamp.is_some() || old.spec == pool.spec)
    {
        return verdict;
    }
    check_name(pool, &mut verdict);
    let substrate = match parent {
        None => {
            refuse(
                &mut verdict,
                CLUSTER,
                format!(
                    "there is no Kubernetes {:?} in this namespace; a pool joins an existing cluster: create the Kubernetes object first, or name an existing one",
                    pool.spec.cluster
                ),
            );
            None
        }
        Some(parent) => {
            check_parent(pool, old, parent, &mut verdict);
            Some(parent.spec.substrate)
        }
    };
    let size = check_worker_size(pool, substrate, &mut verdict);
    check_disk_size(pool, substrate, &mut verdict);
    if let Some(size) = &size {
        check_kubelet(pool, size, &mut verdict);
        if !pool.spec.gpus.is_empty() && size.memory < GPU_DRIVER_MEMORY_BYTES * MILLI {
            verdict.warnings.push(format!(
                "{GPUS}: the workers have {} of memory, and the NVIDIA driver needs at least 4Gi; size the workers up",
                size.memory_text
            ));
        }
    }
    warn_about_remediation(pool, &mut verdict);
    verdict
}

fn refuse(verdict: &mut Verdict, field: impl Into<String>, message: impl Into<String>) {
    verdict.errors.push(FieldError {
        field: field.into(),
        message: message.into(),
    });
}

// ---------------------------------------------------------------------------
// Name
// ---------------------------------------------------------------------------

/// The object is `<cluster>-<pool>` and `kubernetes-nodes-<cluster>-<pool>`
/// fits 53 characters. The CRD's CEL rules say the same; this names the
/// lengths.
fn check_name(pool: &KubernetesNodes, verdict: &mut Verdict) {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let cluster = &pool.spec.cluster;
    let Some(pool_name) = pool.pool_name() else {
        refuse(
            verdict,
            NAME,
            format!(
                "{name:?} must be <cluster>-<pool>: {cluster:?}, a '-', then the pool name, e.g. {cluster}-md0"
            ),
        );
        return;
    };
    let derived = format!("{NODES_NAME_PREFIX}{cluster}-{pool_name}");
    if derived.len() > MAX_DERIVED_NAME_LENGTH {
        refuse(
            verdict,
            NAME,
            format!(
                "the name derived for the pool, {derived:?}, has {} characters, more than {MAX_DERIVED_NAME_LENGTH}: shorten the pool name {pool_name:?} to at most {} characters",
                derived.len(),
                pool_name
                    .len()
                    .saturating_sub(derived.len() - MAX_DERIVED_NAME_LENGTH)
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------

fn check_parent(
    pool: &KubernetesNodes,
    old: Option<&KubernetesNodes>,
    parent: &Kubernetes,
    verdict: &mut Verdict,
) {
    let spec = &pool.spec;
    let cluster = &spec.cluster;
    if old.is_none() && parent.metadata.deletion_timestamp.is_some() {
        refuse(
            verdict,
            CLUSTER,
            format!("Kubernetes {cluster:?} is being deleted; a pool cannot join it"),
        );
    }

    // Substrate: the pool's machine template is of its cluster's
    // infrastructure kind; a mismatch leaves its Machines unreconciled.
    match (parent.spec.substrate, &spec.proxmox) {
        (Substrate::Proxmox, None) => refuse(
            verdict,
            PROXMOX,
            format!(
                "Kubernetes {cluster:?} runs its workers on Proxmox VE (substrate: proxmox), so the pool needs spec.proxmox: the resource pool its workers are cloned into (pool) and a clone source (templateSelector, or sourceNode with templateID)"
            ),
        ),
        (Substrate::Kubevirt, Some(_)) => refuse(
            verdict,
            PROXMOX,
            format!(
                "Kubernetes {cluster:?} runs its workers on KubeVirt (substrate: kubevirt); spec.proxmox applies only to pools of clusters with substrate: proxmox; remove it"
            ),
        ),
        _ => {}
    }
    if parent.spec.substrate == Substrate::Proxmox {
        if !spec.gpus.is_empty() {
            refuse(
                verdict,
                GPUS,
                format!(
                    "GPUs are passed through to KubeVirt workers only, and Kubernetes {cluster:?} runs its workers on Proxmox VE; remove spec.gpus"
                ),
            );
        }
        if spec.storage_class.is_some() {
            verdict.warnings.push(format!(
                "{STORAGE_CLASS} has no effect on Proxmox VE workers: their disks are cloned onto spec.proxmox.storage"
            ));
        }
    }

    // Version: kubelets never newer than the control plane, and at most
    // three minors older.
    if let Some(version) = spec.version {
        let control_plane = parent.spec.version;
        if version > control_plane {
            refuse(
                verdict,
                VERSION,
                format!(
                    "{version} is newer than Kubernetes {cluster:?} ({control_plane}): kubelets may not be newer than their control plane; upgrade the cluster first, or leave spec.version unset to follow it"
                ),
            );
        } else if control_plane.minor() - version.minor() > MAX_KUBELET_MINOR_LAG {
            refuse(
                verdict,
                VERSION,
                format!(
                    "{version} is more than {MAX_KUBELET_MINOR_LAG} minors older than Kubernetes {cluster:?} ({control_plane}), beyond the kubelet's supported version skew; set v1.{} or newer, or leave spec.version unset to follow the cluster",
                    control_plane.minor() - MAX_KUBELET_MINOR_LAG
                ),
            );
        }
    }

    // storageClass may be written down after creation only as the class
    // the workers already use, the cluster's.
    if let Some(old) = old
        && old.spec.storage_class.is_none()
        && let Some(class) = &spec.storage_class
        && class != &parent.spec.storage_class
    {
        refuse(
            verdict,
            STORAGE_CLASS,
            format!(
                "the pool's workers use the cluster's storageClass {:?}; spec.storageClass can be written down as that class but not changed, being immutable; create a new pool to use {class:?}",
                parent.spec.storage_class
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// Size of the workers
// ---------------------------------------------------------------------------

/// CPU and memory of each worker, in thousandths (millicores,
/// thousandths of a byte), and how they were given, for messages.
struct WorkerSize {
    millicpu: i128,
    memory: i128,
    memory_text: String,
    /// Where the size comes from: `instance type u1.medium` or
    /// `resources`.
    source: String,
}

/// Instance type or resources: one of them must size the workers. Returns
/// the size when it is known and valid.
fn check_worker_size(
    pool: &KubernetesNodes,
    substrate: Option<Substrate>,
    verdict: &mut Verdict,
) -> Option<WorkerSize> {
    let spec = &pool.spec;
    if let Some(resources) = &spec.resources
        && let (Some(cpu), Some(memory)) = (&resources.cpu, &resources.memory)
    {
        let millicpu = positive_quantity(cpu)
            .filter(|m| m % MILLI == 0)
            .or_else(|| {
                refuse(
                    verdict,
                    RESOURCES_CPU,
                    format!(
                        "{:?} is not a whole number of vCPUs; workers get whole vCPUs, e.g. 4",
                        cpu.0
                    ),
                );
                None
            });
        let memory_milli = positive_quantity(memory).or_else(|| {
            refuse(
                verdict,
                RESOURCES_MEMORY,
                format!(
                    "{:?} is not a positive memory quantity such as 8Gi",
                    memory.0
                ),
            );
            None
        });
        if substrate == Some(Substrate::Proxmox)
            && let Some(memory_milli) = memory_milli
            && memory_milli % (8 * MEBIBYTE_MILLI) != 0
        {
            refuse(
                verdict,
                RESOURCES_MEMORY,
                format!(
                    "{:?} is not a multiple of 8Mi, which Proxmox VE needs for a VM's memory; round it, e.g. 8Gi",
                    memory.0
                ),
            );
            return None;
        }
        return Some(WorkerSize {
            millicpu: millicpu?,
            memory: memory_milli?,
            memory_text: memory.0.clone(),
            source: "resources".to_string(),
        });
    }
    if spec.instance_type.is_empty() {
        refuse(
            verdict,
            INSTANCE_TYPE,
            "the workers need a size: set an instance type such as u1.medium, or resources.cpu and resources.memory",
        );
        return None;
    }
    let Some(known) = instance_type(&spec.instance_type) else {
        refuse(
            verdict,
            INSTANCE_TYPE,
            format!(
                "{:?} is not an instance type the platform provides; use <series>.<size> with a series of {} (e.g. u1.medium, u1.large, m1.xlarge), or size the workers with resources.cpu and resources.memory",
                spec.instance_type,
                instance_type_series().join(", ")
            ),
        );
        return None;
    };
    let amounts = known.resources();
    Some(WorkerSize {
        millicpu: i128::from(known.cpus) * MILLI,
        memory: i128::from(known.memory_mib) * MEBIBYTE_MILLI,
        memory_text: amounts.memory.0,
        source: format!("instance type {known}"),
    })
}

/// The value of a quantity in thousandths, when it is valid and above zero.
fn positive_quantity(quantity: &Quantity) -> Option<i128> {
    quantity_milli_value(&quantity.0).filter(|value| *value > 0)
}

fn check_disk_size(pool: &KubernetesNodes, substrate: Option<Substrate>, verdict: &mut Verdict) {
    let disk = &pool.spec.disk_size;
    let Some(size) = positive_quantity(disk) else {
        refuse(
            verdict,
            DISK_SIZE,
            format!(
                "{:?} is not a positive size; the system disk holds the Talos image, kubelet state and the image cache: use e.g. 20Gi",
                disk.0
            ),
        );
        return;
    };
    if substrate == Some(Substrate::Proxmox) && size % GIBIBYTE_MILLI != 0 {
        refuse(
            verdict,
            DISK_SIZE,
            format!(
                "{:?} is not a whole number of GiB, which Proxmox VE grows a boot disk by; use e.g. 20Gi",
                disk.0
            ),
        );
    }
}

/// A percentage `maxUnhealthy` is taken of the workers the check covers and
/// rounded down; when even a full pool rounds to zero, the check never
/// replaces a worker.
fn warn_about_remediation(pool: &KubernetesNodes, verdict: &mut Verdict) {
    let spec = &pool.spec;
    let IntOrString::String(text) = &spec.node_health_check.max_unhealthy else {
        return;
    };
    let Some(percent) = text.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
        return;
    };
    let most = i64::from(spec.max_replicas);
    if percent > 0 && most > 0 && most * percent / 100 == 0 {
        verdict.warnings.push(format!(
            "spec.nodeHealthCheck.maxUnhealthy: {text} of at most {most} worker(s) rounds down to 0, so unhealthy workers of this pool are never replaced; set maxUnhealthy: 1 to replace one at a time"
        ));
    }
}

#[cfg(test)]
mod tests;
