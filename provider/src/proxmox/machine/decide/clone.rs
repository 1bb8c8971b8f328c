//! What a clone is made from and where it goes: the template, the nodes'
//! capacity, the machine's size and the placement request.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tenantry_api::proxmox::{
    CloneSource, ProxmoxClusterSpec, ProxmoxMachine, ProxmoxMachineSpec, TargetFileStorageFormat,
    TemplateMatchPolicy,
};

use super::identity::vm_description;
use super::step::{HUMAN_RETRY, REFUSED_RETRY, Wait};
use crate::capi::owner;
use crate::proxmox::client::{CloneParams, ClusterResource, DiskFormat};
use crate::proxmox::machine::status::Reason;
use crate::proxmox::scheduler::{self, Guest, NodeCapacity, PlacementRequest, SchedulerHints};

const MIB: u64 = 1 << 20;

/// The template a clone starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateChoice {
    pub node: String,
    pub vmid: u32,
    /// The template's memory in bytes and vCPUs, when the token can see it.
    pub memory: Option<u64>,
    pub vcpus: Option<u32>,
}

/// Finds the template: by ID and node, or by tags. With tags, several
/// templates may match when each node holds its own copy (local storage);
/// the one on `preferred_node` wins then, so the clone needs no cross-node
/// copy (capmox demands exactly one template cluster-wide, #451).
pub fn choose_template(
    source: CloneSource<'_>,
    resources: &[ClusterResource],
    preferred_node: Option<&str>,
) -> Result<TemplateChoice, String> {
    let sizes = |row: &ClusterResource| (row.maxmem, row.maxcpu.map(|c| c.ceil() as u32));
    match source {
        CloneSource::Template {
            source_node,
            template_id,
        } => {
            let vmid = u32::try_from(template_id)
                .map_err(|_| format!("templateID {template_id} is not a VM ID"))?;
            let row = resources.iter().find(|r| r.is_vm() && r.vmid == Some(vmid));
            let (memory, vcpus) = row.map(sizes).unwrap_or((None, None));
            Ok(TemplateChoice {
                node: source_node.to_string(),
                vmid,
                memory,
                vcpus,
            })
        }
        CloneSource::Selector {
            match_tags,
            match_policy,
        } => {
            let wanted: BTreeSet<String> =
                match_tags.iter().map(|t| t.to_ascii_lowercase()).collect();
            let mut matching: Vec<(&ClusterResource, usize)> = resources
                .iter()
                .filter(|r| r.is_vm() && r.template)
                .filter_map(|r| {
                    let tags: BTreeSet<String> = r
                        .tag_list()
                        .iter()
                        .map(|t| t.to_ascii_lowercase())
                        .collect();
                    let fits = match match_policy {
                        TemplateMatchPolicy::Exact => tags == wanted,
                        TemplateMatchPolicy::UniqueSubset | TemplateMatchPolicy::BestSubset => {
                            tags.is_superset(&wanted)
                        }
                    };
                    fits.then(|| (r, tags.len() - wanted.len()))
                })
                .collect();
            let tags = match_tags.join(", ");
            if matching.is_empty() {
                return Err(format!(
                    "no template the credentials can see has the tags [{tags}] ({match_policy:?} match)"
                ));
            }
            if match_policy == TemplateMatchPolicy::BestSubset {
                let fewest = matching.iter().map(|(_, extra)| *extra).min().unwrap_or(0);
                matching.retain(|(_, extra)| *extra == fewest);
            }
            matching.sort_by_key(|(r, _)| (r.node.clone(), r.vmid));
            let per_node: BTreeSet<&str> = matching
                .iter()
                .filter_map(|(r, _)| r.node.as_deref())
                .collect();
            if per_node.len() < matching.len() {
                let ids: Vec<String> = matching
                    .iter()
                    .filter_map(|(r, _)| r.vmid)
                    .map(|v| v.to_string())
                    .collect();
                return Err(format!(
                    "templates {} all match the tags [{tags}] on one node: tag them apart",
                    ids.join(", ")
                ));
            }
            let chosen = matching
                .iter()
                .find(|(r, _)| preferred_node.is_some() && r.node.as_deref() == preferred_node)
                .or(matching.first())
                .map(|(r, _)| *r)
                .expect("not empty");
            let (memory, vcpus) = sizes(chosen);
            Ok(TemplateChoice {
                node: chosen.node.clone().unwrap_or_default(),
                vmid: chosen.vmid.unwrap_or_default(),
                memory,
                vcpus,
            })
        }
    }
}

/// The nodes and their guests, for the scheduler, from `/cluster/resources`.
/// `Err` names the nodes whose capacity the credentials cannot read.
pub fn node_capacities(resources: &[ClusterResource]) -> Result<Vec<NodeCapacity>, Vec<String>> {
    let mut nodes = Vec::new();
    let mut unknown = Vec::new();
    for row in resources
        .iter()
        .filter(|r| r.resource_type == crate::proxmox::client::ResourceType::Node)
    {
        let name = row.node.clone().unwrap_or_default();
        let online = row.status.as_deref() == Some("online");
        let (Some(maxcpu), Some(maxmem)) = (row.maxcpu, row.maxmem) else {
            if online {
                unknown.push(name);
            }
            continue;
        };
        let guests = resources
            .iter()
            .filter(|r| r.is_vm() && r.node.as_deref() == Some(name.as_str()))
            .map(|r| Guest {
                vmid: r.vmid.unwrap_or_default(),
                maxmem: r.maxmem.unwrap_or_default(),
                cpus: r.maxcpu.map(|c| c.ceil() as u32).unwrap_or_default(),
                template: r.template,
            })
            .collect();
        nodes.push(NodeCapacity {
            name,
            online,
            maxcpu: maxcpu.ceil() as u32,
            maxmem,
            guests,
        });
    }
    if nodes.is_empty() && !unknown.is_empty() {
        return Err(unknown);
    }
    Ok(nodes)
}

/// What a clone is made from and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClonePlan {
    pub template: TemplateChoice,
    pub node: String,
}

/// The machine asking for a clone, and the machines beside it.
pub struct CloneRequest<'a> {
    pub spec: &'a ProxmoxMachineSpec,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub cluster_name: &'a str,
    pub cluster_spec: &'a ProxmoxClusterSpec,
    /// Every ProxmoxMachine this manager knows.
    pub machines: &'a [std::sync::Arc<ProxmoxMachine>],
}

/// Chooses the template and the node: capacity and allowed nodes decide,
/// ties go to the node with fewer machines of the same cluster; with
/// tags, the template copy on the chosen node is preferred.
pub fn plan_clone(
    request: &CloneRequest,
    resources: &[ClusterResource],
) -> Result<ClonePlan, Wait> {
    let spec = request.spec;
    let Some(source) = spec.clone_source() else {
        return Err(Wait::new(
            Reason::InvalidSpec,
            "spec needs a clone source: templateSelector, or templateID with sourceNode",
            None,
        ));
    };
    let template_not_found = |m: String| Wait::new(Reason::TemplateNotFound, m, Some(HUMAN_RETRY));
    let template = choose_template(source, resources, None).map_err(template_not_found)?;
    let nodes = node_capacities(resources).map_err(|unknown| {
        Wait::new(
            Reason::NodeCapacityUnknown,
            format!(
                "the credentials cannot read the capacity of node(s) {}: grant Sys.Audit on /nodes/<node> (or /nodes) to the token and its user",
                unknown.join(", ")
            ),
            Some(HUMAN_RETRY),
        )
    })?;
    let placement = placement_request(request, &template);
    let node = match scheduler::choose_node(&nodes, &placement) {
        Ok(choice) => choice.node,
        Err(none) => {
            let retry = if none.is_transient() {
                Duration::from_secs(30)
            } else {
                HUMAN_RETRY
            };
            let reason = Reason::named(none.reason(), Reason::NoNodeAvailable);
            return Err(Wait::new(reason, none.to_string(), Some(retry)));
        }
    };
    let template = choose_template(source, resources, Some(&node)).map_err(template_not_found)?;
    Ok(ClonePlan { template, node })
}

/// The machine's size (the spec's, else the template's) and where the
/// cluster's other machines are.
pub fn placement_request(request: &CloneRequest, template: &TemplateChoice) -> PlacementRequest {
    let spec = request.spec;
    let memory = spec
        .memory_mib
        .map(|m| m as u64 * MIB)
        .or(template.memory)
        .unwrap_or(0);
    let vcpus = match (spec.num_sockets, spec.num_cores) {
        (None, None) => template.vcpus.unwrap_or(1),
        (sockets, cores) => (sockets.unwrap_or(1) * cores.unwrap_or(1)).max(1) as u32,
    };
    let hints = SchedulerHints {
        memory_adjustment: request
            .cluster_spec
            .scheduler_hints
            .as_ref()
            .and_then(|h| h.memory_adjustment)
            .map_or(100, |a| u32::try_from(a).unwrap_or(u32::MAX)),
        ..SchedulerHints::default()
    };
    PlacementRequest {
        memory,
        vcpus,
        machine_allowed_nodes: spec.allowed_nodes.clone().unwrap_or_default(),
        cluster_allowed_nodes: request
            .cluster_spec
            .allowed_nodes
            .clone()
            .unwrap_or_default(),
        hints,
        placements: sibling_placements(request),
    }
}

/// How many other machines of the same cluster each node holds.
fn sibling_placements(request: &CloneRequest) -> BTreeMap<String, u32> {
    let mut placements = BTreeMap::new();
    for sibling in request.machines.iter().filter(|m| {
        m.metadata.namespace.as_deref() == Some(request.namespace)
            && owner::cluster_name(&m.metadata) == Some(request.cluster_name)
            && m.metadata.uid.as_deref() != Some(request.uid)
    }) {
        if let Some(node) = sibling.status.as_ref().and_then(|s| s.proxmox_node.clone()) {
            *placements.entry(node).or_insert(0u32) += 1;
        }
    }
    placements
}

/// The VM IDs other machines hold or reserved: PVE may not know the
/// reserved ones yet.
pub fn taken_vmids(machines: &[std::sync::Arc<ProxmoxMachine>], uid: &str) -> BTreeSet<u32> {
    machines
        .iter()
        .filter(|m| m.metadata.uid.as_deref() != Some(uid))
        .flat_map(|m| {
            [
                m.status.as_ref().and_then(|s| s.virtual_machine_id),
                m.spec.virtual_machine_id,
            ]
        })
        .flatten()
        .filter_map(|id| u32::try_from(id).ok())
        .collect()
}

/// A full clone's `spec.storage` must be one of the pool's storages, when
/// the pool holds any.
pub fn clone_storage_refusal(spec: &ProxmoxMachineSpec, pool_storages: &[String]) -> Option<Wait> {
    let pool = spec.pool.as_deref().filter(|p| !p.is_empty())?;
    let storage = spec.storage.as_deref().filter(|_| spec.full_clone())?;
    if pool_storages.is_empty() || pool_storages.iter().any(|s| s == storage) {
        return None;
    }
    Some(Wait::new(
        Reason::StorageOutsidePool,
        format!(
            "storage {storage} (spec.storage) is not in pool {pool}, which holds storages {}: tenantry puts disks only on the pool's storages",
            pool_storages.join(", ")
        ),
        Some(REFUSED_RETRY),
    ))
}

/// The clone request PVE gets for a machine.
pub fn clone_params(
    spec: &ProxmoxMachineSpec,
    (namespace, name, uid): (&str, &str, &str),
    vmid: u32,
    plan: &ClonePlan,
) -> CloneParams {
    let mut params = CloneParams::new(vmid)
        .name(name.to_string())
        .description(vm_description(
            spec.description.as_deref(),
            namespace,
            name,
            uid,
        ))
        .full(spec.full_clone());
    if let Some(pool) = spec.pool.as_deref().filter(|p| !p.is_empty()) {
        params = params.pool(pool.to_string());
    }
    if spec.full_clone() {
        if let Some(storage) = &spec.storage {
            params = params.storage(storage.clone());
        }
        if let Some(format) = spec.format {
            params = params.format(match format {
                TargetFileStorageFormat::Raw => DiskFormat::Raw,
                TargetFileStorageFormat::Qcow2 => DiskFormat::Qcow2,
                TargetFileStorageFormat::Vmdk => DiskFormat::Vmdk,
            });
        }
    }
    if plan.node != plan.template.node {
        params = params.target(plan.node.clone());
    }
    if let Some(snapshot) = &spec.snap_name {
        params = params.snapname(snapshot.clone());
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tenantry_api::proxmox::TemplateSelector;

    fn resources(value: serde_json::Value) -> Vec<ClusterResource> {
        serde_json::from_value(value).unwrap()
    }

    fn template_rows() -> Vec<ClusterResource> {
        resources(json!([
            { "id": "qemu/9000", "type": "qemu", "vmid": 9000, "node": "pve1", "template": 1, "tags": "talos;v1.13", "maxmem": 2147483648u64, "maxcpu": 2 },
            { "id": "qemu/9001", "type": "qemu", "vmid": 9001, "node": "pve2", "template": 1, "tags": "talos;v1.13", "maxmem": 2147483648u64, "maxcpu": 2 },
            { "id": "qemu/9002", "type": "qemu", "vmid": 9002, "node": "pve1", "template": 1, "tags": "talos;v1.13;gpu" },
            { "id": "qemu/105", "type": "qemu", "vmid": 105, "node": "pve1", "template": 0, "tags": "talos;v1.13" },
        ]))
    }

    #[test]
    fn a_tagged_template_on_the_chosen_node_wins() {
        let tags = vec!["Talos".to_string(), "v1.13".to_string()];
        let selector = CloneSource::Selector {
            match_tags: &tags,
            match_policy: TemplateMatchPolicy::Exact,
        };
        let on_pve2 = choose_template(selector, &template_rows(), Some("pve2")).unwrap();
        assert_eq!((on_pve2.node.as_str(), on_pve2.vmid), ("pve2", 9001));
        assert_eq!(on_pve2.memory, Some(2 << 30));
        assert_eq!(
            choose_template(selector, &template_rows(), None)
                .unwrap()
                .vmid,
            9000
        );
        // uniqueSubset also matches the gpu template: two on pve1.
        let unique = CloneSource::Selector {
            match_tags: &tags,
            match_policy: TemplateMatchPolicy::UniqueSubset,
        };
        assert!(
            choose_template(unique, &template_rows(), None)
                .unwrap_err()
                .contains("tag them apart")
        );
        let best = CloneSource::Selector {
            match_tags: &tags,
            match_policy: TemplateMatchPolicy::BestSubset,
        };
        assert_eq!(
            choose_template(best, &template_rows(), Some("pve1"))
                .unwrap()
                .vmid,
            9000
        );
        let none = vec!["ubuntu".to_string()];
        let missing = CloneSource::Selector {
            match_tags: &none,
            match_policy: TemplateMatchPolicy::Exact,
        };
        assert!(
            choose_template(missing, &template_rows(), None)
                .unwrap_err()
                .contains("[ubuntu]")
        );
    }

    #[test]
    fn a_template_by_id_is_taken_as_named() {
        let source = CloneSource::Template {
            source_node: "pve1",
            template_id: 9000,
        };
        let choice = choose_template(source, &template_rows(), Some("pve2")).unwrap();
        assert_eq!(
            (choice.node.as_str(), choice.vmid, choice.vcpus),
            ("pve1", 9000, Some(2))
        );
        let _ = TemplateSelector::default();
    }

    #[test]
    fn node_capacities_need_node_statistics() {
        let rows = resources(json!([
            { "id": "node/pve1", "type": "node", "node": "pve1", "status": "online", "maxcpu": 16, "maxmem": 68719476736u64 },
            { "id": "qemu/105", "type": "qemu", "vmid": 105, "node": "pve1", "maxmem": 4294967296u64, "maxcpu": 2 },
        ]));
        let nodes = node_capacities(&rows).unwrap();
        assert_eq!(nodes[0].maxcpu, 16);
        assert_eq!(nodes[0].guests.len(), 1);
        let blind = resources(
            json!([{ "id": "node/pve1", "type": "node", "node": "pve1", "status": "online" }]),
        );
        assert_eq!(node_capacities(&blind).unwrap_err(), ["pve1"]);
    }

    fn machine(
        name: &str,
        cluster: &str,
        node: Option<&str>,
        vmid: Option<i64>,
    ) -> std::sync::Arc<ProxmoxMachine> {
        std::sync::Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
                "kind": "ProxmoxMachine",
                "metadata": {
                    "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                    "labels": { "cluster.x-k8s.io/cluster-name": cluster },
                },
                "spec": { "network": { "networkDevices": [] } },
                "status": { "proxmoxNode": node, "virtualMachineID": vmid },
            }))
            .unwrap(),
        )
    }

    fn spec(value: serde_json::Value) -> ProxmoxMachineSpec {
        let mut value = value;
        value["network"] = json!({ "networkDevices": [] });
        serde_json::from_value(value).unwrap()
    }

    fn two_nodes() -> Vec<ClusterResource> {
        resources(json!([
            { "id": "node/pve1", "type": "node", "node": "pve1", "status": "online", "maxcpu": 16, "maxmem": 68719476736u64 },
            { "id": "node/pve2", "type": "node", "node": "pve2", "status": "online", "maxcpu": 16, "maxmem": 68719476736u64 },
            { "id": "qemu/9000", "type": "qemu", "vmid": 9000, "node": "pve1", "template": 1, "maxmem": 2147483648u64, "maxcpu": 2 },
        ]))
    }

    #[test]
    fn a_clone_goes_where_its_cluster_has_fewer_machines() {
        let spec = spec(json!({ "sourceNode": "pve1", "templateID": 9000, "memoryMiB": 4096 }));
        let cluster_spec = ProxmoxClusterSpec::default();
        let machines = [
            machine("a", "blue", Some("pve1"), Some(101)),
            machine("b", "blue", Some("pve1"), Some(102)),
            machine("c", "green", Some("pve2"), Some(103)),
            machine("me", "blue", None, None),
        ];
        let request = CloneRequest {
            spec: &spec,
            namespace: "default",
            uid: "uid-me",
            cluster_name: "blue",
            cluster_spec: &cluster_spec,
            machines: &machines,
        };
        let plan = plan_clone(&request, &two_nodes()).unwrap();
        assert_eq!(
            plan.node, "pve2",
            "pve1 holds two of blue's machines, pve2 none"
        );
        assert_eq!(
            (plan.template.node.as_str(), plan.template.vmid),
            ("pve1", 9000)
        );
        let placement = placement_request(&request, &plan.template);
        assert_eq!(placement.memory, 4096 * MIB);
        assert_eq!(placement.vcpus, 2, "no CPUs in the spec: the template's");
        assert_eq!(placement.placements.get("pve1"), Some(&2));
        assert_eq!(
            placement.placements.get("pve2"),
            None,
            "green's machine does not count"
        );
        let params = clone_params(&spec, ("default", "me", "uid-me"), 120, &plan);
        assert_eq!(params.target.as_deref(), Some("pve2"));
        assert_eq!(
            taken_vmids(&machines, "uid-me"),
            BTreeSet::from([101, 102, 103])
        );
    }

    #[test]
    fn a_clone_that_cannot_be_planned_says_why() {
        let cluster_spec = ProxmoxClusterSpec::default();
        let cases = [
            (json!({}), Reason::InvalidSpec),
            (
                json!({ "sourceNode": "pve1", "templateID": 9000, "memoryMiB": 1048576 }),
                Reason::InsufficientResources,
            ),
            (
                json!({ "sourceNode": "pve1", "templateID": 9000, "allowedNodes": ["pve9"] }),
                Reason::NoNodeAvailable,
            ),
            (
                json!({ "templateSelector": { "matchTags": ["ubuntu"] } }),
                Reason::TemplateNotFound,
            ),
        ];
        for (value, expected) in cases {
            let spec = spec(value.clone());
            let request = CloneRequest {
                spec: &spec,
                namespace: "default",
                uid: "uid-me",
                cluster_name: "blue",
                cluster_spec: &cluster_spec,
                machines: &[],
            };
            let wait = plan_clone(&request, &two_nodes()).unwrap_err();
            assert_eq!(wait.reason, expected, "{value}: {}", wait.message);
        }
    }

    #[test]
    fn a_full_clone_stays_on_the_pools_storages() {
        let inside = spec(json!({ "pool": "tenants", "storage": "ceph", "full": true }));
        assert_eq!(clone_storage_refusal(&inside, &["ceph".into()]), None);
        assert_eq!(
            clone_storage_refusal(&inside, &[]),
            None,
            "a pool without storages"
        );
        let outside = spec(json!({ "pool": "tenants", "storage": "local-lvm", "full": true }));
        let refusal = clone_storage_refusal(&outside, &["ceph".into()]).unwrap();
        assert_eq!(refusal.reason, Reason::StorageOutsidePool);
        let linked = spec(json!({ "pool": "tenants", "storage": "local-lvm", "full": false }));
        assert_eq!(
            clone_storage_refusal(&linked, &["ceph".into()]),
            None,
            "a linked clone's disks stay with the template"
        );
    }
}
