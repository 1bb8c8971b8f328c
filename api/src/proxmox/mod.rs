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

mod addresses;
mod cluster;
mod machine;

pub use addresses::*;
pub use cluster::*;
pub use machine::*;

#[cfg(test)]
mod tests;
