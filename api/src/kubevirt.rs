//! The KubeVirt substrate's kinds: `KubevirtCluster`, `KubevirtClusterTemplate`,
//! `KubevirtMachine` and `KubevirtMachineTemplate` in
//! `infrastructure.cluster.x-k8s.io/v1alpha1`, with the field names and shapes
//! of cluster-api-provider-kubevirt (CAPK), so CAPK manifests apply unchanged.
//! Tenantry's additions are optional.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::contract::{
    ApiEndpoint, ClusterInitialization, FailureDomain, MachineAddress, MachineInitialization,
    MachineTemplateStatus, ObjectMetaTemplate,
};
use crate::generated::kubevirt::virtual_machine::VirtualMachineSpec;

/// The finalizer tenantry puts on a KubevirtMachine (CAPK's name, so objects
/// moved from CAPK keep being cleaned up).
pub const KUBEVIRT_MACHINE_FINALIZER: &str = "kubevirtmachine.infrastructure.cluster.x-k8s.io";
/// The finalizer tenantry puts on a KubevirtCluster (CAPK's name).
pub const KUBEVIRT_CLUSTER_FINALIZER: &str = "kubevirtcluster.infrastructure.cluster.x-k8s.io";

/// The Talos image factory's public address.
pub const DEFAULT_IMAGE_FACTORY_URL: &str = "https://factory.talos.dev";
/// The Talos platform image that boots on KubeVirt: the OpenStack image reads
/// its machine configuration from a config drive.
pub const DEFAULT_TALOS_PLATFORM_IMAGE: &str = "openstack-amd64.raw.xz";

// ---------------------------------------------------------------------------
// KubevirtCluster
// ---------------------------------------------------------------------------

/// KubevirtCluster: the infrastructure of a workload cluster whose machines
/// are KubeVirt virtual machines. It provides the control-plane endpoint
/// through a Service in the infrastructure cluster and the SSH keys used for
/// the bootstrap check.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KubevirtCluster",
    plural = "kubevirtclusters",
    namespaced,
    status = "KubevirtClusterStatus",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.controlPlaneEndpoint.host"}"#,
    printcolumn = r#"{"name":"Provisioned","type":"boolean","jsonPath":".status.initialization.provisioned"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtClusterSpec {
    /// Where the workload cluster's API server is reached. Filled in from the
    /// control-plane Service unless set by the user or by the system managing
    /// the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Changes to the Service that fronts the control-plane machines
    /// (`<cluster>-lb`, port 6443): its metadata and type (ClusterIP by
    /// default, LoadBalancer or NodePort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_service_template: Option<ControlPlaneServiceTemplate>,
    /// The SSH key pair used to check a machine's bootstrap; filled in by the
    /// controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_keys: Option<SshKeys>,
    /// A Secret holding the kubeconfig (key `kubeconfig`, optional key
    /// `namespace`) of the cluster where the virtual machines run, when that
    /// is not the management cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infra_cluster_secret_ref: Option<ObjectReference>,
}

/// The parts of the control-plane Service a user may change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneServiceTemplate {
    /// Labels, annotations and namespace of the Service. With an external
    /// infrastructure cluster the namespace defaults to the kubeconfig's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true, "nullable" = true))]
    pub metadata: Option<ServiceMetadataTemplate>,
    /// The Service's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ControlPlaneServiceSpec>,
}

/// Metadata for an object tenantry creates on the user's behalf.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMetadataTemplate {
    /// Namespace to create the object in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The control-plane Service's spec fields a user may set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneServiceSpec {
    /// ClusterIP (default), NodePort or LoadBalancer.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub type_: Option<String>,
}

/// Where the SSH key pair of a cluster is kept.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshKeys {
    /// A reference to the object that produced the keys (unused by tenantry,
    /// kept for CAPK compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ObjectReference>,
    /// The Secret holding the key pair (keys `key` and `pub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// Observed state of a KubevirtCluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtClusterStatus {
    /// Whether the infrastructure is ready (v1beta1 contract; kept in step
    /// with `initialization.provisioned`).
    #[serde(default)]
    pub ready: bool,
    /// Initialization status (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// Failure domains the cluster offers (none on KubeVirt today).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<Vec<FailureDomain>>,
    /// Conditions: `Ready`, `LoadBalancerAvailable`, `Paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

/// KubevirtClusterTemplate: a KubevirtCluster blueprint for ClusterClass.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KubevirtClusterTemplate",
    plural = "kubevirtclustertemplates",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry")
)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtClusterTemplateSpec {
    /// The KubevirtCluster to create.
    pub template: KubevirtClusterTemplateResource,
}

/// The object a KubevirtClusterTemplate describes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtClusterTemplateResource {
    /// Labels and annotations for the KubevirtCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The KubevirtCluster's spec.
    pub spec: KubevirtClusterSpec,
}

// ---------------------------------------------------------------------------
// KubevirtMachine
// ---------------------------------------------------------------------------

/// KubevirtMachine: one machine of a workload cluster, run as a KubeVirt
/// VirtualMachine of the same name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KubevirtMachine",
    plural = "kubevirtmachines",
    namespaced,
    status = "KubevirtMachineStatus",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"}"#,
    printcolumn = r#"{"name":"Provisioned","type":"boolean","jsonPath":".status.initialization.provisioned"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"ProviderID","type":"string","jsonPath":".spec.providerID","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtMachineSpec {
    /// The VirtualMachine to run: its metadata and its full KubeVirt spec.
    /// DataVolume templates are renamed `<machine>-<name>` so that every
    /// machine made from one template gets its own disks.
    #[serde(default)]
    pub virtual_machine_template: VirtualMachineTemplateSpec,
    /// `kubevirt://<machine name>`, set by the controller once the VM runs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "providerID"
    )]
    pub provider_id: Option<String>,
    /// How to tell that the machine's bootstrap finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_bootstrap_check: Option<VirtualMachineBootstrapCheckSpec>,
    /// The external infrastructure cluster the VM runs in; defaults to the
    /// KubevirtCluster's and is copied here so deletion works after the
    /// KubevirtCluster is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infra_cluster_secret_ref: Option<ObjectReference>,
    /// Tenantry addition: a Talos boot disk imported by CDI straight from an
    /// image factory (or a mirror of it). Renders the DataVolume template and
    /// the virtio system disk; writing them by hand keeps working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_disk: Option<TalosBootDisk>,
}

/// The VirtualMachine a KubevirtMachine runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineTemplateSpec {
    /// Labels, annotations and namespace of the VirtualMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true, "nullable" = true))]
    pub metadata: Option<ServiceMetadataTemplate>,
    /// The KubeVirt VirtualMachine spec.
    #[serde(default)]
    pub spec: VirtualMachineSpec,
}

/// How the controller confirms that a machine bootstrapped.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineBootstrapCheckSpec {
    /// `ssh` reads CAPI's bootstrap sentinel file over SSH (cloud-init data
    /// only); `none` trusts the VM's Ready condition, which is what Talos
    /// machines use. Defaults to `ssh`, as CAPK does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_strategy: Option<BootstrapCheckStrategy>,
}

/// Bootstrap check strategies.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BootstrapCheckStrategy {
    /// No check beyond the VM being Ready.
    None,
    /// Read `/run/cluster-api/bootstrap-success.complete` over SSH.
    #[default]
    Ssh,
}

/// A Talos system disk imported from an image factory.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosBootDisk {
    /// Base URL of the image factory or its mirror, without a trailing slash.
    /// Defaults to https://factory.talos.dev.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "imageFactoryURL"
    )]
    #[x_kube(validation = Rule::new("!self.endsWith('/')").message("imageFactoryURL must not end with a slash"))]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("imageFactoryURL must be an http:// or https:// URL"))]
    pub image_factory_url: Option<String>,
    /// The image factory schematic: 64 lowercase hexadecimal characters.
    #[serde(rename = "schematicID")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("schematicID must be 64 lowercase hexadecimal characters"))]
    pub schematic_id: String,
    /// Talos version, e.g. v1.13.0.
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+(-[0-9A-Za-z.-]+)?$')").message("talosVersion must look like v1.13.0"))]
    pub talos_version: String,
    /// The platform image file; defaults to openstack-amd64.raw.xz, the image
    /// that reads its configuration from the config drive tenantry attaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!self.contains('/')").message("platformImage is a file name, without slashes"))]
    pub platform_image: Option<String>,
    /// Size of the system disk.
    pub disk_size: Quantity,
    /// StorageClass of the system disk; the cluster default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
}

impl TalosBootDisk {
    /// The image URL CDI imports: `<factory>/image/<schematic>/<version>/<platform image>`.
    pub fn image_url(&self) -> String {
        format!(
            "{}/image/{}/{}/{}",
            self.image_factory_url
                .as_deref()
                .unwrap_or(DEFAULT_IMAGE_FACTORY_URL)
                .trim_end_matches('/'),
            self.schematic_id,
            self.talos_version,
            self.platform_image
                .as_deref()
                .unwrap_or(DEFAULT_TALOS_PLATFORM_IMAGE)
        )
    }
}

/// Observed state of a KubevirtMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtMachineStatus {
    /// Whether the machine is provisioned (v1beta1 contract; kept in step
    /// with `initialization.provisioned`).
    #[serde(default)]
    pub ready: bool,
    /// Initialization status (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// Whether the control-plane Service selects this machine (CAPK field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_configured: Option<bool>,
    /// Addresses of the VM: its hostname and every IP of every interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<MachineAddress>>,
    /// Conditions: `Ready`, `VMProvisioned`, `BootstrapExecSucceeded`, `Paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Whether the workload Node got the providerID (CAPK field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodeupdated: Option<bool>,
    /// A terminal problem, for v1beta1-contract readers. Deprecated: the
    /// `Ready` condition carries the same reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The message of a terminal problem. Deprecated like failureReason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

/// KubevirtMachineTemplate: the KubevirtMachine blueprint a MachineDeployment
/// or MachineSet stamps out. Immutable except for dry-run requests of CAPI's
/// topology controller.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KubevirtMachineTemplate",
    plural = "kubevirtmachinetemplates",
    namespaced,
    status = "MachineTemplateStatus",
    category = "cluster-api",
    derive = "PartialEq",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha1"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry")
)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtMachineTemplateSpec {
    /// The KubevirtMachine to create.
    pub template: KubevirtMachineTemplateResource,
}

/// The object a KubevirtMachineTemplate describes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtMachineTemplateResource {
    /// Labels and annotations for the KubevirtMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The KubevirtMachine's spec.
    pub spec: KubevirtMachineSpec,
}
