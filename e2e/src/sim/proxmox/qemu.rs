//! `/nodes/{node}/qemu/…` (qemu-server): VM list, create, config,
//! power, clone, resize, template, destroy — with the privilege checks
//! qemu-server makes, in the order it makes them.

use serde_json::{Value, json};
use std::collections::BTreeMap;

use super::cluster_api::boot_disk_size;
use super::error::{ApiError, ApiResult};
use super::guest::{self, agent_enabled};
use super::params::{Kind, Prop, Schema, optional, required, split_list};
use super::permissions::{Perms, normalize_path};
use super::router::{Call, Reply};
use super::state::{Cluster, Power, Vm, Volume, disk_drive_string, parse_volname};
use super::tasks::{self, TaskPlan};
use super::vm_config::{
    Drive, KeyPrivilege, NetDevice, config_key_kind, cpus, format_size, is_drive_key, is_net_key,
    key_privilege, memory_mib, parse_resize, parse_size, parse_tags, random_mac, random_uuid,
    render_value, takes_effect_while_running, valid_boot, valid_dns_name, volid_storage,
};

const GIB: u64 = 1024 * 1024 * 1024;

/// The privileges any of which lets a caller into the config update
/// methods (`$vm_config_perm_list`).
const VM_CONFIG_PERM_LIST: &[&str] = &[
    "VM.Config.Disk",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.HWType",
    "VM.Config.Options",
    "VM.Config.Cloudinit",
];

fn base_props() -> [Prop; 2] {
    [required("node", Kind::String), required("vmid", Kind::Vmid)]
}

fn with_base(extra: &[Prop]) -> Vec<Prop> {
    let mut props = base_props().to_vec();
    props.extend_from_slice(extra);
    props
}

// ---------------------------------------------------------------- listing

fn vm_status_json(vm: &Vm) -> Value {
    let running = vm.is_running();
    let maxmem = memory_mib(&vm.config) * 1024 * 1024;
    let mut value = json!({
        "vmid": vm.vmid,
        "name": vm.name(),
        "status": if running { "running" } else { "stopped" },
        "cpus": cpus(&vm.config),
        "maxmem": maxmem,
        "mem": if running { maxmem / 2 } else { 0 },
        "maxdisk": boot_disk_size(vm),
        "disk": 0,
        "cpu": if running { 0.01 } else { 0.0 },
        "uptime": vm.uptime_secs(),
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
    });
    if let Power::Running { pid, paused, .. } = vm.power {
        value["pid"] = json!(pid);
        value["qmpstatus"] = json!(if paused { "paused" } else { "running" });
    } else {
        value["qmpstatus"] = json!("stopped");
    }
    if vm.is_template() {
        value["template"] = json!(1);
    }
    if let Some(lock) = vm.lock() {
        value["lock"] = json!(lock);
    }
    if let Some(tags) = vm.config.get("tags") {
        value["tags"] = json!(tags);
    }
    value
}

/// GET /nodes/{node}/qemu — VMs on the node the caller may audit.
pub fn list(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        optional("full", Kind::Boolean),
    ]))?;
    let node = call.node();
    let perms = call.perms();
    let list: Vec<Value> = call
        .cluster
        .vms
        .values()
        .filter(|vm| vm.node == node)
        .filter(|vm| perms.has(&format!("/vms/{}", vm.vmid), &["VM.Audit"]))
        .map(vm_status_json)
        .collect();
    Ok(Value::Array(list).into())
}

/// GET /nodes/{node}/lxc — the simulator runs no containers.
pub fn lxc_list(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params
        .verify(&Schema::new(&[required("node", Kind::String)]))?;
    Ok(json!([]).into())
}

/// GET /nodes/{node}/qemu/{vmid} — the directory index.
pub fn index(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&base_props()))?;
    call.cluster.vm_on(&call.node(), call.vmid())?;
    let subdirs = [
        "config",
        "pending",
        "status",
        "unlink",
        "vncproxy",
        "migrate",
        "resize",
        "move",
        "rrd",
        "rrddata",
        "monitor",
        "agent",
        "snapshot",
        "spiceproxy",
        "sendkey",
        "firewall",
    ];
    Ok(Value::Array(subdirs.iter().map(|s| json!({ "subdir": s })).collect()).into())
}

/// GET …/status/current — VM.Audit.
pub fn status_current(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms().check(&format!("/vms/{vmid}"), &["VM.Audit"])?;
    call.params.verify(&Schema::new(&base_props()))?;
    let vm = call.cluster.vm_on(&call.node(), vmid)?;
    let mut value = vm_status_json(vm);
    value["ha"] = json!({ "managed": 0 });
    if agent_enabled(vm) {
        value["agent"] = json!(1);
    }
    if vm.is_running() {
        value["running-machine"] = json!("pc-i440fx-9.2+pve1");
        value["running-qemu"] = json!("9.2.0");
    }
    Ok(value.into())
}

/// GET …/config — VM.Audit; pending changes applied unless `current`.
pub fn config(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms().check(&format!("/vms/{vmid}"), &["VM.Audit"])?;
    call.params.verify(&Schema::new(&with_base(&[
        optional("current", Kind::Boolean),
        optional("snapshot", Kind::String),
    ])))?;
    if let Some(snapshot) = call.params.string("snapshot") {
        return Err(ApiError::internal(format!(
            "snapshot '{snapshot}' does not exist"
        )));
    }
    let vm = call.cluster.vm_on(&call.node(), vmid)?;
    let config = if call.params.flag("current") {
        vm.config.clone()
    } else {
        vm.merged_config()
    };
    let mut value = serde_json::Map::new();
    for (key, item) in &config {
        let rendered = if key == "cipassword" {
            json!("**********")
        } else {
            render_value(key, item)
        };
        value.insert(key.clone(), rendered);
    }
    value.insert("digest".into(), json!(vm.digest()));
    Ok(Value::Object(value).into())
}

/// GET …/pending — VM.Audit.
pub fn pending(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms().check(&format!("/vms/{vmid}"), &["VM.Audit"])?;
    call.params.verify(&Schema::new(&base_props()))?;
    let vm = call.cluster.vm_on(&call.node(), vmid)?;
    let mut keys: Vec<&String> = vm.config.keys().chain(vm.pending.keys()).collect();
    keys.sort();
    keys.dedup();
    let rows = keys
        .into_iter()
        .map(|key| {
            let mut row = json!({ "key": key });
            if let Some(value) = vm.config.get(key) {
                row["value"] = render_value(key, value);
            }
            match vm.pending.get(key) {
                Some(Some(value)) => row["pending"] = render_value(key, value),
                Some(None) => row["delete"] = json!(1),
                None => {}
            }
            row
        })
        .collect();
    Ok(Value::Array(rows).into())
}

// ---------------------------------------------------------- config checks

/// Validates and normalises config values, as the schema formats do;
/// network devices without a MAC get a fresh one.
fn normalize_settings(
    cluster: &mut Cluster,
    settings: &mut BTreeMap<String, String>,
) -> ApiResult<()> {
    let mut errors = BTreeMap::new();
    for (key, value) in settings.iter_mut() {
        let result: Result<(), String> = (|| {
            if is_net_key(key) {
                let mut net =
                    NetDevice::parse(value).map_err(|e| format!("invalid format - {e}"))?;
                if net.mac.is_none() {
                    net.mac = Some(random_mac(&mut cluster.rng));
                }
                *value = net.print();
            } else if is_drive_key(key) {
                let drive = Drive::parse(value)
                    .ok_or_else(|| "unable to parse drive options".to_string())?;
                if drive.props.get("import-from").is_some() {
                    return Err("'import-from' is not supported by the simulator".into());
                }
                let (vtype, _) = parse_volname(&drive.file);
                if drive.file.contains(':')
                    && drive.new_disk_request().is_none()
                    && vtype == "iso"
                    && !drive.is_cdrom()
                {
                    return Err("explicit 'media=cdrom' is required for iso images".into());
                }
                *value = drive.print();
            } else {
                match key.as_str() {
                    "name" if !valid_dns_name(value) => {
                        return Err(
                            "invalid format - value does not look like a valid DNS name".into()
                        );
                    }
                    "boot" if !valid_boot(value) => {
                        return Err(format!(
                            "invalid format - format error: boot order '{value}' is not valid"
                        ));
                    }
                    "tags" => *value = parse_tags(value)?.join(";"),
                    "memory" => {
                        let mib = value.trim_start_matches("current=");
                        if !mib.parse::<u64>().is_ok_and(|m| m >= 16) {
                            return Err(format!(
                                "invalid format - memory value '{value}' is not valid"
                            ));
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        })();
        if let Err(message) = result {
            errors.insert(key.clone(), message);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::params(errors))
    }
}

/// `check_vm_modify_config_perm`.
fn check_config_keys<'k>(
    perms: &Perms<'_>,
    vmid: u32,
    pool: Option<&str>,
    keys: impl IntoIterator<Item = &'k String>,
) -> ApiResult<()> {
    if perms.is_root() {
        return Ok(());
    }
    for key in keys {
        match key_privilege(key) {
            KeyPrivilege::All(privileges) => perms.check_vm(vmid, pool, privileges, false)?,
            KeyPrivilege::Any(privileges) => perms.check_vm(vmid, pool, privileges, true)?,
            KeyPrivilege::ByValue => {
                // Tags need VM.Config.Options on the VM (`assert_tag_permissions`).
                if key == "tags" {
                    perms.check(&format!("/vms/{vmid}"), &["VM.Config.Options"])?;
                }
            }
            KeyPrivilege::RootOnly => {
                return Err(ApiError::internal(format!(
                    "only root can set '{key}' config"
                )));
            }
        }
    }
    Ok(())
}

/// `check_volume_access` of pve-storage.
pub fn check_volume_access(perms: &Perms<'_>, vmid: Option<u32>, volid: &str) -> ApiResult<()> {
    let Some(storage) = volid_storage(volid) else {
        if perms.is_root() {
            return Ok(());
        }
        return Err(ApiError::internal(
            "Only root can pass arbitrary filesystem paths.",
        ));
    };
    let storage_path = format!("/storage/{storage}");
    if perms.has(&storage_path, &["Datastore.Allocate"]) {
        return Ok(());
    }
    let (vtype, owner) = parse_volname(volid);
    match (vtype.as_str(), owner) {
        ("iso" | "vztmpl" | "import", _) => perms.check_any(
            &storage_path,
            &["Datastore.AllocateSpace", "Datastore.Audit"],
        ),
        (_, Some(owner)) if Some(owner) == vmid => Ok(()),
        ("images", Some(owner)) => {
            perms.check(&storage_path, &["Datastore.Audit"])?;
            perms.check(&format!("/vms/{owner}"), &["VM.Config.Disk"])
        }
        _ => Err(ApiError::internal(format!(
            "missing privileges to access {volid}"
        ))),
    }
}

/// `$check_storage_access`: what each drive value needs.
fn check_storage_access(
    perms: &Perms<'_>,
    cluster: &Cluster,
    vmid: u32,
    settings: &BTreeMap<String, String>,
    default_storage: Option<&str>,
) -> ApiResult<()> {
    for (key, value) in settings.iter().filter(|(k, _)| is_drive_key(k)) {
        let Some(drive) = Drive::parse(value) else {
            continue;
        };
        if drive.file == "none" || drive.file.ends_with(":cloudinit") || drive.file == "cloudinit" {
            continue;
        }
        if drive.is_cdrom() && drive.file == "cdrom" {
            perms.check("/", &["Sys.Console"])?;
        } else if let (false, Some((storage, _))) = (drive.is_cdrom(), drive.new_disk_request()) {
            let storage = storage.or(default_storage).ok_or_else(|| {
                ApiError::internal("no storage ID specified (and no default storage)")
            })?;
            perms.check(&format!("/storage/{storage}"), &["Datastore.AllocateSpace"])?;
            let config = cluster.storage(storage)?;
            if !config.content.iter().any(|c| c == "images") {
                return Err(ApiError::param(
                    "storage",
                    format!("storage '{storage}' does not support vm images"),
                ));
            }
        } else {
            check_volume_access(perms, Some(vmid), &drive.file)?;
            if drive.storage().is_some() {
                let (vtype, _) = parse_volname(&drive.file);
                if vtype != "images" && vtype != "iso" {
                    return Err(ApiError::param(
                        key.clone(),
                        "content type needs to be 'images' or 'iso'",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `check_bridge_access`: SDN.Use on the local bridge (or its VLAN).
fn check_bridge_access(perms: &Perms<'_>, settings: &BTreeMap<String, String>) -> ApiResult<()> {
    if perms.is_root() {
        return Ok(());
    }
    for value in settings
        .iter()
        .filter(|(k, _)| is_net_key(k))
        .map(|(_, v)| v)
    {
        let Ok(net) = NetDevice::parse(value) else {
            continue;
        };
        let Some(bridge) = net.bridge() else { continue };
        let path = match net.tag() {
            Some(tag) => format!("/sdn/zones/localnetwork/{bridge}/{tag}"),
            None => format!("/sdn/zones/localnetwork/{bridge}"),
        };
        perms.check(&path, &["SDN.Use"])?;
    }
    Ok(())
}

fn config_settings(call: &Call<'_>) -> BTreeMap<String, String> {
    call.params.matching(|key| config_key_kind(key).is_some())
}

/// Allocates the disks a config asks for (`storage:size`) and returns the
/// settings with volume ids, plus the volumes created (for rollback).
fn create_disks(
    cluster: &mut Cluster,
    node: &str,
    vmid: u32,
    settings: &mut BTreeMap<String, String>,
    default_storage: Option<&str>,
) -> Result<Vec<String>, String> {
    let mut created = Vec::new();
    for (key, value) in settings.iter_mut().filter(|(k, _)| is_drive_key(k)) {
        let Some(drive) = Drive::parse(value) else {
            continue;
        };
        if drive.file.ends_with(":cloudinit") {
            let storage = drive.storage().unwrap_or_default().to_string();
            let volid = cluster
                .alloc_disk(
                    node,
                    &storage,
                    vmid,
                    4 * 1024 * 1024,
                    None,
                    Some(&format!("vm-{vmid}-cloudinit")),
                )
                .map_err(|e| e.message.trim_end().to_string())?;
            created.push(volid.clone());
            let mut props = drive.props.clone();
            props.first = Some(volid);
            props.set("media", "cdrom");
            *value = props.print();
            continue;
        }
        if drive.is_cdrom() {
            continue;
        }
        let Some((storage, size_gib)) = drive.new_disk_request() else {
            continue;
        };
        let storage = storage
            .or(default_storage)
            .ok_or_else(|| "no storage ID specified (and no default storage)".to_string())?
            .to_string();
        let size = (size_gib * GIB as f64) as u64;
        let format = drive.props.get("format").map(str::to_string);
        let volid = cluster
            .alloc_disk(node, &storage, vmid, size, format.as_deref(), None)
            .map_err(|e| format!("{key}: {}", e.message.trim_end()))?;
        created.push(volid.clone());
        let mut props = drive.props.clone();
        props.remove("format");
        *value = disk_drive_string(&volid, size, &props);
    }
    Ok(created)
}

fn free_volumes(cluster: &mut Cluster, node: &str, volids: &[String]) {
    for volid in volids {
        cluster.remove_volume(node, volid);
    }
}

/// The default boot order: the first disk, CD-ROMs, the first NIC.
fn default_boot(settings: &BTreeMap<String, String>) -> String {
    let drives: Vec<(String, Drive)> = super::vm_config::drive_keys()
        .filter_map(|k| {
            settings
                .get(&k)
                .and_then(|v| Drive::parse(v))
                .map(|d| (k, d))
        })
        .collect();
    let mut order: Vec<String> = drives
        .iter()
        .find(|(_, d)| !d.is_cdrom())
        .map(|(k, _)| k.clone())
        .into_iter()
        .collect();
    order.extend(
        drives
            .iter()
            .filter(|(_, d)| d.is_cdrom())
            .map(|(k, _)| k.clone()),
    );
    if settings.contains_key("net0") {
        order.push("net0".into());
    }
    format!("order={}", order.join(";"))
}

// ----------------------------------------------------------------- create

/// POST /nodes/{node}/qemu — create a VM (task `qmcreate`).
pub fn create(call: &mut Call<'_>) -> ApiResult<Reply> {
    let props = with_base(&[
        optional("pool", Kind::String),
        optional("storage", Kind::String),
        optional("start", Kind::Boolean),
        optional("bwlimit", Kind::int_min(0)),
    ]);
    let extra = |key: &str| config_key_kind(key);
    call.params.verify(&Schema::with_extra(&props, &extra))?;
    let node = call.node();
    let vmid = call.vmid();
    let pool = call.params.string("pool");
    let storage = call.params.string("storage");
    let start_after = call.params.flag("start");
    let mut settings = config_settings(call);

    {
        let perms = call.perms();
        if let Some(pool) = &pool
            && !call.cluster.users.pools.contains_key(pool)
        {
            return Err(ApiError::permission_what(format!(
                "pool '{pool}' does not exist"
            )));
        }
        if let Some(storage) = &storage {
            perms.check(&format!("/storage/{storage}"), &["Datastore.AllocateSpace"])?;
        }
        if start_after {
            perms.check_vm(vmid, pool.as_deref(), &["VM.PowerMgmt"], false)?;
        }
        let allowed = perms.has(&format!("/vms/{vmid}"), &["VM.Allocate"])
            || pool
                .as_ref()
                .is_some_and(|p| perms.has(&format!("/pool/{p}"), &["VM.Allocate"]));
        if !allowed {
            return Err(ApiError::permission_denied());
        }
        if !settings.is_empty() {
            check_storage_access(&perms, call.cluster, vmid, &settings, storage.as_deref())?;
            check_config_keys(&perms, vmid, pool.as_deref(), settings.keys())?;
            check_bridge_access(&perms, &settings)?;
        }
    }
    normalize_settings(call.cluster, &mut settings)?;
    if let Some(existing) = call.cluster.vms.get(&vmid) {
        return Err(ApiError::internal(format!(
            "unable to create VM {vmid} - VM {vmid} already exists on node '{}'",
            existing.node
        )));
    }

    // `create_and_lock_config`: the config exists (locked) while the task runs.
    let mut locked = BTreeMap::new();
    locked.insert("lock".to_string(), "create".to_string());
    call.cluster.vms.insert(vmid, Vm::new(vmid, &node, locked));

    let smbios_uuid = random_uuid(&mut call.cluster.rng);
    let vmgenid = random_uuid(&mut call.cluster.rng);
    let task_node = node.clone();
    let rollback_node = node.clone();
    let plan = TaskPlan::new()
        .step(1, move |ctx| {
            let mut settings = settings;
            let created = create_disks(
                ctx.cluster,
                &task_node,
                vmid,
                &mut settings,
                storage.as_deref(),
            )
            .map_err(|e| format!("unable to create VM {vmid} - {e}"))?;
            ctx.log
                .extend(created.iter().map(|v| format!("created volume '{v}'")));
            if !settings.contains_key("boot") {
                settings.insert("boot".into(), default_boot(&settings));
            }
            settings
                .entry("smbios1".into())
                .or_insert_with(|| format!("uuid={smbios_uuid}"));
            settings
                .entry("vmgenid".into())
                .or_insert_with(|| vmgenid.to_string());
            settings.insert(
                "meta".into(),
                format!("creation-qemu=9.2.0,ctime={}", Cluster::now_epoch()),
            );
            if let Some(vm) = ctx.cluster.vms.get_mut(&vmid) {
                vm.config = settings;
            }
            if let Some(pool) = &pool
                && let Some(entry) = ctx.cluster.users.pools.get_mut(pool)
            {
                entry.vms.insert(vmid);
            }
            if start_after {
                ctx.log.push("Execute autostart".into());
                guest::power_on(ctx.shared, ctx.cluster, vmid);
            }
            Ok(())
        })
        .on_failure(move |cluster| {
            if let Some(vm) = cluster.vms.remove(&vmid) {
                let volumes: Vec<String> = vm
                    .drives()
                    .into_iter()
                    .filter(|(_, d)| !d.is_cdrom())
                    .map(|(_, d)| d.file)
                    .collect();
                free_volumes(cluster, &rollback_node, &volumes);
            }
            cluster.users.remove_vm_access(vmid);
        });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "qmcreate",
        &vmid.to_string(),
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

// ----------------------------------------------------------------- update

fn update(call: &mut Call<'_>, sync: bool) -> ApiResult<Reply> {
    let vmid = call.vmid();
    let node = call.node();
    call.perms()
        .check_any(&format!("/vms/{vmid}"), VM_CONFIG_PERM_LIST)?;
    let mut props = with_base(&[
        optional("skiplock", Kind::Boolean),
        optional("delete", Kind::String),
        optional("revert", Kind::String),
        optional("force", Kind::Boolean),
        optional("digest", Kind::String),
    ]);
    if !sync {
        props.push(optional(
            "background_delay",
            Kind::Integer {
                min: Some(1),
                max: Some(30),
            },
        ));
    }
    let extra = |key: &str| config_key_kind(key);
    call.params.verify(&Schema::with_extra(&props, &extra))?;

    let skiplock = call.params.flag("skiplock");
    if skiplock && !call.perms().is_root() {
        return Err(ApiError::param(
            "skiplock",
            "Only root may use this option.",
        ));
    }
    let digest = call.params.string("digest");
    let force = call.params.flag("force");
    let mut settings = config_settings(call);
    if let Some(value) = settings.remove("cdrom") {
        let value = if value.contains("media=") {
            value
        } else {
            format!("{value},media=cdrom")
        };
        settings.insert("ide2".into(), value);
    }
    let mut delete = Vec::new();
    for option in split_list(&call.params.string("delete").unwrap_or_default()) {
        let option = if option == "cdrom" {
            "ide2".to_string()
        } else {
            option
        };
        if settings.contains_key(&option) {
            return Err(ApiError::param(
                "delete",
                format!("you can't use '-{option}' and -delete {option}' at the same time"),
            ));
        }
        if config_key_kind(&option).is_none() {
            return Err(ApiError::param(
                "delete",
                format!("unknown option '{option}'"),
            ));
        }
        delete.push(option);
    }
    let revert = call.params.string("revert").unwrap_or_default();
    if delete.is_empty() && settings.is_empty() && revert.is_empty() {
        return Err(ApiError::internal("no options specified"));
    }
    normalize_settings(call.cluster, &mut settings)?;
    {
        let perms = call.perms();
        check_config_keys(&perms, vmid, None, delete.iter())?;
        check_config_keys(&perms, vmid, None, settings.keys())?;
        check_storage_access(&perms, call.cluster, vmid, &settings, None)?;
        check_bridge_access(&perms, &settings)?;
    }

    // Early checks before forking: the config exists, digest, lock.
    let vm = call.cluster.vm_on(&node, vmid)?;
    if let Some(digest) = &digest
        && *digest != vm.digest()
    {
        return Err(ApiError::internal(
            "checksum mismatch (file change by other user?)",
        ));
    }
    if !skiplock {
        vm.check_lock()?;
    }
    let update = ConfigUpdate {
        node: node.clone(),
        vmid,
        settings,
        delete,
        force,
        skiplock,
        authid: call.authid.to_string(),
    };
    if sync {
        update.apply(call.cluster)?;
        return Ok(Reply::null());
    }
    let plan = TaskPlan::new().step(1, move |ctx| {
        update
            .apply(ctx.cluster)
            .map_err(|e| e.message.trim_end().to_string())
    });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "qmconfig",
        &vmid.to_string(),
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

/// A config change as `$updatefn` applies it, under the config lock: in
/// the request for `PUT`, in the `qmconfig` task for `POST`.
struct ConfigUpdate {
    node: String,
    vmid: u32,
    settings: BTreeMap<String, String>,
    delete: Vec<String>,
    force: bool,
    skiplock: bool,
    authid: String,
}

impl ConfigUpdate {
    fn apply(self, cluster: &mut Cluster) -> ApiResult<()> {
        let Self {
            node,
            vmid,
            mut settings,
            delete,
            force,
            skiplock,
            authid,
        } = self;
        {
            let vm = cluster.vm_on(&node, vmid)?;
            if !skiplock {
                vm.check_lock()?;
            }
            // `$check_drive_perms`: CD-ROM media need VM.Config.CDROM, other
            // drives VM.Config.Disk, checked for every drive set or deleted.
            let perms = Perms::new(&cluster.users, &authid);
            for key in settings
                .keys()
                .chain(delete.iter())
                .filter(|k| is_drive_key(k))
            {
                let value = settings.get(key).or_else(|| vm.config.get(key));
                let cdrom = value
                    .and_then(|v| Drive::parse(v))
                    .is_some_and(|d| d.is_cdrom());
                let privilege = if cdrom {
                    "VM.Config.CDROM"
                } else {
                    "VM.Config.Disk"
                };
                perms.check_vm(vmid, None, &[privilege], false)?;
            }
        }
        create_disks(cluster, &node, vmid, &mut settings, None).map_err(ApiError::internal)?;
        apply_changes(cluster, &node, vmid, settings, delete, force);
        Ok(())
    }
}

fn apply_changes(
    cluster: &mut Cluster,
    node: &str,
    vmid: u32,
    settings: BTreeMap<String, String>,
    delete: Vec<String>,
    force: bool,
) {
    let mut freed = Vec::new();
    let vm = cluster.vms.get_mut(&vmid).expect("checked above");
    let running = vm.is_running();
    for key in delete {
        if running && !takes_effect_while_running(&key) {
            vm.pending.insert(key, None);
            continue;
        }
        let Some(old) = vm.config.remove(&key) else {
            continue;
        };
        // A detached disk stays as `unusedN` unless forced away.
        if is_drive_key(&key)
            && let Some(drive) = Drive::parse(&old)
            && !drive.is_cdrom()
            && drive.file.contains(':')
        {
            if force {
                freed.push(drive.file);
            } else {
                let slot = (0..256)
                    .map(|i| format!("unused{i}"))
                    .find(|k| !vm.config.contains_key(k))
                    .expect("a free unused slot");
                vm.config.insert(slot, drive.file);
            }
        } else if key.starts_with("unused") && force {
            freed.push(old);
        }
    }
    for (key, value) in settings {
        if key == "tags" {
            let merged = parse_tags(&value).unwrap_or_default().join(";");
            vm.config.insert(key, merged);
        } else if running && !takes_effect_while_running(&key) {
            vm.pending.insert(key, Some(value));
        } else {
            vm.pending.remove(&key);
            vm.config.insert(key, value);
        }
    }
    free_volumes(cluster, node, &freed);
}

/// POST …/config — asynchronous (task `qmconfig`).
pub fn update_async(call: &mut Call<'_>) -> ApiResult<Reply> {
    update(call, false)
}

/// PUT …/config — synchronous.
pub fn update_sync(call: &mut Call<'_>) -> ApiResult<Reply> {
    update(call, true)
}

// ------------------------------------------------------------------ power

fn power_props() -> Vec<Prop> {
    with_base(&[
        optional("skiplock", Kind::Boolean),
        optional("timeout", Kind::int_min(0)),
        optional("forceStop", Kind::Boolean),
        optional("keepActive", Kind::Boolean),
        optional("overrule-shutdown", Kind::Boolean),
        optional("migratedfrom", Kind::String),
        optional("stateuri", Kind::String),
        optional("machine", Kind::String),
        optional("force-cpu", Kind::String),
        optional("targetstorage", Kind::String),
        optional("migration_type", Kind::String),
        optional("migration_network", Kind::String),
        optional("todisk", Kind::Boolean),
        optional("statestorage", Kind::String),
        optional("nocheck", Kind::Boolean),
    ])
}

/// Common start of every power call: VM.PowerMgmt, schema, config exists.
fn power_call(call: &mut Call<'_>) -> ApiResult<(String, u32, bool)> {
    let vmid = call.vmid();
    call.perms()
        .check(&format!("/vms/{vmid}"), &["VM.PowerMgmt"])?;
    call.params.verify(&Schema::new(&power_props()))?;
    let skiplock = call.params.flag("skiplock");
    if skiplock && !call.perms().is_root() {
        return Err(ApiError::param(
            "skiplock",
            "Only root may use this option.",
        ));
    }
    let node = call.node();
    call.cluster.vm_on(&node, vmid)?;
    Ok((node, vmid, skiplock))
}

fn locked_check(cluster: &Cluster, vmid: u32, skiplock: bool) -> Result<(), String> {
    let vm = cluster
        .vms
        .get(&vmid)
        .ok_or_else(|| format!("Configuration file for VM {vmid} does not exist"))?;
    if !skiplock {
        vm.check_lock()
            .map_err(|e| e.message.trim_end().to_string())?;
    }
    Ok(())
}

fn power_task(
    call: &mut Call<'_>,
    node: &str,
    vmid: u32,
    task_type: &str,
    plan: TaskPlan,
) -> Reply {
    let upid = tasks::start(
        call.shared,
        call.cluster,
        node,
        task_type,
        &vmid.to_string(),
        call.authid,
        plan,
    );
    json!(upid).into()
}

/// POST …/status/start — task `qmstart`; lock and state are checked in it.
pub fn start(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, skiplock) = power_call(call)?;
    let plan = TaskPlan::new().step(1, move |ctx| {
        let vm = ctx
            .cluster
            .vms
            .get(&vmid)
            .ok_or_else(|| format!("Configuration file for VM {vmid} does not exist"))?;
        if vm.is_template() {
            return Err("you can't start a vm if it's a template".into());
        }
        locked_check(ctx.cluster, vmid, skiplock)?;
        if ctx.cluster.vms[&vmid].is_running() {
            return Err(format!("VM {vmid} already running"));
        }
        guest::power_on(ctx.shared, ctx.cluster, vmid);
        Ok(())
    });
    Ok(power_task(call, &node, vmid, "qmstart", plan))
}

/// POST …/status/stop — task `qmstop`: immediate power off.
pub fn stop(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, skiplock) = power_call(call)?;
    let plan = TaskPlan::new().step(1, move |ctx| {
        locked_check(ctx.cluster, vmid, skiplock)?;
        if let Some(vm) = ctx.cluster.vms.get_mut(&vmid) {
            guest::power_off(vm);
        }
        Ok(())
    });
    Ok(power_task(call, &node, vmid, "qmstop", plan))
}

/// Whether an ACPI request reaches a guest that acts on it.
fn guest_responds(vm: &Vm) -> bool {
    vm.guest.is_up()
}

/// POST …/status/shutdown — task `qmshutdown`: ACPI shutdown; a guest that
/// ignores it makes the task fail after the timeout unless `forceStop`.
pub fn shutdown(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, skiplock) = power_call(call)?;
    let force_stop = call.params.flag("forceStop");
    let vm = call.cluster.vm_on(&node, vmid)?;
    if matches!(vm.power, Power::Running { paused: true, .. }) {
        return Err(ApiError::internal("VM is paused - cannot shutdown"));
    }
    let ignores_acpi = vm.is_running() && !guest_responds(vm);
    let mut plan = TaskPlan::new().step(1, move |ctx| {
        locked_check(ctx.cluster, vmid, skiplock)?;
        let Some(vm) = ctx.cluster.vms.get_mut(&vmid) else {
            return Ok(());
        };
        if !vm.is_running() {
            return Ok(());
        }
        if guest_responds(vm) || force_stop {
            if !guest_responds(vm) {
                ctx.log
                    .push("VM still running - terminating now with SIGTERM".into());
            }
            guest::power_off(vm);
            Ok(())
        } else {
            Err("VM quit/powerdown failed - got timeout".into())
        }
    });
    if ignores_acpi {
        plan = plan.extra_time(call.shared.config.timings.shutdown_timeout);
    }
    Ok(power_task(call, &node, vmid, "qmshutdown", plan))
}

/// POST …/status/reboot — task `qmreboot` (ACPI, like shutdown).
pub fn reboot(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, skiplock) = power_call(call)?;
    let vm = call.cluster.vm_on(&node, vmid)?;
    if matches!(vm.power, Power::Running { paused: true, .. }) {
        return Err(ApiError::internal("VM is paused - cannot shutdown"));
    }
    if !vm.is_running() {
        return Err(ApiError::internal(format!("VM {vmid} not running")));
    }
    let ignores_acpi = !guest_responds(vm);
    let mut plan = TaskPlan::new().step(1, move |ctx| {
        locked_check(ctx.cluster, vmid, skiplock)?;
        let shared = ctx.shared.clone();
        let Some(vm) = ctx.cluster.vms.get_mut(&vmid) else {
            return Ok(());
        };
        if !vm.is_running() {
            return Ok(());
        }
        if !guest_responds(vm) {
            return Err("VM quit/powerdown failed - got timeout".into());
        }
        // A reboot applies pending changes, as qmeventd restarts the VM.
        vm.apply_pending();
        guest::begin_boot(&shared, vm);
        Ok(())
    });
    if ignores_acpi {
        plan = plan.extra_time(call.shared.config.timings.shutdown_timeout);
    }
    Ok(power_task(call, &node, vmid, "qmreboot", plan))
}

/// POST …/status/reset — task `qmreset`: hard reset, the guest boots again.
pub fn reset(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, skiplock) = power_call(call)?;
    if !call.cluster.vm_on(&node, vmid)?.is_running() {
        return Err(ApiError::internal(format!("VM {vmid} not running")));
    }
    let plan = TaskPlan::new().step(1, move |ctx| {
        locked_check(ctx.cluster, vmid, skiplock)?;
        let shared = ctx.shared.clone();
        if let Some(vm) = ctx.cluster.vms.get_mut(&vmid)
            && vm.is_running()
        {
            guest::begin_boot(&shared, vm);
        }
        Ok(())
    });
    Ok(power_task(call, &node, vmid, "qmreset", plan))
}

fn set_paused(cluster: &mut Cluster, vmid: u32, pause: bool) -> Result<(), String> {
    let vm = cluster
        .vms
        .get_mut(&vmid)
        .ok_or_else(|| format!("Configuration file for VM {vmid} does not exist"))?;
    match &mut vm.power {
        Power::Running { paused, .. } => {
            *paused = pause;
            Ok(())
        }
        Power::Stopped => Err(format!("VM {vmid} not running")),
    }
}

/// POST …/status/suspend — task `qmsuspend` (pause, no hibernation).
pub fn suspend(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, skiplock) = power_call(call)?;
    let plan = TaskPlan::new().step(1, move |ctx| {
        locked_check(ctx.cluster, vmid, skiplock)?;
        set_paused(ctx.cluster, vmid, true)
    });
    Ok(power_task(call, &node, vmid, "qmsuspend", plan))
}

/// POST …/status/resume — task `qmresume`.
pub fn resume(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (node, vmid, _) = power_call(call)?;
    if !call.cluster.vm_on(&node, vmid)?.is_running() {
        return Err(ApiError::internal(format!("VM {vmid} not running")));
    }
    let plan = TaskPlan::new().step(1, move |ctx| set_paused(ctx.cluster, vmid, false));
    Ok(power_task(call, &node, vmid, "qmresume", plan))
}

// ------------------------------------------------------------------ clone

/// A disk of the source VM and how it is copied.
struct CloneDisk {
    key: String,
    drive: Drive,
    source_volid: String,
    target_storage: String,
    size: u64,
    format: String,
}

/// POST …/clone — task `qmclone` with the source vmid as task id.
pub fn clone(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    let node = call.node();
    let newid = call.params.vmid("newid");
    let pool_param = call.params.string("pool");
    {
        // and(VM.Clone on the source, or(VM.Allocate on /vms/{newid}, on /pool/{pool}))
        let perms = call.perms();
        perms.check(&format!("/vms/{vmid}"), &["VM.Clone"])?;
        let new_path = normalize_path(&format!(
            "/vms/{}",
            call.params.str("newid").unwrap_or_default()
        ))
        .unwrap_or_else(|| "/vms".to_string());
        let via_vm = perms.has(&new_path, &["VM.Allocate"]);
        let via_pool = pool_param
            .as_ref()
            .is_some_and(|p| perms.has(&format!("/pool/{p}"), &["VM.Allocate"]));
        if !via_vm && !via_pool {
            return Err(ApiError::permission_denied());
        }
    }
    call.params.verify(&Schema::new(&with_base(&[
        required("newid", Kind::Vmid),
        optional("name", Kind::String),
        optional("description", Kind::String),
        optional("pool", Kind::String),
        optional("snapname", Kind::String),
        optional("storage", Kind::String),
        optional("format", Kind::String),
        optional("full", Kind::Boolean),
        optional("target", Kind::String),
        optional("bwlimit", Kind::int_min(0)),
    ])))?;
    let newid = newid.expect("verified");
    let name = call.params.string("name");
    if let Some(name) = &name
        && !valid_dns_name(name)
    {
        return Err(ApiError::param(
            "name",
            "invalid format - value does not look like a valid DNS name",
        ));
    }
    let format = call.params.string("format");
    if let Some(format) = &format
        && !["raw", "qcow2", "vmdk"].contains(&format.as_str())
    {
        return Err(ApiError::param(
            "format",
            format!("value '{format}' does not have a value in the enumeration 'raw, qcow2, vmdk'"),
        ));
    }
    let description = call.params.string("description");
    let storage = call.params.string("storage");
    let target = call
        .params
        .string("target")
        .filter(|t| *t != node && t != "localhost");

    // `$load_and_check`, run before forking.
    if let Some(pool) = &pool_param
        && !call.cluster.users.pools.contains_key(pool)
    {
        return Err(ApiError::permission_what(format!(
            "pool '{pool}' does not exist"
        )));
    }
    if let Some(target) = &target
        && !call.cluster.nodes.contains_key(target)
    {
        return Err(ApiError::internal(format!(
            "no such cluster node '{target}'"
        )));
    }
    if let Some(storage) = &storage {
        let config = call.cluster.storage_on(storage, &node)?;
        if !config.content.iter().any(|c| c == "images") {
            return Err(ApiError::param(
                "storage",
                format!("storage '{storage}' does not support vm images"),
            ));
        }
        if let Some(target) = &target {
            call.cluster.storage_on(storage, target)?;
            if !config.shared {
                return Err(ApiError::internal(format!(
                    "can't clone to non-shared storage '{storage}'"
                )));
            }
        }
    }
    let source = call.cluster.vm_on(&node, vmid)?;
    source.check_lock()?;
    if let Some(snapname) = call.params.string("snapname") {
        return Err(ApiError::internal(format!(
            "snapshot '{snapname}' does not exist"
        )));
    }
    let full = call.params.bool("full").unwrap_or(!source.is_template());
    if storage.is_some() && !full {
        return Err(ApiError::internal(
            "parameter 'storage' not allowed for linked clones",
        ));
    }
    if format.is_some() && !full {
        return Err(ApiError::internal(
            "parameter 'format' not allowed for linked clones",
        ));
    }
    let old_config = source.config.clone();
    let old_name = source.config.get("name").cloned();

    // `$check_storage_access_clone`, bridges, and what is copied how.
    let mut shared_vm = true;
    let mut disks = Vec::new();
    {
        let perms = call.perms();
        let cluster = &*call.cluster;
        for (key, drive) in source.drives() {
            if drive.file == "none" {
                continue;
            }
            if drive.is_cdrom() {
                if drive.file == "cdrom" {
                    perms.check("/", &["Sys.Console"])?;
                } else if let Some(sid) = drive.storage() {
                    shared_vm &= cluster.storages.get(sid).is_some_and(|s| s.shared);
                }
                continue;
            }
            let Some(source_storage) = drive.storage() else {
                continue;
            };
            let source_config = cluster.storage(source_storage)?;
            shared_vm &= source_config.shared;
            let target_storage = storage
                .clone()
                .unwrap_or_else(|| source_storage.to_string());
            perms.check(
                &format!("/storage/{target_storage}"),
                &["Datastore.AllocateSpace"],
            )?;
            let volume = cluster.volume(&node, &drive.file);
            let source_format = volume.map_or("raw".to_string(), |v| v.format.clone());
            if !full {
                let is_base = drive.file.contains("base-");
                if !is_base || !source_config.kind.supports_linked_clone(&source_format) {
                    return Err(ApiError::internal(format!(
                        "Linked clone feature is not supported for '{}' ({key})",
                        drive.file
                    )));
                }
            }
            disks.push(CloneDisk {
                key,
                size: volume
                    .map(|v| v.size)
                    .or_else(|| drive.props.get("size").and_then(parse_size))
                    .unwrap_or(0),
                source_volid: drive.file.clone(),
                drive,
                target_storage,
                format: format.clone().unwrap_or(source_format),
            });
        }
        check_bridge_access(&perms, &old_config)?;
    }
    if let Some(target) = &target
        && !shared_vm
    {
        return Err(ApiError::internal(format!(
            "can't clone VM to node '{target}' (VM uses local storage)"
        )));
    }
    if call.cluster.vms.contains_key(&newid) {
        return Err(ApiError::internal(format!(
            "unable to create VM {newid}: config file already exists"
        )));
    }

    // The new config: everything but snapshot state, unused disks and
    // drives (added as they are copied); fresh MACs, SMBIOS UUID, vmgenid.
    let mut new_config = BTreeMap::from([("lock".to_string(), "clone".to_string())]);
    for (key, value) in &old_config {
        if matches!(
            key.as_str(),
            "snapshots"
                | "parent"
                | "snaptime"
                | "vmstate"
                | "snapstate"
                | "runningcpu"
                | "runningmachine"
                | "running-nets-host-mtu"
                | "template"
                | "lock"
        ) || key.starts_with("unused")
        {
            continue;
        }
        if is_net_key(key) {
            let mut net = NetDevice::parse(value).map_err(ApiError::internal)?;
            net.mac = Some(random_mac(&mut call.cluster.rng));
            new_config.insert(key.clone(), net.print());
        } else if is_drive_key(key) && !Drive::parse(value).is_some_and(|d| d.is_cdrom()) {
            continue;
        } else {
            new_config.insert(key.clone(), value.clone());
        }
    }
    let mut smbios = super::vm_config::PropertyString::parse(
        new_config
            .get("smbios1")
            .map(String::as_str)
            .unwrap_or_default(),
    );
    smbios.first = None;
    smbios.set("uuid", random_uuid(&mut call.cluster.rng).to_string());
    new_config.insert("smbios1".into(), smbios.print());
    if new_config.contains_key("vmgenid") {
        new_config.insert(
            "vmgenid".into(),
            random_uuid(&mut call.cluster.rng).to_string(),
        );
    }
    new_config.insert(
        "name".into(),
        name.unwrap_or_else(|| {
            format!(
                "Copy-of-VM-{}",
                old_name.unwrap_or_else(|| vmid.to_string())
            )
        }),
    );
    if let Some(description) = description {
        new_config.insert("description".into(), description);
    }

    // The worker writes a temporary config holding only the lock at once,
    // so the VMID is taken while the disks are copied.
    let temp_config = BTreeMap::from([("lock".to_string(), "clone".to_string())]);
    call.cluster
        .vms
        .insert(newid, Vm::new(newid, &node, temp_config));

    let step_node = node.clone();
    let rollback_node = node.clone();
    let pool = pool_param.clone();
    let plan = TaskPlan::new()
        .step(3, move |ctx| {
            let mut created = Vec::new();
            for disk in &disks {
                let mode = if full { "full" } else { "linked" };
                ctx.log.push(format!(
                    "create {mode} clone of drive {} ({})",
                    disk.key, disk.source_volid
                ));
                let volid = if full {
                    ctx.cluster.alloc_disk(
                        &step_node,
                        &disk.target_storage,
                        newid,
                        disk.size,
                        Some(&disk.format),
                        None,
                    )
                } else {
                    alloc_linked(ctx.cluster, &step_node, disk, newid)
                };
                let volid = match volid {
                    Ok(volid) => volid,
                    Err(error) => {
                        free_volumes(ctx.cluster, &step_node, &created);
                        return Err(format!("clone failed: {}", error.message.trim_end()));
                    }
                };
                created.push(volid.clone());
                let mut props = disk.drive.props.clone();
                props.remove("format");
                new_config.insert(
                    disk.key.clone(),
                    disk_drive_string(&volid, disk.size, &props),
                );
            }
            if let Some(vm) = ctx.cluster.vms.get_mut(&newid) {
                vm.config = new_config;
            }
            Ok(())
        })
        .step(1, move |ctx| {
            let Some(vm) = ctx.cluster.vms.get_mut(&newid) else {
                return Err("clone failed: config file vanished".into());
            };
            vm.config.remove("lock");
            if let Some(target) = &target {
                vm.node = target.clone();
            }
            // PVE adds the VM to the pool last, after the config is final.
            if let Some(pool) = &pool
                && let Some(entry) = ctx.cluster.users.pools.get_mut(pool)
            {
                entry.vms.insert(newid);
            }
            Ok(())
        })
        .on_failure(move |cluster| {
            if let Some(vm) = cluster.vms.remove(&newid) {
                let volumes: Vec<String> = vm
                    .drives()
                    .into_iter()
                    .filter(|(_, d)| !d.is_cdrom())
                    .map(|(_, d)| d.file)
                    .collect();
                free_volumes(cluster, &rollback_node, &volumes);
            }
            cluster.users.remove_vm_access(newid);
        });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "qmclone",
        &vmid.to_string(),
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

/// A linked clone's volume: file storages encode the base in the name.
fn alloc_linked(
    cluster: &mut Cluster,
    node: &str,
    disk: &CloneDisk,
    newid: u32,
) -> ApiResult<String> {
    let storage = cluster.storage_on(&disk.target_storage, node)?.clone();
    let base_name = disk
        .source_volid
        .split_once(':')
        .map(|(_, n)| n.to_string())
        .unwrap_or_default();
    let volid = (0..)
        .map(|n| {
            if storage.kind.is_file_based() {
                format!(
                    "{}:{base_name}/{newid}/vm-{newid}-disk-{n}.{}",
                    storage.id, disk.format
                )
            } else {
                format!("{}:vm-{newid}-disk-{n}", storage.id)
            }
        })
        .find(|v| cluster.volume(node, v).is_none())
        .expect("a free disk name");
    cluster.insert_volume(
        node,
        Volume {
            volid: volid.clone(),
            storage: storage.id.clone(),
            content: "images".into(),
            vmid: Some(newid),
            format: disk.format.clone(),
            size: disk.size,
            ctime: Cluster::now_epoch(),
            data: None,
        },
    );
    Ok(volid)
}

// ----------------------------------------------------------------- resize

/// PUT …/resize — task `resize`; every check but `skiplock` runs in it.
pub fn resize(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms()
        .check(&format!("/vms/{vmid}"), &["VM.Config.Disk"])?;
    call.params.verify(&Schema::new(&with_base(&[
        required("disk", Kind::String),
        required("size", Kind::String),
        optional("digest", Kind::String),
        optional("skiplock", Kind::Boolean),
    ])))?;
    let node = call.node();
    let disk = call.params.string("disk").unwrap_or_default();
    if !is_drive_key(&disk) {
        return Err(ApiError::param(
            "disk",
            format!("value '{disk}' does not have a value in the enumeration of drive names"),
        ));
    }
    let size_text = call.params.string("size").unwrap_or_default();
    let Some((grow, size)) = parse_resize(&size_text) else {
        return Err(ApiError::param(
            "size",
            "value does not match the regex pattern",
        ));
    };
    let skiplock = call.params.flag("skiplock");
    if skiplock && !call.perms().is_root() {
        return Err(ApiError::param(
            "skiplock",
            "Only root may use this option.",
        ));
    }
    let digest = call.params.string("digest");
    let authid = call.authid.to_string();
    let step_node = node.clone();
    let plan = TaskPlan::new().step(1, move |ctx| {
        let vm = ctx
            .cluster
            .vm_on(&step_node, vmid)
            .map_err(|e| e.message.trim_end().to_string())?;
        if let Some(digest) = &digest
            && *digest != vm.digest()
        {
            return Err("checksum mismatch (file change by other user?)".into());
        }
        if !skiplock {
            vm.check_lock()
                .map_err(|e| e.message.trim_end().to_string())?;
        }
        let value = vm
            .config
            .get(&disk)
            .ok_or_else(|| format!("disk '{disk}' does not exist"))?;
        let mut drive =
            Drive::parse(value).ok_or_else(|| format!("disk '{disk}' has no associated volume"))?;
        if drive.is_cdrom() {
            return Err("you can't resize a cdrom".into());
        }
        let volid = drive.file.clone();
        let storage = drive
            .storage()
            .ok_or_else(|| format!("disk '{disk}' has no associated volume"))?
            .to_string();
        Perms::new(&ctx.cluster.users, &authid)
            .check(&format!("/storage/{storage}"), &["Datastore.AllocateSpace"])
            .map_err(|e| e.message.trim_end().to_string())?;
        let current = ctx
            .cluster
            .volume(&step_node, &volid)
            .map(|v| v.size)
            .ok_or_else(|| format!("Could not determine current size of volume '{volid}'"))?;
        let new_size = if grow { current + size } else { size };
        if new_size < current {
            return Err("shrinking disks is not supported".into());
        }
        if new_size == current {
            return Ok(());
        }
        ctx.log
            .push(format!("resize --disk {disk} --size {size_text}"));
        if let Some(volume) = ctx.cluster.volumes.values_mut().find(|v| v.volid == volid) {
            volume.size = new_size;
        }
        drive.props.set("size", format_size(new_size));
        if let Some(vm) = ctx.cluster.vms.get_mut(&vmid) {
            vm.config.insert(disk.clone(), drive.print());
        }
        Ok(())
    });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "resize",
        &vmid.to_string(),
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

// --------------------------------------------------------------- template

fn template_checks(vm: &Vm) -> Result<(), ApiError> {
    vm.check_lock()?;
    if vm.is_template() {
        return Err(ApiError::internal(
            "you can't convert a template to a template",
        ));
    }
    if vm.is_running() {
        return Err(ApiError::internal(
            "you can't convert a VM to template if VM is running",
        ));
    }
    Ok(())
}

/// POST …/template — task `qmtemplate`: disks become base images.
pub fn template(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms()
        .check(&format!("/vms/{vmid}"), &["VM.Allocate"])?;
    call.params
        .verify(&Schema::new(&with_base(&[optional("disk", Kind::String)])))?;
    let node = call.node();
    template_checks(call.cluster.vm_on(&node, vmid)?)?;
    let step_node = node.clone();
    let plan = TaskPlan::new().step(1, move |ctx| {
        let vm = ctx
            .cluster
            .vm_on(&step_node, vmid)
            .map_err(|e| e.message.trim_end().to_string())?;
        template_checks(vm).map_err(|e| e.message.trim_end().to_string())?;
        let drives = vm.drives();
        let mut renamed = Vec::new();
        for (key, drive) in drives {
            if drive.is_cdrom() || !drive.file.contains(":") {
                continue;
            }
            let (_, owner) = parse_volname(&drive.file);
            if owner != Some(vmid) || drive.file.contains("base-") {
                continue;
            }
            if let Some(base) = ctx.cluster.make_base(&step_node, &drive.file) {
                let mut drive = drive;
                drive.file = base;
                renamed.push((key, drive.print()));
            }
        }
        let vm = ctx.cluster.vms.get_mut(&vmid).expect("checked above");
        for (key, value) in renamed {
            vm.config.insert(key, value);
        }
        vm.config.insert("template".into(), "1".into());
        Ok(())
    });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "qmtemplate",
        &vmid.to_string(),
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

// ---------------------------------------------------------------- destroy

fn destroy_checks(vm: &Vm) -> Result<(), ApiError> {
    if vm.config.get("protection").is_some_and(|p| p == "1") {
        return Err(ApiError::internal(format!(
            "can't remove VM {} - protection mode enabled",
            vm.vmid
        )));
    }
    if vm.is_running() {
        return Err(ApiError::internal(format!(
            "VM {} is running - destroy failed",
            vm.vmid
        )));
    }
    Ok(())
}

/// DELETE /nodes/{node}/qemu/{vmid} — VM.Allocate; a running VM is refused
/// synchronously; the rest happens in task `qmdestroy`.
pub fn destroy(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms()
        .check(&format!("/vms/{vmid}"), &["VM.Allocate"])?;
    call.params.verify(&Schema::new(&with_base(&[
        optional("skiplock", Kind::Boolean),
        optional("purge", Kind::Boolean),
        optional("destroy-unreferenced-disks", Kind::Boolean),
    ])))?;
    let skiplock = call.params.flag("skiplock");
    if skiplock && !call.perms().is_root() {
        return Err(ApiError::param(
            "skiplock",
            "Only root may use this option.",
        ));
    }
    let unreferenced = call.params.flag("destroy-unreferenced-disks");
    let purge = call.params.flag("purge");
    let node = call.node();
    destroy_checks(call.cluster.vm_on(&node, vmid)?)?;

    let step_node = node.clone();
    let plan = TaskPlan::new().step(1, move |ctx| {
        let vm = ctx
            .cluster
            .vm_on(&step_node, vmid)
            .map_err(|e| e.message.trim_end().to_string())?;
        destroy_checks(vm).map_err(|e| e.message.trim_end().to_string())?;
        if !skiplock {
            vm.check_lock()
                .map_err(|e| e.message.trim_end().to_string())?;
        }
        // Disks owned by this VM go; ISOs and other VMs' base images stay.
        let mut volumes: Vec<String> = vm
            .config
            .iter()
            .filter(|(k, _)| is_drive_key(k) || k.starts_with("unused"))
            .filter_map(|(_, v)| Drive::parse(v))
            .filter(|d| !d.is_cdrom() || d.file.contains("-cloudinit"))
            .map(|d| d.file)
            .filter(|volid| parse_volname(volid).1 == Some(vmid))
            .collect();
        if unreferenced {
            let node_scope = step_node.clone();
            let extra: Vec<String> = ctx
                .cluster
                .volumes
                .iter()
                .filter(|((scope, _), v)| {
                    (scope.is_empty() || *scope == node_scope) && v.vmid == Some(vmid)
                })
                .map(|(_, v)| v.volid.clone())
                .collect();
            volumes.extend(extra);
        }
        for volid in &volumes {
            if ctx.cluster.remove_volume(&step_node, volid).is_some() {
                ctx.log.push(format!("Removing image: {volid}"));
            }
        }
        ctx.cluster.users.remove_vm_access(vmid);
        if purge {
            ctx.log
                .push(format!("purging VM {vmid} from related configurations.."));
        }
        ctx.cluster.vms.remove(&vmid);
        Ok(())
    });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "qmdestroy",
        &vmid.to_string(),
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

/// PUT …/unlink — detach (and with `force` destroy) disks; VM.Config.Disk.
pub fn unlink(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vmid = call.vmid();
    call.perms()
        .check(&format!("/vms/{vmid}"), &["VM.Config.Disk"])?;
    call.params.verify(&Schema::new(&with_base(&[
        required("idlist", Kind::String),
        optional("force", Kind::Boolean),
    ])))?;
    let node = call.node();
    let force = call.params.flag("force");
    let idlist = split_list(&call.params.string("idlist").unwrap_or_default());
    ConfigUpdate {
        node,
        vmid,
        settings: BTreeMap::new(),
        delete: idlist,
        force,
        skiplock: false,
        authid: call.authid.to_string(),
    }
    .apply(call.cluster)?;
    Ok(Reply::null())
}
