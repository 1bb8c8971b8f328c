//! The tenant-facing kinds in `apps.tenantry.dev/v1alpha1`. Today:
//! `Kubernetes`, one object per tenant cluster, whose parameters mirror the
//! managed Kubernetes service of the reference text (storage class, version,
//! control plane, Talos worker image, OIDC, addons). Worker pools are a
//! separate kind, `KubernetesNodes`.
//!
//! Every rule the CRD schema and CEL can express is here, next to the field it
//! guards; what needs parsing (apiserver flags, the Talos support matrix)
//! lives in the admission webhook (`tenantry_provider::tenant::kubernetes::admission`).
//! Also the small pure tables the companion controller and the webhook share:
//! the patch release each minor runs, the resource presets, the flags the
//! control plane owns.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::{Reason, Rule};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// API group of the tenant-facing kinds.
pub const GROUP: &str = "apps.tenantry.dev";

/// Longest name a `Kubernetes` object may have: the worker pools' release
/// names (`kubernetes-nodes-<cluster>-<pool>`) must fit Helm's 53 characters
/// with a pool name of at least 4.
pub const MAX_CLUSTER_NAME_LENGTH: usize = 32;

/// The default StorageClass inside a tenant cluster.
pub const DEFAULT_STORAGE_CLASS: &str = "replicated";
/// Talos release of the worker image when `talos.version` is not set.
pub const DEFAULT_TALOS_VERSION: &str = "v1.13.6";
/// Image factory schematic of the worker image when `talos.schematicID` is
/// not set: the siderolabs/qemu-guest-agent system extension and nothing
/// else (no kernel arguments), the guest agent KubeVirt and Proxmox VE read
/// a VM's addresses from.
pub const DEFAULT_TALOS_SCHEMATIC_ID: &str =
    "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
/// Installer image repository when `talos.installerRepository` is not set.
pub const DEFAULT_TALOS_INSTALLER_REPOSITORY: &str = "factory.talos.dev/installer";

/// Condition type: the tenant's etcd cluster is available and its Kamaji
/// DataStore exists.
pub const ETCD_READY_CONDITION: &str = "EtcdReady";
/// Condition type: the Kamaji control plane is initialized and ready.
pub const CONTROL_PLANE_READY_CONDITION: &str = "ControlPlaneReady";
/// Condition type: the control-plane workloads run (worker health is reported
/// on each `KubernetesNodes` pool).
pub const WORKLOADS_READY_CONDITION: &str = "WorkloadsReady";
/// Condition type summarising the others (the one `Ready` of every kind).
pub use crate::contract::READY_CONDITION;
/// Finalizer of `Kubernetes` objects: the companion takes the cluster down
/// in the safe order before the object goes.
pub const KUBERNETES_FINALIZER: &str = "apps.tenantry.dev/kubernetes";

/// Volume names the control plane uses for the Talos trust pieces of the
/// `talos-csr-signer` sidecar; user volumes may not take them.
pub const RESERVED_VOLUME_NAMES: &[&str] = &["talos-ca", "talos-tls-cert"];
/// Volume name of the OIDC AuthenticationConfiguration, reserved while
/// `oidc.mode` is not None.
pub const AUTHENTICATION_CONFIG_VOLUME: &str = "authentication-config";

/// The kube-apiserver flag the control plane renders from
/// `controlPlane.apiServer.admissionControllers`.
pub const ENABLE_ADMISSION_PLUGINS_FLAG: &str = "--enable-admission-plugins";
/// The kube-apiserver flag the control plane renders from
/// `controlPlane.kubelet.preferredAddressTypes`.
pub const KUBELET_PREFERRED_ADDRESS_TYPES_FLAG: &str = "--kubelet-preferred-address-types";

/// kube-apiserver flags the tenant control plane sets itself (Kamaji drops an
/// `extraArgs` entry naming one), as listed by the reference text.
pub const CONTROL_PLANE_OWNED_FLAGS: &[&str] = &[
    "--advertise-address",
    "--client-ca-file",
    ENABLE_ADMISSION_PLUGINS_FLAG,
    "--service-cluster-ip-range",
    "--kubelet-client-certificate",
    "--kubelet-client-key",
    KUBELET_PREFERRED_ADDRESS_TYPES_FLAG,
    "--proxy-client-cert-file",
    "--proxy-client-key-file",
    "--requestheader-allowed-names",
    "--requestheader-client-ca-file",
    "--secure-port",
    "--service-account-key-file",
    "--service-account-signing-key-file",
    "--tls-cert-file",
    "--tls-private-key-file",
    "--etcd-servers",
    "--etcd-cafile",
    "--etcd-certfile",
    "--etcd-keyfile",
    "--etcd-prefix",
    "--etcd-compaction-interval",
    "--egress-selector-config-file",
];

/// Admission plugins the KamajiControlPlane CRD accepts in
/// `spec.admissionControllers` (its enum, controlplane.cluster.x-k8s.io
/// v1alpha2).
pub const ADMISSION_PLUGINS: &[&str] = &[
    "AlwaysAdmit",
    "AlwaysDeny",
    "AlwaysPullImages",
    "CertificateApproval",
    "CertificateSigning",
    "CertificateSubjectRestriction",
    "DefaultIngressClass",
    "DefaultStorageClass",
    "DefaultTolerationSeconds",
    "DenyEscalatingExec",
    "DenyExecOnPrivileged",
    "DenyServiceExternalIPs",
    "EventRateLimit",
    "ExtendedResourceToleration",
    "ImagePolicyWebhook",
    "LimitPodHardAntiAffinityTopology",
    "LimitRanger",
    "MutatingAdmissionWebhook",
    "NamespaceAutoProvision",
    "NamespaceExists",
    "NamespaceLifecycle",
    "NodeRestriction",
    "OwnerReferencesPermissionEnforcement",
    "PersistentVolumeClaimResize",
    "PersistentVolumeLabel",
    "PodNodeSelector",
    "PodSecurity",
    "PodSecurityPolicy",
    "PodTolerationRestriction",
    "Priority",
    "ResourceQuota",
    "RuntimeClass",
    "SecurityContextDeny",
    "ServiceAccount",
    "StorageObjectInUseProtection",
    "TaintNodesByCondition",
    "ValidatingAdmissionWebhook",
];

/// The plugins the control plane enables when `admissionControllers` is
/// empty (the TenantControlPlane CRD's default set).
pub const DEFAULT_ADMISSION_PLUGINS: &[&str] = &[
    "CertificateApproval",
    "CertificateSigning",
    "CertificateSubjectRestriction",
    "DefaultIngressClass",
    "DefaultStorageClass",
    "DefaultTolerationSeconds",
    "LimitRanger",
    "MutatingAdmissionWebhook",
    "NamespaceLifecycle",
    "PersistentVolumeClaimResize",
    "Priority",
    "ResourceQuota",
    "RuntimeClass",
    "ServiceAccount",
    "StorageObjectInUseProtection",
    "TaintNodesByCondition",
    "ValidatingAdmissionWebhook",
];

/// Node address types the KamajiControlPlane accepts in
/// `spec.kubelet.preferredAddressTypes`.
pub const NODE_ADDRESS_TYPES: &[&str] = &[
    "Hostname",
    "InternalIP",
    "ExternalIP",
    "InternalDNS",
    "ExternalDNS",
];

/// The name of the CAPI Cluster (and KamajiControlPlane, infrastructure
/// cluster) of the `Kubernetes` object `name`.
pub fn cluster_name(name: &str) -> String {
    format!("kubernetes-{name}")
}

/// The Secret holding the admin kubeconfigs of the `Kubernetes` object
/// `name`: keys `admin.conf`, `admin.svc`, `super-admin.conf`,
/// `super-admin.svc`.
pub fn admin_kubeconfig_secret_name(name: &str) -> String {
    format!("kubernetes-{name}-admin-kubeconfig")
}

// ---------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------

/// The tenant cluster to run. Every field has a default, so `spec: {}` asks
/// for a Kubernetes v1.35 cluster with two control-plane replicas on KubeVirt.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "apps.tenantry.dev",
    version = "v1alpha1",
    kind = "Kubernetes",
    singular = "kubernetes",
    plural = "kuberneteses",
    namespaced,
    status = "KubernetesStatus",
    category = "tenantry",
    derive = "PartialEq",
    derive = "Default",
    // clusterctl installs and deletes the provider's components by this label.
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    doc = "Kubernetes: a tenant Kubernetes cluster. Its control plane runs as pods in this namespace (Kamaji, backed by the namespace's etcd); its workers are the KubernetesNodes pools that name it. The admin kubeconfig is in the Secret kubernetes-<name>-admin-kubeconfig.",
    validation = Rule::new("size(self.metadata.name) <= 32").message("metadata.name must be at most 32 characters, so that the names derived for every worker pool (kubernetes-nodes-<cluster>-<pool>) stay within 53 characters").reason(Reason::FieldValueInvalid),
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Running","type":"string","jsonPath":".status.version","priority":1}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.proxmox) || (has(self.substrate) && self.substrate == 'proxmox')").message("spec.proxmox applies only to substrate: proxmox; remove it, or create a new cluster with substrate: proxmox").field_path(".proxmox").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.substrate) || self.substrate != 'proxmox' || (has(self.proxmox) && has(self.proxmox.ipv4Config) && has(self.proxmox.dnsServers) && size(self.proxmox.dnsServers) > 0)").message("substrate: proxmox needs spec.proxmox.ipv4Config (the workers' address pool: capmox assigns static addresses and has no DHCP) and at least one spec.proxmox.dnsServers entry").field_path(".proxmox").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!has(self.oidc) || !has(self.oidc.mode) || self.oidc.mode == 'None' || !has(self.controlPlane) || !has(self.controlPlane.apiServer) || !has(self.controlPlane.apiServer.extraVolumes) || self.controlPlane.apiServer.extraVolumes.all(v, v.name != 'authentication-config')").message("controlPlane.apiServer.extraVolumes: the name authentication-config is reserved while spec.oidc.mode is not None (the control plane mounts the OIDC AuthenticationConfiguration under it); rename the volume").field_path(".controlPlane.apiServer.extraVolumes").reason(Reason::FieldValueForbidden))]
pub struct KubernetesSpec {
    /// Default StorageClass inside the tenant cluster. Remote-accessible
    /// LINSTOR classes of the management cluster are propagated to the tenant
    /// under the same name. Immutable.
    #[serde(default = "default_storage_class")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("storageClass is immutable: the tenant cluster's default StorageClass cannot change after creation; create a new cluster to use another").reason(Reason::FieldValueForbidden))]
    pub storage_class: String,

    /// Kubernetes minor version of the control plane, v1.31 to v1.35. Each
    /// minor runs one pinned patch release (see status.version). Upgrade one
    /// minor at a time; downgrades are refused.
    #[serde(default)]
    pub version: KubernetesVersion,

    /// External hostname of the cluster's API server. Defaults to
    /// `<cluster-name>.<tenant host>` when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("host must be a DNS name such as k8s.example.org: lowercase letters, digits, '-' and '.', without scheme or port"))]
    pub host: Option<String>,

    /// Which infrastructure runs the worker VMs: `kubevirt` (inside the
    /// management cluster) or `proxmox` (an external Proxmox VE cluster).
    /// The control plane is Kamaji either way. Must match the substrate of
    /// every KubernetesNodes pool of the cluster. Immutable: to switch,
    /// create a new cluster.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("substrate is immutable: an existing cluster cannot switch between kubevirt and proxmox; create a new cluster").reason(Reason::FieldValueForbidden))]
    pub substrate: Substrate,

    /// Proxmox substrate settings; only with substrate: proxmox, where
    /// ipv4Config and dnsServers are required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxmox: Option<ProxmoxSettings>,

    /// The Kamaji control plane: replicas, per-component resources, extra
    /// apiserver flags and volumes, kubelet connection settings.
    #[serde(default)]
    pub control_plane: ControlPlane,

    /// Image overrides for air-gapped or rate-limited registries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Images>,

    /// The Talos Linux image the workers run. Must be a Talos release that
    /// supports the chosen Kubernetes version.
    #[serde(default)]
    pub talos: TalosSettings,

    /// OIDC authentication and per-user RBAC for the tenant kube-apiserver.
    #[serde(default)]
    pub oidc: Oidc,

    /// Cluster addons. Stored and validated; rendered by a later release.
    #[serde(default)]
    pub addons: Addons,

    /// Removed: worker pools are `KubernetesNodes` objects now. Still
    /// accepted and stored, with no effect; the API answers with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub node_groups: Option<Value>,

    /// Removed: health checks are set per `KubernetesNodes` pool. Still
    /// accepted and stored, with no effect; the API answers with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub node_health_check: Option<Value>,

    /// Removed: set per `KubernetesNodes` pool. Still accepted and stored,
    /// with no effect; the API answers with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_node_provision_time: Option<String>,
}

impl Default for KubernetesSpec {
    fn default() -> Self {
        Self {
            storage_class: default_storage_class(),
            version: KubernetesVersion::default(),
            host: None,
            substrate: Substrate::default(),
            proxmox: None,
            control_plane: ControlPlane::default(),
            images: None,
            talos: TalosSettings::default(),
            oidc: Oidc::default(),
            addons: Addons::default(),
            node_groups: None,
            node_health_check: None,
            max_node_provision_time: None,
        }
    }
}

fn default_storage_class() -> String {
    DEFAULT_STORAGE_CLASS.to_string()
}

/// Kubernetes minor versions a tenant cluster can run.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[schemars(transform = enum_described_by_field)]
pub enum KubernetesVersion {
    /// Kubernetes 1.31.
    #[serde(rename = "v1.31")]
    V1_31,
    /// Kubernetes 1.32.
    #[serde(rename = "v1.32")]
    V1_32,
    /// Kubernetes 1.33.
    #[serde(rename = "v1.33")]
    V1_33,
    /// Kubernetes 1.34.
    #[serde(rename = "v1.34")]
    V1_34,
    /// Kubernetes 1.35.
    #[default]
    #[serde(rename = "v1.35")]
    V1_35,
}

impl KubernetesVersion {
    /// Every supported minor, oldest first.
    pub const ALL: [Self; 5] = [
        Self::V1_31,
        Self::V1_32,
        Self::V1_33,
        Self::V1_34,
        Self::V1_35,
    ];

    /// The minor number: 31 for v1.31.
    pub fn minor(self) -> u32 {
        match self {
            Self::V1_31 => 31,
            Self::V1_32 => 32,
            Self::V1_33 => 33,
            Self::V1_34 => 34,
            Self::V1_35 => 35,
        }
    }

    /// How the API spells it: `v1.35`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_31 => "v1.31",
            Self::V1_32 => "v1.32",
            Self::V1_33 => "v1.33",
            Self::V1_34 => "v1.34",
            Self::V1_35 => "v1.35",
        }
    }

    /// The patch release the control plane and the kubelets run for this
    /// minor: the patches the Cozystack chart pins (`files/versions.yaml`),
    /// so a cluster moved from the platform's chart keeps its version.
    pub fn pinned_patch(self) -> &'static str {
        match self {
            Self::V1_31 => "v1.31.14",
            Self::V1_32 => "v1.32.13",
            Self::V1_33 => "v1.33.13",
            Self::V1_34 => "v1.34.9",
            Self::V1_35 => "v1.35.6",
        }
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Infrastructure providers for the worker VMs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = enum_described_by_field)]
#[serde(rename_all = "lowercase")]
pub enum Substrate {
    /// KubeVirt virtual machines in the management cluster.
    #[default]
    Kubevirt,
    /// Virtual machines cloned on an external Proxmox VE cluster.
    Proxmox,
}

impl Substrate {
    /// How the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubevirt => "kubevirt",
            Self::Proxmox => "proxmox",
        }
    }
}

// ---------------------------------------------------------------------------
// Proxmox
// ---------------------------------------------------------------------------

/// The cluster-wide half of the Proxmox substrate: the ProxmoxCluster's
/// placement and addresses, and the Proxmox CCM and CSI driver that run in
/// this namespace. The pool each worker is cloned into is set per
/// KubernetesNodes pool (`proxmox.pool`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxSettings {
    /// Secret in this namespace with the Proxmox VE API token tenantry
    /// creates and deletes the workers with (keys url, token_id,
    /// token_secret, as for a ProxmoxCluster's credentialsRef);
    /// `proxmox-credentials` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret_name: Option<String>,
    /// Proxmox nodes worker VMs may be placed on. Empty means every node of
    /// the Proxmox cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub allowed_nodes: Vec<String>,
    /// Nameservers written into each worker's network configuration.
    /// Required with substrate: proxmox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 253)))]
    pub dns_servers: Vec<String>,
    /// Skip verification of the Proxmox API server certificate in the CCM and
    /// the CSI controller. Default false; a stock Proxmox VE install serves a
    /// self-signed certificate, so either set true for it or install a
    /// certificate the management cluster trusts.
    #[serde(default)]
    pub insecure: bool,
    /// Address pool for the workers. capmox assigns static addresses and has
    /// no DHCP mode, so it is required with substrate: proxmox.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "ipv4Config"
    )]
    pub ipv4_config: Option<ProxmoxIpv4Config>,
    /// Proxmox cloud-controller-manager settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ccm: Option<ProxmoxCcm>,
    /// Proxmox CSI driver settings; the driver is installed unless
    /// `enabled: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi: Option<ProxmoxCsi>,
}

/// The workers' IPv4 address pool on Proxmox.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxIpv4Config {
    /// Ranges or CIDRs, e.g. `10.0.0.120-10.0.0.170`. They must not overlap a
    /// DHCP range on the same L2 network, or two workers answer to one
    /// address.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 64)))]
    pub addresses: Vec<String>,
    /// Default gateway of the workers.
    #[schemars(length(min = 1, max = 64))]
    pub gateway: String,
    /// Netmask prefix length; 24 by default.
    #[serde(default = "default_ipv4_prefix")]
    #[schemars(range(min = 1, max = 32))]
    pub prefix: i32,
}

fn default_ipv4_prefix() -> i32 {
    24
}

/// Proxmox cloud-controller-manager settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxCcm {
    /// Secret in this namespace holding the controller's Proxmox API
    /// credentials under the keys url, token_id, token_secret and region. May
    /// name the same Secret as csi.credentialsSecretName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret_name: Option<String>,
}

/// Proxmox CSI driver settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxCsi {
    /// Install the driver; true by default. Without it a Proxmox-backed
    /// tenant cannot provision PersistentVolumes.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Secret in this namespace holding the driver's Proxmox API credentials
    /// under the keys url, token_id, token_secret and region. Nothing of it
    /// reaches the tenant cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret_name: Option<String>,
    /// StorageClasses to create in the tenant cluster; names are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(c, self.exists_one(d, d.name == c.name))").message("proxmox.csi.storageClasses names must be unique").reason(Reason::FieldValueInvalid))]
    pub storage_classes: Vec<ProxmoxStorageClass>,
}

impl Default for ProxmoxCsi {
    fn default() -> Self {
        Self {
            enabled: true,
            credentials_secret_name: None,
            storage_classes: Vec::new(),
        }
    }
}

fn default_true() -> bool {
    true
}

/// A StorageClass in the tenant cluster backed by a Proxmox storage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxStorageClass {
    /// StorageClass name inside the tenant cluster.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Proxmox storage id the volumes are created on, as `pvesm status`
    /// shows it.
    #[schemars(length(min = 1, max = 64))]
    pub storage: String,
    /// Filesystem the driver formats volumes with: ext4 or xfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fstype: Option<Filesystem>,
    /// Mark volumes as SSD-backed, which changes the discard and cache
    /// defaults Proxmox applies.
    #[serde(default)]
    pub ssd: bool,
    /// Delete or Retain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,
}

/// Filesystems the Proxmox CSI driver formats.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(transform = enum_described_by_field)]
#[serde(rename_all = "lowercase")]
pub enum Filesystem {
    /// ext4.
    Ext4,
    /// XFS.
    Xfs,
}

/// What happens to a volume when its claim is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(transform = enum_described_by_field)]
pub enum ReclaimPolicy {
    /// The disk is deleted with the PersistentVolume.
    Delete,
    /// The disk is kept.
    Retain,
}

// ---------------------------------------------------------------------------
// Control plane
// ---------------------------------------------------------------------------

/// The Kamaji control plane of the tenant cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlane {
    /// Number of control-plane replicas (pods running apiserver, controller
    /// manager and scheduler); 2 by default.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 16))]
    pub replicas: i32,
    /// The kube-apiserver.
    #[serde(default)]
    pub api_server: ApiServer,
    /// The kube-controller-manager.
    #[serde(default)]
    pub controller_manager: ControlPlaneComponent,
    /// The kube-scheduler.
    #[serde(default)]
    pub scheduler: ControlPlaneComponent,
    /// Konnectivity, the tunnel from the control plane to the workers.
    #[serde(default)]
    pub konnectivity: Konnectivity,
    /// How the kube-apiserver reaches kubelets.
    #[serde(default)]
    pub kubelet: KubeletConnection,
}

impl Default for ControlPlane {
    fn default() -> Self {
        Self {
            replicas: default_replicas(),
            api_server: ApiServer::default(),
            controller_manager: ControlPlaneComponent::default(),
            scheduler: ControlPlaneComponent::default(),
            konnectivity: Konnectivity::default(),
            kubelet: KubeletConnection::default(),
        }
    }
}

fn default_replicas() -> i32 {
    2
}

/// The kube-apiserver of the tenant cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.extraVolumeMounts) || self.extraVolumeMounts.all(m, has(self.extraVolumes) && self.extraVolumes.exists(v, v.name == m.name))").message("every extraVolumeMounts name must be the name of an extraVolumes entry; the control plane's own volumes (talos-ca, talos-tls-cert, authentication-config) cannot be mounted").field_path(".extraVolumeMounts").reason(Reason::FieldValueInvalid))]
pub struct ApiServer {
    /// CPU and memory of each apiserver container. Whatever is left unset is
    /// taken from resourcesPreset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ComponentResources>,
    /// Named size used for the resources left unset; c1.medium (2 CPU, 2Gi)
    /// by default.
    #[serde(default = "api_server_preset")]
    pub resources_preset: ResourcesPreset,
    /// Extra command-line flags for the tenant kube-apiserver, passed through
    /// to the KamajiControlPlane's spec.apiServer.extraArgs, each entry as
    /// written (`--name=value`, or `--name` followed by its value). For OIDC
    /// use spec.oidc; this is the escape hatch for unrelated flags. The
    /// control plane sets these flags itself, so an entry naming one is
    /// refused: --advertise-address, --client-ca-file,
    /// --enable-admission-plugins, --service-cluster-ip-range,
    /// --kubelet-client-certificate, --kubelet-client-key,
    /// --kubelet-preferred-address-types, --proxy-client-cert-file,
    /// --proxy-client-key-file, --requestheader-allowed-names,
    /// --requestheader-client-ca-file, --secure-port,
    /// --service-account-key-file, --service-account-signing-key-file,
    /// --tls-cert-file, --tls-private-key-file, --etcd-servers,
    /// --etcd-cafile, --etcd-certfile, --etcd-keyfile, --etcd-prefix,
    /// --etcd-compaction-interval, --egress-selector-config-file. Two of them
    /// have a field instead, and an entry written as --flag=value moves into
    /// it while the field is empty: --enable-admission-plugins into
    /// admissionControllers, --kubelet-preferred-address-types into
    /// controlPlane.kubelet.preferredAddressTypes. Also refused: one kube
    /// feature gate spelled both bare and kube:-prefixed, two
    /// --emulated-version entries for kube, and --oidc-* or
    /// --authentication-config while spec.oidc.mode is not None.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 4096)))]
    pub extra_args: Vec<String>,
    /// Admission plugins the tenant kube-apiserver enables, passed to the
    /// KamajiControlPlane's spec.admissionControllers (rendered as
    /// --enable-admission-plugins). A non-empty list replaces the control
    /// plane's default set: CertificateApproval, CertificateSigning,
    /// CertificateSubjectRestriction, DefaultIngressClass,
    /// DefaultStorageClass, DefaultTolerationSeconds, LimitRanger,
    /// MutatingAdmissionWebhook, NamespaceLifecycle,
    /// PersistentVolumeClaimResize, Priority, ResourceQuota, RuntimeClass,
    /// ServiceAccount, StorageObjectInUseProtection, TaintNodesByCondition,
    /// ValidatingAdmissionWebhook (NodeRestriction is not in it). The
    /// apiserver also keeps its own defaults, so leaving a plugin out does
    /// not turn it off: name it in --disable-admission-plugins in extraArgs
    /// and keep it out of this list (and out of the default set, by listing
    /// the plugins you want here). Only the names the KamajiControlPlane
    /// accepts, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = admission_plugin_items)]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q == p))").message("admissionControllers must name each plugin once").reason(Reason::FieldValueInvalid))]
    pub admission_controllers: Vec<String>,
    /// Extra volumes of the control-plane pods, passed to the
    /// KamajiControlPlane's spec.deployment.extraVolumes; for example a
    /// ConfigMap or Secret holding a file an extraArgs flag reads. Each is a
    /// core/v1 Volume with a unique DNS-label name and exactly one source,
    /// which must be configMap or secret: the pods run on the management
    /// cluster. The names talos-ca and talos-tls-cert are reserved, and
    /// authentication-config too while spec.oidc.mode is not None.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = extra_volume_items)]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w.name == v.name))").message("extraVolumes names must be unique").reason(Reason::FieldValueInvalid))]
    pub extra_volumes: Vec<Volume>,
    /// Extra mounts of the kube-apiserver container, passed to the
    /// KamajiControlPlane's spec.apiServer.extraVolumeMounts. Each is a
    /// core/v1 VolumeMount whose name is one of extraVolumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = volume_mount_items)]
    pub extra_volume_mounts: Vec<VolumeMount>,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self {
            resources: None,
            resources_preset: api_server_preset(),
            extra_args: Vec::new(),
            admission_controllers: Vec::new(),
            extra_volumes: Vec::new(),
            extra_volume_mounts: Vec::new(),
        }
    }
}

fn api_server_preset() -> ResourcesPreset {
    ResourcesPreset::API_SERVER_DEFAULT
}

/// Resources of a control-plane component other than the apiserver.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneComponent {
    /// CPU and memory of each container. Whatever is left unset is taken
    /// from resourcesPreset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ComponentResources>,
    /// Named size used for the resources left unset; t1.micro (500m,
    /// 256Mi) by default.
    #[serde(default)]
    pub resources_preset: ResourcesPreset,
}

impl Default for ControlPlaneComponent {
    fn default() -> Self {
        Self {
            resources: None,
            resources_preset: ResourcesPreset::COMPONENT_DEFAULT,
        }
    }
}

/// Konnectivity settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Konnectivity {
    /// The konnectivity server next to each apiserver.
    #[serde(default)]
    pub server: ControlPlaneComponent,
}

/// How the tenant kube-apiserver connects to kubelets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConnection {
    /// Node address types the kube-apiserver tries, in order, when it
    /// connects to a kubelet; passed to the KamajiControlPlane's
    /// spec.kubelet.preferredAddressTypes (rendered as
    /// --kubelet-preferred-address-types). Each type once. Empty means
    /// InternalIP, ExternalIP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = address_type_items)]
    #[x_kube(validation = Rule::new("self.all(t, self.exists_one(u, u == t))").message("preferredAddressTypes must name each address type once").reason(Reason::FieldValueInvalid))]
    pub preferred_address_types: Vec<String>,
}

/// Explicit CPU and memory of a control-plane container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentResources {
    /// CPU, e.g. 500m or 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub cpu: Option<Quantity>,
    /// Memory, e.g. 512Mi or 4Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub memory: Option<Quantity>,
}

/// A Kubernetes quantity (the pattern apimachinery parses).
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// CPU and memory of one container.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceAmounts {
    /// CPU.
    pub cpu: Quantity,
    /// Memory.
    pub memory: Quantity,
}

impl ComponentResources {
    /// The resources a component gets: each one set here, the preset's
    /// otherwise.
    pub fn or_preset(resources: Option<&Self>, preset: ResourcesPreset) -> ResourceAmounts {
        let from_preset = preset.resources();
        ResourceAmounts {
            cpu: resources
                .and_then(|r| r.cpu.clone())
                .unwrap_or(from_preset.cpu),
            memory: resources
                .and_then(|r| r.memory.clone())
                .unwrap_or(from_preset.memory),
        }
    }
}

// ---------------------------------------------------------------------------
// Resource presets
// ---------------------------------------------------------------------------

/// A named CPU and memory size: `<series>.<size>` (series t1, c1, s1, u1, m1
/// give 0.5, 1, 2, 4 and 8 GiB of memory per CPU; sizes nano 250m, micro
/// 500m, small 1, medium 2, large 4, xlarge 8, 2xlarge 16, 4xlarge 32 CPUs),
/// or one of the older plain sizes nano (250m, 128Mi), micro (500m, 256Mi),
/// small (1, 512Mi), medium (1, 1Gi), large (2, 2Gi), xlarge (4, 4Gi),
/// 2xlarge (8, 8Gi).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(try_from = "String", into = "String")]
pub struct ResourcesPreset {
    series: Option<PresetSeries>,
    size: PresetSize,
}

/// The memory-per-CPU families of the presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PresetSeries {
    T1,
    C1,
    S1,
    U1,
    M1,
}

impl PresetSeries {
    const ALL: [Self; 5] = [Self::T1, Self::C1, Self::S1, Self::U1, Self::M1];

    fn name(self) -> &'static str {
        match self {
            Self::T1 => "t1",
            Self::C1 => "c1",
            Self::S1 => "s1",
            Self::U1 => "u1",
            Self::M1 => "m1",
        }
    }

    fn memory_mib_per_cpu(self) -> u64 {
        match self {
            Self::T1 => 512,
            Self::C1 => 1024,
            Self::S1 => 2048,
            Self::U1 => 4096,
            Self::M1 => 8192,
        }
    }
}

/// The sizes of the presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PresetSize {
    Nano,
    Micro,
    Small,
    Medium,
    Large,
    Xlarge,
    Xlarge2,
    Xlarge4,
}

impl PresetSize {
    const ALL: [Self; 8] = [
        Self::Nano,
        Self::Micro,
        Self::Small,
        Self::Medium,
        Self::Large,
        Self::Xlarge,
        Self::Xlarge2,
        Self::Xlarge4,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Nano => "nano",
            Self::Micro => "micro",
            Self::Small => "small",
            Self::Medium => "medium",
            Self::Large => "large",
            Self::Xlarge => "xlarge",
            Self::Xlarge2 => "2xlarge",
            Self::Xlarge4 => "4xlarge",
        }
    }

    /// CPU of a series preset, in millicores.
    fn series_millicpu(self) -> u64 {
        match self {
            Self::Nano => 250,
            Self::Micro => 500,
            Self::Small => 1_000,
            Self::Medium => 2_000,
            Self::Large => 4_000,
            Self::Xlarge => 8_000,
            Self::Xlarge2 => 16_000,
            Self::Xlarge4 => 32_000,
        }
    }

    /// CPU (millicores) and memory (MiB) of a plain preset; there is no
    /// plain 4xlarge.
    fn plain(self) -> Option<(u64, u64)> {
        match self {
            Self::Nano => Some((250, 128)),
            Self::Micro => Some((500, 256)),
            Self::Small => Some((1_000, 512)),
            Self::Medium => Some((1_000, 1_024)),
            Self::Large => Some((2_000, 2_048)),
            Self::Xlarge => Some((4_000, 4_096)),
            Self::Xlarge2 => Some((8_000, 8_192)),
            Self::Xlarge4 => None,
        }
    }
}

impl ResourcesPreset {
    /// The apiserver's default, c1.medium.
    pub const API_SERVER_DEFAULT: Self = Self {
        series: Some(PresetSeries::C1),
        size: PresetSize::Medium,
    };
    /// The other components' default, t1.micro.
    pub const COMPONENT_DEFAULT: Self = Self {
        series: Some(PresetSeries::T1),
        size: PresetSize::Micro,
    };

    /// Every preset, series presets first.
    pub fn all() -> Vec<Self> {
        let series = PresetSeries::ALL.into_iter().flat_map(|series| {
            PresetSize::ALL.into_iter().map(move |size| Self {
                series: Some(series),
                size,
            })
        });
        let plain = PresetSize::ALL
            .into_iter()
            .filter(|size| size.plain().is_some())
            .map(|size| Self { series: None, size });
        series.chain(plain).collect()
    }

    /// The preset's CPU and memory (container limits; the controller derives
    /// requests from them).
    pub fn resources(self) -> ResourceAmounts {
        let (millicpu, memory_mib) = match self.series {
            Some(series) => {
                let millicpu = self.size.series_millicpu();
                (millicpu, millicpu * series.memory_mib_per_cpu() / 1_000)
            }
            None => self
                .size
                .plain()
                .expect("plain presets are built only for sizes with a plain row"),
        };
        ResourceAmounts {
            cpu: Quantity(if millicpu % 1_000 == 0 {
                (millicpu / 1_000).to_string()
            } else {
                format!("{millicpu}m")
            }),
            memory: Quantity(if memory_mib % 1_024 == 0 {
                format!("{}Gi", memory_mib / 1_024)
            } else {
                format!("{memory_mib}Mi")
            }),
        }
    }
}

impl Default for ResourcesPreset {
    fn default() -> Self {
        Self::COMPONENT_DEFAULT
    }
}

impl fmt::Display for ResourcesPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.series {
            Some(series) => write!(f, "{}.{}", series.name(), self.size.name()),
            None => f.write_str(self.size.name()),
        }
    }
}

/// A name that is not a preset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPreset(pub String);

impl fmt::Display for UnknownPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a resources preset; use <series>.<size> (series t1, c1, s1, u1, m1; sizes nano to 4xlarge) or nano to 2xlarge",
            self.0
        )
    }
}

impl std::error::Error for UnknownPreset {}

impl FromStr for ResourcesPreset {
    type Err = UnknownPreset;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::all()
            .into_iter()
            .find(|preset| preset.to_string() == name)
            .ok_or_else(|| UnknownPreset(name.to_string()))
    }
}

impl TryFrom<String> for ResourcesPreset {
    type Error = UnknownPreset;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl From<ResourcesPreset> for String {
    fn from(preset: ResourcesPreset) -> Self {
        preset.to_string()
    }
}

impl JsonSchema for ResourcesPreset {
    fn schema_name() -> Cow<'static, str> {
        "ResourcesPreset".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<String> = Self::all().iter().map(ToString::to_string).collect();
        json_schema!({ "type": "string", "enum": names })
    }
}

// ---------------------------------------------------------------------------
// Images, Talos
// ---------------------------------------------------------------------------

/// Image overrides.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Images {
    /// Image of the talos-csr-signer sidecar in the control-plane pods (the
    /// Talos trustd the workers get their apid certificate from). Empty
    /// means tenantry's pinned default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^[^\\\\s]+$')").message("images.talosCsrSigner must be an image reference without whitespace, e.g. registry.example.org/talos-csr-signer:v1"))]
    pub talos_csr_signer: Option<String>,
}

/// The Talos Linux image the workers boot and install.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosSettings {
    /// Talos release of the worker OS image and installer, e.g. v1.13.6.
    /// Its minor must support spec.version (Talos v1.13 supports Kubernetes
    /// v1.31 to v1.36).
    #[serde(default = "default_talos_version")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+(-[0-9A-Za-z.-]+)?$')").message("talos.version must be a Talos release such as v1.13.6"))]
    pub version: String,
    /// Image factory schematic ID: 64 lowercase hexadecimal characters. The
    /// default carries the siderolabs/qemu-guest-agent system extension and
    /// nothing else; use your own for other extensions or kernel arguments.
    #[serde(rename = "schematicID", default = "default_talos_schematic_id")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("talos.schematicID must be 64 lowercase hexadecimal characters"))]
    pub schematic_id: String,
    /// Base URL of the Talos image factory that serves the worker disk
    /// image; a self-hosted factory, a caching mirror or an internal HTTP
    /// server work too. No trailing slash. When unset at creation, tenantry's
    /// admission webhook fills in the platform's default (the manager's
    /// --talos-image-factory-url, https://factory.talos.dev unless the
    /// platform configured another), so the object shows what the workers
    /// boot from.
    #[serde(
        rename = "imageFactoryURL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.endsWith('/')").message("talos.imageFactoryURL must not end with a slash, e.g. https://factory.talos.dev"))]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("talos.imageFactoryURL must be an http:// or https:// URL"))]
    pub image_factory_url: Option<String>,
    /// OCI repository prefix of the Talos installer image, resolved as
    /// `<installerRepository>/<schematicID>:<version>`. No scheme, no
    /// trailing slash.
    #[serde(default = "default_installer_repository")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.endsWith('/')").message("talos.installerRepository must not end with a slash, e.g. factory.talos.dev/installer"))]
    #[x_kube(validation = Rule::new("!self.contains('://')").message("talos.installerRepository is an image repository without a scheme, e.g. registry.example.org/installer"))]
    pub installer_repository: String,
    /// Talos machine.registries.mirrors for the workers: upstream registry
    /// host to mirror endpoints. Workers still fall back to the upstream
    /// registry unless a host sets skipFallback: true.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub registry_mirrors: BTreeMap<String, RegistryMirror>,
}

impl TalosSettings {
    /// The image factory the workers boot from: `imageFactoryURL`, or
    /// `default` (the manager's) for an object stored without it, which
    /// happens only when it bypassed the admission webhook.
    pub fn image_factory_url_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.image_factory_url.as_deref().unwrap_or(default)
    }
}

impl Default for TalosSettings {
    fn default() -> Self {
        Self {
            version: default_talos_version(),
            schematic_id: default_talos_schematic_id(),
            image_factory_url: None,
            installer_repository: default_installer_repository(),
            registry_mirrors: BTreeMap::new(),
        }
    }
}

fn default_talos_version() -> String {
    DEFAULT_TALOS_VERSION.to_string()
}

fn default_talos_schematic_id() -> String {
    DEFAULT_TALOS_SCHEMATIC_ID.to_string()
}

fn default_installer_repository() -> String {
    DEFAULT_TALOS_INSTALLER_REPOSITORY.to_string()
}

/// Mirrors of one upstream registry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryMirror {
    /// Mirror endpoints, tried in order, e.g. http://registry-mirror:5000.
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 512)))]
    pub endpoints: Vec<String>,
    /// Send the image path unchanged (no /v2/ prefix) to the mirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub override_path: Option<bool>,
    /// Never fall back to the upstream registry; what an air gap needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_fallback: Option<bool>,
}

// ---------------------------------------------------------------------------
// OIDC
// ---------------------------------------------------------------------------

/// OIDC authentication for the tenant kube-apiserver.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode != 'CustomConfig' || (has(self.customConfig) && ((has(self.customConfig.config) && size(self.customConfig.config) > 0) || (has(self.customConfig.secretRef) && has(self.customConfig.secretRef.name) && size(self.customConfig.secretRef.name) > 0)))").message("oidc.mode CustomConfig needs oidc.customConfig.config (an inline AuthenticationConfiguration) or oidc.customConfig.secretRef.name (a Secret with a config.yaml key)").field_path(".customConfig").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!has(self.customConfig) || !(has(self.customConfig.config) && size(self.customConfig.config) > 0 && has(self.customConfig.secretRef) && has(self.customConfig.secretRef.name) && size(self.customConfig.secretRef.name) > 0)").message("oidc.customConfig.config and oidc.customConfig.secretRef.name are mutually exclusive: set one of them").field_path(".customConfig").reason(Reason::FieldValueForbidden))]
pub struct Oidc {
    /// None: no OIDC, only the admin kubeconfig works. System: trust the
    /// platform's identity provider. CustomConfig: trust the issuer of a
    /// tenant-supplied AuthenticationConfiguration.
    #[serde(default)]
    pub mode: OidcMode,
    /// The tenant-supplied AuthenticationConfiguration, used with mode
    /// CustomConfig: exactly one of config or secretRef.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_config: Option<OidcCustomConfig>,
    /// Users granted access; each becomes one ClusterRoleBinding in the
    /// tenant cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub users: Vec<OidcUser>,
}

/// Identity modes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = enum_described_by_field)]
pub enum OidcMode {
    /// No OIDC.
    #[default]
    None,
    /// The platform's identity provider.
    System,
    /// A tenant-supplied AuthenticationConfiguration.
    CustomConfig,
}

/// A tenant-supplied AuthenticationConfiguration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcCustomConfig {
    /// Inline AuthenticationConfiguration YAML
    /// (apiserver.config.k8s.io/v1beta1), written verbatim into a Secret
    /// mounted on the kube-apiserver. Mutually exclusive with secretRef.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1048576))]
    pub config: Option<String>,
    /// An existing Secret in this namespace whose config.yaml key holds the
    /// AuthenticationConfiguration. Mutually exclusive with config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<OidcSecretRef>,
}

/// A Secret in the cluster's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcSecretRef {
    /// The Secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
}

/// A user of the tenant cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcUser {
    /// Email claim of the user, used verbatim as the User subject of the
    /// ClusterRoleBinding.
    #[schemars(length(min = 1, max = 320))]
    pub email: String,
    /// admin (ClusterRole cluster-admin) or view (ClusterRole view).
    pub role: OidcRole,
}

/// Roles a user can be bound to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = enum_described_by_field)]
#[serde(rename_all = "lowercase")]
pub enum OidcRole {
    /// ClusterRole cluster-admin.
    Admin,
    /// ClusterRole view.
    #[default]
    View,
}

// ---------------------------------------------------------------------------
// Addons
// ---------------------------------------------------------------------------

/// Cluster addons. Each optional block is off unless `enabled: true`;
/// valuesOverride is deep-merged into the addon's Helm values.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.hami) && has(self.hami.enabled) && self.hami.enabled) || (has(self.gpuOperator) && has(self.gpuOperator.enabled) && self.gpuOperator.enabled)").message("addons.hami needs addons.gpuOperator.enabled: true (HAMi virtualises the GPUs the GPU Operator exposes)").field_path(".hami").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!(has(self.ouroboros) && has(self.ouroboros.enabled) && self.ouroboros.enabled) || (has(self.ingressNginx) && has(self.ingressNginx.enabled) && self.ingressNginx.enabled)").message("addons.ouroboros needs addons.ingressNginx.enabled: true (it fixes hairpin NAT for ingress-nginx with PROXY protocol; without ingress-nginx there is nothing to fix)").field_path(".ouroboros").reason(Reason::FieldValueInvalid))]
pub struct Addons {
    /// cert-manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_manager: Option<Addon>,
    /// Cilium, always installed as the CNI; only its values can be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cilium: Option<AddonValues>,
    /// CoreDNS, always installed; only its values can be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coredns: Option<AddonValues>,
    /// Gateway API CRDs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "gatewayAPI"
    )]
    pub gateway_api: Option<GatewayApiAddon>,
    /// ingress-nginx; schedules on the workers of a KubernetesNodes pool
    /// with the role ingress-nginx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_nginx: Option<IngressNginxAddon>,
    /// NVIDIA GPU Operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_operator: Option<Addon>,
    /// HAMi GPU virtualisation; needs gpuOperator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hami: Option<Addon>,
    /// Monitoring agents (with the Vertical Pod Autoscaler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring_agents: Option<Addon>,
    /// Vertical Pod Autoscaler, installed and removed with monitoringAgents;
    /// only its values can be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertical_pod_autoscaler: Option<AddonValues>,
    /// Velero backup and restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub velero: Option<Addon>,
    /// Ouroboros, the hairpin-NAT fix for ingress-nginx with PROXY protocol;
    /// needs ingressNginx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ouroboros: Option<Addon>,
}

/// An addon that can be turned on, with Helm value overrides.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Addon {
    /// Install the addon; false by default.
    #[serde(default)]
    pub enabled: bool,
    /// Helm values deep-merged over tenantry's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub values_override: Option<Value>,
}

/// An addon that is always installed; only its Helm values can change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonValues {
    /// Helm values deep-merged over tenantry's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub values_override: Option<Value>,
}

/// The Gateway API CRDs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayApiAddon {
    /// Install the CRDs; false by default.
    #[serde(default)]
    pub enabled: bool,
}

/// The ingress-nginx controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressNginxAddon {
    /// Install the controller; false by default. It runs on the workers of
    /// a KubernetesNodes pool with the role ingress-nginx.
    #[serde(default)]
    pub enabled: bool,
    /// Proxied (the default: the platform's ingress forwards the hosts below)
    /// or LoadBalancer.
    #[serde(default)]
    pub expose_method: ExposeMethod,
    /// Domains routed to this cluster when exposeMethod is Proxied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub hosts: Vec<String>,
    /// Helm values deep-merged over tenantry's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub values_override: Option<Value>,
}

/// How the ingress controller is reached.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = enum_described_by_field)]
pub enum ExposeMethod {
    /// Through the platform's ingress, for the listed hosts.
    #[default]
    Proxied,
    /// A LoadBalancer Service.
    LoadBalancer,
}

// ---------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------

/// Observed state of a tenant cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesStatus {
    /// Conditions: `EtcdReady`, `ControlPlaneReady`, `WorkloadsReady` (the
    /// control plane only; worker health is on each KubernetesNodes pool)
    /// and `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// URL of the tenant kube-apiserver, as admin.conf has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The Secret with the admin kubeconfigs (keys admin.conf, admin.svc,
    /// super-admin.conf, super-admin.svc), once it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_kubeconfig_secret_name: Option<String>,
    /// The Kubernetes release the control plane runs, e.g. v1.35.4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

// ---------------------------------------------------------------------------
// Schema helpers
// ---------------------------------------------------------------------------

/// A field's doc comment describes its enum; the variants' docs stay in Rust.
fn enum_described_by_field(schema: &mut Schema) {
    schema.remove("description");
}

/// A free-form object the apiserver stores as given.
fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// Longest name a volume may have (a DNS label); bounded so the CEL rules
/// comparing names stay within the apiserver's cost limits.
const MAX_VOLUME_NAME_LENGTH: u64 = 63;

/// The items of a list of strings are one of `values`, and the list is no
/// longer than `values` (a CEL rule on the field refuses repeats).
fn string_enum_items(schema: &mut Schema, values: &[&str]) {
    let longest = values.iter().map(|v| v.len()).max().unwrap_or(0);
    schema.insert("maxItems".into(), values.len().into());
    schema.insert(
        "items".into(),
        serde_json::json!({ "type": "string", "enum": values, "maxLength": longest }),
    );
}

fn admission_plugin_items(schema: &mut Schema) {
    string_enum_items(schema, ADMISSION_PLUGINS);
}

fn address_type_items(schema: &mut Schema) {
    string_enum_items(schema, NODE_ADDRESS_TYPES);
}

/// The volume a list item describes: a bounded name, and the rules about its
/// source. core/v1 Volume inlines every source as a property, so the source
/// list is taken from the schema itself and stays right across Kubernetes
/// versions.
fn extra_volume_items(schema: &mut Schema) {
    let Some(items) = schema.get_mut("items").and_then(Value::as_object_mut) else {
        return;
    };
    let mut sources: Vec<String> = items
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .keys()
                .filter(|name| name.as_str() != "name")
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    sources.sort();
    if let Some(name) = items
        .get_mut("properties")
        .and_then(|p| p.get_mut("name"))
        .and_then(Value::as_object_mut)
    {
        name.insert("maxLength".into(), MAX_VOLUME_NAME_LENGTH.into());
    }
    let has_sources = sources
        .iter()
        .map(|source| format!("has(self.{source})"))
        .collect::<Vec<_>>()
        .join(", ");
    let reserved = RESERVED_VOLUME_NAMES
        .iter()
        .map(|name| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let rules = [
        Rule::new("self.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
            .message("extraVolumes name must be a DNS label: 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit")
            .field_path(".name")
            .reason(Reason::FieldValueInvalid),
        Rule::new(format!("!(self.name in [{reserved}])"))
            .message("extraVolumes names talos-ca and talos-tls-cert are reserved for the control plane's Talos trust volumes; rename the volume")
            .field_path(".name")
            .reason(Reason::FieldValueForbidden),
        Rule::new(format!("[{has_sources}].exists_one(set, set)"))
            .message("each extraVolumes entry needs exactly one volume source")
            .reason(Reason::FieldValueInvalid),
        Rule::new("has(self.configMap) || has(self.secret)")
            .message("extraVolumes allow only configMap and secret sources: the control-plane pods run on the management cluster, so host-reaching and token-projecting sources are refused")
            .reason(Reason::FieldValueForbidden),
    ];
    let mut items_schema = Schema::from(items.clone());
    for rule in rules {
        kube::core::validate(&mut items_schema, rule).expect("a CEL rule serializes");
    }
    *items = items_schema
        .as_object()
        .cloned()
        .expect("an object schema stays an object");
}

fn volume_mount_items(schema: &mut Schema) {
    if let Some(name) = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(|properties| properties.get_mut("name"))
        .and_then(Value::as_object_mut)
    {
        name.insert("maxLength".into(), MAX_VOLUME_NAME_LENGTH.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    fn schema() -> Value {
        let crd = Kubernetes::crd();
        serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("schema"),
        )
        .expect("schema serializes")
    }

    #[test]
    fn every_minor_pins_a_patch_of_itself() {
        for version in KubernetesVersion::ALL {
            let patch = version.pinned_patch();
            assert!(
                patch.starts_with(&format!("{}.", version.as_str())),
                "{version} pins {patch}"
            );
        }
        assert_eq!(KubernetesVersion::default().pinned_patch(), "v1.35.6");
    }

    #[test]
    fn version_serializes_as_the_minor() {
        assert_eq!(json!(KubernetesVersion::V1_34), json!("v1.34"));
        let parsed: KubernetesVersion = serde_json::from_value(json!("v1.31")).unwrap();
        assert_eq!(parsed, KubernetesVersion::V1_31);
        assert!(serde_json::from_value::<KubernetesVersion>(json!("v1.30")).is_err());
    }

    #[test]
    fn presets_match_the_reference_table() {
        let table = [
            ("nano", "250m", "128Mi"),
            ("micro", "500m", "256Mi"),
            ("small", "1", "512Mi"),
            ("medium", "1", "1Gi"),
            ("large", "2", "2Gi"),
            ("xlarge", "4", "4Gi"),
            ("2xlarge", "8", "8Gi"),
            ("t1.micro", "500m", "256Mi"),
            ("t1.nano", "250m", "128Mi"),
            ("c1.medium", "2", "2Gi"),
            ("s1.small", "1", "2Gi"),
            ("u1.nano", "250m", "1Gi"),
            ("m1.4xlarge", "32", "256Gi"),
        ];
        for (name, cpu, memory) in table {
            let preset: ResourcesPreset = name.parse().unwrap();
            let resources = preset.resources();
            assert_eq!(
                (resources.cpu.0.as_str(), resources.memory.0.as_str()),
                (cpu, memory),
                "{name}"
            );
            assert_eq!(preset.to_string(), name);
        }
        assert_eq!(ResourcesPreset::all().len(), 5 * 8 + 7);
        assert!("4xlarge".parse::<ResourcesPreset>().is_err());
        assert!("c2.medium".parse::<ResourcesPreset>().is_err());
    }

    #[test]
    fn explicit_resources_win_over_the_preset_one_by_one() {
        let resources = ComponentResources {
            cpu: Some(Quantity("4000m".into())),
            memory: None,
        };
        let amounts =
            ComponentResources::or_preset(Some(&resources), ResourcesPreset::API_SERVER_DEFAULT);
        assert_eq!(amounts.cpu.0, "4000m");
        assert_eq!(amounts.memory.0, "2Gi");
        let amounts = ComponentResources::or_preset(None, ResourcesPreset::COMPONENT_DEFAULT);
        assert_eq!(
            (amounts.cpu.0, amounts.memory.0),
            ("500m".into(), "256Mi".into())
        );
    }

    #[test]
    fn an_empty_spec_takes_the_reference_defaults() {
        let spec: KubernetesSpec = serde_json::from_value(json!({})).unwrap();
        assert_eq!(spec, KubernetesSpec::default());
        assert_eq!(spec.storage_class, "replicated");
        assert_eq!(spec.version, KubernetesVersion::V1_35);
        assert_eq!(spec.substrate, Substrate::Kubevirt);
        assert_eq!(spec.control_plane.replicas, 2);
        assert_eq!(
            spec.control_plane.api_server.resources_preset.to_string(),
            "c1.medium"
        );
        assert_eq!(
            spec.control_plane.scheduler.resources_preset.to_string(),
            "t1.micro"
        );
        assert_eq!(spec.talos.version, "v1.13.6");
        // The manager's default, filled in at admission.
        assert_eq!(spec.talos.image_factory_url, None);
        assert_eq!(spec.oidc.mode, OidcMode::None);
    }

    #[test]
    fn the_schema_defaults_match_the_rust_defaults() {
        let schema = schema();
        let spec = &schema["properties"]["spec"]["properties"];
        assert_eq!(spec["storageClass"]["default"], json!("replicated"));
        assert_eq!(spec["version"]["default"], json!("v1.35"));
        assert_eq!(spec["substrate"]["default"], json!("kubevirt"));
        let control_plane = &spec["controlPlane"]["properties"];
        assert_eq!(control_plane["replicas"]["default"], json!(2));
        assert_eq!(
            control_plane["apiServer"]["properties"]["resourcesPreset"]["default"],
            json!("c1.medium")
        );
        assert_eq!(
            control_plane["konnectivity"]["properties"]["server"]["properties"]["resourcesPreset"]
                ["default"],
            json!("t1.micro")
        );
        assert_eq!(
            spec["talos"]["properties"]["installerRepository"]["default"],
            json!("factory.talos.dev/installer")
        );
    }

    #[test]
    fn the_image_factory_url_has_no_schema_default_and_keeps_its_rules() {
        // The manager's configured default is filled in by the mutating
        // webhook; a schema default would hide it behind the public factory.
        let schema = schema();
        let talos = &schema["properties"]["spec"]["properties"]["talos"];
        assert!(talos["default"].get("imageFactoryURL").is_none(), "{talos}");
        let url = &talos["properties"]["imageFactoryURL"];
        assert!(url.get("default").is_none(), "{url}");
        assert_eq!(url["maxLength"], json!(512));
        assert_eq!(
            url["x-kubernetes-validations"].as_array().map(Vec::len),
            Some(2)
        );
        let talos: TalosSettings = serde_json::from_value(json!({})).unwrap();
        assert_eq!(
            talos.image_factory_url_or("http://mirror:8080"),
            "http://mirror:8080"
        );
        assert!(
            serde_json::to_value(&talos)
                .unwrap()
                .get("imageFactoryURL")
                .is_none()
        );
        let talos = TalosSettings {
            image_factory_url: Some("https://factory.example.org".into()),
            ..TalosSettings::default()
        };
        assert_eq!(
            talos.image_factory_url_or("http://mirror:8080"),
            "https://factory.example.org"
        );
    }

    #[test]
    fn the_name_limit_is_a_root_rule() {
        let rules = &schema()["x-kubernetes-validations"];
        assert!(
            rules
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["rule"] == json!("size(self.metadata.name) <= 32")),
            "{rules}"
        );
        assert_eq!(MAX_CLUSTER_NAME_LENGTH, 32);
    }

    #[test]
    fn extra_volumes_rules_cover_every_volume_source() {
        let schema = schema();
        let items = &schema["properties"]["spec"]["properties"]["controlPlane"]["properties"]["apiServer"]
            ["properties"]["extraVolumes"]["items"];
        let sources: Vec<&String> = items["properties"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.as_str() != "name")
            .collect();
        assert!(sources.len() > 20, "{sources:?}");
        let exactly_one = items["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"].as_str().unwrap().contains("exists_one"))
            .expect("exactly-one-source rule");
        for source in sources {
            assert!(
                exactly_one["rule"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("has(self.{source})")),
                "{source} missing"
            );
        }
        assert_eq!(items["properties"]["name"]["maxLength"], json!(63));
    }

    #[test]
    fn the_extra_args_description_lists_every_owned_flag() {
        let schema = schema();
        let description = schema["properties"]["spec"]["properties"]["controlPlane"]["properties"]
            ["apiServer"]["properties"]["extraArgs"]["description"]
            .as_str()
            .unwrap()
            .to_string();
        for flag in CONTROL_PLANE_OWNED_FLAGS {
            assert!(description.contains(flag), "{flag} missing");
        }
    }

    #[test]
    fn admission_controllers_accept_only_kamaji_plugin_names() {
        let schema = schema();
        let items = &schema["properties"]["spec"]["properties"]["controlPlane"]["properties"]["apiServer"]
            ["properties"]["admissionControllers"]["items"];
        assert_eq!(items["enum"], json!(ADMISSION_PLUGINS));
        for plugin in DEFAULT_ADMISSION_PLUGINS {
            assert!(ADMISSION_PLUGINS.contains(plugin), "{plugin}");
        }
    }

    #[test]
    fn derived_names_follow_the_cluster_name() {
        assert_eq!(cluster_name("demo"), "kubernetes-demo");
        assert_eq!(
            admin_kubeconfig_secret_name("demo"),
            "kubernetes-demo-admin-kubeconfig"
        );
    }
}
