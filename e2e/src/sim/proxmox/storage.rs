//! `/nodes/{node}/storage/…` (pve-storage): storage list and status,
//! volume listing, allocation (what the Proxmox CSI plugin does), deletion
//! and ISO upload.

use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde_json::{Value, json};
use sha2::Digest;

use super::error::{ApiError, ApiResult};
use super::params::{Kind, Schema, optional, required};
use super::qemu::check_volume_access;
use super::router::{Call, Reply};
use super::state::{Cluster, Volume, parse_volname};
use super::tasks::{self, TaskPlan};
use super::vm_config::volid_storage;

/// A file received by the upload endpoint.
#[derive(Clone)]
pub struct Upload {
    pub file_name: String,
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("file_name", &self.file_name)
            .field("bytes", &self.data.len())
            .finish()
    }
}

fn storage_entry(cluster: &Cluster, node: &str, id: &str) -> Value {
    let storage = &cluster.storages[id];
    let used = cluster.used_bytes(node, storage);
    let total = storage.total_bytes;
    json!({
        "storage": id,
        "type": storage.kind.as_str(),
        "content": storage.content.join(","),
        "enabled": 1,
        "active": 1,
        "shared": u8::from(storage.shared),
        "total": total,
        "used": used,
        "avail": total.saturating_sub(used),
        "used_fraction": used as f64 / total.max(1) as f64,
    })
}

/// GET /nodes/{node}/storage — storages the caller may audit or allocate on.
pub fn list(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        optional("content", Kind::String),
        optional("enabled", Kind::Boolean),
        optional("format", Kind::Boolean),
        optional("storage", Kind::String),
        optional("target", Kind::String),
    ]))?;
    let node = call.node();
    let content = call.params.string("content");
    let only = call.params.string("storage");
    let target = call.params.string("target").filter(|t| *t != node);
    let cluster = &*call.cluster;
    if let Some(only) = &only
        && !cluster
            .storages
            .get(only)
            .is_some_and(|s| cluster.storage_available_on(s, &node))
    {
        return Err(ApiError::param("storage", "No such storage."));
    }
    let perms = call.perms();
    let rows: Vec<Value> = cluster
        .storages
        .values()
        .filter(|s| cluster.storage_available_on(s, &node))
        .filter(|s| {
            content
                .as_ref()
                .is_none_or(|wanted| wanted.split(',').all(|c| s.content.iter().any(|h| h == c)))
        })
        .filter(|s| {
            perms.has_any(
                &format!("/storage/{}", s.id),
                &["Datastore.Audit", "Datastore.AllocateSpace"],
            )
        })
        .filter(|s| only.as_ref().is_none_or(|o| *o == s.id))
        .filter(|s| {
            target
                .as_ref()
                .is_none_or(|t| s.shared && cluster.storage_available_on(s, t))
        })
        .map(|s| storage_entry(cluster, &node, &s.id))
        .collect();
    Ok(Value::Array(rows).into())
}

fn storage_param(call: &Call<'_>) -> String {
    call.params.string("storage").unwrap_or_default()
}

/// GET …/storage/{storage}/status — Datastore.Audit or AllocateSpace.
pub fn status(call: &mut Call<'_>) -> ApiResult<Reply> {
    let storage = storage_param(call);
    call.perms().check_any(
        &format!("/storage/{storage}"),
        &["Datastore.Audit", "Datastore.AllocateSpace"],
    )?;
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("storage", Kind::String),
    ]))?;
    let node = call.node();
    let cluster = &*call.cluster;
    if !cluster
        .storages
        .get(&storage)
        .is_some_and(|s| cluster.storage_available_on(s, &node))
    {
        return Err(ApiError::param("storage", "No such storage."));
    }
    let mut entry = storage_entry(cluster, &node, &storage);
    if let Some(map) = entry.as_object_mut() {
        map.remove("storage");
    }
    Ok(entry.into())
}

fn volume_json(volume: &Volume) -> Value {
    let mut value = json!({
        "volid": volume.volid,
        "content": volume.content,
        "format": volume.format,
        "size": volume.size,
        "ctime": volume.ctime,
    });
    if let Some(vmid) = volume.vmid {
        value["vmid"] = json!(vmid);
    }
    value
}

/// GET …/storage/{storage}/content — rows filtered by `check_volume_access`.
pub fn content(call: &mut Call<'_>) -> ApiResult<Reply> {
    let storage_id = storage_param(call);
    call.perms().check_any(
        &format!("/storage/{storage_id}"),
        &["Datastore.Audit", "Datastore.AllocateSpace"],
    )?;
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("storage", Kind::String),
        optional("content", Kind::String),
        optional("vmid", Kind::Vmid),
    ]))?;
    let node = call.node();
    let storage = call.cluster.storage_on(&storage_id, &node)?.clone();
    let content = call.params.string("content");
    let vmid = call.params.vmid("vmid");
    let perms = call.perms();
    let mut rows: Vec<Value> = call
        .cluster
        .volumes_on(&node, &storage)
        .into_iter()
        .filter(|v| content.as_ref().is_none_or(|c| *c == v.content))
        .filter(|v| vmid.is_none_or(|id| v.vmid == Some(id)))
        .filter(|v| check_volume_access(&perms, None, &v.volid).is_ok())
        .map(volume_json)
        .collect();
    rows.sort_by(|a, b| a["volid"].as_str().cmp(&b["volid"].as_str()));
    Ok(Value::Array(rows).into())
}

/// The volume id of a `{volume}` path parameter (`real_volume_id`).
fn real_volume_id(storage: &str, volume: &str) -> ApiResult<String> {
    if let Some(sid) = volid_storage(volume) {
        if !storage.is_empty() && sid != storage {
            return Err(ApiError::param(
                "volume",
                format!("storage ID mismatch ({sid} != {storage})"),
            ));
        }
        Ok(volume.to_string())
    } else if storage.is_empty() {
        Err(ApiError::param(
            "volume",
            "no storage specified - incomplete volume ID",
        ))
    } else {
        Ok(format!("{storage}:{volume}"))
    }
}

/// GET …/content/{volume} — `check_volume_access`.
pub fn volume_info(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("storage", Kind::String),
        required("volume", Kind::String),
    ]))?;
    let node = call.node();
    let volid = real_volume_id(
        &storage_param(call),
        call.params.str("volume").unwrap_or_default(),
    )?;
    check_volume_access(&call.perms(), None, &volid)?;
    let volume = call.cluster.volume(&node, &volid).ok_or_else(|| {
        ApiError::internal(format!("volume_size_info on '{volid}' failed - no format"))
    })?;
    let storage = volume.storage.clone();
    Ok(json!({
        "path": format!("/var/lib/vz/{storage}/{}", volid.split_once(':').map_or("", |(_, n)| n)),
        "size": volume.size,
        "used": volume.size,
        "format": volume.format,
    })
    .into())
}

/// POST …/storage/{storage}/content — allocate a disk image (Proxmox CSI);
/// Datastore.AllocateSpace. `size` is in KiB unless suffixed M or G.
pub fn allocate(call: &mut Call<'_>) -> ApiResult<Reply> {
    let storage = storage_param(call);
    call.perms()
        .check(&format!("/storage/{storage}"), &["Datastore.AllocateSpace"])?;
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("storage", Kind::String),
        required("filename", Kind::String),
        required("vmid", Kind::Vmid),
        required("size", Kind::String),
        optional("format", Kind::String),
    ]))?;
    let node = call.node();
    let vmid = call.params.vmid("vmid").unwrap_or_default();
    let name = call.params.string("filename").unwrap_or_default();
    let size_text = call.params.string("size").unwrap_or_default();
    static SIZE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^(\d+)([MG])?$").expect("valid regex"));
    let captures = SIZE
        .captures(&size_text)
        .ok_or_else(|| ApiError::param("size", format!("unable to parse size '{size_text}'")))?;
    let kib: u64 = captures[1].parse().unwrap_or(0);
    let kib = match captures.get(2).map(|m| m.as_str()) {
        Some("M") => kib * 1024,
        Some("G") => kib * 1024 * 1024,
        _ => kib,
    };
    let (stem, name_format) = match name.rsplit_once('.') {
        Some((stem, ext)) if ["raw", "qcow2", "vmdk"].contains(&ext) => {
            (stem.to_string(), Some(ext.to_string()))
        }
        _ => (name.clone(), None),
    };
    let format = call.params.string("format");
    if let (Some(a), Some(b)) = (&format, &name_format)
        && a != b
    {
        return Err(ApiError::param(
            "format",
            format!("different storage formats ({a} != {b})"),
        ));
    }
    if !stem.starts_with(&format!("vm-{vmid}-")) && !stem.starts_with(&format!("base-{vmid}-")) {
        return Err(ApiError::internal(format!(
            "illegal name '{name}' - should be 'vm-{vmid}-*'"
        )));
    }
    let volid = call.cluster.alloc_disk(
        &node,
        &storage,
        vmid,
        kib * 1024,
        format.or(name_format).as_deref(),
        Some(&name),
    )?;
    Ok(json!(volid).into())
}

/// DELETE …/content/{volume} — Datastore.Allocate; task `imgdel`.
pub fn delete_volume(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        optional("storage", Kind::String),
        required("volume", Kind::String),
        optional(
            "delay",
            Kind::Integer {
                min: Some(1),
                max: Some(30),
            },
        ),
    ]))?;
    let node = call.node();
    let volid = real_volume_id(
        &storage_param(call),
        call.params.str("volume").unwrap_or_default(),
    )?;
    let storage = volid_storage(&volid).unwrap_or_default().to_string();
    call.perms()
        .check(&format!("/storage/{storage}"), &["Datastore.Allocate"])?;
    call.cluster.storage_on(&storage, &node)?;
    let (_, owner) = parse_volname(&volid);
    let id = match owner {
        Some(vmid) => format!("{vmid}@{storage}"),
        None => storage.clone(),
    };
    let step_node = node.clone();
    let plan = TaskPlan::new().step(1, move |ctx| {
        // Freeing a missing image only warns; the task ends `WARNINGS: 1`.
        if ctx.cluster.remove_volume(&step_node, &volid).is_none() {
            ctx.warn(format!("disk image '{volid}' does not exist"));
        }
        ctx.log.push(format!("Removed volume '{volid}'"));
        Ok(())
    });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "imgdel",
        &id,
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

/// POST …/storage/{storage}/upload — multipart, Datastore.AllocateTemplate
/// (checked before the body is read, and again here); task `imgcopy`.
pub fn upload(call: &mut Call<'_>) -> ApiResult<Reply> {
    let storage_id = storage_param(call);
    call.perms().check(
        &format!("/storage/{storage_id}"),
        &["Datastore.AllocateTemplate"],
    )?;
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("storage", Kind::String),
        required("content", Kind::String),
        required("filename", Kind::String),
        optional("checksum", Kind::String),
        optional("checksum-algorithm", Kind::String),
        optional("tmpfilename", Kind::String),
    ]))?;
    let node = call.node();
    let storage = call.cluster.storage_on(&storage_id, &node)?.clone();
    if !storage.kind.is_file_based() {
        return Err(ApiError::internal(format!(
            "can't upload to storage type '{}'",
            storage.kind.as_str()
        )));
    }
    let upload = call
        .upload
        .take()
        .ok_or_else(|| ApiError::internal("missing temporary file name"))?;
    let content = call.params.string("content").unwrap_or_default();
    let filename = upload
        .file_name
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    static ISO: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)^[^/]+\.(?:iso|img)$").expect("valid regex"));
    static VZTMPL: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^[^/]+\.tar\.(?:gz|xz|zst|bz2)$").expect("valid regex"));
    let directory = match content.as_str() {
        "iso" if ISO.is_match(&filename) => "iso",
        "vztmpl" if VZTMPL.is_match(&filename) => "vztmpl",
        "iso" | "vztmpl" => return Err(ApiError::param("filename", "wrong file extension")),
        _ => {
            return Err(ApiError::param(
                "content",
                format!("upload content type '{content}' not allowed"),
            ));
        }
    };
    if !storage.content.contains(&content) {
        return Err(ApiError::internal(format!(
            "storage '{storage_id}' does not support '{content}' content"
        )));
    }
    let checksum = call.params.string("checksum");
    let algorithm = call.params.string("checksum-algorithm");
    let volid = format!("{storage_id}:{directory}/{filename}");
    let step_node = node.clone();
    let data = Arc::new(upload.data);
    let plan = TaskPlan::new().step(1, move |ctx| {
        ctx.log.push(format!(
            "starting file import from: /var/tmp/pveupload-{}",
            data.len()
        ));
        if let (Some(expected), Some(algorithm)) = (&checksum, &algorithm) {
            ctx.log.push("calculating checksum...".into());
            if let Some(actual) = digest(algorithm, &data)
                && !actual.eq_ignore_ascii_case(expected)
            {
                return Err(format!(
                    "checksum mismatch: got '{actual}' != expect '{expected}'"
                ));
            }
        }
        ctx.log.push(format!("target node: {step_node}"));
        ctx.log.push(format!("file size is: {}", data.len()));
        // PVE simply overwrites an existing file of the same name.
        ctx.cluster.insert_volume(
            &step_node,
            Volume {
                volid: volid.clone(),
                storage: storage_id.clone(),
                content: content.clone(),
                vmid: None,
                format: content.clone(),
                size: data.len() as u64,
                ctime: Cluster::now_epoch(),
                data: Some(data),
            },
        );
        ctx.log.push("finished file import successfully".into());
        Ok(())
    });
    let upid = tasks::start(
        call.shared,
        call.cluster,
        &node,
        "imgcopy",
        "",
        call.authid,
        plan,
    );
    Ok(json!(upid).into())
}

fn digest(algorithm: &str, data: &[u8]) -> Option<String> {
    Some(match algorithm {
        "sha224" => hex::encode(sha2::Sha224::digest(data)),
        "sha256" => hex::encode(sha2::Sha256::digest(data)),
        "sha384" => hex::encode(sha2::Sha384::digest(data)),
        "sha512" => hex::encode(sha2::Sha512::digest(data)),
        // md5 and sha1 are accepted but not verified.
        _ => return None,
    })
}
