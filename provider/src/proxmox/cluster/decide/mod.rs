//! Pure decisions for a ProxmoxCluster: which privileges its machines will
//! need where (the preflight), which of them the token lacks, whether the
//! token reaches beyond its tenant, and where the machines run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use tenantry_api::contract::CONTROL_PLANE_LABEL;
use tenantry_api::proxmox::{
    CloneSource, NodeLocation, NodeLocations, ProxmoxClusterSpec, ProxmoxMachine,
    ProxmoxMachineSpec,
};

use crate::capi::conditions::DesiredCondition;
use crate::proxmox::client::Permissions;

mod pools;
mod ready;

pub use pools::{pool_object, pool_references};
pub use ready::{new_warnings, ready_condition};

/// Condition: the PVE API answers with the cluster's credentials (capmox's name).
pub const PROXMOX_AVAILABLE: &str = "ProxmoxAvailable";
/// Condition: the token holds every privilege the machines need.
pub const PRIVILEGES_SUFFICIENT: &str = "PrivilegesSufficient";
/// Condition: the token reaches no further than the tenant's pools and
/// storages (False is a warning, not a failure).
pub const TOKEN_SCOPED: &str = "TokenScoped";

pub use super::status::Reason;

/// The local bridges' SDN zone, which PVE checks `SDN.Use` on.
const LOCAL_NETWORK_ZONE: &str = "/sdn/zones/localnetwork";

/// One privilege the machines need on one path, and what for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    pub path: String,
    pub privilege: &'static str,
}

/// The privileges on a VM's pool (or on `/vms` without pool) for what
/// tenantry does to a clone: allocate it, read it, size it, attach the
/// seed, power it, ask its agent.
fn vm_privileges(spec: &ProxmoxMachineSpec) -> Vec<&'static str> {
    let mut privileges = vec!["VM.Allocate", "VM.Audit", "VM.Config.CDROM", "VM.PowerMgmt"];
    if spec.num_cores.is_some() || spec.num_sockets.is_some() {
        privileges.push("VM.Config.CPU");
    }
    if spec.memory_mib.is_some() {
        privileges.push("VM.Config.Memory");
    }
    if !spec.network.network_devices.is_empty() {
        privileges.push("VM.Config.Network");
    }
    if spec.disks.as_ref().is_some_and(|d| d.boot_volume.is_some()) {
        privileges.push("VM.Config.Disk");
    }
    if spec.tags.as_ref().is_some_and(|t| !t.is_empty()) {
        privileges.push("VM.Config.Options");
    }
    let skip_agent = spec
        .checks
        .as_ref()
        .and_then(|c| c.skip_qemu_guest_agent)
        .unwrap_or(false);
    if !skip_agent {
        privileges.push("VM.GuestAgent.Audit");
    }
    privileges
}

/// Everything the cluster's machines (and the machines its templates
/// stamp out) will need, by path.
pub fn requirements<'a>(
    cluster: &ProxmoxClusterSpec,
    machines: impl IntoIterator<Item = &'a ProxmoxMachineSpec>,
) -> BTreeSet<Requirement> {
    let mut needed = BTreeSet::new();
    let mut add = |path: String, privilege: &'static str| {
        needed.insert(Requirement { path, privilege });
    };
    let mut any_machine = false;
    for spec in machines {
        any_machine = true;
        let nodes = spec.effective_allowed_nodes(cluster);
        if nodes.is_empty() {
            add("/nodes".into(), "Sys.Audit");
        }
        for node in nodes {
            add(format!("/nodes/{node}"), "Sys.Audit");
        }
        if let Some(CloneSource::Template { template_id, .. }) = spec.clone_source() {
            add(format!("/vms/{template_id}"), "VM.Clone");
        }
        let vm_path = match spec.pool.as_deref().filter(|p| !p.is_empty()) {
            Some(pool) => format!("/pool/{pool}"),
            None => "/vms".to_string(),
        };
        for privilege in vm_privileges(spec) {
            add(vm_path.clone(), privilege);
        }
        if spec.full_clone()
            && let Some(storage) = &spec.storage
        {
            add(format!("/storage/{storage}"), "Datastore.AllocateSpace");
        }
        if let Some(storage) = &spec.iso_storage {
            // Upload the seed, find it, delete it.
            for privilege in [
                "Datastore.AllocateTemplate",
                "Datastore.Audit",
                "Datastore.Allocate",
            ] {
                add(format!("/storage/{storage}"), privilege);
            }
        }
        for device in &spec.network.network_devices {
            if let Some(bridge) = &device.bridge {
                add(format!("{LOCAL_NETWORK_ZONE}/{bridge}"), "SDN.Use");
            }
        }
    }
    if !any_machine {
        // Before any machine exists, at least the nodes must be visible.
        match cluster.allowed_nodes.as_deref().filter(|n| !n.is_empty()) {
            Some(nodes) => {
                for node in nodes {
                    add(format!("/nodes/{node}"), "Sys.Audit");
                }
            }
            None => add("/nodes".into(), "Sys.Audit"),
        }
    }
    needed
}

/// The paths to ask `/access/permissions` about.
pub fn paths(requirements: &BTreeSet<Requirement>) -> BTreeSet<String> {
    let mut paths: BTreeSet<String> = requirements.iter().map(|r| r.path.clone()).collect();
    paths.insert("/".into());
    paths.insert("/vms".into());
    paths
}

/// The requirements the token's effective permissions do not meet.
pub fn missing(
    requirements: &BTreeSet<Requirement>,
    permissions: &Permissions,
) -> Vec<Requirement> {
    requirements
        .iter()
        .filter(|r| !permissions.has(&r.path, r.privilege))
        .cloned()
        .collect()
}

/// The `PrivilegesSufficient` condition: every missing privilege, grouped
/// by path.
pub fn privileges_condition(missing: &[Requirement]) -> DesiredCondition {
    if missing.is_empty() {
        return DesiredCondition::true_(PRIVILEGES_SUFFICIENT, Reason::AllPrivilegesHeld.as_str());
    }
    let mut by_path: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for requirement in missing {
        by_path
            .entry(&requirement.path)
            .or_default()
            .push(requirement.privilege);
    }
    let list: Vec<String> = by_path
        .iter()
        .map(|(path, privileges)| format!("{} on {path}", privileges.join(", ")))
        .collect();
    DesiredCondition::false_(
        PRIVILEGES_SUFFICIENT,
        Reason::MissingPrivileges.as_str(),
        format!(
            "the token lacks {}; grant them to the token and to its user (a privilege-separated token is capped by its user)",
            list.join("; ")
        ),
    )
}

/// The `TokenScoped` condition: False when the token holds more than
/// `Sys.Audit` on `/vms` (from there or inherited from `/`), or anything
/// beyond it on `/` that propagates: such a token reaches every VM (or
/// storage) on the hypervisor, not just the tenant's pool.
pub fn scope_condition(permissions: &Permissions) -> DesiredCondition {
    let beyond = |path: &str, propagating_only: bool| -> Vec<String> {
        permissions
            .at(path)
            .into_iter()
            .flatten()
            .filter(|(privilege, propagates)| {
                *privilege != "Sys.Audit" && (!propagating_only || **propagates)
            })
            .map(|(privilege, _)| privilege.clone())
            .collect()
    };
    let on_vms = beyond("/vms", false);
    let on_root = beyond("/", true);
    if on_vms.is_empty() && on_root.is_empty() {
        return DesiredCondition::true_(TOKEN_SCOPED, Reason::Scoped.as_str());
    }
    let mut held = Vec::new();
    if !on_root.is_empty() {
        held.push(format!("{} on / (propagated)", on_root.join(", ")));
    }
    if !on_vms.is_empty() {
        held.push(format!("{} on /vms", on_vms.join(", ")));
    }
    DesiredCondition::false_(
        TOKEN_SCOPED,
        Reason::ReachesEveryVm.as_str(),
        format!(
            "the token holds {}: it reaches every VM on the hypervisor, not only the tenant's; grant VM privileges on /pool/<pool> and storage privileges on the tenant's storages instead",
            held.join("; ")
        ),
    )
}

/// Why the control-plane endpoint cannot share the machines' pools: a
/// machine would get the endpoint's address (capmox refuses it too).
pub fn endpoint_outside_pools(cluster: &ProxmoxClusterSpec) -> Result<(), String> {
    let Some(host) = cluster
        .control_plane_endpoint
        .as_ref()
        .map(|e| e.host.as_str())
    else {
        return Ok(());
    };
    let Ok(ip) = host.parse::<IpAddr>() else {
        return Ok(());
    };
    let configs = [cluster.ipv4_config.as_ref(), cluster.ipv6_config.as_ref()]
        .into_iter()
        .chain(
            cluster
                .zone_config
                .iter()
                .flatten()
                .flat_map(|z| [z.ipv4_config.as_ref(), z.ipv6_config.as_ref()]),
        )
        .flatten();
    for config in configs {
        if config.contains(ip).map_err(|e| e.to_string())? {
            return Err(format!(
                "the control-plane endpoint {ip} lies in an address pool: take it out of the pool's addresses"
            ));
        }
    }
    Ok(())
}

/// Where the cluster's machines run, by role (capmox's `nodeLocations`).
pub fn node_locations(machines: &[&ProxmoxMachine]) -> Option<NodeLocations> {
    let mut control_plane = Vec::new();
    let mut workers = Vec::new();
    let mut sorted: Vec<&&ProxmoxMachine> = machines.iter().collect();
    sorted.sort_by_key(|m| m.metadata.name.clone());
    for machine in sorted {
        let Some(node) = machine.status.as_ref().and_then(|s| s.proxmox_node.clone()) else {
            continue;
        };
        let location = NodeLocation {
            machine: k8s_openapi::api::core::v1::LocalObjectReference {
                name: machine.metadata.name.clone().unwrap_or_default(),
            },
            node,
            zone: machine.spec.network.zone.clone(),
        };
        if machine
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
        {
            control_plane.push(location);
        } else {
            workers.push(location);
        }
    }
    if control_plane.is_empty() && workers.is_empty() {
        return None;
    }
    Some(NodeLocations {
        control_plane: (!control_plane.is_empty()).then_some(control_plane),
        workers: (!workers.is_empty()).then_some(workers),
    })
}

#[cfg(test)]
mod tests;
