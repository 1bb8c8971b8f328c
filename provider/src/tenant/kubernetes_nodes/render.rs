//! What a `KubernetesNodes` pool becomes, as pure functions of the pool and
//! its parent `Kubernetes` (no I/O): the workers' infrastructure machine
//! template (named by a hash of its content, so any change to it rolls the
//! pool), the Talos bootstrap template, the MachineDeployment the cluster
//! autoscaler scales and the MachineHealthCheck that replaces unhealthy
//! workers.
//!
//! For the pool `<pool>` of the cluster `<cluster>` the objects are named
//! `kubernetes-<cluster>-<pool>` (the machine template
//! `kubernetes-<cluster>-<pool>-<hash>`), as the platform chart names them.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tenantry_api::tenant::{Kubernetes, Substrate, cluster_name};
use tenantry_api::tenant_nodes::{
    KubernetesNodes, default_reserved_memory_bytes, default_reserved_millicpu, pool_object_name,
    quantity_milli_value,
};

use crate::tenant::kubernetes::render::KUBERNETES_LABEL;

/// Label on everything a pool's controller creates, naming the pool object.
pub const POOL_LABEL: &str = "apps.tenantry.dev/kubernetes-nodes";
/// CAPI's labels tying Machines to their cluster and deployment.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Prefix of the role labels CAPI copies from a Machine to its Node.
pub const NODE_ROLE_PREFIX: &str = "node-role.kubernetes.io/";
/// Hex digits of the machine template's content hash in its name.
const HASH_LENGTH: usize = 10;

/// Cluster autoscaler annotations (cluster-api provider).
pub const MIN_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
pub const MAX_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
pub const MAX_PROVISION_TIME_ANNOTATION: &str =
    "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime";
pub const CAPACITY_MEMORY_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";
pub const CAPACITY_CPU_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
pub const CAPACITY_GPU_COUNT_ANNOTATION: &str =
    "capacity.cluster-autoscaler.kubernetes.io/gpu-count";

/// The bridge Proxmox workers' first NIC is attached to.
const PROXMOX_BRIDGE: &str = "vmbr0";

/// The names the pool's objects derive from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolNames {
    /// The parent `Kubernetes` object.
    pub kubernetes: String,
    /// The pool object (`<cluster>-<pool>`).
    pub pool_object: String,
    /// The CAPI Cluster (`kubernetes-<cluster>`).
    pub cluster: String,
    /// MachineDeployment, MachineHealthCheck and TalosConfigTemplate
    /// (`kubernetes-<cluster>-<pool>`).
    pub objects: String,
}

impl PoolNames {
    /// None when the pool's name does not start with `<cluster>-` (the CRD
    /// refuses such names).
    pub fn of(pool: &KubernetesNodes) -> Option<Self> {
        let pool_name = pool.pool_name()?;
        Some(Self {
            kubernetes: pool.spec.cluster.clone(),
            pool_object: pool.metadata.name.clone()?,
            cluster: cluster_name(&pool.spec.cluster),
            objects: pool_object_name(&pool.spec.cluster, pool_name),
        })
    }

    /// Labels of every object of the pool.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (KUBERNETES_LABEL.to_string(), self.kubernetes.clone()),
            (POOL_LABEL.to_string(), self.pool_object.clone()),
            (CLUSTER_NAME_LABEL.to_string(), self.cluster.clone()),
        ])
    }

    /// What selects the pool's Machines.
    pub fn machine_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CLUSTER_NAME_LABEL.to_string(), self.cluster.clone()),
            (DEPLOYMENT_NAME_LABEL.to_string(), self.objects.clone()),
        ])
    }
}

/// The infrastructure machine template's kind on the cluster's substrate.
pub fn machine_template_kind(substrate: Substrate) -> &'static str {
    match substrate {
        Substrate::Kubevirt => "KubevirtMachineTemplate",
        Substrate::Proxmox => "ProxmoxMachineTemplate",
    }
}

/// The Talos version of the pool's workers (the cluster's `talos.version`).
fn talos_version(kubernetes: &Kubernetes) -> &str {
    &kubernetes.spec.talos.version
}

fn role_labels(pool: &KubernetesNodes) -> BTreeMap<String, String> {
    pool.spec
        .roles
        .iter()
        .map(|role| (format!("{NODE_ROLE_PREFIX}{role}"), String::new()))
        .collect()
}

/// Whole MiB of a memory quantity, rounded down; None when unparsable.
fn mebibytes(quantity: &str) -> Option<i128> {
    Some(quantity_milli_value(quantity)? / 1000 / (1 << 20))
}

/// Whole cores of a CPU quantity, rounded up (a VM has whole vCPUs).
fn whole_cores(quantity: &str) -> Option<i128> {
    Some((quantity_milli_value(quantity)? + 999) / 1000)
}

/// The machine template's spec on KubeVirt: the Talos disk from the image
/// factory (the cluster's, else `default_image_factory_url`), the instance
/// type (or explicit cpu/memory), GPUs and roles.
fn kubevirt_template_spec(
    kubernetes: &Kubernetes,
    pool: &KubernetesNodes,
    names: &PoolNames,
    default_image_factory_url: &str,
) -> Value {
    let talos = &kubernetes.spec.talos;
    let mut vm_labels = role_labels(pool);
    vm_labels.insert(DEPLOYMENT_NAME_LABEL.to_string(), names.objects.clone());
    vm_labels.insert(KUBERNETES_LABEL.to_string(), names.kubernetes.clone());
    let mut domain = json!({
        "devices": { "interfaces": [{ "name": "default", "bridge": {} }] },
    });
    let mut vm_spec = json!({ "runStrategy": "Always" });
    if pool.spec.sized_by_resources() {
        let resources = pool.spec.resources.clone().unwrap_or_default();
        if let Some(cores) = resources.cpu.as_ref().and_then(|c| whole_cores(&c.0)) {
            domain["cpu"] = json!({ "cores": cores, "sockets": 1, "threads": 1 });
        }
        if let Some(memory) = resources.memory {
            domain["memory"] = json!({ "guest": memory.0 });
        }
    } else {
        vm_spec["instancetype"] = json!({
            "kind": "VirtualMachineClusterInstancetype",
            "name": pool.spec.instance_type,
        });
    }
    if !pool.spec.gpus.is_empty() {
        domain["devices"]["gpus"] = pool
            .spec
            .gpus
            .iter()
            .enumerate()
            .map(|(i, gpu)| json!({ "name": format!("gpu{}", i + 1), "deviceName": gpu.name }))
            .collect();
    }
    // The VM object carries the labels (the VMI template's metadata is not
    // part of the machine template's schema, so it would be pruned and
    // every apply would look like a change of an immutable template).
    vm_spec["template"] = json!({
        "spec": {
            "domain": domain,
            "networks": [{ "name": "default", "pod": {} }],
            "evictionStrategy": "External",
        },
    });
    json!({
        // Talos runs no SSH server: nothing to check in the guest.
        "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
        "bootDisk": {
            "imageFactoryURL": talos.image_factory_url_or(default_image_factory_url),
            "schematicID": talos.schematic_id,
            "talosVersion": talos_version(kubernetes),
            "diskSize": pool.spec.disk_size.0,
            "storageClass": pool.spec.effective_storage_class(&kubernetes.spec),
        },
        "virtualMachineTemplate": {
            "metadata": { "labels": vm_labels },
            "spec": vm_spec,
        },
    })
}

/// The machine template's spec on Proxmox VE: a full clone of the pool's
/// template into `proxmox.pool`, sized from the instance type or
/// resources. The Talos version is carried by the template VM (and named
/// in the description), so a `talos.version` change rolls the pool too.
fn proxmox_template_spec(kubernetes: &Kubernetes, pool: &KubernetesNodes) -> Value {
    let settings = pool.spec.proxmox.clone().unwrap_or_default();
    let size = pool.spec.worker_size();
    let cores = size
        .as_ref()
        .and_then(|s| whole_cores(&s.cpu.0))
        .unwrap_or(2);
    let memory = size
        .as_ref()
        .and_then(|s| mebibytes(&s.memory.0))
        .unwrap_or(4096);
    let disk_gb = quantity_milli_value(&pool.spec.disk_size.0)
        .map(|m| (m / 1000 + (1 << 30) - 1) / (1 << 30))
        .unwrap_or(20);
    let mut spec = json!({
        "pool": settings.pool,
        "full": true,
        "numSockets": 1,
        "numCores": cores,
        "memoryMiB": memory,
        "disks": { "bootVolume": { "disk": "scsi0", "sizeGb": disk_gb } },
        "description": format!(
            "worker of {} (Talos {})",
            cluster_name(&pool.spec.cluster),
            talos_version(kubernetes)
        ),
        "network": { "networkDevices": [{ "name": "net0", "bridge": PROXMOX_BRIDGE, "model": "virtio" }] },
        "tags": [format!("talos-{}", talos_version(kubernetes))],
    });
    if let Some(selector) = &settings.template_selector {
        spec["templateSelector"] = serde_json::to_value(selector).unwrap_or_default();
    }
    if let Some(node) = &settings.source_node {
        spec["sourceNode"] = json!(node);
    }
    if let Some(id) = settings.template_id {
        spec["templateID"] = json!(id);
    }
    if let Some(storage) = &settings.storage {
        spec["storage"] = json!(storage);
    }
    if let Some(storage) = &settings.iso_storage {
        spec["isoStorage"] = json!(storage);
    }
    let allowed = kubernetes
        .spec
        .proxmox
        .as_ref()
        .map(|p| p.allowed_nodes.clone())
        .unwrap_or_default();
    if !allowed.is_empty() {
        spec["allowedNodes"] = json!(allowed);
    }
    spec
}

/// The first `HASH_LENGTH` hex digits of the SHA-256 of a spec's JSON
/// (serde_json orders object keys, so equal specs hash equal).
pub fn content_hash(spec: &Value) -> String {
    let digest = Sha256::digest(spec.to_string().as_bytes());
    digest
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..HASH_LENGTH]
        .to_string()
}

/// The infrastructure machine template, named `<objects>-<hash of its
/// spec>`: a change to what the workers are made of creates a new template
/// and the MachineDeployment rolls to it. `default_image_factory_url` is
/// the manager's, for a cluster stored without `talos.imageFactoryURL`.
pub fn machine_template(
    kubernetes: &Kubernetes,
    pool: &KubernetesNodes,
    names: &PoolNames,
    default_image_factory_url: &str,
) -> Value {
    let substrate = kubernetes.spec.substrate;
    let spec = match substrate {
        Substrate::Kubevirt => {
            kubevirt_template_spec(kubernetes, pool, names, default_image_factory_url)
        }
        Substrate::Proxmox => proxmox_template_spec(kubernetes, pool),
    };
    let api_version = match substrate {
        Substrate::Kubevirt => "infrastructure.cluster.x-k8s.io/v1alpha1",
        Substrate::Proxmox => "infrastructure.cluster.x-k8s.io/v1alpha2",
    };
    json!({
        "apiVersion": api_version,
        "kind": machine_template_kind(substrate),
        "metadata": {
            "name": format!("{}-{}", names.objects, content_hash(&spec)),
            "labels": names.labels(),
        },
        "spec": { "template": { "spec": spec } },
    })
}

/// The TalosConfigTemplate (CABPT, `generateType: none`): every worker of
/// the pool boots with `worker_config` as it is. CABPT's webhook refuses
/// any change to a template's spec, so, like the machine template, it is
/// named `<objects>-<hash of its spec>`: a new worker config is a new
/// template, and the MachineDeployment rolls to it.
pub fn talos_config_template(
    kubernetes: &Kubernetes,
    names: &PoolNames,
    worker_config: &str,
) -> Value {
    let spec = json!({
        "generateType": "none",
        "talosVersion": crate::tenant::talos::talos_minor(talos_version(kubernetes)),
        "data": worker_config,
    });
    json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1alpha3",
        "kind": "TalosConfigTemplate",
        "metadata": {
            "name": format!("{}-{}", names.objects, content_hash(&spec)),
            "labels": names.labels(),
        },
        "spec": { "template": { "spec": spec } },
    })
}

/// What one worker offers pods once the kubelet's reservations and the
/// hard eviction threshold are taken off: (memory in MiB rounded down,
/// millicores rounded up), for the autoscaler's scale-from-zero.
pub fn allocatable(pool: &KubernetesNodes) -> Option<(i128, i128)> {
    let size = pool.spec.worker_size()?;
    let memory = quantity_milli_value(&size.memory.0)? / 1000;
    let millicpu = quantity_milli_value(&size.cpu.0)?;
    let kubelet = &pool.spec.kubelet;
    let reserved_memory = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.as_ref()
            .and_then(|q| quantity_milli_value(&q.0))
            .map(|m| m / 1000)
            .unwrap_or(default_reserved_memory_bytes(memory.max(0) as u128) as i128)
    };
    let reserved_cpu = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.as_ref()
            .and_then(|q| quantity_milli_value(&q.0))
            .unwrap_or(default_reserved_millicpu(millicpu.max(0) as u128) as i128)
    };
    let eviction = match kubelet.eviction_hard_memory.strip_suffix('%') {
        Some(percent) => memory * percent.parse::<i128>().ok()? / 100,
        None => quantity_milli_value(&kubelet.eviction_hard_memory)? / 1000,
    };
    let memory_left = memory
        - reserved_memory(&kubelet.system_reserved_memory)
        - reserved_memory(&kubelet.kube_reserved_memory)
        - eviction;
    let cpu_left = millicpu
        - reserved_cpu(&kubelet.system_reserved_cpu)
        - reserved_cpu(&kubelet.kube_reserved_cpu);
    Some(((memory_left / (1 << 20)).max(0), cpu_left.max(0)))
}

/// The MachineDeployment. It has no `spec.replicas`: the cluster
/// autoscaler owns the count between the min/max annotations, and CAPI's
/// defaulting seeds it from the min-size annotation when the deployment is
/// created.
pub fn machine_deployment(
    kubernetes: &Kubernetes,
    pool: &KubernetesNodes,
    names: &PoolNames,
    machine_template_name: &str,
    bootstrap_template_name: &str,
) -> Value {
    let mut annotations = BTreeMap::from([
        (
            MIN_SIZE_ANNOTATION.to_string(),
            pool.spec.min_replicas.to_string(),
        ),
        (
            MAX_SIZE_ANNOTATION.to_string(),
            pool.spec.max_replicas.to_string(),
        ),
        (
            MAX_PROVISION_TIME_ANNOTATION.to_string(),
            pool.spec.max_node_provision_time.clone(),
        ),
    ]);
    if let Some((memory, cpu)) = allocatable(pool) {
        annotations.insert(
            CAPACITY_MEMORY_ANNOTATION.to_string(),
            format!("{memory}Mi"),
        );
        annotations.insert(CAPACITY_CPU_ANNOTATION.to_string(), format!("{cpu}m"));
    }
    if !pool.spec.gpus.is_empty() {
        annotations.insert(
            CAPACITY_GPU_COUNT_ANNOTATION.to_string(),
            pool.spec.gpus.len().to_string(),
        );
    }
    let mut template_labels = names.machine_selector();
    template_labels.extend(role_labels(pool));
    template_labels.insert(POOL_LABEL.to_string(), names.pool_object.clone());
    let version = pool.spec.effective_version(&kubernetes.spec).pinned_patch();
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {
            "name": names.objects,
            "labels": names.labels(),
            "annotations": annotations,
        },
        "spec": {
            "clusterName": names.cluster,
            "selector": { "matchLabels": names.machine_selector() },
            "rollout": { "strategy": {
                "type": "RollingUpdate",
                // Replacements come up before old workers go, as many at
                // once as the pool may hold.
                "rollingUpdate": { "maxSurge": pool.spec.max_replicas.max(1), "maxUnavailable": 0 },
            }},
            "template": {
                "metadata": { "labels": template_labels },
                "spec": {
                    "clusterName": names.cluster,
                    "version": version,
                    "bootstrap": { "configRef": {
                        "apiGroup": "bootstrap.cluster.x-k8s.io",
                        "kind": "TalosConfigTemplate",
                        "name": bootstrap_template_name,
                    }},
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": machine_template_kind(kubernetes.spec.substrate),
                        "name": machine_template_name,
                    },
                },
            },
        },
    })
}

/// Seconds of a whole s/m/h duration (`20m`, `1h30m`, `90s`); the CRD
/// admits no other shape.
pub fn duration_seconds(text: &str) -> Option<i64> {
    let mut total = 0i64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        // Checked: a value past i64 seconds is no duration, not a panic.
        total = total.checked_add(digits.parse::<i64>().ok()?.checked_mul(unit)?)?;
        digits.clear();
    }
    (digits.is_empty() && total > 0).then_some(total)
}

/// The MachineHealthCheck: a worker whose Node stays Ready=Unknown or
/// Ready=False past its timeout, or that never gets a Ready Node within
/// the startup timeout, is replaced — while at most `maxUnhealthy` of the
/// pool are unhealthy (CAPI rounds a percentage down).
pub fn machine_health_check(pool: &KubernetesNodes, names: &PoolNames) -> Value {
    let check = &pool.spec.node_health_check;
    let seconds = |text: &str, default: i64| duration_seconds(text).unwrap_or(default);
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": { "name": names.objects, "labels": names.labels() },
        "spec": {
            "clusterName": names.cluster,
            "selector": { "matchLabels": names.machine_selector() },
            "checks": {
                "nodeStartupTimeoutSeconds": seconds(&check.node_startup_timeout, 1200),
                "unhealthyNodeConditions": [
                    { "type": "Ready", "status": "Unknown", "timeoutSeconds": seconds(&check.ready_unknown_timeout, 300) },
                    { "type": "Ready", "status": "False", "timeoutSeconds": seconds(&check.ready_false_timeout, 600) },
                ],
            },
            "remediation": { "triggerIf": { "unhealthyLessThanOrEqualTo": check.max_unhealthy } },
        },
    })
}

#[cfg(test)]
mod tests;
