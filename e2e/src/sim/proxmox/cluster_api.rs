//! `/version`, `/nodes`, node status and `/cluster/*` (pve-manager).

use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::params::{Kind, Schema, optional, required};
use super::router::{Call, Reply};
use super::state::{Cluster, Power, Vm};
use super::vm_config::{Drive, PropertyString, cpus, memory_mib, parse_size};

const MIB: u64 = 1024 * 1024;
/// What the host itself uses, so node memory is never reported as idle.
const HOST_MEMORY_USED: u64 = 2048 * MIB;

/// GET /version — any authenticated caller.
pub fn version(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[]))?;
    let version = &call.cluster.version;
    let release = version
        .rsplit_once('.')
        .map_or(version.as_str(), |(release, _)| release);
    Ok(json!({
        "version": version,
        "release": release,
        "repoid": "5e11a15e",
    })
    .into())
}

fn node_memory_used(cluster: &Cluster, node: &str) -> u64 {
    HOST_MEMORY_USED
        + cluster
            .vms
            .values()
            .filter(|vm| vm.node == node && vm.is_running())
            .map(|vm| memory_mib(&vm.config) * MIB)
            .sum::<u64>()
}

/// GET /nodes — every node; statistics only where the caller has Sys.Audit.
pub fn nodes(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[]))?;
    let perms = call.perms();
    let cluster = &*call.cluster;
    let list: Vec<Value> = cluster
        .nodes
        .values()
        .map(|node| {
            let name = &node.spec.name;
            let mut entry = json!({
                "node": name,
                "id": format!("node/{name}"),
                "type": "node",
                "status": if node.online { "online" } else { "offline" },
                "level": "",
                "ssl_fingerprint": "00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF",
            });
            if node.online && perms.has(&format!("/nodes/{name}"), &["Sys.Audit"]) {
                entry["cpu"] = json!(0.02);
                entry["maxcpu"] = json!(node.spec.cpus);
                entry["mem"] = json!(node_memory_used(cluster, name));
                entry["maxmem"] = json!(node.spec.memory_bytes);
                entry["disk"] = json!(8u64 << 30);
                entry["maxdisk"] = json!(100u64 << 30);
                entry["uptime"] = json!(cluster.started.elapsed().as_secs() + 3600);
            }
            entry
        })
        .collect();
    Ok(Value::Array(list).into())
}

/// GET /nodes/{node}/status — Sys.Audit on /nodes/{node}.
pub fn node_status(call: &mut Call<'_>) -> ApiResult<Reply> {
    let node = call.node();
    call.perms()
        .check(&format!("/nodes/{node}"), &["Sys.Audit"])?;
    call.params
        .verify(&Schema::new(&[required("node", Kind::String)]))?;
    let cluster = &*call.cluster;
    let state = cluster.check_node(&node)?;
    let total = state.spec.memory_bytes;
    let used = node_memory_used(cluster, &node).min(total);
    Ok(json!({
        "memory": {"total": total, "used": used, "free": total - used},
        "swap": {"total": 0, "used": 0, "free": 0},
        "cpu": 0.02,
        "wait": 0,
        "cpuinfo": {
            "cpus": state.spec.cpus,
            "cores": state.spec.cpus,
            "sockets": 1,
            "model": "pve-sim virtual CPU",
            "mhz": "2400.000",
            "hvm": "1",
        },
        "uptime": cluster.started.elapsed().as_secs() + 3600,
        "loadavg": ["0.10", "0.05", "0.01"],
        "kversion": "Linux 6.14.8-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2",
        "pveversion": format!("pve-manager/{}/5e11a15e", cluster.version),
        "rootfs": {"total": 100u64 << 30, "used": 8u64 << 30, "free": 92u64 << 30, "avail": 92u64 << 30},
        "idle": 0,
    })
    .into())
}

/// The boot disk's size (`bootdisk_size`): first disk of the boot order,
/// else the first of scsi0/virtio0/sata0/ide0 that is not a CD-ROM.
pub fn boot_disk_size(vm: &Vm) -> u64 {
    let order: Vec<String> = vm
        .config
        .get("boot")
        .map(|b| PropertyString::parse(b))
        .and_then(|p| {
            p.get("order")
                .map(|o| o.split(';').map(String::from).collect())
        })
        .unwrap_or_else(|| {
            ["scsi0", "virtio0", "sata0", "ide0"]
                .map(String::from)
                .to_vec()
        });
    order
        .iter()
        .filter_map(|key| vm.config.get(key))
        .filter_map(|value| Drive::parse(value))
        .find(|drive| !drive.is_cdrom())
        .and_then(|drive| drive.props.get("size").and_then(parse_size))
        .unwrap_or(0)
}

/// A VM as `/cluster/resources` and pool member lists show it.
pub fn vm_resource(cluster: &Cluster, vm: &Vm) -> Value {
    let online = cluster.nodes.get(&vm.node).is_some_and(|n| n.online);
    let status = match (online, vm.power) {
        (false, _) => "unknown",
        (true, Power::Running { .. }) => "running",
        (true, Power::Stopped) => "stopped",
    };
    let running = vm.is_running() && online;
    let maxmem = memory_mib(&vm.config) * MIB;
    json!({
        "id": format!("qemu/{}", vm.vmid),
        "vmid": vm.vmid,
        "node": vm.node,
        "type": "qemu",
        "status": status,
        "name": vm.name(),
        "template": u8::from(vm.is_template()),
        "maxcpu": cpus(&vm.config),
        "cpu": if running { 0.01 } else { 0.0 },
        "maxmem": maxmem,
        "mem": if running { maxmem / 2 } else { 0 },
        "maxdisk": boot_disk_size(vm),
        "disk": 0,
        "uptime": if running { vm.uptime_secs() } else { 0 },
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
    })
}

fn storage_resource(cluster: &Cluster, storage_id: &str, node: &str) -> Value {
    let storage = &cluster.storages[storage_id];
    json!({
        "id": format!("storage/{node}/{storage_id}"),
        "storage": storage_id,
        "node": node,
        "type": "storage",
        "plugintype": storage.kind.as_str(),
        "status": "available",
        "shared": u8::from(storage.shared),
        "content": storage.content.join(","),
        "maxdisk": storage.total_bytes,
        "disk": cluster.used_bytes(node, storage),
    })
}

/// GET /cluster/resources — every caller; rows filtered by what it may audit.
pub fn resources(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params
        .verify(&Schema::new(&[optional("type", Kind::String)]))?;
    let kind = call.params.string("type");
    if let Some(kind) = &kind
        && !["vm", "storage", "node", "sdn"].contains(&kind.as_str())
    {
        return Err(ApiError::param(
            "type",
            format!(
                "value '{kind}' does not have a value in the enumeration 'vm, storage, node, sdn'"
            ),
        ));
    }
    let wants = |k: &str| kind.as_deref().is_none_or(|wanted| wanted == k);
    let perms = call.perms();
    let cluster = &*call.cluster;
    let mut rows = Vec::new();

    if kind.is_none() {
        for pool in cluster.users.pools.keys() {
            if perms.has(&format!("/pool/{pool}"), &["Pool.Audit"]) {
                rows.push(json!({"id": format!("/pool/{pool}"), "pool": pool, "type": "pool"}));
            }
        }
    }
    if wants("vm") {
        for vm in cluster.vms.values() {
            if !perms.has(&format!("/vms/{}", vm.vmid), &["VM.Audit"]) {
                continue;
            }
            let mut entry = vm_resource(cluster, vm);
            if let Some(lock) = vm.lock() {
                entry["lock"] = json!(lock);
            }
            if let Some(tags) = vm.config.get("tags") {
                entry["tags"] = json!(tags);
            }
            if let Some(pool) = cluster.users.pool_of_vm(vm.vmid)
                && perms.has(&format!("/pool/{pool}"), &["Pool.Audit"])
            {
                entry["pool"] = json!(pool);
            }
            rows.push(entry);
        }
    }
    if wants("node") {
        for node in cluster.nodes.values() {
            let name = &node.spec.name;
            let mut entry = json!({
                "id": format!("node/{name}"),
                "node": name,
                "type": "node",
                "status": if node.online { "online" } else { "offline" },
                "level": "",
                "cgroup-mode": 2,
            });
            if perms.has(&format!("/nodes/{name}"), &["Sys.Audit"]) {
                entry["maxcpu"] = json!(node.spec.cpus);
                entry["maxmem"] = json!(node.spec.memory_bytes);
                entry["maxdisk"] = json!(100u64 << 30);
                if node.online {
                    entry["cpu"] = json!(0.02);
                    entry["mem"] = json!(node_memory_used(cluster, name));
                    entry["disk"] = json!(8u64 << 30);
                    entry["uptime"] = json!(cluster.started.elapsed().as_secs() + 3600);
                }
            }
            rows.push(entry);
        }
    }
    if wants("storage") {
        for (id, storage) in &cluster.storages {
            if !perms.has(&format!("/storage/{id}"), &["Datastore.Audit"]) {
                continue;
            }
            for node in cluster.nodes.keys() {
                if cluster.storage_available_on(storage, node) {
                    rows.push(storage_resource(cluster, id, node));
                }
            }
        }
    }
    Ok(Value::Array(rows).into())
}

/// GET /cluster/nextid — the id as a JSON string; with `vmid`, asserts it
/// is free.
pub fn nextid(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params
        .verify(&Schema::new(&[optional("vmid", Kind::Vmid)]))?;
    if let Some(vmid) = call.params.vmid("vmid") {
        if call.cluster.vms.contains_key(&vmid) {
            return Err(ApiError::param("vmid", format!("VM {vmid} already exists")));
        }
        return Ok(json!(vmid.to_string()).into());
    }
    let next = call
        .cluster
        .next_free_vmid()
        .ok_or_else(|| ApiError::internal("unable to get any free VMID in range [100, 1000000]"))?;
    Ok(json!(next.to_string()).into())
}

/// GET /cluster/status — Sys.Audit on /.
pub fn cluster_status(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.perms().check("/", &["Sys.Audit"])?;
    call.params.verify(&Schema::new(&[]))?;
    let cluster = &*call.cluster;
    let local = cluster.nodes.keys().next().cloned().unwrap_or_default();
    let mut rows = Vec::new();
    match &cluster.cluster_name {
        Some(name) => {
            let online = cluster.nodes.values().filter(|n| n.online).count();
            rows.push(json!({
                "type": "cluster",
                "id": "cluster",
                "name": name,
                "nodes": cluster.nodes.len(),
                "version": cluster.nodes.len() + 1,
                "quorate": u8::from(online * 2 > cluster.nodes.len()),
            }));
            for node in cluster.nodes.values() {
                rows.push(json!({
                    "type": "node",
                    "id": format!("node/{}", node.spec.name),
                    "name": node.spec.name,
                    "nodeid": node.nodeid,
                    "ip": node.ip.to_string(),
                    "local": u8::from(node.spec.name == local),
                    "online": u8::from(node.online),
                    "level": "",
                }));
            }
        }
        None => {
            let node = &cluster.nodes[&local];
            rows.push(json!({
                "type": "node",
                "id": format!("node/{local}"),
                "name": local,
                "nodeid": 0,
                "ip": node.ip.to_string(),
                "local": 1,
                "online": 1,
                "level": "",
            }));
        }
    }
    Ok(Value::Array(rows).into())
}
