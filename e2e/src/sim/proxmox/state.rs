//! The simulated cluster's state: nodes, storages and their volumes, VMs,
//! `user.cfg` (users, tokens, roles, ACLs, pools) and tasks.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use sha2::{Digest, Sha256};

use super::config::{NodeSpec, PveSimConfig, StorageSpec};
use super::error::{ApiError, ApiResult};
use super::guest::Guest;
use super::permissions::{ROOT, Token, UserConfig};
use super::tasks::Task;
use super::vm_config::{Drive, PropertyString, format_size};

/// A cluster node and whether it is a quorate member right now.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub spec: NodeSpec,
    pub online: bool,
    pub nodeid: u32,
    pub ip: Ipv4Addr,
}

/// A volume on a storage.
#[derive(Debug, Clone)]
pub struct Volume {
    pub volid: String,
    pub storage: String,
    /// `iso`, `images`, `vztmpl`…
    pub content: String,
    /// The VM the volume belongs to (from its name), if any.
    pub vmid: Option<u32>,
    pub format: String,
    pub size: u64,
    pub ctime: i64,
    /// Uploaded file contents (ISOs); disks carry none.
    pub data: Option<Arc<Vec<u8>>>,
}

/// Power state as qemu-server sees it (a QEMU process or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    Stopped,
    Running {
        pid: u32,
        since: Instant,
        paused: bool,
    },
}

/// A QEMU VM: its config file on its node, pending changes, and runtime.
#[derive(Debug, Clone)]
pub struct Vm {
    pub vmid: u32,
    pub node: String,
    pub config: BTreeMap<String, String>,
    /// Changes waiting for the next start: `Some(value)` sets, `None` deletes.
    pub pending: BTreeMap<String, Option<String>>,
    pub power: Power,
    pub guest: Guest,
    /// Bumped on every power transition so stale boot timers do nothing.
    pub boot_generation: u64,
}

impl Vm {
    pub fn new(vmid: u32, node: &str, config: BTreeMap<String, String>) -> Self {
        Self {
            vmid,
            node: node.to_string(),
            config,
            pending: BTreeMap::new(),
            power: Power::Stopped,
            guest: Guest::default(),
            boot_generation: 0,
        }
    }

    pub fn lock(&self) -> Option<&str> {
        self.config.get("lock").map(String::as_str)
    }

    /// `check_lock`: "VM is locked (clone)".
    pub fn check_lock(&self) -> ApiResult<()> {
        match self.lock() {
            Some(lock) => Err(ApiError::internal(format!("VM is locked ({lock})"))),
            None => Ok(()),
        }
    }

    pub fn is_template(&self) -> bool {
        self.config.get("template").is_some_and(|t| t == "1")
    }

    pub fn is_running(&self) -> bool {
        matches!(self.power, Power::Running { .. })
    }

    pub fn name(&self) -> String {
        self.config
            .get("name")
            .cloned()
            .unwrap_or_else(|| format!("VM {}", self.vmid))
    }

    /// The config with pending changes applied (what `GET config` shows).
    pub fn merged_config(&self) -> BTreeMap<String, String> {
        let mut merged = self.config.clone();
        for (key, value) in &self.pending {
            match value {
                Some(value) => {
                    merged.insert(key.clone(), value.clone());
                }
                None => {
                    merged.remove(key);
                }
            }
        }
        merged
    }

    pub fn apply_pending(&mut self) {
        self.config = self.merged_config();
        self.pending.clear();
    }

    /// SHA digest of the config file, for the `digest` optimistic check.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        for (key, value) in &self.config {
            hasher.update(key.as_bytes());
            hasher.update(b": ");
            hasher.update(value.as_bytes());
            hasher.update(b"\n");
        }
        hex::encode(hasher.finalize())[..40].to_string()
    }

    /// Drives of the current config, in key order.
    pub fn drives(&self) -> Vec<(String, Drive)> {
        self.config
            .iter()
            .filter(|(k, _)| super::vm_config::is_drive_key(k))
            .filter_map(|(k, v)| Drive::parse(v).map(|d| (k.clone(), d)))
            .collect()
    }

    pub fn uptime_secs(&self) -> u64 {
        match self.power {
            Power::Running { since, .. } => since.elapsed().as_secs(),
            Power::Stopped => 0,
        }
    }
}

/// Everything inside the simulated cluster.
pub struct Cluster {
    pub nodes: BTreeMap<String, NodeState>,
    pub storages: BTreeMap<String, StorageSpec>,
    /// Keyed by (scope, volid): scope is the node for local storages and
    /// empty for shared ones.
    pub volumes: BTreeMap<(String, String), Volume>,
    pub vms: BTreeMap<u32, Vm>,
    pub users: UserConfig,
    pub tasks: BTreeMap<String, Task>,
    pub rng: StdRng,
    pub next_pid: u32,
    pub started: Instant,
    pub cluster_name: Option<String>,
    pub version: String,
    pub guest_os: super::config::GuestOsInfo,
}

impl Cluster {
    /// A freshly installed cluster with one root API token (returned).
    pub fn new(config: &PveSimConfig) -> (Self, String, String) {
        let mut rng = StdRng::seed_from_u64(config.seed);
        let nodes = config
            .nodes
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let state = NodeState {
                    spec: spec.clone(),
                    online: true,
                    nodeid: index as u32 + 1,
                    ip: Ipv4Addr::new(192, 0, 2, 10 + index as u8),
                };
                (spec.name.clone(), state)
            })
            .collect();
        let storages = config
            .storages
            .iter()
            .map(|s| (s.id.clone(), s.clone()))
            .collect();
        let mut users = UserConfig::new();
        let secret = super::vm_config::random_uuid(&mut rng).to_string();
        users
            .users
            .get_mut(ROOT)
            .expect("root exists")
            .tokens
            .insert(
                config.root_token_name.clone(),
                Token {
                    // Without privilege separation the token is root@pam's
                    // equal, so it can set everything else up.
                    privsep: false,
                    expire: 0,
                    comment: Some("created by pve-sim".into()),
                    secret: secret.clone(),
                },
            );
        let token_id = format!("{ROOT}!{}", config.root_token_name);
        let cluster = Self {
            nodes,
            storages,
            volumes: BTreeMap::new(),
            vms: BTreeMap::new(),
            users,
            tasks: BTreeMap::new(),
            rng,
            next_pid: 4000,
            started: Instant::now(),
            cluster_name: config.cluster_name.clone(),
            version: config.version.clone(),
            guest_os: config.guest_os.clone(),
        };
        (cluster, token_id, secret)
    }

    pub fn now_epoch() -> i64 {
        chrono::Utc::now().timestamp()
    }

    /// The node must exist (else PVE fails the hostname lookup of the proxy)
    /// and be online (else 595).
    pub fn check_node(&self, node: &str) -> ApiResult<&NodeState> {
        match self.nodes.get(node) {
            None => Err(ApiError::internal(format!(
                "hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
            ))),
            Some(state) if !state.online => Err(ApiError::node_unreachable()),
            Some(state) => Ok(state),
        }
    }

    /// `load_config` on a node: the VM's config file must be on that node.
    pub fn vm_on(&self, node: &str, vmid: u32) -> ApiResult<&Vm> {
        match self.vms.get(&vmid) {
            Some(vm) if vm.node == node => Ok(vm),
            _ => Err(config_missing(node, vmid)),
        }
    }

    pub fn vm_on_mut(&mut self, node: &str, vmid: u32) -> ApiResult<&mut Vm> {
        match self.vms.get_mut(&vmid) {
            Some(vm) if vm.node == node => Ok(vm),
            _ => Err(config_missing(node, vmid)),
        }
    }

    pub fn storage(&self, id: &str) -> ApiResult<&StorageSpec> {
        self.storages
            .get(id)
            .ok_or_else(|| ApiError::internal(format!("storage '{id}' does not exist")))
    }

    pub fn storage_available_on(&self, storage: &StorageSpec, node: &str) -> bool {
        storage
            .nodes
            .as_ref()
            .is_none_or(|nodes| nodes.iter().any(|n| n == node))
    }

    /// `storage_check_enabled`.
    pub fn storage_on(&self, id: &str, node: &str) -> ApiResult<&StorageSpec> {
        let storage = self.storage(id)?;
        if !self.storage_available_on(storage, node) {
            return Err(ApiError::internal(format!(
                "storage '{id}' is not available on node '{node}'"
            )));
        }
        Ok(storage)
    }

    /// Where a storage's volumes live when seen from `node`.
    pub fn scope(&self, storage: &StorageSpec, node: &str) -> String {
        if storage.shared {
            String::new()
        } else {
            node.to_string()
        }
    }

    pub fn volume(&self, node: &str, volid: &str) -> Option<&Volume> {
        let storage = self.storages.get(super::vm_config::volid_storage(volid)?)?;
        let scope = self.scope(storage, node);
        self.volumes.get(&(scope, volid.to_string()))
    }

    pub fn volumes_on(&self, node: &str, storage: &StorageSpec) -> Vec<&Volume> {
        let scope = self.scope(storage, node);
        self.volumes
            .iter()
            .filter(|((s, _), v)| *s == scope && v.storage == storage.id)
            .map(|(_, v)| v)
            .collect()
    }

    pub fn used_bytes(&self, node: &str, storage: &StorageSpec) -> u64 {
        self.volumes_on(node, storage).iter().map(|v| v.size).sum()
    }

    pub fn insert_volume(&mut self, node: &str, volume: Volume) {
        let storage = self.storages[&volume.storage].clone();
        let scope = self.scope(&storage, node);
        self.volumes.insert((scope, volume.volid.clone()), volume);
    }

    pub fn remove_volume(&mut self, node: &str, volid: &str) -> Option<Volume> {
        let storage = self
            .storages
            .get(super::vm_config::volid_storage(volid)?)?
            .clone();
        let scope = self.scope(&storage, node);
        self.volumes.remove(&(scope, volid.to_string()))
    }

    /// Allocates a new disk `vm-<vmid>-disk-<n>` (`vdisk_alloc`).
    pub fn alloc_disk(
        &mut self,
        node: &str,
        storage_id: &str,
        vmid: u32,
        size: u64,
        format: Option<&str>,
        name: Option<&str>,
    ) -> ApiResult<String> {
        let storage = self.storage_on(storage_id, node)?.clone();
        if !storage.content.iter().any(|c| c == "images") {
            return Err(ApiError::param(
                "storage",
                format!("storage '{storage_id}' does not support vm images"),
            ));
        }
        // Block storages only hold raw volumes; file storages default to raw.
        let format = format
            .filter(|_| storage.kind.is_file_based())
            .unwrap_or("raw")
            .to_string();
        let available = storage
            .total_bytes
            .saturating_sub(self.used_bytes(node, &storage));
        if size > available {
            return Err(ApiError::internal(format!(
                "unable to create image: not enough free space on storage '{storage_id}'"
            )));
        }
        let volname = |disk: &str| {
            if storage.kind.is_file_based() {
                let file = if disk.contains('.') {
                    disk.to_string()
                } else {
                    format!("{disk}.{format}")
                };
                format!("{storage_id}:{vmid}/{file}")
            } else {
                format!("{storage_id}:{disk}")
            }
        };
        let volid = match name {
            Some(name) => {
                let volid = volname(name);
                if self.volume(node, &volid).is_some() {
                    return Err(ApiError::internal(format!(
                        "disk image '{volid}' already exists"
                    )));
                }
                volid
            }
            None => (0..)
                .map(|n| volname(&format!("vm-{vmid}-disk-{n}")))
                .find(|v| self.volume(node, v).is_none())
                .expect("a free disk name"),
        };
        self.insert_volume(
            node,
            Volume {
                volid: volid.clone(),
                storage: storage_id.to_string(),
                content: "images".into(),
                vmid: Some(vmid),
                format,
                size,
                ctime: Self::now_epoch(),
                data: None,
            },
        );
        Ok(volid)
    }

    /// Renames a VM disk to its base image name (template conversion).
    pub fn make_base(&mut self, node: &str, volid: &str) -> Option<String> {
        let mut volume = self.remove_volume(node, volid)?;
        let base = volid.replacen("vm-", "base-", 1);
        volume.volid = base.clone();
        self.insert_volume(node, volume);
        Some(base)
    }

    pub fn next_pid(&mut self) -> u32 {
        self.next_pid += 1;
        self.next_pid
    }

    /// The first free VMID from 100, as `/cluster/nextid` answers.
    pub fn next_free_vmid(&self) -> Option<u32> {
        (100..1_000_000).find(|id| !self.vms.contains_key(id))
    }

    pub fn pool_of(&self, vmid: u32) -> Option<String> {
        self.users.pool_of_vm(vmid).map(str::to_string)
    }
}

fn config_missing(node: &str, vmid: u32) -> ApiError {
    ApiError::internal(format!(
        "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
    ))
}

/// Volume name kinds, after `parse_volname`: (content type, owner vmid).
pub fn parse_volname(volid: &str) -> (String, Option<u32>) {
    let Some((_, name)) = volid.split_once(':') else {
        return ("images".into(), None);
    };
    for kind in ["iso", "vztmpl", "backup", "snippets", "import"] {
        if name.starts_with(&format!("{kind}/")) {
            return (kind.into(), None);
        }
    }
    // Owner: the last `<vmid>/` directory or the `vm-<id>-`/`base-<id>-` name.
    let last = name.rsplit('/').next().unwrap_or(name);
    let owner = last
        .strip_prefix("vm-")
        .or_else(|| last.strip_prefix("base-"))
        .and_then(|rest| rest.split('-').next())
        .and_then(|id| id.parse().ok());
    ("images".into(), owner)
}

/// A drive string for a freshly allocated disk.
pub fn disk_drive_string(volid: &str, size: u64, options: &PropertyString) -> String {
    let mut props = options.clone();
    props.first = Some(volid.to_string());
    props.remove("import-from");
    props.set("size", format_size(size));
    props.print()
}
