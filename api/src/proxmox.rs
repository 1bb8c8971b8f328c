//! The Proxmox VE substrate's kinds: `ProxmoxCluster`, `ProxmoxClusterTemplate`,
//! `ProxmoxMachine` and `ProxmoxMachineTemplate` in
//! `infrastructure.cluster.x-k8s.io/v1alpha2`, with the field names, shapes and
//! admission rules of cluster-api-provider-proxmox (capmox) v1alpha2, so capmox
//! manifests apply unchanged. Tenantry's additions are optional.
//!
//! Also the small pure rules the Proxmox reconcilers share: providerIDs, the
//! nodes a machine may be placed on, the clone source, and the InClusterIPPools
//! a cluster's address configuration becomes.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use k8s_openapi::api::core::v1::{LocalObjectReference, SecretReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::contract::{
    ApiEndpoint, ClusterInitialization, MachineAddress, MachineInitialization,
    MachineTemplateStatus, ObjectMetaTemplate,
};
use crate::generated::ipam::in_cluster_ip_pool::InClusterIpPoolSpec;

/// The finalizer on a ProxmoxMachine (capmox's name, so machines moved from
/// capmox keep being cleaned up).
pub const PROXMOX_MACHINE_FINALIZER: &str = "proxmoxmachine.infrastructure.cluster.x-k8s.io";
/// The finalizer on a ProxmoxCluster (capmox's name).
pub const PROXMOX_CLUSTER_FINALIZER: &str = "proxmoxcluster.infrastructure.cluster.x-k8s.io";
/// The finalizer on the credentials Secret a ProxmoxCluster references, so the
/// Secret outlives the machines that still need it (capmox's name).
pub const PROXMOX_CREDENTIALS_FINALIZER: &str =
    "proxmoxcluster.infrastructure.cluster.x-k8s.io/secret";

/// Scheme of a Proxmox machine's providerID: `proxmox://<SMBIOS uuid>`.
pub const PROVIDER_ID_PREFIX: &str = "proxmox://";

/// Label naming the Proxmox zone of an InClusterIPPool or a machine (capmox's key).
pub const PROXMOX_ZONE_LABEL: &str = "topology.kubernetes.io/proxmox-zone";
/// Annotation on an InClusterIPPool naming its family, `ipv4` or `ipv6`
/// (capmox's key, so pools made by capmox are recognised).
pub const IP_FAMILY_ANNOTATION: &str = "ipam.capmox.cluster.x-k8s.io/ip-family";
/// Annotation on an InClusterIPPool carrying the metric of its gateway route.
pub const GATEWAY_METRIC_ANNOTATION: &str = "ipam.capmox.cluster.x-k8s.io/gateway-metric";
/// The route metric of a gateway when `metric` is not set.
pub const DEFAULT_GATEWAY_METRIC: i32 = 100;
/// How long a released address stays reserved before the pool hands it out
/// again, so an old and a new node never answer to one address (capmox's value).
pub const ADDRESS_REUSE_GRACE_PERIOD_SECONDS: i32 = 60;

/// Pattern of a Proxmox network zone name (a label value).
const ZONE_PATTERN: &str = r"^[a-z0-9A-Z](?:[a-z0-9A-Z-_.]{0,61}[a-z0-9A-Z])?$";
/// Pattern of a Proxmox VM tag (compared case-insensitively by Proxmox).
const TAG_PATTERN: &str = r"^(?i)[a-z0-9_][a-z0-9_\-\+\.]*$";
/// Pattern of a Proxmox network device name.
const NET_NAME_PATTERN: &str = r"^net[0-9]+$";

// ---------------------------------------------------------------------------
// ProxmoxCluster
// ---------------------------------------------------------------------------

/// The desired state of a ProxmoxCluster: where the control plane is reached,
/// the address pools and nameservers of its machines, the Proxmox nodes they
/// may run on, and the credentials tenantry talks to Proxmox VE with.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "ProxmoxCluster",
    plural = "proxmoxclusters",
    namespaced,
    status = "ProxmoxClusterStatus",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    doc = "ProxmoxCluster: the infrastructure of a workload cluster whose machines are virtual machines cloned on a Proxmox VE cluster.",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha2"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    validation = Rule::new("has(self.spec.ipv4Config) || has(self.spec.ipv6Config)").message("spec needs an address pool: set ipv4Config, ipv6Config or both").field_path(".spec"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.controlPlaneEndpoint.host"}"#,
    printcolumn = r#"{"name":"Provisioned","type":"boolean","jsonPath":".status.initialization.provisioned"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterSpec {
    /// Where the workload cluster's API server is reached. Set by the user, or
    /// by the control plane provider when `externalManagedControlPlane` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.port >= 1 && self.port <= 65535").message("controlPlaneEndpoint.port must be between 1 and 65535"))]
    #[x_kube(validation = Rule::new("self.host.size() >= 1 && self.host.size() <= 512").message("controlPlaneEndpoint.host must be 1 to 512 characters long"))]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// True when the control plane does not run on machines of this cluster
    /// (for example Kamaji); its provider then fills in controlPlaneEndpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub external_managed_control_plane: Option<bool>,
    /// Proxmox nodes machines may be placed on. Empty means every node of the
    /// Proxmox cluster. A machine's own allowedNodes replaces this list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allowed_nodes: Option<Vec<String>>,
    /// How machines are spread over the allowed nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_hints: Option<SchedulerHints>,
    /// The IPv4 address pool of the machines' first network device. At least
    /// one of ipv4Config and ipv6Config is required: machines get static
    /// addresses, there is no DHCP.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "ipv4Config"
    )]
    pub ipv4_config: Option<IpConfigSpec>,
    /// The IPv6 address pool of the machines' first network device.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "ipv6Config"
    )]
    pub ipv6_config: Option<IpConfigSpec>,
    /// Nameservers written into every machine's network configuration.
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub dns_servers: Vec<String>,
    /// Address pools and nameservers per Proxmox network zone, for machines
    /// whose `network.zone` names one. Keyed by zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["zone".into()]))]
    pub zone_config: Option<Vec<ZoneConfigSpec>>,
    /// The Secret holding the Proxmox VE API credentials: keys `url` (the
    /// server's base URL, e.g. https://pve.example:8006), `token_id`
    /// (`user@realm!tokenid`; capmox's `token` is read too), `token_secret`
    /// (the token's secret; capmox's `secret` is read too), and optionally
    /// `root_ca` or `ca.crt` (PEM) and `insecure`. Tenantry verifies the
    /// server's certificate unless `insecure` is "true". Tenant scope: tenantry reads
    /// the Secret only from this ProxmoxCluster's own namespace and refuses a
    /// reference to another namespace, so one tenant's cluster can never use
    /// another tenant's token. Without it, the manager's own credentials are
    /// used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = MapMerge::Atomic)]
    pub credentials_ref: Option<SecretReference>,
}

/// Placement hints for the scheduler that picks a machine's Proxmox node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulerHints {
    /// How much of a node's memory may be promised to VMs, in percent: 100
    /// (the default) allows exactly the node's memory, 300 allows three times
    /// as much, 0 turns the memory check off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub memory_adjustment: Option<i64>,
}

/// An address pool: the addresses machines take their static IPs from, and
/// the network they belong to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpConfigSpec {
    /// Addresses to hand out: single IPs, ranges (`10.0.0.10-10.0.0.50`) and
    /// CIDRs (`10.0.1.0/28`), which need not be contiguous. They must not
    /// overlap a DHCP range on the same network.
    #[x_kube(validation = Rule::new("self.size() > 0").message("addresses must list at least one IP, range or CIDR"))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub addresses: Vec<String>,
    /// Prefix length of the network the addresses belong to.
    #[schemars(range(min = 1, max = 128))]
    pub prefix: i32,
    /// The default gateway of that network.
    #[schemars(length(min = 1))]
    pub gateway: String,
    /// Metric of the default route through the gateway; 100 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), extend("default" = 100))]
    pub metric: Option<i32>,
}

/// Address pools and nameservers of one Proxmox network zone.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneConfigSpec {
    /// The zone's name.
    #[schemars(pattern(ZONE_PATTERN))]
    pub zone: String,
    /// The zone's IPv4 address pool.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "ipv4Config"
    )]
    pub ipv4_config: Option<IpConfigSpec>,
    /// The zone's IPv6 address pool.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "ipv6Config"
    )]
    pub ipv6_config: Option<IpConfigSpec>,
    /// Nameservers of machines in the zone.
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub dns_servers: Vec<String>,
}

/// Observed state of a ProxmoxCluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterStatus {
    /// Whether the infrastructure is ready (v1beta1 contract; kept in step
    /// with `initialization.provisioned`).
    #[serde(default)]
    pub ready: bool,
    /// Initialization status (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// The InClusterIPPools made from ipv4Config and ipv6Config.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "inClusterIPPoolRef"
    )]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub in_cluster_ip_pool_ref: Option<Vec<LocalObjectReference>>,
    /// The InClusterIPPools made from each zone's configuration, keyed by zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["zone".into()]))]
    pub in_cluster_zone_ref: Option<Vec<InClusterZoneRef>>,
    /// Which Proxmox node each machine was placed on, used to spread the
    /// next machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_locations: Option<NodeLocations>,
    /// Conditions: `Ready`, `ProxmoxAvailable`, `PrivilegesSufficient`,
    /// `TokenScoped`, `Paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

/// The InClusterIPPools of one zone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InClusterZoneRef {
    /// The zone; `default` for the cluster-wide configuration.
    #[serde(default = "default_zone_name")]
    #[schemars(pattern(ZONE_PATTERN))]
    pub zone: String,
    /// The zone's IPv4 pool.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "inClusterIPPoolRefV4"
    )]
    #[x_kube(merge_strategy = MapMerge::Atomic)]
    pub in_cluster_ip_pool_ref_v4: Option<LocalObjectReference>,
    /// The zone's IPv6 pool.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "inClusterIPPoolRefV6"
    )]
    #[x_kube(merge_strategy = MapMerge::Atomic)]
    pub in_cluster_ip_pool_ref_v6: Option<LocalObjectReference>,
}

fn default_zone_name() -> String {
    "default".into()
}

impl Default for InClusterZoneRef {
    /// The `default` zone without pools, as the apiserver defaults an empty entry.
    fn default() -> Self {
        Self {
            zone: default_zone_name(),
            in_cluster_ip_pool_ref_v4: None,
            in_cluster_ip_pool_ref_v6: None,
        }
    }
}

/// Where the machines of a cluster run, by role.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLocations {
    /// Control-plane machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub control_plane: Option<Vec<NodeLocation>>,
    /// Worker machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub workers: Option<Vec<NodeLocation>>,
}

/// The Proxmox node one machine was placed on.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLocation {
    /// The ProxmoxMachine.
    #[x_kube(merge_strategy = MapMerge::Atomic)]
    pub machine: LocalObjectReference,
    /// The Proxmox node.
    #[schemars(length(min = 1))]
    pub node: String,
    /// The machine's network zone, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(ZONE_PATTERN))]
    pub zone: Option<String>,
}

/// ProxmoxClusterTemplate: a ProxmoxCluster blueprint for ClusterClass.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "ProxmoxClusterTemplate",
    plural = "proxmoxclustertemplates",
    shortname = "pct",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    doc = "ProxmoxClusterTemplate: a ProxmoxCluster blueprint for ClusterClass.",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha2"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterTemplateSpec {
    /// The ProxmoxCluster to create. Unlike on a ProxmoxCluster, neither
    /// ipv4Config nor ipv6Config is required here: ClusterClass patches may
    /// add them.
    pub template: ProxmoxClusterTemplateResource,
}

/// The object a ProxmoxClusterTemplate describes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxClusterTemplateResource {
    /// Labels and annotations for the ProxmoxCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The ProxmoxCluster's spec.
    pub spec: ProxmoxClusterSpec,
}

// ---------------------------------------------------------------------------
// ProxmoxMachine
// ---------------------------------------------------------------------------

/// The desired state of a ProxmoxMachine: which VM template to clone, how to
/// size the clone, its network, and where in Proxmox VE it may live.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "ProxmoxMachine",
    plural = "proxmoxmachines",
    shortname = "moxm",
    namespaced,
    status = "ProxmoxMachineStatus",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    doc = "ProxmoxMachine: one machine of a workload cluster, run as a Proxmox VE virtual machine cloned from a template.",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha2"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    validation = Rule::new("!has(self.spec.templateSelector) || (!has(self.spec.templateID) && !has(self.spec.sourceNode))").message("spec.templateSelector cannot be combined with spec.templateID or spec.sourceNode: pick one clone source").field_path(".spec"),
    validation = Rule::new("has(self.spec.templateSelector) || (has(self.spec.templateID) && has(self.spec.sourceNode))").message("spec needs a clone source: templateSelector, or templateID together with sourceNode").field_path(".spec"),
    // Immutability is checked on the machine only: CAPI never edits a
    // template in place, but its topology controller dry-runs changed
    // templates against the current ones to decide whether to rotate them, and
    // a transition rule on the template would refuse that dry run.
    validation = Rule::new("!has(oldSelf.spec.disks) || !has(oldSelf.spec.disks.bootVolume) || !has(self.spec.disks) || !has(self.spec.disks.bootVolume) || self.spec.disks.bootVolume == oldSelf.spec.disks.bootVolume").message("disks.bootVolume is immutable").field_path(".spec.disks.bootVolume"),
    validation = Rule::new("has(self.spec.pool) == has(oldSelf.spec.pool) && (!has(self.spec.pool) || self.spec.pool == oldSelf.spec.pool)").message("pool is immutable: it cannot be set, changed or removed after creation, since tenantry acts only on VMs in the machine's pool").field_path(".spec.pool"),
    validation = Rule::new("has(self.spec.isoStorage) == has(oldSelf.spec.isoStorage) && (!has(self.spec.isoStorage) || self.spec.isoStorage == oldSelf.spec.isoStorage)").message("isoStorage is immutable: it cannot be set, changed or removed after creation, so the seed ISO is removed from where it was put").field_path(".spec.isoStorage"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"}"#,
    printcolumn = r#"{"name":"Provisioned","type":"boolean","jsonPath":".status.initialization.provisioned"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.proxmoxNode"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"ProviderID","type":"string","jsonPath":".spec.providerID","priority":1}"#,
    printcolumn = r#"{"name":"Machine","type":"string","jsonPath":".metadata.ownerReferences[?(@.kind==\"Machine\")].name","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.format) || !has(self.full) || self.full").message("format needs full=true: a linked clone keeps the template's disk format"))]
#[x_kube(validation = Rule::new("!has(self.storage) || !has(self.full) || self.full").message("storage needs full=true: a linked clone stays on the template's storage"))]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxMachineSpec {
    /// `proxmox://<SMBIOS uuid of the VM>`, set by the controller once the VM
    /// exists.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "providerID"
    )]
    #[schemars(
        length(equal = 46),
        pattern(
            r"^proxmox://[a-fA-F0-9]{8}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-[a-fA-F0-9]{12}$"
        )
    )]
    pub provider_id: Option<String>,
    /// The Proxmox VM ID of the machine, set by the controller once cloned.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "virtualMachineID"
    )]
    pub virtual_machine_id: Option<i64>,
    /// Picks the VM template to clone by its Proxmox tags instead of by ID.
    /// Excludes templateID and sourceNode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_selector: Option<TemplateSelector>,
    /// The Proxmox node holding the VM template; goes with templateID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub source_node: Option<String>,
    /// The VM ID of the template to clone; goes with sourceNode.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "templateID"
    )]
    pub template_id: Option<i32>,
    /// The clone's description in Proxmox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Disk format of a full clone: raw, qcow2 or vmdk. Needs full=true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TargetFileStorageFormat>,
    /// Full clone (the default) or, with false, a linked clone sharing the
    /// template's disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub full: Option<bool>,
    /// The Proxmox resource pool the VM is cloned into. Tenantry passes it on
    /// every clone, replacements included, and refuses to act on a VM that is
    /// not a member of this pool (or, when unset, on one that is in any pool):
    /// a tenant's token scoped to the pool by Proxmox ACLs then reaches only
    /// the tenant's machines. Immutable on a ProxmoxMachine: it can be neither
    /// set, changed nor removed after creation, so a machine never loses sight
    /// of its own VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Snapshot of the template to clone from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snap_name: Option<String>,
    /// Storage for the clone's disks. Needs full=true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// Tenantry addition: the Proxmox storage that receives the machine's
    /// NoCloud seed ISO (`user-data-<vmid>.iso`). It must accept ISO images
    /// and be reachable from the VM's node, and the credentials need
    /// Datastore.AllocateTemplate on it. capmox takes whichever ISO storage
    /// Proxmox lists first, in no fixed order, which lands the ISO where the
    /// tenant's token cannot write or the node cannot read; when unset, tenantry picks the first enabled ISO storage of
    /// the node in name order, so at least the choice does not change between
    /// reconciles. Immutable on a ProxmoxMachine, so the ISO is always removed
    /// from where it was put.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z][a-zA-Z0-9._-]*[a-zA-Z0-9]$')").message("isoStorage must be a Proxmox storage ID: a letter, then letters, digits, '.', '_' or '-', ending in a letter or digit"))]
    pub iso_storage: Option<String>,
    /// Proxmox nodes this machine may be placed on; replaces the cluster's
    /// allowedNodes when not empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allowed_nodes: Option<Vec<String>>,
    /// Number of CPU sockets; the template's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub num_sockets: Option<i32>,
    /// Cores per socket; the template's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub num_cores: Option<i32>,
    /// Memory in MiB, a multiple of 8; the template's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "memoryMiB")]
    #[schemars(range(min = 0), extend("multipleOf" = 8))]
    pub memory_mib: Option<i32>,
    /// The clone's disks; only the boot volume can be grown today.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<Storage>,
    /// The VM's network devices and routing.
    pub network: NetworkSpec,
    /// VM IDs the clone may take; the next free ID of the Proxmox cluster when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "vmIDRange")]
    pub vm_id_range: Option<VmIdRange>,
    /// Readiness checks to skip, for images without cloud-init or the QEMU
    /// guest agent (Talos skips both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<ProxmoxMachineChecks>,
    /// What goes into the NoCloud meta-data besides the hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_settings: Option<MetadataSettings>,
    /// Tags added to the VM in Proxmox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(pattern(TAG_PATTERN)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub tags: Option<Vec<String>>,
}

/// The enums' own doc comments are for Rust readers: kube hoists an optional
/// enum's schema over its field's, so without this the field's description
/// (what `kubectl explain` shows) would be replaced by the enum's.
fn field_describes_enum(schema: &mut schemars::Schema) {
    schema.remove("description");
}

/// Disk formats of a full clone.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[schemars(transform = field_describes_enum)]
#[serde(rename_all = "lowercase")]
pub enum TargetFileStorageFormat {
    /// Raw image.
    Raw,
    /// QEMU copy-on-write image.
    Qcow2,
    /// VMware disk image.
    Vmdk,
}

/// Picks a VM template by its Proxmox tags.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSelector {
    /// The tags to match, compared case-insensitively.
    #[schemars(length(min = 1), inner(pattern(TAG_PATTERN)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub match_tags: Vec<String>,
    /// How a template's tags must relate to matchTags: `exact` (the default;
    /// the same set), `uniqueSubset` (a superset, and only one template may
    /// qualify) or `bestSubset` (the superset with the fewest extra tags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "exact"))]
    pub match_policy: Option<TemplateMatchPolicy>,
}

/// How template tags are matched.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[schemars(transform = field_describes_enum)]
#[serde(rename_all = "camelCase")]
pub enum TemplateMatchPolicy {
    /// The template's tags equal matchTags.
    #[default]
    Exact,
    /// Exactly one template's tags include all of matchTags.
    UniqueSubset,
    /// Of the templates whose tags include matchTags, the one with the fewest
    /// others.
    BestSubset,
}

/// The disks of a machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// The boot disk, grown to sizeGb after cloning. Immutable on a
    /// ProxmoxMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_volume: Option<DiskSize>,
}

/// A disk and the size it is grown to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSize {
    /// The disk's bus and index in the template, e.g. scsi0.
    #[schemars(length(min = 1))]
    pub disk: String,
    /// Size in GiB; Proxmox can grow a disk but not shrink it.
    #[schemars(range(min = 5))]
    pub size_gb: i32,
}

/// The network of a machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// The network zone the machine belongs to, selecting the cluster's
    /// zoneConfig entry of that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(ZONE_PATTERN))]
    pub zone: Option<String>,
    /// The VM's network devices, keyed by name. `net0` takes its addresses
    /// from the cluster's (or zone's) pools unless it names its own.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub network_devices: Vec<NetworkDevice>,
    /// Virtual routing and forwarding devices, keyed by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub vrfs: Option<Vec<VrfDevice>>,
}

/// One network device of a VM.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkDevice {
    /// The Proxmox device name, `net0` by default.
    #[serde(default = "default_net_name")]
    #[schemars(length(min = 4), pattern(NET_NAME_PATTERN))]
    pub name: String,
    /// The Proxmox bridge the device is attached to, e.g. vmbr0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub bridge: Option<String>,
    /// The emulated network card; virtio by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "virtio"))]
    pub model: Option<NetworkModel>,
    /// MTU of the device; 1 means the bridge's MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 1 || (self >= 576 && self <= 65520)").message("mtu must be 1 (the bridge's MTU) or between 576 and 65520"))]
    pub mtu: Option<i32>,
    /// VLAN tag of the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4094))]
    pub vlan: Option<i32>,
    /// Number of packet queues of the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub queues: Option<i32>,
    /// Whether the device gets the default IPv4 route.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "defaultIPv4"
    )]
    pub default_ipv4: Option<bool>,
    /// Whether the device gets the default IPv6 route.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "defaultIPv6"
    )]
    pub default_ipv6: Option<bool>,
    /// IPAM pools (InClusterIPPool or GlobalInClusterIPPool) the device takes
    /// one address from each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub ip_pool_ref: Option<Vec<IpPoolReference>>,
    /// Nameservers for this device, replacing the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub dns_servers: Option<Vec<String>>,
    /// Extra routes through this device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub routes: Option<Vec<RouteSpec>>,
    /// Policy routing rules for this device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub routing_policy: Option<Vec<RoutingPolicySpec>>,
    /// MTU of the link inside the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 1 || (self >= 576 && self <= 65520)").message("linkMtu must be 1 or between 576 and 65520"))]
    pub link_mtu: Option<i32>,
}

fn default_net_name() -> String {
    "net0".into()
}

impl Default for NetworkDevice {
    /// `net0` with nothing else set, as the apiserver defaults an empty entry.
    fn default() -> Self {
        Self {
            name: default_net_name(),
            bridge: None,
            model: None,
            mtu: None,
            vlan: None,
            queues: None,
            default_ipv4: None,
            default_ipv6: None,
            ip_pool_ref: None,
            dns_servers: None,
            routes: None,
            routing_policy: None,
            link_mtu: None,
        }
    }
}

/// Emulated network cards Proxmox offers.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[schemars(transform = field_describes_enum)]
#[serde(rename_all = "lowercase")]
pub enum NetworkModel {
    /// Intel E1000.
    E1000,
    /// Paravirtualised virtio-net.
    #[default]
    Virtio,
    /// Realtek RTL8139.
    Rtl8139,
    /// VMware vmxnet3.
    Vmxnet3,
}

/// A reference to an IPAM pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
#[x_kube(validation = Rule::new("has(self.apiGroup) && self.apiGroup == 'ipam.cluster.x-k8s.io'").message("ipPoolRef.apiGroup must be ipam.cluster.x-k8s.io"))]
#[x_kube(validation = Rule::new("self.kind == 'InClusterIPPool' || self.kind == 'GlobalInClusterIPPool'").message("ipPoolRef.kind must be InClusterIPPool or GlobalInClusterIPPool"))]
pub struct IpPoolReference {
    /// ipam.cluster.x-k8s.io.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// InClusterIPPool or GlobalInClusterIPPool.
    pub kind: String,
    /// The pool's name; an InClusterIPPool is looked up in the machine's
    /// namespace.
    pub name: String,
}

/// A static route.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// Destination network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Route metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub metric: Option<i32>,
    /// Routing table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<i32>,
    /// Whether the route is IPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is6: Option<bool>,
}

/// A policy routing rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoutingPolicySpec {
    /// Destination prefix matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Source prefix matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Routing table to look up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<i32>,
    /// Priority of the rule. 0, 32765 and 32766 belong to the kernel's own
    /// rules and are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 4294967295_i64))]
    #[x_kube(validation = Rule::new("(self > 0 && self < 32765) || (self > 32766)").message("routingPolicy priority must be 1-32764 or above 32766: 0, 32765 and 32766 are the kernel's own rules"))]
    pub priority: Option<i64>,
    /// Whether the rule is IPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is6: Option<bool>,
}

/// A VRF device grouping network devices into their own routing table.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VrfDevice {
    /// The VRF's name.
    #[schemars(length(min = 3))]
    pub name: String,
    /// Routing table of the VRF. 254 (main) and 255 (local) are the kernel's
    /// and are refused.
    #[schemars(range(min = 1, max = 4294967295_i64))]
    #[x_kube(validation = Rule::new("(self > 0 && self < 254) || (self > 255)").message("vrfs table must not be 254 or 255, the kernel's main and local tables"))]
    pub table: i64,
    /// Network devices enslaved to the VRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(length(min = 4), pattern(NET_NAME_PATTERN)))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub interfaces: Option<Vec<String>>,
    /// Routes in the VRF's table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub routes: Option<Vec<RouteSpec>>,
    /// Policy routing rules for the VRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub routing_policy: Option<Vec<RoutingPolicySpec>>,
}

/// The VM IDs a clone may take.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.end >= self.start").message("vmIDRange.end must not be below vmIDRange.start"))]
pub struct VmIdRange {
    /// First ID of the range.
    #[schemars(range(min = 100, max = 999999999))]
    pub start: i64,
    /// Last ID of the range.
    #[schemars(range(min = 100, max = 999999999))]
    pub end: i64,
}

/// Readiness checks a machine may skip.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxMachineChecks {
    /// Do not wait for the QEMU guest agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_qemu_guest_agent: Option<bool>,
    /// Do not ask cloud-init (through the guest agent) whether it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_cloud_init_status: Option<bool>,
}

/// What the NoCloud meta-data carries.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataSettings {
    /// Write `provider-id: proxmox://<uuid>` into the meta-data, for images
    /// (such as Talos) that set the Node's providerID from it.
    #[serde(rename = "providerIDInjection")]
    pub provider_id_injection: bool,
}

/// Observed state of a ProxmoxMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxMachineStatus {
    /// Whether the machine is provisioned (v1beta1 contract; kept in step
    /// with `initialization.provisioned`).
    #[serde(default)]
    pub ready: bool,
    /// Initialization status (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// Addresses of the VM: its hostname and the IPs it was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub addresses: Option<Vec<MachineAddress>>,
    /// The Proxmox node the VM runs on (or is being cloned to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxmox_node: Option<String>,
    /// Tenantry addition: the VM ID reserved for this machine's clone. It is
    /// recorded before the clone is requested, so a restart at any point
    /// finds the VM (or the clone still in flight) instead of cloning a
    /// second one; `spec.virtualMachineID` is set once the clone is done.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "virtualMachineID"
    )]
    pub virtual_machine_id: Option<i64>,
    /// Where the VM is in its life: `notfound`, `pending` or `ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_status: Option<String>,
    /// Whether the bootstrap data reached the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_data_provided: Option<bool>,
    /// The addresses given to each network device, keyed by device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["net".into()]))]
    pub ip_addresses: Option<Vec<IpAddressesSpec>>,
    /// The VM's network devices as Proxmox reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub network: Option<Vec<NetworkStatus>>,
    /// The UPID of the Proxmox task in flight for this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_ref: Option<String>,
    /// No new task is started for this machine before this time, after a
    /// failed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<Time>,
    /// Conditions: `Ready`, `VirtualMachineProvisioned`, `Paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

/// The addresses of one network device.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpAddressesSpec {
    /// The device, e.g. net0 (`default` in objects written by older capmox).
    #[schemars(length(min = 4), pattern(r"^(net[0-9]+|default)$"))]
    pub net: String,
    /// IPv4 addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub ipv4: Option<Vec<String>>,
    /// IPv6 addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub ipv6: Option<Vec<String>>,
}

/// A network device of the VM as Proxmox reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// Whether the device is connected.
    pub connected: bool,
    /// IP addresses the guest reports on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub ip_addrs: Option<Vec<String>>,
    /// The device's MAC address.
    #[schemars(
        length(equal = 17),
        pattern(r"^([0-9A-Fa-f]{2}[:]){5}([0-9A-Fa-f]{2})$")
    )]
    pub mac_addr: String,
    /// The Proxmox device name, e.g. net0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(NET_NAME_PATTERN))]
    pub network_name: Option<String>,
}

/// ProxmoxMachineTemplate: the ProxmoxMachine blueprint a MachineDeployment,
/// MachineSet or control plane stamps out.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "ProxmoxMachineTemplate",
    plural = "proxmoxmachinetemplates",
    shortname = "pmt",
    namespaced,
    status = "MachineTemplateStatus",
    category = "cluster-api",
    derive = "PartialEq",
    doc = "ProxmoxMachineTemplate: the ProxmoxMachine blueprint a MachineDeployment, MachineSet or control plane stamps out.",
    label("cluster.x-k8s.io/v1beta2", "v1alpha2"),
    label("cluster.x-k8s.io/v1beta1", "v1alpha2"),
    label("cluster.x-k8s.io/provider", "infrastructure-tenantry")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxMachineTemplateSpec {
    /// The ProxmoxMachine to create.
    pub template: ProxmoxMachineTemplateResource,
}

/// The object a ProxmoxMachineTemplate describes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxMachineTemplateResource {
    /// Labels and annotations for the ProxmoxMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The ProxmoxMachine's spec. Its clone source may be left out entirely
    /// in a template that ClusterClass patches complete (capmox's own
    /// ClusterClasses do this); a ProxmoxMachine made from it still needs one.
    #[x_kube(validation = Rule::new("has(self.templateSelector) || has(self.templateID) == has(self.sourceNode)").message("templateID and sourceNode go together: set both, or templateSelector instead"))]
    pub spec: ProxmoxMachineSpec,
}

// ---------------------------------------------------------------------------
// Rules the reconcilers share
// ---------------------------------------------------------------------------

/// Why a providerID is not `proxmox://<uuid>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderIdError {
    /// The ID does not start with `proxmox://`.
    WrongScheme(String),
    /// What follows the scheme is not an SMBIOS UUID.
    NotAUuid(String),
}

impl fmt::Display for ProviderIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WrongScheme(id) => write!(f, "providerID {id:?} does not start with proxmox://"),
            Self::NotAUuid(id) => write!(
                f,
                "providerID {id:?} does not end in an SMBIOS UUID (8-4-4-4-12 hexadecimal digits)"
            ),
        }
    }
}

impl std::error::Error for ProviderIdError {}

/// Whether `text` is a UUID in its 8-4-4-4-12 hexadecimal form.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The providerID of a VM with this SMBIOS UUID: `proxmox://<uuid>`, the form
/// capmox writes and the Proxmox cloud-controller-manager reads in its capmox
/// mode. The UUID keeps its case, since CAPI compares providerIDs as strings.
pub fn provider_id(smbios_uuid: &str) -> Result<String, ProviderIdError> {
    let id = format!("{PROVIDER_ID_PREFIX}{smbios_uuid}");
    parse_provider_id(&id)?;
    Ok(id)
}

/// The SMBIOS UUID a providerID names.
pub fn parse_provider_id(provider_id: &str) -> Result<&str, ProviderIdError> {
    let uuid = provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .ok_or_else(|| ProviderIdError::WrongScheme(provider_id.to_string()))?;
    if is_uuid(uuid) {
        Ok(uuid)
    } else {
        Err(ProviderIdError::NotAUuid(provider_id.to_string()))
    }
}

/// Where a machine is cloned from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloneSource<'a> {
    /// A template named by node and VM ID.
    Template {
        /// The node holding the template.
        source_node: &'a str,
        /// The template's VM ID.
        template_id: i32,
    },
    /// The template whose tags match.
    Selector {
        /// The tags to match.
        match_tags: &'a [String],
        /// How to match them.
        match_policy: TemplateMatchPolicy,
    },
}

impl ProxmoxMachineSpec {
    /// The clone source, or None when it is missing or ambiguous (admission
    /// refuses both on a ProxmoxMachine).
    pub fn clone_source(&self) -> Option<CloneSource<'_>> {
        match (&self.template_selector, &self.source_node, self.template_id) {
            (Some(selector), None, None) => Some(CloneSource::Selector {
                match_tags: &selector.match_tags,
                match_policy: selector.match_policy.unwrap_or_default(),
            }),
            (None, Some(source_node), Some(template_id)) => Some(CloneSource::Template {
                source_node,
                template_id,
            }),
            _ => None,
        }
    }

    /// Whether the clone is a full clone (the default) rather than linked.
    pub fn full_clone(&self) -> bool {
        self.full.unwrap_or(true)
    }

    /// The Proxmox nodes this machine may be placed on: its own allowedNodes
    /// when not empty, else the cluster's. Empty means every node.
    pub fn effective_allowed_nodes<'a>(&'a self, cluster: &'a ProxmoxClusterSpec) -> &'a [String] {
        match self.allowed_nodes.as_deref() {
            Some(nodes) if !nodes.is_empty() => nodes,
            _ => cluster.allowed_nodes.as_deref().unwrap_or_default(),
        }
    }
}

/// Why a ProxmoxCluster's credentialsRef cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialsRefError {
    /// The reference has no name.
    MissingName,
    /// The reference points into another namespace.
    OtherNamespace {
        /// The namespace the reference names.
        referenced: String,
        /// The ProxmoxCluster's namespace.
        own: String,
    },
}

impl fmt::Display for CredentialsRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingName => write!(f, "spec.credentialsRef.name is empty"),
            Self::OtherNamespace { referenced, own } => write!(
                f,
                "spec.credentialsRef.namespace {referenced:?} is not the ProxmoxCluster's namespace {own:?}: credentials are read only from the cluster's own namespace"
            ),
        }
    }
}

impl std::error::Error for CredentialsRefError {}

impl ProxmoxClusterSpec {
    /// The name of the credentials Secret, which must live in `namespace`, the
    /// ProxmoxCluster's own; None when the manager's credentials apply.
    pub fn credentials_secret_name(
        &self,
        namespace: &str,
    ) -> Result<Option<&str>, CredentialsRefError> {
        let Some(reference) = &self.credentials_ref else {
            return Ok(None);
        };
        match reference.namespace.as_deref() {
            Some(referenced) if !referenced.is_empty() && referenced != namespace => {
                return Err(CredentialsRefError::OtherNamespace {
                    referenced: referenced.to_string(),
                    own: namespace.to_string(),
                });
            }
            _ => {}
        }
        match reference.name.as_deref() {
            Some(name) if !name.is_empty() => Ok(Some(name)),
            _ => Err(CredentialsRefError::MissingName),
        }
    }

    /// The InClusterIPPools this cluster's address configuration becomes:
    /// one per family for ipv4Config/ipv6Config, then one per family for each
    /// zone, in that order.
    pub fn desired_ip_pools(&self, cluster_name: &str) -> Result<Vec<DesiredIpPool>, AddressError> {
        let mut pools = Vec::new();
        let mut add = |zone: Option<&str>, family: IpFamily, config: &Option<IpConfigSpec>| {
            if let Some(config) = config {
                pools.push(DesiredIpPool {
                    name: in_cluster_ip_pool_name(cluster_name, zone, family),
                    zone: zone.map(str::to_string),
                    family,
                    gateway_metric: config.metric.unwrap_or(DEFAULT_GATEWAY_METRIC),
                    spec: config.in_cluster_ip_pool_spec(family)?,
                });
            }
            Ok::<(), AddressError>(())
        };
        add(None, IpFamily::V4, &self.ipv4_config)?;
        add(None, IpFamily::V6, &self.ipv6_config)?;
        for zone in self.zone_config.iter().flatten() {
            add(Some(&zone.zone), IpFamily::V4, &zone.ipv4_config)?;
            add(Some(&zone.zone), IpFamily::V6, &zone.ipv6_config)?;
        }
        Ok(pools)
    }
}

/// An IP address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(address: &IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// The value of the ip-family annotation: `ipv4` or `ipv6`.
    pub fn annotation_value(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }

    /// The longest prefix of the family.
    pub fn max_prefix(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    fn short(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V6 => "v6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}

/// The name capmox gives the InClusterIPPool of a cluster and family:
/// `<cluster>-v4-icip` / `<cluster>-v6-icip`, and `<cluster>-<zone>-v4-icip`
/// for a zone. Tenantry uses the same names, so pools made by capmox are
/// adopted rather than duplicated.
pub fn in_cluster_ip_pool_name(cluster_name: &str, zone: Option<&str>, family: IpFamily) -> String {
    match zone {
        Some(zone) => format!("{cluster_name}-{zone}-{}-icip", family.short()),
        None => format!("{cluster_name}-{}-icip", family.short()),
    }
}

/// One InClusterIPPool a ProxmoxCluster needs.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredIpPool {
    /// The pool's name.
    pub name: String,
    /// The zone it serves; None for the cluster-wide configuration.
    pub zone: Option<String>,
    /// Its family (the ip-family annotation).
    pub family: IpFamily,
    /// The metric of its gateway route (the gateway-metric annotation).
    pub gateway_metric: i32,
    /// Its spec.
    pub spec: InClusterIpPoolSpec,
}

/// Why an entry of `addresses` (or the gateway) cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressError {
    /// Not an IP, a range `a-b` or a CIDR.
    Unparsable(String),
    /// A range whose end lies before its start.
    BackwardsRange(String),
    /// A range mixing IPv4 and IPv6, or a CIDR prefix longer than its family allows.
    Malformed(String),
    /// An address of the other family (e.g. IPv6 in ipv4Config).
    WrongFamily {
        /// The entry.
        entry: String,
        /// The family the configuration is for.
        expected: IpFamily,
    },
    /// A prefix longer than the family allows.
    PrefixTooLong {
        /// The prefix.
        prefix: i32,
        /// The family the configuration is for.
        family: IpFamily,
    },
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unparsable(entry) => {
                write!(f, "{entry:?} is not an IP address, a range a-b or a CIDR")
            }
            Self::BackwardsRange(entry) => write!(f, "range {entry:?} ends before it starts"),
            Self::Malformed(entry) => write!(
                f,
                "{entry:?} mixes address families or has a prefix too long for its family"
            ),
            Self::WrongFamily { entry, expected } => {
                write!(f, "{entry:?} is not an {expected} address")
            }
            Self::PrefixTooLong { prefix, family } => {
                write!(f, "prefix {prefix} is too long for {family}")
            }
        }
    }
}

impl std::error::Error for AddressError {}

/// One entry of an address pool: a single address, an inclusive range or a
/// CIDR block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpBlock {
    /// One address.
    Address(IpAddr),
    /// Every address from `first` to `last`, both included.
    Range {
        /// First address.
        first: IpAddr,
        /// Last address.
        last: IpAddr,
    },
    /// Every address of a network.
    Cidr {
        /// The network address (host bits cleared).
        network: IpAddr,
        /// The prefix length.
        prefix: u8,
    },
}

fn to_bits(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_bits(family: IpFamily, bits: u128) -> IpAddr {
    match family {
        // Truncation is intended: IPv4 bits never exceed 32.
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

impl FromStr for IpBlock {
    type Err = AddressError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let text = entry.trim();
        let parse = |s: &str| {
            s.trim()
                .parse::<IpAddr>()
                .map_err(|_| AddressError::Unparsable(entry.to_string()))
        };
        if let Some((first, last)) = text.split_once('-') {
            let (first, last) = (parse(first)?, parse(last)?);
            if IpFamily::of(&first) != IpFamily::of(&last) {
                return Err(AddressError::Malformed(entry.to_string()));
            }
            if to_bits(first) > to_bits(last) {
                return Err(AddressError::BackwardsRange(entry.to_string()));
            }
            return Ok(Self::Range { first, last });
        }
        if let Some((address, prefix)) = text.split_once('/') {
            let address = parse(address)?;
            let family = IpFamily::of(&address);
            let prefix: u8 = prefix
                .trim()
                .parse()
                .map_err(|_| AddressError::Unparsable(entry.to_string()))?;
            if prefix > family.max_prefix() {
                return Err(AddressError::Malformed(entry.to_string()));
            }
            let host_bits = u32::from(family.max_prefix() - prefix);
            let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
            let network = from_bits(family, to_bits(address) & mask);
            return Ok(Self::Cidr { network, prefix });
        }
        Ok(Self::Address(parse(text)?))
    }
}

impl fmt::Display for IpBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Address(address) => write!(f, "{address}"),
            Self::Range { first, last } => write!(f, "{first}-{last}"),
            Self::Cidr { network, prefix } => write!(f, "{network}/{prefix}"),
        }
    }
}

impl IpBlock {
    /// The block's address family.
    pub fn family(&self) -> IpFamily {
        match self {
            Self::Address(address)
            | Self::Range { first: address, .. }
            | Self::Cidr {
                network: address, ..
            } => IpFamily::of(address),
        }
    }

    /// The first and last address of the block, as integers.
    fn bounds(&self) -> (u128, u128) {
        match *self {
            Self::Address(address) => (to_bits(address), to_bits(address)),
            Self::Range { first, last } => (to_bits(first), to_bits(last)),
            Self::Cidr { network, prefix } => {
                let host_bits = u32::from(self.family().max_prefix() - prefix);
                let size_minus_one = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
                let start = to_bits(network);
                (start, start + size_minus_one)
            }
        }
    }

    /// Whether `address` lies in the block.
    pub fn contains(&self, address: IpAddr) -> bool {
        if IpFamily::of(&address) != self.family() {
            return false;
        }
        let (first, last) = self.bounds();
        (first..=last).contains(&to_bits(address))
    }

    /// How many addresses the block spans (saturating at u128::MAX for ::/0).
    pub fn len(&self) -> u128 {
        let (first, last) = self.bounds();
        (last - first).saturating_add(1)
    }

    /// Whether the block is empty; never, since every form holds an address.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl IpConfigSpec {
    /// Every entry of `addresses`, parsed and checked to be of `family`.
    pub fn blocks(&self, family: IpFamily) -> Result<Vec<IpBlock>, AddressError> {
        self.addresses
            .iter()
            .map(|entry| {
                let block: IpBlock = entry.parse()?;
                if block.family() == family {
                    Ok(block)
                } else {
                    Err(AddressError::WrongFamily {
                        entry: entry.clone(),
                        expected: family,
                    })
                }
            })
            .collect()
    }

    /// Whether any entry of `addresses` covers `address`, e.g. the
    /// control-plane endpoint, which must not be handed to a machine.
    pub fn contains(&self, address: IpAddr) -> Result<bool, AddressError> {
        let mut found = false;
        for entry in &self.addresses {
            let block: IpBlock = entry.parse()?;
            found |= block.contains(address);
        }
        Ok(found)
    }

    /// The spec of the InClusterIPPool made from this configuration: the
    /// addresses in the canonical text the in-cluster IPAM provider accepts
    /// (single IPs, `first-last` ranges, CIDRs with host bits cleared), the
    /// prefix, the gateway, and capmox's reuse grace period.
    pub fn in_cluster_ip_pool_spec(
        &self,
        family: IpFamily,
    ) -> Result<InClusterIpPoolSpec, AddressError> {
        let addresses = self
            .blocks(family)?
            .iter()
            .map(IpBlock::to_string)
            .collect();
        let gateway: IpAddr = self
            .gateway
            .trim()
            .parse()
            .map_err(|_| AddressError::Unparsable(self.gateway.clone()))?;
        if IpFamily::of(&gateway) != family {
            return Err(AddressError::WrongFamily {
                entry: self.gateway.clone(),
                expected: family,
            });
        }
        if self.prefix < 1 || self.prefix > i32::from(family.max_prefix()) {
            return Err(AddressError::PrefixTooLong {
                prefix: self.prefix,
                family,
            });
        }
        Ok(InClusterIpPoolSpec {
            address_reuse_grace_period_seconds: Some(ADDRESS_REUSE_GRACE_PERIOD_SECONDS),
            addresses,
            gateway: Some(gateway.to_string()),
            prefix: i64::from(self.prefix),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "5b0c2c7e-1f3a-4d2b-9c8e-0a1b2c3d4e5f";

    fn ipv4(addresses: &[&str]) -> IpConfigSpec {
        IpConfigSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            prefix: 24,
            gateway: "10.0.0.1".into(),
            metric: None,
        }
    }

    #[test]
    fn provider_id_round_trips_the_smbios_uuid() {
        let id = provider_id(UUID).unwrap();
        assert_eq!(id, format!("proxmox://{UUID}"));
        assert_eq!(id.len(), 46, "the CRD pins providerID to 46 characters");
        assert_eq!(parse_provider_id(&id).unwrap(), UUID);
    }

    #[test]
    fn provider_id_keeps_the_uuid_case() {
        let upper = UUID.to_uppercase();
        assert_eq!(
            parse_provider_id(&format!("proxmox://{upper}")).unwrap(),
            upper
        );
    }

    #[test]
    fn provider_ids_of_other_forms_are_refused() {
        assert!(matches!(
            parse_provider_id(&format!("kubevirt://{UUID}")),
            Err(ProviderIdError::WrongScheme(_))
        ));
        // The Proxmox CCM's default form, region/vmid, is not capmox's.
        assert!(matches!(
            parse_provider_id("proxmox://region-1/105"),
            Err(ProviderIdError::NotAUuid(_))
        ));
        assert!(matches!(
            parse_provider_id("proxmox://5b0c2c7e1f3a4d2b9c8e0a1b2c3d4e5f"),
            Err(ProviderIdError::NotAUuid(_))
        ));
        assert!(provider_id("not-a-uuid").is_err());
    }

    #[test]
    fn machine_allowed_nodes_replace_the_clusters() {
        let cluster = ProxmoxClusterSpec {
            allowed_nodes: Some(vec!["pve1".into(), "pve2".into()]),
            ..Default::default()
        };
        let mut machine = ProxmoxMachineSpec::default();
        assert_eq!(machine.effective_allowed_nodes(&cluster), ["pve1", "pve2"]);
        machine.allowed_nodes = Some(vec![]);
        assert_eq!(
            machine.effective_allowed_nodes(&cluster),
            ["pve1", "pve2"],
            "an empty list on the machine does not override"
        );
        machine.allowed_nodes = Some(vec!["pve3".into()]);
        assert_eq!(machine.effective_allowed_nodes(&cluster), ["pve3"]);
    }

    #[test]
    fn no_allowed_nodes_anywhere_means_every_node() {
        let machine = ProxmoxMachineSpec::default();
        assert!(
            machine
                .effective_allowed_nodes(&ProxmoxClusterSpec::default())
                .is_empty()
        );
    }

    #[test]
    fn clone_source_is_a_template_or_a_selector() {
        let by_id = ProxmoxMachineSpec {
            source_node: Some("pve1".into()),
            template_id: Some(9000),
            ..Default::default()
        };
        assert_eq!(
            by_id.clone_source(),
            Some(CloneSource::Template {
                source_node: "pve1",
                template_id: 9000
            })
        );
        let by_tags = ProxmoxMachineSpec {
            template_selector: Some(TemplateSelector {
                match_tags: vec!["capi".into(), "ubuntu".into()],
                match_policy: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            by_tags.clone_source(),
            Some(CloneSource::Selector {
                match_tags: &["capi".to_string(), "ubuntu".to_string()],
                match_policy: TemplateMatchPolicy::Exact
            })
        );
        let half = ProxmoxMachineSpec {
            template_id: Some(9000),
            ..Default::default()
        };
        assert_eq!(half.clone_source(), None);
        let both = ProxmoxMachineSpec {
            source_node: Some("pve1".into()),
            ..by_tags.clone()
        };
        assert_eq!(both.clone_source(), None);
    }

    #[test]
    fn defaulted_list_keys_default_in_rust_too() {
        assert_eq!(NetworkDevice::default().name, "net0");
        assert_eq!(InClusterZoneRef::default().zone, "default");
        let device: NetworkDevice = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(device, NetworkDevice::default());
    }

    #[test]
    fn clones_are_full_unless_said_otherwise() {
        assert!(ProxmoxMachineSpec::default().full_clone());
        let linked = ProxmoxMachineSpec {
            full: Some(false),
            ..Default::default()
        };
        assert!(!linked.full_clone());
    }

    #[test]
    fn credentials_are_read_from_the_clusters_own_namespace_only() {
        let with_ref = |name: Option<&str>, namespace: Option<&str>| ProxmoxClusterSpec {
            credentials_ref: Some(SecretReference {
                name: name.map(str::to_string),
                namespace: namespace.map(str::to_string),
            }),
            ..Default::default()
        };
        assert_eq!(
            ProxmoxClusterSpec::default().credentials_secret_name("tenant-a"),
            Ok(None)
        );
        assert_eq!(
            with_ref(Some("creds"), None).credentials_secret_name("tenant-a"),
            Ok(Some("creds"))
        );
        assert_eq!(
            with_ref(Some("creds"), Some("tenant-a")).credentials_secret_name("tenant-a"),
            Ok(Some("creds"))
        );
        assert_eq!(
            with_ref(Some("creds"), Some("tenant-b")).credentials_secret_name("tenant-a"),
            Err(CredentialsRefError::OtherNamespace {
                referenced: "tenant-b".into(),
                own: "tenant-a".into()
            })
        );
        assert_eq!(
            with_ref(None, None).credentials_secret_name("tenant-a"),
            Err(CredentialsRefError::MissingName)
        );
    }

    #[test]
    fn pool_names_follow_capmox() {
        assert_eq!(
            in_cluster_ip_pool_name("demo", None, IpFamily::V4),
            "demo-v4-icip"
        );
        assert_eq!(
            in_cluster_ip_pool_name("demo", None, IpFamily::V6),
            "demo-v6-icip"
        );
        assert_eq!(
            in_cluster_ip_pool_name("demo", Some("zone-a"), IpFamily::V4),
            "demo-zone-a-v4-icip"
        );
    }

    #[test]
    fn address_entries_parse_as_ips_ranges_and_cidrs() {
        assert_eq!(
            "10.0.0.5".parse::<IpBlock>().unwrap(),
            IpBlock::Address("10.0.0.5".parse().unwrap())
        );
        let range: IpBlock = " 10.0.0.10 - 10.0.0.20 ".parse().unwrap();
        assert_eq!(range.to_string(), "10.0.0.10-10.0.0.20");
        assert_eq!(range.len(), 11);
        let cidr: IpBlock = "10.0.1.7/28".parse().unwrap();
        assert_eq!(cidr.to_string(), "10.0.1.0/28", "host bits are cleared");
        assert_eq!(cidr.len(), 16);
        let v6: IpBlock = "2001:db8::10-2001:db8::100".parse().unwrap();
        assert_eq!(v6.family(), IpFamily::V6);
        assert_eq!(v6.len(), 0xf1);
        assert_eq!("::/0".parse::<IpBlock>().unwrap().len(), u128::MAX);
        assert_eq!("0.0.0.0/0".parse::<IpBlock>().unwrap().len(), 1 << 32);
    }

    #[test]
    fn bad_address_entries_are_refused() {
        assert!(matches!(
            "10.0.0.300".parse::<IpBlock>(),
            Err(AddressError::Unparsable(_))
        ));
        assert!(matches!(
            "10.0.0.20-10.0.0.10".parse::<IpBlock>(),
            Err(AddressError::BackwardsRange(_))
        ));
        assert!(matches!(
            "10.0.0.1-2001:db8::1".parse::<IpBlock>(),
            Err(AddressError::Malformed(_))
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<IpBlock>(),
            Err(AddressError::Malformed(_))
        ));
        assert!(matches!(
            "10.0.0.0/x".parse::<IpBlock>(),
            Err(AddressError::Unparsable(_))
        ));
    }

    #[test]
    fn blocks_know_what_they_contain() {
        let range: IpBlock = "10.0.0.10-10.0.0.20".parse().unwrap();
        assert!(range.contains("10.0.0.10".parse().unwrap()));
        assert!(range.contains("10.0.0.20".parse().unwrap()));
        assert!(!range.contains("10.0.0.21".parse().unwrap()));
        assert!(!range.contains("::ffff:10.0.0.15".parse().unwrap()));
        let cidr: IpBlock = "10.0.1.0/30".parse().unwrap();
        assert!(cidr.contains("10.0.1.3".parse().unwrap()));
        assert!(!cidr.contains("10.0.1.4".parse().unwrap()));
    }

    #[test]
    fn the_endpoint_is_found_in_a_pool_that_covers_it() {
        let config = ipv4(&["10.0.0.10-10.0.0.20", "10.0.0.64/28"]);
        assert_eq!(config.contains("10.0.0.15".parse().unwrap()), Ok(true));
        assert_eq!(config.contains("10.0.0.70".parse().unwrap()), Ok(true));
        assert_eq!(config.contains("10.0.0.9".parse().unwrap()), Ok(false));
        assert_eq!(config.contains("2001:db8::1".parse().unwrap()), Ok(false));
        assert!(
            ipv4(&["nonsense"])
                .contains("10.0.0.1".parse().unwrap())
                .is_err()
        );
    }

    #[test]
    fn an_ipv4_config_becomes_an_in_cluster_ip_pool_spec() {
        let config = ipv4(&["10.0.0.10-10.0.0.20", "10.0.0.70/28", "10.0.0.99"]);
        let spec = config.in_cluster_ip_pool_spec(IpFamily::V4).unwrap();
        assert_eq!(
            spec.addresses,
            ["10.0.0.10-10.0.0.20", "10.0.0.64/28", "10.0.0.99"]
        );
        assert_eq!(spec.prefix, 24);
        assert_eq!(spec.gateway.as_deref(), Some("10.0.0.1"));
        assert_eq!(spec.address_reuse_grace_period_seconds, Some(60));
        assert_eq!(spec.allocate_reserved_ip_addresses, None);
    }

    #[test]
    fn a_pool_of_the_wrong_family_is_refused() {
        let v6_in_v4 = ipv4(&["2001:db8::10-2001:db8::20"]);
        assert!(matches!(
            v6_in_v4.in_cluster_ip_pool_spec(IpFamily::V4),
            Err(AddressError::WrongFamily { .. })
        ));
        let v4_gateway = IpConfigSpec {
            addresses: vec!["2001:db8::10-2001:db8::20".into()],
            prefix: 64,
            gateway: "10.0.0.1".into(),
            metric: None,
        };
        assert!(matches!(
            v4_gateway.in_cluster_ip_pool_spec(IpFamily::V6),
            Err(AddressError::WrongFamily { .. })
        ));
        let long_prefix = IpConfigSpec {
            prefix: 64,
            ..ipv4(&["10.0.0.10"])
        };
        assert_eq!(
            long_prefix.in_cluster_ip_pool_spec(IpFamily::V4),
            Err(AddressError::PrefixTooLong {
                prefix: 64,
                family: IpFamily::V4
            })
        );
    }

    #[test]
    fn a_dual_stack_cluster_with_a_zone_needs_four_pools() {
        let v6 = IpConfigSpec {
            addresses: vec!["2001:db8::10-2001:db8::100".into()],
            prefix: 64,
            gateway: "2001:db8::1".into(),
            metric: Some(200),
        };
        let cluster = ProxmoxClusterSpec {
            ipv4_config: Some(ipv4(&["10.0.0.10-10.0.0.20"])),
            ipv6_config: Some(v6.clone()),
            zone_config: Some(vec![ZoneConfigSpec {
                zone: "zone-a".into(),
                ipv4_config: Some(ipv4(&["10.0.0.30-10.0.0.40"])),
                ipv6_config: Some(v6),
                dns_servers: vec!["10.0.0.53".into()],
            }]),
            ..Default::default()
        };
        let pools = cluster.desired_ip_pools("demo").unwrap();
        let summary: Vec<_> = pools
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.zone.as_deref(),
                    p.family,
                    p.gateway_metric,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("demo-v4-icip", None, IpFamily::V4, 100),
                ("demo-v6-icip", None, IpFamily::V6, 200),
                ("demo-zone-a-v4-icip", Some("zone-a"), IpFamily::V4, 100),
                ("demo-zone-a-v6-icip", Some("zone-a"), IpFamily::V6, 200),
            ]
        );
        assert_eq!(pools[2].spec.addresses, ["10.0.0.30-10.0.0.40"]);
        assert_eq!(IpFamily::V6.annotation_value(), "ipv6");
    }

    #[test]
    fn a_bad_entry_anywhere_fails_the_whole_cluster() {
        let cluster = ProxmoxClusterSpec {
            ipv4_config: Some(ipv4(&["10.0.0.10-10.0.0.20", "10.0.0.x"])),
            ..Default::default()
        };
        assert_eq!(
            cluster.desired_ip_pools("demo"),
            Err(AddressError::Unparsable("10.0.0.x".into()))
        );
    }
}
