//! ProxmoxMachine and ProxmoxMachineTemplate, and the rules a machine's
//! spec carries: its providerID and its clone source.

use super::*;

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
