//! `/nodes/{node}/qemu/{vmid}/...`: one VM or template.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::agent::AgentApi;
use super::error::Result;
use super::serde_helpers::opt_bool_as_int;
use super::types::{VmConfig, VmStatus};
use super::upid::Upid;
use super::{NoParams, ProxmoxClient, api_path};

/// One QEMU VM on a node. Get it with [`ProxmoxClient::qemu`].
#[derive(Debug, Clone)]
pub struct QemuApi<'a> {
    client: &'a ProxmoxClient,
    node: String,
    vmid: u32,
}

impl<'a> QemuApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient, node: &str, vmid: u32) -> Self {
        Self {
            client,
            node: node.to_owned(),
            vmid,
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn vmid(&self) -> u32 {
        self.vmid
    }

    fn path(&self, tail: &[&str]) -> String {
        let vmid = self.vmid.to_string();
        let mut segments = vec!["nodes", self.node.as_str(), "qemu", vmid.as_str()];
        segments.extend_from_slice(tail);
        api_path(&segments)
    }

    /// `GET …/status/current`.
    pub async fn status(&self) -> Result<VmStatus> {
        self.client
            .get(&self.path(&["status", "current"]), &NoParams)
            .await
    }

    /// `GET …/config` (the current values, not pending ones).
    pub async fn config(&self) -> Result<VmConfig> {
        self.client.get(&self.path(&["config"]), &NoParams).await
    }

    /// `POST …/config`: applied by a `qmconfig` task (for a stopped VM
    /// immediately; a running VM gets most changes as pending).
    pub async fn update_config(&self, update: &VmConfigUpdate) -> Result<Upid> {
        self.client.post(&self.path(&["config"]), update).await
    }

    /// `PUT …/config`: the same, applied synchronously (no task).
    pub async fn update_config_sync(&self, update: &VmConfigUpdate) -> Result<()> {
        let _: serde_json::Value = self.client.put(&self.path(&["config"]), update).await?;
        Ok(())
    }

    /// `POST …/status/start`.
    pub async fn start(&self) -> Result<Upid> {
        self.power("start", &NoParams).await
    }

    /// `POST …/status/stop`: hard power-off.
    pub async fn stop(&self) -> Result<Upid> {
        self.power("stop", &NoParams).await
    }

    /// `POST …/status/shutdown`: ACPI (or agent) shutdown.
    pub async fn shutdown(&self, params: &ShutdownParams) -> Result<Upid> {
        self.power("shutdown", params).await
    }

    /// `POST …/status/reset`: hard reset.
    pub async fn reset(&self) -> Result<Upid> {
        self.power("reset", &NoParams).await
    }

    /// `POST …/status/reboot`: guest reboot (shutdown, then start).
    pub async fn reboot(&self) -> Result<Upid> {
        self.power("reboot", &NoParams).await
    }

    /// `POST …/status/resume`: for a VM QEMU reports as paused.
    pub async fn resume(&self) -> Result<Upid> {
        self.power("resume", &NoParams).await
    }

    async fn power(&self, action: &str, params: &impl Serialize) -> Result<Upid> {
        self.client
            .post(&self.path(&["status", action]), params)
            .await
    }

    /// `POST …/clone`: a `qmclone` task. PVE locks the new VM (`lock: clone`)
    /// for the duration and adds it to `pool` only at the end of the task.
    pub async fn clone_to(&self, params: &CloneParams) -> Result<Upid> {
        self.client.post(&self.path(&["clone"]), params).await
    }

    /// `PUT …/resize`. PVE 8 runs it as a `resize` task; older releases
    /// resized synchronously and answered `null`.
    pub async fn resize(&self, disk: &str, size: &DiskSize) -> Result<Option<Upid>> {
        #[derive(Serialize)]
        struct Resize<'s> {
            disk: &'s str,
            size: String,
        }
        self.client
            .put(
                &self.path(&["resize"]),
                &Resize {
                    disk,
                    size: size.to_string(),
                },
            )
            .await
    }

    /// `DELETE /nodes/{node}/qemu/{vmid}`: a `qmdestroy` task. Refused
    /// synchronously while the VM runs ([`super::ProxmoxError::VmRunning`]).
    pub async fn delete(&self, params: &DeleteParams) -> Result<Upid> {
        self.client.delete(&self.path(&[]), params).await
    }

    /// `POST …/template`: converts the (stopped) VM into a template. Recent
    /// releases answer with a task, older ones with `null`.
    pub async fn convert_to_template(&self) -> Result<Option<Upid>> {
        self.client.post(&self.path(&["template"]), &NoParams).await
    }

    /// The VM's guest agent.
    pub fn agent(&self) -> AgentApi<'a> {
        AgentApi::new(self.client, &self.node, self.vmid)
    }
}

/// Parameters of `POST …/clone`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CloneParams {
    pub newid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The pool the new VM joins (also what `VM.Allocate` is checked on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Full copy instead of a linked clone. PVE's default is linked for
    /// templates and full otherwise; `storage` and `format` need a full clone.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub full: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<DiskFormat>,
    /// Target node (for shared storage, or the source node for local storage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapname: Option<String>,
}

impl CloneParams {
    pub fn new(newid: u32) -> Self {
        Self {
            newid,
            ..Self::default()
        }
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    pub fn pool(mut self, pool: impl Into<String>) -> Self {
        self.pool = Some(pool.into());
        self
    }

    pub fn full(mut self, full: bool) -> Self {
        self.full = Some(full);
        self
    }

    pub fn storage(mut self, storage: impl Into<String>) -> Self {
        self.storage = Some(storage.into());
        self
    }

    pub fn format(mut self, format: DiskFormat) -> Self {
        self.format = Some(format);
        self
    }

    pub fn target(mut self, node: impl Into<String>) -> Self {
        self.target = Some(node.into());
        self
    }

    pub fn snapname(mut self, snapshot: impl Into<String>) -> Self {
        self.snapname = Some(snapshot.into());
        self
    }
}

/// Disk image format for a full clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    Raw,
    Qcow2,
    Vmdk,
}

/// Parameters of `POST …/status/shutdown`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShutdownParams {
    /// Seconds to wait before giving up (PVE's default is 180).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    /// Hard-stop the VM when the timeout passes instead of failing the task.
    #[serde(
        rename = "forceStop",
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub force_stop: Option<bool>,
}

/// Query parameters of `DELETE /nodes/{node}/qemu/{vmid}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeleteParams {
    /// Also remove the VM from backup jobs, replication and HA (and ACLs).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub purge: Option<bool>,
    /// Also destroy disks on enabled storages that carry the vmid but are not
    /// referenced by the config (left over by a failed operation).
    #[serde(
        rename = "destroy-unreferenced-disks",
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub destroy_unreferenced_disks: Option<bool>,
    /// Ignore a lock (root@pam only).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub skiplock: Option<bool>,
}

impl DeleteParams {
    /// Purge and destroy unreferenced disks: nothing of the VM is left behind.
    pub fn thorough() -> Self {
        Self {
            purge: Some(true),
            destroy_unreferenced_disks: Some(true),
            skiplock: None,
        }
    }
}

/// The `size` of `PUT …/resize`: an absolute size or growth, in GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskSize {
    /// Set the disk to this size (PVE refuses to shrink).
    Gib(u64),
    /// Grow the disk by this much.
    GrowGib(u64),
}

impl fmt::Display for DiskSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gib(n) => write!(f, "{n}G"),
            Self::GrowGib(n) => write!(f, "+{n}G"),
        }
    }
}

/// Changes to a VM config, for `POST`/`PUT …/config`. Keys are PVE's
/// (`cores`, `memory`, `net0`, `ide0`, …), values their text form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmConfigUpdate {
    values: BTreeMap<String, String>,
    delete: BTreeSet<String>,
    digest: Option<String>,
}

impl VmConfigUpdate {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value` (and un-deletes it).
    pub fn set(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        let key = key.into();
        self.delete.remove(&key);
        self.values.insert(key, value.to_string());
        self
    }

    /// Removes `key` from the config.
    pub fn delete(mut self, key: impl Into<String>) -> Self {
        let key = key.into();
        self.values.remove(&key);
        self.delete.insert(key);
        self
    }

    /// Only apply if the config still has this digest (optimistic locking).
    pub fn if_digest(mut self, digest: impl Into<String>) -> Self {
        self.digest = Some(digest.into());
        self
    }

    pub fn cores(self, cores: u32) -> Self {
        self.set("cores", cores)
    }

    pub fn sockets(self, sockets: u32) -> Self {
        self.set("sockets", sockets)
    }

    pub fn memory_mib(self, mib: u64) -> Self {
        self.set("memory", mib)
    }

    pub fn name(self, name: &str) -> Self {
        self.set("name", name)
    }

    pub fn description(self, description: &str) -> Self {
        self.set("description", description)
    }

    /// Replaces the tag list (PVE joins tags with `;`).
    pub fn tags<S: AsRef<str>>(self, tags: &[S]) -> Self {
        let joined = tags.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(";");
        self.set("tags", joined)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.delete.is_empty()
    }
}

impl Serialize for VmConfigUpdate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in &self.values {
            map.serialize_entry(key, value)?;
        }
        if !self.delete.is_empty() {
            let keys = self
                .delete
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(",");
            map.serialize_entry("delete", &keys)?;
        }
        if let Some(digest) = &self.digest {
            map.serialize_entry("digest", digest)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::client::test_support::{client, form_body, query_string};

    #[test]
    fn clone_params_encode_as_pve_expects() {
        let params = CloneParams::new(105)
            .name("worker-a")
            .pool("tenant-a")
            .full(true)
            .storage("local-lvm")
            .format(DiskFormat::Qcow2)
            .target("pve2")
            .snapname("base")
            .description("tenant A, pool workers");
        assert_eq!(
            form_body(&params),
            "newid=105&name=worker-a&description=tenant+A%2C+pool+workers&pool=tenant-a&full=1\
             &storage=local-lvm&format=qcow2&target=pve2&snapname=base"
        );
        assert_eq!(
            form_body(&CloneParams::new(106).full(false)),
            "newid=106&full=0"
        );
    }

    #[test]
    fn delete_params_go_in_the_query() {
        assert_eq!(
            query_string(&DeleteParams::thorough()),
            "purge=1&destroy-unreferenced-disks=1"
        );
        assert_eq!(query_string(&DeleteParams::default()), "");
        assert_eq!(
            query_string(&DeleteParams {
                skiplock: Some(true),
                ..DeleteParams::default()
            }),
            "skiplock=1"
        );
    }

    #[test]
    fn shutdown_params() {
        let params = ShutdownParams {
            timeout: Some(60),
            force_stop: Some(true),
        };
        assert_eq!(form_body(&params), "timeout=60&forceStop=1");
    }

    #[test]
    fn disk_sizes() {
        assert_eq!(DiskSize::Gib(20).to_string(), "20G");
        assert_eq!(DiskSize::GrowGib(5).to_string(), "+5G");
    }

    #[test]
    fn config_update_sets_deletes_and_digest() {
        let update = VmConfigUpdate::new()
            .cores(4)
            .memory_mib(8192)
            .set("net0", "virtio,bridge=vmbr0,tag=20")
            .tags(&["tenant-a", "worker"])
            .delete("ide0")
            .delete("cores")
            .if_digest("abc123");
        assert_eq!(
            form_body(&update),
            "memory=8192&net0=virtio%2Cbridge%3Dvmbr0%2Ctag%3D20&tags=tenant-a%3Bworker\
             &delete=cores%2Cide0&digest=abc123"
        );
        assert!(!update.is_empty());
        assert!(VmConfigUpdate::new().is_empty());
        // Setting again un-deletes.
        let update = VmConfigUpdate::new()
            .delete("ide0")
            .set("ide0", "none,media=cdrom");
        assert_eq!(form_body(&update), "ide0=none%2Cmedia%3Dcdrom");
    }

    #[test]
    fn paths_are_under_the_vm() {
        let client = client();
        let vm = client.qemu("pve1", 105);
        assert_eq!(
            vm.path(&["status", "current"]),
            "/nodes/pve1/qemu/105/status/current"
        );
        assert_eq!(vm.path(&[]), "/nodes/pve1/qemu/105");
        assert_eq!(vm.node(), "pve1");
        assert_eq!(vm.vmid(), 105);
    }
}
