//! `/pools` (pve-manager): resource pools, in both the current query/body
//! form (`/pools?poolid=`) and the deprecated `/pools/{poolid}` form.

use serde_json::{Value, json};

use super::cluster_api::vm_resource;
use super::error::{ApiError, ApiResult};
use super::params::{Kind, Schema, optional, required, split_list};
use super::permissions::Pool;
use super::router::{Call, Reply};

fn valid_poolid(pool: &str) -> bool {
    !pool.is_empty()
        && pool.split('/').count() <= 3
        && pool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn members(call: &Call<'_>, pool: &Pool, kind: Option<&str>) -> Vec<Value> {
    let cluster = &*call.cluster;
    let mut members = Vec::new();
    if kind.is_none_or(|k| k == "qemu") {
        for vmid in &pool.vms {
            // Destroyed guests are skipped, as PVE skips ids not in the VM list.
            if let Some(vm) = cluster.vms.get(vmid) {
                members.push(vm_resource(cluster, vm));
            }
        }
    }
    if kind.is_none_or(|k| k == "storage") {
        for storage_id in &pool.storage {
            let Some(storage) = cluster.storages.get(storage_id) else {
                continue;
            };
            let node = cluster
                .nodes
                .keys()
                .find(|n| cluster.storage_available_on(storage, n))
                .cloned()
                .unwrap_or_default();
            members.push(json!({
                "id": format!("storage/{node}/{storage_id}"),
                "storage": storage_id,
                "node": node,
                "type": "storage",
                "plugintype": storage.kind.as_str(),
                "status": "available",
                "shared": u8::from(storage.shared),
                "content": storage.content.join(","),
                "maxdisk": storage.total_bytes,
                "disk": cluster.used_bytes(&node, storage),
            }));
        }
    }
    members
}

/// GET /pools — pools with Pool.Audit; with `poolid`, that pool's members.
/// (PVE computes the Pool.Audit check for `poolid` but does not enforce it.)
pub fn index(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        optional("poolid", Kind::String),
        optional("type", Kind::String),
    ]))?;
    let kind = call.params.string("type");
    if let Some(kind) = &kind {
        if !["qemu", "lxc", "storage"].contains(&kind.as_str()) {
            return Err(ApiError::param(
                "type",
                format!(
                    "value '{kind}' does not have a value in the enumeration 'qemu, lxc, storage'"
                ),
            ));
        }
        if !call.params.contains("poolid") {
            return Err(ApiError::param(
                "type",
                "missing property - 'type' requires another property",
            ));
        }
    }
    if let Some(poolid) = call.params.string("poolid") {
        let pool = call
            .cluster
            .users
            .pools
            .get(&poolid)
            .cloned()
            .ok_or_else(|| ApiError::internal(format!("pool '{poolid}' does not exist")))?;
        let mut entry = json!({
            "poolid": poolid,
            "members": members(call, &pool, kind.as_deref()),
        });
        if let Some(comment) = &pool.comment {
            entry["comment"] = json!(comment);
        }
        return Ok(json!([entry]).into());
    }
    let perms = call.perms();
    let rows: Vec<Value> = call
        .cluster
        .users
        .pools
        .iter()
        .filter(|(name, _)| perms.has(&format!("/pool/{name}"), &["Pool.Audit"]))
        .map(|(name, pool)| {
            let mut entry = json!({ "poolid": name });
            if let Some(comment) = &pool.comment {
                entry["comment"] = json!(comment);
            }
            entry
        })
        .collect();
    Ok(Value::Array(rows).into())
}

/// GET /pools/{poolid} (deprecated) — Pool.Audit enforced.
pub fn read_deprecated(call: &mut Call<'_>) -> ApiResult<Reply> {
    let poolid = call.params.string("poolid").unwrap_or_default();
    call.perms()
        .check(&format!("/pool/{poolid}"), &["Pool.Audit"])?;
    let reply = index(call)?;
    let mut first = reply.data.get(0).cloned().unwrap_or(Value::Null);
    if let Some(map) = first.as_object_mut() {
        map.remove("poolid");
    }
    Ok(first.into())
}

/// POST /pools — Pool.Allocate on /pool/{poolid}.
pub fn create(call: &mut Call<'_>) -> ApiResult<Reply> {
    let poolid = call.params.string("poolid").unwrap_or_default();
    call.perms()
        .check(&format!("/pool/{poolid}"), &["Pool.Allocate"])?;
    call.params.verify(&Schema::new(&[
        required("poolid", Kind::String),
        optional("comment", Kind::String),
    ]))?;
    if !valid_poolid(&poolid) {
        return Err(ApiError::param(
            "poolid",
            "invalid format - value does not look like a valid pool id",
        ));
    }
    let pools = &mut call.cluster.users.pools;
    if pools.contains_key(&poolid) {
        return Err(ApiError::internal(format!(
            "create pool failed: pool '{poolid}' already exists"
        )));
    }
    let leaf = match poolid.rsplit_once('/') {
        Some((parent, leaf)) => {
            if !pools.contains_key(parent) {
                return Err(ApiError::internal(format!(
                    "create pool failed: parent '{parent}' of pool '{poolid}' does not exist"
                )));
            }
            leaf
        }
        None => poolid.as_str(),
    };
    if !leaf.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(ApiError::internal(
            "create pool failed: pool name must start with a letter",
        ));
    }
    pools.insert(
        poolid.clone(),
        Pool {
            comment: call.params.string("comment").filter(|c| !c.is_empty()),
            ..Pool::default()
        },
    );
    Ok(Reply::null())
}

/// PUT /pools and PUT /pools/{poolid} — Pool.Allocate, plus the right to
/// modify permissions on every VM and storage added or removed.
pub fn update(call: &mut Call<'_>) -> ApiResult<Reply> {
    let poolid = call.params.string("poolid").unwrap_or_default();
    call.perms()
        .check(&format!("/pool/{poolid}"), &["Pool.Allocate"])?;
    call.params.verify(&Schema::new(&[
        required("poolid", Kind::String),
        optional("comment", Kind::String),
        optional("vms", Kind::String),
        optional("storage", Kind::String),
        optional("allow-move", Kind::Boolean),
        optional("delete", Kind::Boolean),
    ]))?;
    let fail = |message: String| ApiError::internal(format!("update pools failed: {message}"));
    let delete = call.params.flag("delete");
    let allow_move = call.params.flag("allow-move");
    let mut users = call.cluster.users.clone();
    let Some(mut pool) = users.pools.get(&poolid).cloned() else {
        return Err(fail(format!("pool '{poolid}' does not exist")));
    };
    if let Some(comment) = call.params.string("comment") {
        pool.comment = Some(comment).filter(|c| !c.is_empty());
    }
    let perms = call.perms();
    for vm in split_list(&call.params.string("vms").unwrap_or_default()) {
        let vmid: u32 = vm.parse().map_err(|_| {
            ApiError::param(
                "vms",
                format!("invalid format - value '{vm}' does not look like a valid VM ID"),
            )
        })?;
        perms.check_perm_modify(&format!("/vms/{vmid}"))?;
        if delete {
            if !pool.vms.remove(&vmid) {
                return Err(fail(format!("VM {vmid} is not a pool member")));
            }
            continue;
        }
        if pool.vms.contains(&vmid) {
            return Err(fail(format!("VM {vmid} is already a pool member")));
        }
        if let Some(existing) = users.pool_of_vm(vmid).map(str::to_string) {
            if !allow_move {
                return Err(fail(format!(
                    "VM {vmid} belongs already to pool '{existing}' and 'allow-move' is not set"
                )));
            }
            perms.check(&format!("/pool/{existing}"), &["Pool.Allocate"])?;
            if let Some(old) = users.pools.get_mut(&existing) {
                old.vms.remove(&vmid);
            }
        }
        pool.vms.insert(vmid);
    }
    for storage in split_list(&call.params.string("storage").unwrap_or_default()) {
        perms.check_perm_modify(&format!("/storage/{storage}"))?;
        if delete {
            if !pool.storage.remove(&storage) {
                return Err(fail(format!("Storage '{storage}' is not a pool member")));
            }
        } else if !pool.storage.insert(storage.clone()) {
            return Err(fail(format!(
                "Storage '{storage}' is already a pool member"
            )));
        }
    }
    users.pools.insert(poolid, pool);
    call.cluster.users = users;
    Ok(Reply::null())
}

/// DELETE /pools?poolid= and DELETE /pools/{poolid} — Pool.Allocate; the
/// pool must hold no (existing) VM, storage or sub-pool.
pub fn delete(call: &mut Call<'_>) -> ApiResult<Reply> {
    let poolid = call.params.string("poolid").unwrap_or_default();
    call.perms()
        .check(&format!("/pool/{poolid}"), &["Pool.Allocate"])?;
    call.params
        .verify(&Schema::new(&[required("poolid", Kind::String)]))?;
    let fail = |message: String| ApiError::internal(format!("delete pool failed: {message}"));
    let cluster = &mut *call.cluster;
    let Some(pool) = cluster.users.pools.get(&poolid) else {
        return Err(fail(format!("pool '{poolid}' does not exist")));
    };
    if let Some(sub) = cluster
        .users
        .pools
        .keys()
        .find(|p| p.starts_with(&format!("{poolid}/")))
    {
        return Err(fail(format!(
            "pool '{poolid}' is not empty (contains pool '{sub}')"
        )));
    }
    if let Some(vmid) = pool.vms.iter().find(|id| cluster.vms.contains_key(id)) {
        return Err(fail(format!(
            "pool '{poolid}' is not empty (contains VM {vmid})"
        )));
    }
    if let Some(storage) = pool
        .storage
        .iter()
        .find(|id| cluster.storages.contains_key(*id))
    {
        return Err(fail(format!(
            "pool '{poolid}' is not empty (contains storage '{storage}')"
        )));
    }
    cluster.users.pools.remove(&poolid);
    cluster.users.delete_pool_acl(&poolid);
    Ok(Reply::null())
}
