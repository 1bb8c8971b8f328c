//! Shapes the Cluster API infrastructure contract (v1beta2, with the v1beta1
//! fields CAPI still reads) asks every infrastructure kind to carry.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// CRD label naming the API versions that answer the v1beta2 contract.
pub const CONTRACT_V1BETA2_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// CRD label naming the API versions that answer the v1beta1 contract.
pub const CONTRACT_V1BETA1_LABEL: &str = "cluster.x-k8s.io/v1beta1";
/// CRD label clusterctl uses to tell which provider owns a CRD.
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
/// Our value of the provider label.
pub const PROVIDER_NAME: &str = "infrastructure-tenantry";

/// Label on every object of a workload cluster naming the Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Annotation that pauses reconciliation of a single object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Annotation `clusterctl move` puts on each source object just before it
/// deletes it: the object lives on in the target management cluster, so a
/// provider must leave the infrastructure alone.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// Annotation marking an infrastructure cluster as managed by another system
/// (for example the Kamaji control plane provider).
pub const MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/managed-by";
/// Annotation CAPI's topology controller sets on dry-run server-side-apply
/// requests; template immutability must not refuse those.
pub const TOPOLOGY_DRY_RUN_ANNOTATION: &str = "topology.cluster.x-k8s.io/dry-run";
/// Label on Machines and infrastructure machines of the control plane.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Condition type summarising an object's state (mirrored by CAPI into the
/// Machine's and Cluster's `InfrastructureReady`).
pub const READY_CONDITION: &str = "Ready";
/// Condition type reporting whether reconciliation is paused.
pub const PAUSED_CONDITION: &str = "Paused";

/// Initialization status of an infrastructure machine (v1beta2 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// True once the machine's infrastructure is fully provisioned; CAPI then
    /// copies providerID and addresses to the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// Initialization status of an infrastructure cluster (v1beta2 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// True once the cluster's infrastructure is ready; CAPI then copies the
    /// control-plane endpoint to the Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// An address of a machine, as CAPI's `MachineAddress`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// The address type.
    #[serde(rename = "type")]
    pub type_: MachineAddressType,
    /// The address.
    #[x_kube(validation = "self.size() >= 1 && self.size() <= 256")]
    pub address: String,
}

/// Kinds of machine address CAPI knows.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum MachineAddressType {
    Hostname,
    ExternalIP,
    InternalIP,
    ExternalDNS,
    InternalDNS,
}

/// Where the control plane's API server is reached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// Host name or IP address.
    pub host: String,
    /// Port.
    pub port: i32,
}

impl ApiEndpoint {
    /// Whether the endpoint has been set (CAPI treats the zero value as unset).
    pub fn is_set(&self) -> bool {
        !self.host.is_empty() && self.port != 0
    }
}

/// A failure domain an infrastructure cluster offers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain.
    pub name: String,
    /// Whether control-plane machines may be placed in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// Labels and annotations copied onto objects created from a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaTemplate {
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Architecture and operating system of the nodes a machine template makes,
/// read by the cluster autoscaler when scaling from zero.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// CPU architecture: amd64, arm64, s390x or ppc64le.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Operating system, e.g. linux.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}

/// Status of a machine template: what a node made from it provides, for the
/// cluster autoscaler's scale-from-zero.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateStatus {
    /// Resources a node made from this template provides (cpu, memory, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Architecture and operating system of those nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}
