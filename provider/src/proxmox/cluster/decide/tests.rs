use super::*;
use serde_json::json;

fn machine(value: serde_json::Value) -> ProxmoxMachineSpec {
    serde_json::from_value(value).unwrap()
}

fn permissions(value: serde_json::Value) -> Permissions {
    serde_json::from_value(value).unwrap()
}

fn worker() -> ProxmoxMachineSpec {
    machine(json!({
        "sourceNode": "pve1", "templateID": 9000, "pool": "tenant-a", "storage": "tenant-a-disks",
        "isoStorage": "tenant-a-iso", "numCores": 2, "memoryMiB": 2048, "allowedNodes": ["pve1", "pve2"],
        "network": { "networkDevices": [{ "name": "net0", "bridge": "vmbr0" }] }
    }))
}

#[test]
fn a_worker_needs_its_template_pool_storages_nodes_and_bridge() {
    let needed = requirements(&ProxmoxClusterSpec::default(), [&worker()]);
    let text: Vec<String> = needed
        .iter()
        .map(|r| format!("{} {}", r.privilege, r.path))
        .collect();
    for expected in [
        "VM.Clone /vms/9000",
        "VM.Allocate /pool/tenant-a",
        "VM.Audit /pool/tenant-a",
        "VM.Config.CPU /pool/tenant-a",
        "VM.Config.Memory /pool/tenant-a",
        "VM.Config.Network /pool/tenant-a",
        "VM.Config.CDROM /pool/tenant-a",
        "VM.PowerMgmt /pool/tenant-a",
        "VM.GuestAgent.Audit /pool/tenant-a",
        "Datastore.AllocateSpace /storage/tenant-a-disks",
        "Datastore.AllocateTemplate /storage/tenant-a-iso",
        "Datastore.Allocate /storage/tenant-a-iso",
        "Sys.Audit /nodes/pve1",
        "Sys.Audit /nodes/pve2",
        "SDN.Use /sdn/zones/localnetwork/vmbr0",
    ] {
        assert!(
            text.contains(&expected.to_string()),
            "{expected} missing from {text:?}"
        );
    }
    assert!(
        !text.iter().any(|t| t.contains("VM.Config.Disk")),
        "no boot volume, no disk privilege"
    );
}

#[test]
fn missing_privileges_are_named_with_their_paths() {
    let needed = requirements(&ProxmoxClusterSpec::default(), [&worker()]);
    let held = permissions(json!({
        "/vms/9000": {},
        "/pool/tenant-a": { "VM.Allocate": 1, "VM.Audit": 1, "VM.Config.CPU": 1, "VM.Config.Memory": 1,
            "VM.Config.Network": 1, "VM.Config.CDROM": 1, "VM.PowerMgmt": 1, "VM.GuestAgent.Audit": 1 },
        "/storage/tenant-a-disks": { "Datastore.Audit": 1 },
        "/storage/tenant-a-iso": { "Datastore.AllocateTemplate": 1, "Datastore.Audit": 1, "Datastore.Allocate": 1 },
        "/nodes/pve1": { "Sys.Audit": 1 }, "/nodes/pve2": { "Sys.Audit": 1 },
        "/sdn/zones/localnetwork/vmbr0": { "SDN.Use": 1 },
    }));
    let missing = missing(&needed, &held);
    let condition = privileges_condition(&missing);
    assert!(!condition.is_true());
    assert_eq!(condition.reason, Reason::MissingPrivileges.as_str());
    assert!(
        condition
            .message
            .contains("Datastore.AllocateSpace on /storage/tenant-a-disks"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.contains("VM.Clone on /vms/9000"),
        "{}",
        condition.message
    );
    assert!(privileges_condition(&[]).is_true());
}

#[test]
fn a_token_reaching_every_vm_is_flagged() {
    let scoped = permissions(json!({ "/": { "Sys.Audit": 0 }, "/vms": {} }));
    assert!(scope_condition(&scoped).is_true());
    let broad = permissions(
        json!({ "/": { "Sys.Audit": 1, "VM.Allocate": 1 }, "/vms": { "Sys.Audit": 1, "VM.Allocate": 1 } }),
    );
    let condition = scope_condition(&broad);
    assert_eq!(condition.reason, Reason::ReachesEveryVm.as_str());
    assert!(
        condition
            .message
            .contains("reaches every VM on the hypervisor"),
        "{}",
        condition.message
    );
    let on_vms = permissions(json!({ "/": {}, "/vms": { "VM.PowerMgmt": 0 } }));
    assert!(!scope_condition(&on_vms).is_true());
    let root_only = permissions(json!({ "/": { "Sys.Modify": 0 }, "/vms": {} }));
    assert!(
        scope_condition(&root_only).is_true(),
        "non-propagating privileges on / reach no VM"
    );
}

#[test]
fn the_endpoint_must_not_be_a_machine_address() {
    let mut cluster: ProxmoxClusterSpec = serde_json::from_value(json!({
        "controlPlaneEndpoint": { "host": "10.0.0.15", "port": 6443 },
        "ipv4Config": { "addresses": ["10.0.0.10-10.0.0.20"], "prefix": 24, "gateway": "10.0.0.1" },
        "dnsServers": ["10.0.0.53"]
    }))
    .unwrap();
    assert!(
        endpoint_outside_pools(&cluster)
            .unwrap_err()
            .contains("10.0.0.15")
    );
    cluster.control_plane_endpoint.as_mut().unwrap().host = "10.0.0.5".into();
    assert!(endpoint_outside_pools(&cluster).is_ok());
    cluster.control_plane_endpoint.as_mut().unwrap().host = "api.example".into();
    assert!(endpoint_outside_pools(&cluster).is_ok());
}

#[test]
fn machines_are_located_by_role() {
    let located = |name: &str, node: Option<&str>, control_plane: bool| -> ProxmoxMachine {
        let mut labels = serde_json::Map::new();
        if control_plane {
            labels.insert(CONTROL_PLANE_LABEL.into(), json!(""));
        }
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2", "kind": "ProxmoxMachine",
            "metadata": { "name": name, "labels": labels },
            "spec": { "network": { "networkDevices": [] } },
            "status": node.map(|n| json!({ "proxmoxNode": n })).unwrap_or(json!({})),
        }))
        .unwrap()
    };
    let machines = [
        located("w-2", Some("pve2"), false),
        located("cp-1", Some("pve1"), true),
        located("w-1", None, false),
    ];
    let refs: Vec<&ProxmoxMachine> = machines.iter().collect();
    let locations = node_locations(&refs).unwrap();
    assert_eq!(locations.control_plane.unwrap()[0].node, "pve1");
    let workers = locations.workers.unwrap();
    assert_eq!(workers.len(), 1, "unplaced machines are not listed");
    assert_eq!(workers[0].machine.name, "w-2");
    assert!(node_locations(&[]).is_none());
}
