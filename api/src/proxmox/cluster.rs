//! ProxmoxCluster and ProxmoxClusterTemplate, and the rules a cluster's
//! spec carries: its credentials reference and the IP pools its address
//! configuration becomes.

use super::*;

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
