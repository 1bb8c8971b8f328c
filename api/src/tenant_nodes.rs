//! `KubernetesNodes` (`apps.tenantry.dev/v1alpha1`): one worker pool of a
//! tenant cluster, with its own lifecycle (the reference text's "Worker pools
//! split into KubernetesNodes"). A pool names its `Kubernetes` parent in
//! `spec.cluster` and is itself named `<cluster>-<pool>`, as the Cozystack
//! `kubernetes-nodes` chart names its objects; the objects it becomes are
//! named `kubernetes-<cluster>-<pool>`.
//!
//! Every rule the CRD schema and CEL can express is here, next to the field it
//! guards. What needs the parent cluster (substrate, version, storage class)
//! or arithmetic on quantities (kubelet reservations against the workers'
//! memory) lives in the admission webhook
//! (`tenantry_provider::tenant::kubernetes_nodes::admission`). Also the small pure tables
//! the webhook and the pool controller share: the instance types of the
//! reference text, the kubelet reservation defaults, a quantity parser.

use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::{Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::proxmox::TemplateSelector;
use crate::tenant::{KubernetesSpec, KubernetesVersion, ResourceAmounts};

/// Prefix of the name derived for a pool: `kubernetes-nodes-<cluster>-<pool>`,
/// the Helm release name of the Cozystack chart a pool replaces.
pub const NODES_NAME_PREFIX: &str = "kubernetes-nodes-";
/// Longest name derived for a pool (Helm's release-name limit, kept so pools
/// adopted from Cozystack and pools created here are named alike).
pub const MAX_DERIVED_NAME_LENGTH: usize = 53;
/// Longest name a `KubernetesNodes` object may have: its derived name,
/// `kubernetes-nodes-<name>`, must fit [`MAX_DERIVED_NAME_LENGTH`].
pub const MAX_POOL_OBJECT_NAME_LENGTH: usize = MAX_DERIVED_NAME_LENGTH - NODES_NAME_PREFIX.len();

/// Instance type of the workers when `instanceType` is not set.
pub const DEFAULT_INSTANCE_TYPE: &str = "u1.medium";
/// Size of a worker's system disk when `diskSize` is not set.
pub const DEFAULT_DISK_SIZE: &str = "20Gi";
/// Fewest workers of a pool when `minReplicas` is not set.
pub const DEFAULT_MIN_REPLICAS: i32 = 0;
/// Most workers of a pool when `maxReplicas` is not set.
pub const DEFAULT_MAX_REPLICAS: i32 = 10;
/// `nodeHealthCheck.maxUnhealthy` when not set.
pub const DEFAULT_MAX_UNHEALTHY: &str = "50%";
/// `nodeHealthCheck.nodeStartupTimeout` when not set.
pub const DEFAULT_NODE_STARTUP_TIMEOUT: &str = "20m";
/// `nodeHealthCheck.readyUnknownTimeout` when not set.
pub const DEFAULT_READY_UNKNOWN_TIMEOUT: &str = "5m";
/// `nodeHealthCheck.readyFalseTimeout` when not set.
pub const DEFAULT_READY_FALSE_TIMEOUT: &str = "10m";
/// `maxNodeProvisionTime` when not set.
pub const DEFAULT_MAX_NODE_PROVISION_TIME: &str = "30m";
/// `kubelet.evictionHardMemory` when not set.
pub const DEFAULT_EVICTION_HARD_MEMORY: &str = "7%";
/// `kubelet.evictionSoftMemory` when not set.
pub const DEFAULT_EVICTION_SOFT_MEMORY: &str = "10%";

/// The role whose workers run the ingress-nginx addon.
pub const INGRESS_NGINX_ROLE: &str = "ingress-nginx";

/// The finalizer that keeps a pool until its workers and objects are gone.
pub const KUBERNETES_NODES_FINALIZER: &str = "apps.tenantry.dev/kubernetes-nodes";

/// Condition type: the pool's workers are up, as many Ready as desired.
pub const WORKERS_READY_CONDITION: &str = "WorkersReady";
/// Condition type summarising the others (the one `Ready` of every kind).
pub use crate::contract::READY_CONDITION;

/// A Kubernetes quantity (the pattern apimachinery parses).
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// A whole number of hours, minutes and seconds, in that order, whose first
/// segment is positive: `30m`, `1h30m`, `20m0s`. Narrower than Go's duration
/// syntax on purpose (the reference text's rule): no fractions that round to
/// zero, no zero or negative timeouts that remediate at once, and at most six
/// digits a segment, so no value overflows Go's parser.
const WHOLE_DURATION_RULE: &str = "self.matches('^([1-9][0-9]{0,5}h([0-9]{1,6}m)?([0-9]{1,6}s)?|[1-9][0-9]{0,5}m([0-9]{1,6}s)?|[1-9][0-9]{0,5}s)$')";

/// The name derived for the pool `<pool>` of the cluster `<cluster>`:
/// `kubernetes-nodes-<cluster>-<pool>`. It must fit
/// [`MAX_DERIVED_NAME_LENGTH`].
pub fn nodes_derived_name(cluster: &str, pool: &str) -> String {
    format!("{NODES_NAME_PREFIX}{cluster}-{pool}")
}

/// The name of the objects a pool becomes (MachineDeployment,
/// MachineHealthCheck, bootstrap template): `kubernetes-<cluster>-<pool>`.
pub fn pool_object_name(cluster: &str, pool: &str) -> String {
    format!("{}-{pool}", crate::tenant::cluster_name(cluster))
}

// ---------------------------------------------------------------------------
// KubernetesNodes
// ---------------------------------------------------------------------------

/// One worker pool of a tenant cluster. Every field but `cluster` has a
/// default, so `spec: {cluster: demo}` on an object named `demo-md0` asks for
/// an autoscaled pool of 0 to 10 u1.medium workers with 20Gi disks.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "apps.tenantry.dev",
    version = "v1alpha1",
    kind = "KubernetesNodes",
    singular = "kubernetesnodes",
    plural = "kubernetesnodes",
    namespaced,
    status = "KubernetesNodesStatus",
    category = "tenantry",
    derive = "PartialEq",
    // clusterctl installs and deletes the provider's components by this label.
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    doc = "KubernetesNodes: a worker pool of the tenant cluster named in spec.cluster. The object is named <cluster>-<pool>; its workers are virtual machines on the cluster's substrate (KubeVirt or Proxmox VE) that boot Talos Linux and join the cluster, scaled between minReplicas and maxReplicas by the cluster autoscaler and replaced by a health check when unhealthy.",
    validation = Rule::new("self.metadata.name.startsWith(self.spec.cluster + '-') && self.metadata.name.substring(size(self.spec.cluster) + 1).matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be <cluster>-<pool>: spec.cluster, a '-', then the pool name (lowercase letters, digits and '-', starting and ending with a letter or digit), e.g. demo-md0 for the pool md0 of the cluster demo").reason(Reason::FieldValueInvalid),
    validation = Rule::new("size(self.metadata.name) <= 36").message("metadata.name must be at most 36 characters, so that the name derived for the pool (kubernetes-nodes-<cluster>-<pool>) stays within 53 characters").reason(Reason::FieldValueInvalid),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready Replicas","type":"integer","jsonPath":".status.readyReplicas","priority":1}"#,
    printcolumn = r#"{"name":"Instance Type","type":"string","jsonPath":".spec.instanceType","priority":1}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not be greater than maxReplicas").field_path(".minReplicas").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(oldSelf.storageClass) || (has(self.storageClass) && self.storageClass == oldSelf.storageClass)").message("storageClass is immutable once set: it can be neither changed nor removed; create a new pool to use another StorageClass").field_path(".storageClass").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.ephemeralStorage)").message("ephemeralStorage was renamed to diskSize (the reference text's migration 41): move the value to spec.diskSize").field_path(".ephemeralStorage").reason(Reason::FieldValueForbidden))]
pub struct KubernetesNodesSpec {
    /// Name of the `Kubernetes` object (in this namespace) whose cluster the
    /// workers join. Immutable: a pool cannot move to another cluster.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("cluster is immutable: a pool cannot move to another cluster; create a new pool").reason(Reason::FieldValueForbidden))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("cluster must be the name of a Kubernetes object: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit").reason(Reason::FieldValueInvalid))]
    pub cluster: String,

    /// StorageClass of the workers' system disks (KubeVirt); they
    /// live-migrate, so the class must provide ReadWriteMany volumes. Unset
    /// means the cluster's storageClass. Immutable once set: it can be
    /// written down later only as the cluster's storageClass, and then
    /// neither changed nor removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class: Option<String>,

    /// Kubernetes minor the workers' kubelets run, v1.31 to v1.35. Unset
    /// means the cluster's spec.version. May lag the cluster by up to three
    /// minors, never lead it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<KubernetesVersion>,

    /// Fewest workers; the cluster autoscaler never scales below it. 0 by
    /// default: workers appear when pods cannot be scheduled.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: i32,

    /// Most workers the cluster autoscaler scales to; 10 by default. Also
    /// how many extra workers a rollout may create at once.
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_replicas: i32,

    /// Instance type sizing each worker, one of the platform's instance
    /// types: series u1 (universal, 1 vCPU : 4Gi), o1 (overcommitted
    /// memory), cx1 (dedicated CPUs, 1:2), m1 (memory, 1:8), n1, d1, gn1 and
    /// rt1 (realtime), in sizes such as nano, micro, small, medium, large,
    /// xlarge, 2xlarge, 4xlarge and 8xlarge; u1.medium (1 vCPU, 4Gi) by
    /// default. Ignored when resources sets cpu and memory; empty only then.
    #[serde(default = "default_instance_type")]
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new(r"self == '' || self.matches('^[a-z0-9]+\\.[a-z0-9]+$')").message("instanceType must be an instance type name such as u1.medium (or empty, with resources.cpu and resources.memory set)").reason(Reason::FieldValueInvalid))]
    pub instance_type: String,

    /// Size of each worker's single system disk: the Talos OS image, kubelet
    /// state, the container image cache and local-path volumes; 20Gi by
    /// default. On Proxmox VE the template's boot disk is grown to it, in
    /// whole GiB. Changing it replaces the workers.
    #[serde(default = "default_disk_size")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN, "nullable" = false))]
    pub disk_size: Quantity,

    /// Removed: renamed to diskSize. Refused, with a message pointing at
    /// diskSize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_string")]
    pub ephemeral_storage: Option<Value>,

    /// Roles of the workers, each set as the node label
    /// node-role.kubernetes.io/<role>; addons schedule by them (ingress-nginx
    /// runs on the workers of a pool with the role ingress-nginx).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[x_kube(validation = Rule::new(r"self.all(r, r.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))").message("each roles entry must be a label name: 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, e.g. ingress-nginx").reason(Reason::FieldValueInvalid))]
    pub roles: Vec<String>,

    /// Explicit vCPUs and memory of each worker, instead of instanceType:
    /// set both cpu and memory, or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<WorkerResources>,

    /// GPUs passed through to each worker (KubeVirt only). The NVIDIA driver
    /// needs at least 4Gi of memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub gpus: Vec<Gpu>,

    /// What each worker's kubelet keeps back from pods: reservations for the
    /// operating system and for the kubelet and container runtime, and the
    /// memory eviction thresholds. Reservations left unset are computed from
    /// the workers' size.
    #[serde(default)]
    pub kubelet: KubeletReservations,

    /// The health check that replaces unhealthy workers.
    #[serde(default)]
    pub node_health_check: NodeHealthCheck,

    /// How long the cluster autoscaler waits for a new worker to register
    /// as a Node before it counts the machine as failed and asks for
    /// another; 30m by default. A whole number of s, m or h (30m, 1h30m,
    /// 20m0s). Size it above the slowest join: disk image import, boot and
    /// the CNI rollout.
    #[serde(default = "default_max_node_provision_time")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(WHOLE_DURATION_RULE).message("maxNodeProvisionTime must be a whole number of s, m or h with a positive first segment, e.g. 30m, 1h30m or 20m0s").reason(Reason::FieldValueInvalid))]
    pub max_node_provision_time: String,

    /// Proxmox VE settings of the pool; required when the cluster's
    /// substrate is proxmox, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxmox: Option<ProxmoxPoolSettings>,
}

impl Default for KubernetesNodesSpec {
    fn default() -> Self {
        Self {
            cluster: String::new(),
            storage_class: None,
            version: None,
            min_replicas: default_min_replicas(),
            max_replicas: default_max_replicas(),
            instance_type: default_instance_type(),
            disk_size: default_disk_size(),
            ephemeral_storage: None,
            roles: Vec::new(),
            resources: None,
            gpus: Vec::new(),
            kubelet: KubeletReservations::default(),
            node_health_check: NodeHealthCheck::default(),
            max_node_provision_time: default_max_node_provision_time(),
            proxmox: None,
        }
    }
}

impl KubernetesNodesSpec {
    /// A pool of the cluster `cluster` with every other field defaulted.
    pub fn for_cluster(cluster: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            ..Self::default()
        }
    }

    /// CPU and memory of each worker: `resources` when it sets both, else
    /// the instance type's; None when neither is known.
    pub fn worker_size(&self) -> Option<ResourceAmounts> {
        match &self.resources {
            Some(WorkerResources {
                cpu: Some(cpu),
                memory: Some(memory),
            }) => Some(ResourceAmounts {
                cpu: cpu.clone(),
                memory: memory.clone(),
            }),
            _ => instance_type_resources(&self.instance_type),
        }
    }

    /// Whether `resources` sizes the workers (so instanceType is ignored).
    pub fn sized_by_resources(&self) -> bool {
        self.resources
            .as_ref()
            .is_some_and(|r| r.cpu.is_some() && r.memory.is_some())
    }

    /// The StorageClass of the workers' disks: the pool's, else the cluster's.
    pub fn effective_storage_class<'a>(&'a self, cluster: &'a KubernetesSpec) -> &'a str {
        self.storage_class
            .as_deref()
            .unwrap_or(cluster.storage_class.as_str())
    }

    /// The Kubernetes minor of the workers: the pool's, else the cluster's.
    pub fn effective_version(&self, cluster: &KubernetesSpec) -> KubernetesVersion {
        self.version.unwrap_or(cluster.version)
    }
}

impl KubernetesNodes {
    /// The pool's name within its cluster: the object's name without the
    /// `<cluster>-` prefix. None when the name does not start with it (the
    /// CRD refuses such names).
    pub fn pool_name(&self) -> Option<&str> {
        let name = self.metadata.name.as_deref()?;
        let pool = name
            .strip_prefix(self.spec.cluster.as_str())?
            .strip_prefix('-')?;
        (!pool.is_empty()).then_some(pool)
    }
}

fn default_min_replicas() -> i32 {
    DEFAULT_MIN_REPLICAS
}

fn default_max_replicas() -> i32 {
    DEFAULT_MAX_REPLICAS
}

fn default_instance_type() -> String {
    DEFAULT_INSTANCE_TYPE.to_string()
}

fn default_disk_size() -> Quantity {
    Quantity(DEFAULT_DISK_SIZE.to_string())
}

fn default_max_node_provision_time() -> String {
    DEFAULT_MAX_NODE_PROVISION_TIME.to_string()
}

/// Explicit size of each worker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.cpu) == has(self.memory)").message("resources.cpu and resources.memory are set together: both size the workers instead of instanceType, and one alone would leave the other to an instance type the workers no longer use").reason(Reason::FieldValueInvalid))]
pub struct WorkerResources {
    /// Whole vCPUs of each worker, e.g. 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub cpu: Option<Quantity>,
    /// Memory of each worker, e.g. 8Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub memory: Option<Quantity>,
}

/// A GPU passed through to each worker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// The GPU's device (resource) name as the management cluster's nodes
    /// advertise it, e.g. nvidia.com/AD102GL_L40S.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(r"self.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')").message("gpus name must be a device resource name <vendor domain>/<device>, e.g. nvidia.com/AD102GL_L40S").reason(Reason::FieldValueInvalid))]
    pub name: String,
}

/// The kubelet's reservations and memory eviction thresholds. A reservation
/// left unset is computed from the workers' size: 5% of memory, at least
/// 256Mi and at most 1Gi, and 5% of CPU, at least 50m and at most 500m,
/// each for the system and again for the kubelet. Reservations plus the hard
/// eviction threshold must leave memory (and the reservations CPU) for pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletReservations {
    /// CPU reserved for the operating system (kubelet systemReserved), e.g.
    /// 100m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub system_reserved_cpu: Option<Quantity>,
    /// Memory reserved for the operating system (kubelet systemReserved),
    /// e.g. 512Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub system_reserved_memory: Option<Quantity>,
    /// CPU reserved for the kubelet and the container runtime (kubelet
    /// kubeReserved), e.g. 100m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub kube_reserved_cpu: Option<Quantity>,
    /// Memory reserved for the kubelet and the container runtime (kubelet
    /// kubeReserved), e.g. 512Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub kube_reserved_memory: Option<Quantity>,
    /// Available memory below which the kubelet evicts pods at once: a
    /// percentage of the worker's memory (7% by default) or an amount such as
    /// 500Mi. The same kind as evictionSoftMemory, and below it.
    #[serde(default = "default_eviction_hard_memory")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(r"self.matches('^([0-9]+(\\.[0-9]+)?%|[0-9]+(\\.[0-9]+)?([KMGTPE]i|[kMGTPE]|[eE][0-9]+)?)$')").message("kubelet.evictionHardMemory must be a percentage such as 7% or a memory quantity such as 500Mi").reason(Reason::FieldValueInvalid))]
    pub eviction_hard_memory: String,
    /// Available memory below which the kubelet evicts pods after a grace
    /// period of 1m30s: a percentage of the worker's memory (10% by default)
    /// or an amount such as 1Gi. The same kind as evictionHardMemory, and
    /// above it.
    #[serde(default = "default_eviction_soft_memory")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(r"self.matches('^([0-9]+(\\.[0-9]+)?%|[0-9]+(\\.[0-9]+)?([KMGTPE]i|[kMGTPE]|[eE][0-9]+)?)$')").message("kubelet.evictionSoftMemory must be a percentage such as 10% or a memory quantity such as 1Gi").reason(Reason::FieldValueInvalid))]
    pub eviction_soft_memory: String,
}

impl Default for KubeletReservations {
    fn default() -> Self {
        Self {
            system_reserved_cpu: None,
            system_reserved_memory: None,
            kube_reserved_cpu: None,
            kube_reserved_memory: None,
            eviction_hard_memory: default_eviction_hard_memory(),
            eviction_soft_memory: default_eviction_soft_memory(),
        }
    }
}

fn default_eviction_hard_memory() -> String {
    DEFAULT_EVICTION_HARD_MEMORY.to_string()
}

fn default_eviction_soft_memory() -> String {
    DEFAULT_EVICTION_SOFT_MEMORY.to_string()
}

const MEBIBYTE: u128 = 1 << 20;
const GIBIBYTE: u128 = 1 << 30;

/// Memory the kubelet reserves, for the system and again for itself, when
/// the reservation is not set: 5% of the worker's memory, at least 256Mi and
/// at most 1Gi (in bytes).
pub fn default_reserved_memory_bytes(worker_memory_bytes: u128) -> u128 {
    (worker_memory_bytes * 5 / 100).clamp(256 * MEBIBYTE, GIBIBYTE)
}

/// CPU the kubelet reserves, for the system and again for itself, when the
/// reservation is not set: 5% of the worker's CPU, at least 50m and at most
/// 500m (in millicores).
pub fn default_reserved_millicpu(worker_millicpu: u128) -> u128 {
    (worker_millicpu * 5 / 100).clamp(50, 500)
}

/// The MachineHealthCheck of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealthCheck {
    /// Most unhealthy workers the check tolerates before it stops
    /// replacing them: a number, or a percentage of the pool's workers
    /// ("50%" by default, "0%" turns remediation off). A percentage is
    /// rounded down, so at "50%" a pool of one worker is never remediated
    /// and a pool of two remediates one unhealthy worker but not two.
    #[serde(default = "default_max_unhealthy")]
    #[schemars(extend("nullable" = false))]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')").message("nodeHealthCheck.maxUnhealthy must be a non-negative integer (e.g. 1) or a percentage from 0% to 100% (e.g. 50%); a number written as a string is refused by the MachineHealthCheck").reason(Reason::FieldValueInvalid))]
    pub max_unhealthy: IntOrString,
    /// How long a worker may take from creation (and again from its
    /// infrastructure becoming ready) to a Ready Node before it is replaced;
    /// 20m by default. A whole number of s, m or h.
    #[serde(default = "default_node_startup_timeout")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(WHOLE_DURATION_RULE).message("nodeHealthCheck.nodeStartupTimeout must be a whole number of s, m or h with a positive first segment, e.g. 20m or 1h30m").reason(Reason::FieldValueInvalid))]
    pub node_startup_timeout: String,
    /// How long a worker's Node may report Ready=Unknown (its kubelet went
    /// quiet) before the worker is replaced; 5m by default. A whole number
    /// of s, m or h.
    #[serde(default = "default_ready_unknown_timeout")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(WHOLE_DURATION_RULE).message("nodeHealthCheck.readyUnknownTimeout must be a whole number of s, m or h with a positive first segment, e.g. 5m or 90s").reason(Reason::FieldValueInvalid))]
    pub ready_unknown_timeout: String,
    /// How long a worker's Node may report Ready=False (for example while
    /// its CNI is still rolling out) before the worker is replaced; 10m by
    /// default. A whole number of s, m or h.
    #[serde(default = "default_ready_false_timeout")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(WHOLE_DURATION_RULE).message("nodeHealthCheck.readyFalseTimeout must be a whole number of s, m or h with a positive first segment, e.g. 10m or 1h").reason(Reason::FieldValueInvalid))]
    pub ready_false_timeout: String,
}

impl Default for NodeHealthCheck {
    fn default() -> Self {
        Self {
            max_unhealthy: default_max_unhealthy(),
            node_startup_timeout: default_node_startup_timeout(),
            ready_unknown_timeout: default_ready_unknown_timeout(),
            ready_false_timeout: default_ready_false_timeout(),
        }
    }
}

fn default_max_unhealthy() -> IntOrString {
    IntOrString::String(DEFAULT_MAX_UNHEALTHY.to_string())
}

fn default_node_startup_timeout() -> String {
    DEFAULT_NODE_STARTUP_TIMEOUT.to_string()
}

fn default_ready_unknown_timeout() -> String {
    DEFAULT_READY_UNKNOWN_TIMEOUT.to_string()
}

fn default_ready_false_timeout() -> String {
    DEFAULT_READY_FALSE_TIMEOUT.to_string()
}

/// Where on Proxmox VE the pool's workers are cloned: the resource pool
/// they join, the template they are cloned from (templateSelector, or
/// sourceNode with templateID, as on a ProxmoxMachine) and the storages of
/// their disks and seed ISOs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.templateSelector) || (!has(self.templateID) && !has(self.sourceNode))").message("proxmox.templateSelector cannot be combined with proxmox.templateID or proxmox.sourceNode: pick one clone source").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("has(self.templateSelector) || (has(self.templateID) && has(self.sourceNode))").message("proxmox needs a clone source: templateSelector, or templateID together with sourceNode").reason(Reason::FieldValueRequired))]
pub struct ProxmoxPoolSettings {
    /// The Proxmox resource pool every worker is cloned into, replacements
    /// included. Grant the tenant's CSI and CCM tokens their privileges on
    /// /pool/<pool>: that ACL is what keeps one tenant's controllers away
    /// from other tenants' VMs. Tenantry acts only on VMs in this pool.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(r"self.matches('^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$')").message("proxmox.pool must be a Proxmox pool ID: letters, digits, '.', '_' or '-', nested at most three levels with '/'").reason(Reason::FieldValueInvalid))]
    pub pool: String,
    /// Picks the VM template to clone by its Proxmox tags. Excludes
    /// templateID and sourceNode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_selector: Option<TemplateSelector>,
    /// The Proxmox node holding the VM template; goes with templateID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub source_node: Option<String>,
    /// The VM ID of the template to clone; goes with sourceNode.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "templateID"
    )]
    #[schemars(range(min = 100, max = 999_999_999))]
    pub template_id: Option<i32>,
    /// Proxmox storage of the workers' disks (a full clone); the template's
    /// storage when unset. A storage dedicated to the tenant is what lets
    /// its CSI token be scoped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z][a-zA-Z0-9._-]*[a-zA-Z0-9]$')").message("proxmox.storage must be a Proxmox storage ID: a letter, then letters, digits, '.', '_' or '-', ending in a letter or digit").reason(Reason::FieldValueInvalid))]
    pub storage: Option<String>,
    /// Proxmox storage that receives each worker's NoCloud seed ISO; it must
    /// accept ISO images, be reachable from the workers' nodes, and the
    /// credentials need Datastore.AllocateTemplate on it. The first enabled
    /// ISO storage of the node in name order when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z][a-zA-Z0-9._-]*[a-zA-Z0-9]$')").message("proxmox.isoStorage must be a Proxmox storage ID: a letter, then letters, digits, '.', '_' or '-', ending in a letter or digit").reason(Reason::FieldValueInvalid))]
    pub iso_storage: Option<String>,
}

// ---------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------

/// Observed state of a worker pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesNodesStatus {
    /// Conditions: `WorkersReady` (as many workers Ready as desired) and
    /// `Ready`. The cluster's own `WorkloadsReady` does not cover workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Workers the pool has now (the MachineDeployment's replicas, which
    /// the cluster autoscaler sets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Workers whose Node is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

// ---------------------------------------------------------------------------
// Instance types
// ---------------------------------------------------------------------------

/// An instance type of the reference text's table: vCPUs and memory of a
/// worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceType {
    /// Its name, `<series>.<size>`, e.g. u1.medium.
    pub name: &'static str,
    /// vCPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
}

impl InstanceType {
    const fn new(name: &'static str, cpus: u32, memory_mib: u64) -> Self {
        Self {
            name,
            cpus,
            memory_mib,
        }
    }

    /// The instance type's CPU and memory as quantities (`1`, `4Gi`).
    pub fn resources(&self) -> ResourceAmounts {
        ResourceAmounts {
            cpu: Quantity(self.cpus.to_string()),
            memory: Quantity(if self.memory_mib.is_multiple_of(1024) {
                format!("{}Gi", self.memory_mib / 1024)
            } else {
                format!("{}Mi", self.memory_mib)
            }),
        }
    }
}

impl fmt::Display for InstanceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The instance types the platform provides (the reference text's
/// "instanceType Resources" table), in its order.
pub const INSTANCE_TYPES: &[InstanceType] = &[
    InstanceType::new("cx1.2xlarge", 8, 16384),
    InstanceType::new("cx1.2xlarge1gi", 8, 16384),
    InstanceType::new("cx1.4xlarge", 16, 32768),
    InstanceType::new("cx1.4xlarge1gi", 16, 32768),
    InstanceType::new("cx1.8xlarge", 32, 65536),
    InstanceType::new("cx1.8xlarge1gi", 32, 65536),
    InstanceType::new("cx1.large", 2, 4096),
    InstanceType::new("cx1.large1gi", 2, 4096),
    InstanceType::new("cx1.medium", 1, 2048),
    InstanceType::new("cx1.medium1gi", 1, 2048),
    InstanceType::new("cx1.xlarge", 4, 8192),
    InstanceType::new("cx1.xlarge1gi", 4, 8192),
    InstanceType::new("d1.2xlarge", 8, 32768),
    InstanceType::new("d1.2xmedium", 2, 4096),
    InstanceType::new("d1.4xlarge", 16, 65536),
    InstanceType::new("d1.8xlarge", 32, 131072),
    InstanceType::new("d1.large", 2, 8192),
    InstanceType::new("d1.medium", 1, 4096),
    InstanceType::new("d1.micro", 1, 1024),
    InstanceType::new("d1.nano", 1, 512),
    InstanceType::new("d1.small", 1, 2048),
    InstanceType::new("d1.xlarge", 4, 16384),
    InstanceType::new("gn1.2xlarge", 8, 32768),
    InstanceType::new("gn1.4xlarge", 16, 65536),
    InstanceType::new("gn1.8xlarge", 32, 131072),
    InstanceType::new("gn1.xlarge", 4, 16384),
    InstanceType::new("m1.2xlarge", 8, 65536),
    InstanceType::new("m1.2xlarge1gi", 8, 65536),
    InstanceType::new("m1.4xlarge", 16, 131072),
    InstanceType::new("m1.4xlarge1gi", 16, 131072),
    InstanceType::new("m1.8xlarge", 32, 262144),
    InstanceType::new("m1.8xlarge1gi", 32, 262144),
    InstanceType::new("m1.large", 2, 16384),
    InstanceType::new("m1.large1gi", 2, 16384),
    InstanceType::new("m1.xlarge", 4, 32768),
    InstanceType::new("m1.xlarge1gi", 4, 32768),
    InstanceType::new("n1.2xlarge", 16, 32768),
    InstanceType::new("n1.4xlarge", 32, 65536),
    InstanceType::new("n1.8xlarge", 64, 131072),
    InstanceType::new("n1.large", 4, 8192),
    InstanceType::new("n1.medium", 4, 4096),
    InstanceType::new("n1.xlarge", 8, 16384),
    InstanceType::new("o1.2xlarge", 8, 32768),
    InstanceType::new("o1.4xlarge", 16, 65536),
    InstanceType::new("o1.8xlarge", 32, 131072),
    InstanceType::new("o1.large", 2, 8192),
    InstanceType::new("o1.medium", 1, 4096),
    InstanceType::new("o1.micro", 1, 1024),
    InstanceType::new("o1.nano", 1, 512),
    InstanceType::new("o1.small", 1, 2048),
    InstanceType::new("o1.xlarge", 4, 16384),
    InstanceType::new("rt1.2xlarge", 8, 32768),
    InstanceType::new("rt1.4xlarge", 16, 65536),
    InstanceType::new("rt1.8xlarge", 32, 131072),
    InstanceType::new("rt1.large", 2, 8192),
    InstanceType::new("rt1.medium", 1, 4096),
    InstanceType::new("rt1.micro", 1, 1024),
    InstanceType::new("rt1.small", 1, 2048),
    InstanceType::new("rt1.xlarge", 4, 16384),
    InstanceType::new("u1.2xlarge", 8, 32768),
    InstanceType::new("u1.2xmedium", 2, 4096),
    InstanceType::new("u1.4xlarge", 16, 65536),
    InstanceType::new("u1.8xlarge", 32, 131072),
    InstanceType::new("u1.large", 2, 8192),
    InstanceType::new("u1.medium", 1, 4096),
    InstanceType::new("u1.micro", 1, 1024),
    InstanceType::new("u1.nano", 1, 512),
    InstanceType::new("u1.small", 1, 2048),
    InstanceType::new("u1.xlarge", 4, 16384),
];

/// The instance type named `name`, if the platform provides it.
pub fn instance_type(name: &str) -> Option<&'static InstanceType> {
    INSTANCE_TYPES.iter().find(|t| t.name == name)
}

/// CPU and memory of the instance type named `name` (u1.medium: 1 and 4Gi),
/// if the platform provides it.
pub fn instance_type_resources(name: &str) -> Option<ResourceAmounts> {
    instance_type(name).map(InstanceType::resources)
}

/// The series of the instance types (u1, o1, cx1, …), each once, in table
/// order, for messages.
pub fn instance_type_series() -> Vec<&'static str> {
    let mut series: Vec<&'static str> = Vec::new();
    for t in INSTANCE_TYPES {
        let name = t.name.split('.').next().unwrap_or(t.name);
        if !series.contains(&name) {
            series.push(name);
        }
    }
    series
}

// ---------------------------------------------------------------------------
// Quantities
// ---------------------------------------------------------------------------

/// The value of a Kubernetes quantity in thousandths of its unit (millicores
/// for CPU, thousandths of a byte for memory), rounded up as apimachinery's
/// `MilliValue` rounds. Accepts the forms apimachinery parses: a decimal
/// number with an optional binary (Ki … Ei) or decimal (n, u, m, k, M … E)
/// suffix or a decimal exponent (1e9). None for anything else, and for
/// values too large to hold.
pub fn quantity_milli_value(text: &str) -> Option<i128> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || number.matches('.').count() > 1 {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    if digits.len() > 30 {
        return None;
    }
    let mantissa: i128 = digits.parse().ok()?;
    // value = mantissa × 2^binary × 10^decimal / 10^fraction digits, in
    // thousandths.
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exponent => {
            let exponent = exponent
                .strip_prefix('e')
                .or_else(|| exponent.strip_prefix('E'))?;
            let digits = exponent.trim_start_matches(['+', '-']);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let value: i32 = exponent.parse().ok()?;
            (0, value)
        }
    };
    let scale = decimal
        .checked_add(3)?
        .checked_sub(i32::try_from(fraction.len()).ok()?)?;
    let mut numerator = mantissa.checked_mul(1i128.checked_shl(binary)?)?;
    let mut denominator: i128 = 1;
    if scale >= 0 {
        numerator = numerator.checked_mul(10i128.checked_pow(scale.unsigned_abs())?)?;
    } else {
        denominator = 10i128.checked_pow(scale.unsigned_abs())?;
    }
    // Rounded up without `numerator + denominator - 1`, which can overflow.
    let value = numerator / denominator + i128::from(numerator % denominator != 0);
    Some(if negative { -value } else { value })
}

// ---------------------------------------------------------------------------
// Schema helpers
// ---------------------------------------------------------------------------

/// A value the apiserver accepts as an integer or a string.
fn int_or_string(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-int-or-string": true })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    fn schema() -> Value {
        let crd = KubernetesNodes::crd();
        serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("schema"),
        )
        .expect("schema serializes")
    }

    fn rules(schema: &Value) -> Vec<String> {
        schema["x-kubernetes-validations"]
            .as_array()
            .map(|rules| {
                rules
                    .iter()
                    .map(|r| r["rule"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_spec_with_only_the_cluster_takes_the_reference_defaults() {
        let spec: KubernetesNodesSpec =
            serde_json::from_value(json!({ "cluster": "demo" })).unwrap();
        assert_eq!(spec, KubernetesNodesSpec::for_cluster("demo"));
        assert_eq!(spec.min_replicas, 0);
        assert_eq!(spec.max_replicas, 10);
        assert_eq!(spec.instance_type, "u1.medium");
        assert_eq!(spec.disk_size.0, "20Gi");
        assert_eq!(
            spec.node_health_check.max_unhealthy,
            IntOrString::String("50%".into())
        );
        assert_eq!(spec.node_health_check.node_startup_timeout, "20m");
        assert_eq!(spec.node_health_check.ready_unknown_timeout, "5m");
        assert_eq!(spec.node_health_check.ready_false_timeout, "10m");
        assert_eq!(spec.max_node_provision_time, "30m");
        assert_eq!(spec.kubelet.eviction_hard_memory, "7%");
        assert_eq!(spec.kubelet.eviction_soft_memory, "10%");
        assert!(serde_json::from_value::<KubernetesNodesSpec>(json!({})).is_err());
    }

    #[test]
    fn the_schema_defaults_match_the_rust_defaults() {
        let schema = schema();
        assert_eq!(schema["required"], json!(["spec"]));
        let spec = &schema["properties"]["spec"];
        assert_eq!(spec["required"], json!(["cluster"]));
        let fields = &spec["properties"];
        assert_eq!(fields["minReplicas"]["default"], json!(0));
        assert_eq!(fields["maxReplicas"]["default"], json!(10));
        assert_eq!(fields["instanceType"]["default"], json!("u1.medium"));
        assert_eq!(fields["diskSize"]["default"], json!("20Gi"));
        assert_eq!(fields["maxNodeProvisionTime"]["default"], json!("30m"));
        let health = &fields["nodeHealthCheck"];
        assert_eq!(
            health["default"],
            json!({
                "maxUnhealthy": "50%",
                "nodeStartupTimeout": "20m",
                "readyUnknownTimeout": "5m",
                "readyFalseTimeout": "10m",
            })
        );
        assert_eq!(
            health["properties"]["maxUnhealthy"]["x-kubernetes-int-or-string"],
            json!(true)
        );
        assert_eq!(
            fields["kubelet"]["default"],
            json!({ "evictionHardMemory": "7%", "evictionSoftMemory": "10%" })
        );
    }

    #[test]
    fn the_crd_names_and_columns_are_the_documented_ones() {
        let crd = KubernetesNodes::crd();
        assert_eq!(crd.spec.group, "apps.tenantry.dev");
        assert_eq!(crd.spec.names.plural, "kubernetesnodes");
        assert_eq!(crd.spec.names.singular.as_deref(), Some("kubernetesnodes"));
        assert_eq!(crd.spec.names.categories, Some(vec!["tenantry".into()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(
            crd.metadata.labels.unwrap()["cluster.x-k8s.io/provider"],
            "infrastructure-tenantry"
        );
        let columns: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .filter(|c| c.priority.unwrap_or(0) == 0)
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(columns, ["Cluster", "Ready", "Replicas", "Age"]);
    }

    #[test]
    fn the_name_rules_are_root_rules_and_agree_with_the_derived_name_limit() {
        let root = rules(&schema());
        assert!(
            root.iter()
                .any(|r| r.contains("startsWith(self.spec.cluster + '-')")),
            "{root:?}"
        );
        assert!(
            root.contains(&format!(
                "size(self.metadata.name) <= {MAX_POOL_OBJECT_NAME_LENGTH}"
            )),
            "{root:?}"
        );
        assert_eq!(MAX_POOL_OBJECT_NAME_LENGTH, 36);
        // The longest cluster name still leaves a pool name of three.
        let cluster = "c".repeat(crate::tenant::MAX_CLUSTER_NAME_LENGTH);
        assert_eq!(
            nodes_derived_name(&cluster, "md0").len(),
            MAX_DERIVED_NAME_LENGTH
        );
    }

    #[test]
    fn immutability_and_removed_field_rules_sit_where_the_apiserver_checks_them() {
        let schema = schema();
        let spec = &schema["properties"]["spec"];
        let spec_rules = rules(spec);
        assert!(
            spec_rules
                .iter()
                .any(|r| r.contains("oldSelf.storageClass")),
            "{spec_rules:?}"
        );
        assert!(spec_rules.contains(&"!has(self.ephemeralStorage)".to_string()));
        assert!(spec_rules.contains(&"self.minReplicas <= self.maxReplicas".to_string()));
        assert!(rules(&spec["properties"]["cluster"]).contains(&"self == oldSelf".to_string()));
        assert_eq!(
            spec["properties"]["ephemeralStorage"]["x-kubernetes-int-or-string"],
            json!(true)
        );
    }

    #[test]
    fn derived_names_follow_the_cluster_and_pool() {
        assert_eq!(
            nodes_derived_name("demo", "md0"),
            "kubernetes-nodes-demo-md0"
        );
        assert_eq!(pool_object_name("demo", "md0"), "kubernetes-demo-md0");
        let mut pool = KubernetesNodes::new("demo-md0", KubernetesNodesSpec::for_cluster("demo"));
        assert_eq!(pool.pool_name(), Some("md0"));
        pool.metadata.name = Some("demo-".into());
        assert_eq!(pool.pool_name(), None);
        pool.metadata.name = Some("other-md0".into());
        assert_eq!(pool.pool_name(), None);
        pool.metadata.name = Some("demo.x-gpu".into());
        pool.spec.cluster = "demo.x".into();
        assert_eq!(pool.pool_name(), Some("gpu"));
    }

    #[test]
    fn instance_types_match_the_reference_table() {
        let table = [
            ("u1.nano", "1", "512Mi"),
            ("u1.micro", "1", "1Gi"),
            ("u1.small", "1", "2Gi"),
            ("u1.medium", "1", "4Gi"),
            ("u1.2xmedium", "2", "4Gi"),
            ("u1.large", "2", "8Gi"),
            ("u1.xlarge", "4", "16Gi"),
            ("u1.2xlarge", "8", "32Gi"),
            ("u1.4xlarge", "16", "64Gi"),
            ("u1.8xlarge", "32", "128Gi"),
            ("o1.medium", "1", "4Gi"),
            ("cx1.medium", "1", "2Gi"),
            ("cx1.8xlarge1gi", "32", "64Gi"),
            ("m1.large", "2", "16Gi"),
            ("m1.8xlarge", "32", "256Gi"),
            ("n1.medium", "4", "4Gi"),
            ("n1.8xlarge", "64", "128Gi"),
            ("d1.2xmedium", "2", "4Gi"),
            ("gn1.xlarge", "4", "16Gi"),
            ("rt1.micro", "1", "1Gi"),
        ];
        for (name, cpu, memory) in table {
            let resources = instance_type_resources(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(
                (resources.cpu.0.as_str(), resources.memory.0.as_str()),
                (cpu, memory),
                "{name}"
            );
        }
        assert_eq!(INSTANCE_TYPES.len(), 69);
        assert!(instance_type(DEFAULT_INSTANCE_TYPE).is_some());
        assert!(instance_type("u1.3xlarge").is_none());
        assert!(
            instance_type("c1.medium").is_none(),
            "a control-plane preset, not an instance type"
        );
        assert_eq!(
            instance_type_series(),
            ["cx1", "d1", "gn1", "m1", "n1", "o1", "rt1", "u1"]
        );
        for t in INSTANCE_TYPES {
            assert_eq!(
                INSTANCE_TYPES.iter().filter(|u| u.name == t.name).count(),
                1,
                "{t}"
            );
            assert!(
                t.memory_mib.is_multiple_of(8),
                "{t}: Proxmox wants memory in multiples of 8 MiB"
            );
        }
    }

    #[test]
    fn the_worker_size_comes_from_resources_when_both_are_set() {
        let mut spec = KubernetesNodesSpec::for_cluster("demo");
        let size = spec.worker_size().unwrap();
        assert_eq!((size.cpu.0.as_str(), size.memory.0.as_str()), ("1", "4Gi"));
        assert!(!spec.sized_by_resources());
        spec.resources = Some(WorkerResources {
            cpu: Some(Quantity("6".into())),
            memory: Some(Quantity("12Gi".into())),
        });
        spec.instance_type = String::new();
        let size = spec.worker_size().unwrap();
        assert_eq!((size.cpu.0.as_str(), size.memory.0.as_str()), ("6", "12Gi"));
        assert!(spec.sized_by_resources());
        spec.resources.as_mut().unwrap().cpu = None;
        assert_eq!(spec.worker_size(), None);
    }

    #[test]
    fn the_pool_follows_the_cluster_unless_it_says_otherwise() {
        let cluster = KubernetesSpec::default();
        let mut spec = KubernetesNodesSpec::for_cluster("demo");
        assert_eq!(spec.effective_storage_class(&cluster), "replicated");
        assert_eq!(spec.effective_version(&cluster), KubernetesVersion::V1_35);
        spec.storage_class = Some("local".into());
        spec.version = Some(KubernetesVersion::V1_33);
        assert_eq!(spec.effective_storage_class(&cluster), "local");
        assert_eq!(spec.effective_version(&cluster), KubernetesVersion::V1_33);
    }

    #[test]
    fn reservation_defaults_are_five_percent_clamped() {
        let mib = 1u128 << 20;
        assert_eq!(default_reserved_memory_bytes(512 * mib), 256 * mib);
        assert_eq!(
            default_reserved_memory_bytes(8 * 1024 * mib),
            8 * 1024 * mib * 5 / 100
        );
        assert_eq!(default_reserved_memory_bytes(128 * 1024 * mib), 1024 * mib);
        assert_eq!(default_reserved_millicpu(1_000), 50);
        assert_eq!(default_reserved_millicpu(4_000), 200);
        assert_eq!(default_reserved_millicpu(64_000), 500);
    }

    #[test]
    fn quantities_parse_like_apimachinery() {
        let cases: &[(&str, Option<i128>)] = &[
            ("1", Some(1_000)),
            ("500m", Some(500)),
            ("1.5", Some(1_500)),
            ("0.1m", Some(1)),
            (".5", Some(500)),
            ("2.", Some(2_000)),
            ("+3", Some(3_000)),
            ("-250m", Some(-250)),
            ("1Ki", Some(1_024_000)),
            ("256Mi", Some(256 * (1 << 20) * 1_000)),
            ("1.5Gi", Some(3 * (1 << 29) * 1_000)),
            ("1k", Some(1_000_000)),
            ("1G", Some(1_000_000_000_000)),
            ("1e9", Some(1_000_000_000_000)),
            ("500e6", Some(500_000_000_000)),
            ("1E", Some(1_000_000_000_000_000_000_000)),
            ("1E3", Some(1_000_000)),
            ("1e-3", Some(1)),
            ("100n", Some(1)),
            ("", None),
            ("banana", None),
            ("1.2.3", None),
            ("1Gb", None),
            ("1e", None),
            ("1e1.5", None),
            ("Gi", None),
            (".", None),
            ("99999999999999999999999999999999Ei", None),
        ];
        for (text, want) in cases {
            assert_eq!(quantity_milli_value(text), *want, "{text}");
        }
    }

    #[test]
    fn quantities_too_large_for_the_exponent_are_none_not_a_panic() {
        // The exponent plus three overflowed i32.
        assert_eq!(quantity_milli_value("1e2147483647"), None);
        assert_eq!(quantity_milli_value("1e2147483645"), None);
    }

    #[test]
    fn rounding_up_a_value_near_the_limit_does_not_overflow() {
        // mantissa × 2^60 is 2^60 - 1 below i128::MAX; adding the divisor
        // (10^19) minus one to round up overflowed.
        assert_eq!(
            quantity_milli_value(".0147573952589676412927Ei"),
            Some(17_014_118_346_046_923_174)
        );
    }
}
