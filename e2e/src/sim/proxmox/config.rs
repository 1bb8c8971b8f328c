//! How a simulated PVE cluster starts: its nodes and storages (what an
//! installer and `pvesm` would have set up), the timings of tasks and guests,
//! and the delay PVE puts on failed logins. Everything else — users, tokens,
//! roles, ACLs, pools, templates — is created through the API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::faults::FaultSpec;

const GIB: u64 = 1024 * 1024 * 1024;

/// A cluster node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
}

impl NodeSpec {
    pub fn new(name: impl Into<String>, cpus: u32, memory_gib: u64) -> Self {
        Self {
            name: name.into(),
            cpus,
            memory_bytes: memory_gib * GIB,
        }
    }
}

/// `pve1:16:64G` — name, CPUs, memory (K/M/G/T suffix, GiB when bare).
impl FromStr for NodeSpec {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        let mut parts = text.split(':');
        let name = parts
            .next()
            .filter(|n| !n.is_empty())
            .context("node name")?;
        let cpus = parts.next().unwrap_or("8").parse().context("node cpus")?;
        let memory_bytes = parse_bytes(parts.next().unwrap_or("32G"), GIB)?;
        if parts.next().is_some() {
            bail!("node spec is name[:cpus[:memory]], got {text:?}");
        }
        Ok(Self {
            name: name.to_string(),
            cpus,
            memory_bytes,
        })
    }
}

/// The storage plugin types the simulator knows, with what each can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageType {
    Dir,
    Nfs,
    Cifs,
    Lvm,
    Lvmthin,
    Zfspool,
    Rbd,
}

impl StorageType {
    pub fn as_str(self) -> &'static str {
        match self {
            StorageType::Dir => "dir",
            StorageType::Nfs => "nfs",
            StorageType::Cifs => "cifs",
            StorageType::Lvm => "lvm",
            StorageType::Lvmthin => "lvmthin",
            StorageType::Zfspool => "zfspool",
            StorageType::Rbd => "rbd",
        }
    }

    /// File-based storages have a path: they hold ISOs and accept uploads.
    pub fn is_file_based(self) -> bool {
        matches!(
            self,
            StorageType::Dir | StorageType::Nfs | StorageType::Cifs
        )
    }

    /// Whether disks on it can be linked-cloned (qcow2 on file storages).
    pub fn supports_linked_clone(self, format: &str) -> bool {
        match self {
            StorageType::Dir | StorageType::Nfs | StorageType::Cifs => format == "qcow2",
            StorageType::Lvm => false,
            StorageType::Lvmthin | StorageType::Zfspool | StorageType::Rbd => true,
        }
    }

    fn allowed_content(self) -> &'static [&'static str] {
        if self.is_file_based() {
            &[
                "images", "rootdir", "iso", "vztmpl", "backup", "snippets", "import",
            ]
        } else {
            &["images", "rootdir"]
        }
    }

    fn shared_by_nature(self) -> bool {
        matches!(
            self,
            StorageType::Nfs | StorageType::Cifs | StorageType::Rbd
        )
    }
}

impl FromStr for StorageType {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        serde_norway::from_str(text).with_context(|| format!("unknown storage type {text:?}"))
    }
}

/// A storage as `storage.cfg` defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageSpec {
    pub id: String,
    pub kind: StorageType,
    /// Content types, e.g. `iso`, `images`.
    pub content: Vec<String>,
    /// Shared storages have one set of volumes for the whole cluster;
    /// others have their own on every node they are available on.
    pub shared: bool,
    /// Nodes the storage is available on; `None` means all.
    pub nodes: Option<Vec<String>>,
    pub total_bytes: u64,
}

impl StorageSpec {
    pub fn new(id: impl Into<String>, kind: StorageType, content: &[&str]) -> Self {
        Self {
            id: id.into(),
            kind,
            content: content.iter().map(|c| c.to_string()).collect(),
            shared: kind.shared_by_nature(),
            nodes: None,
            total_bytes: 500 * GIB,
        }
    }

    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    pub fn on_nodes(mut self, nodes: &[&str]) -> Self {
        self.nodes = Some(nodes.iter().map(|n| n.to_string()).collect());
        self
    }

    fn validate(&self) -> anyhow::Result<()> {
        for content in &self.content {
            if !self.kind.allowed_content().contains(&content.as_str()) {
                bail!(
                    "storage {}: type {} cannot hold content {content:?}",
                    self.id,
                    self.kind.as_str()
                );
            }
        }
        Ok(())
    }
}

/// `id:type:content[:shared][:size]`, content comma-separated, e.g.
/// `local:dir:iso,vztmpl,images` or `ceph:rbd:images:shared:2T`.
impl FromStr for StorageSpec {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        let mut parts = text.split(':');
        let id = parts
            .next()
            .filter(|n| !n.is_empty())
            .context("storage id")?;
        let kind: StorageType = parts.next().context("storage type")?.parse()?;
        let content: Vec<&str> = parts
            .next()
            .context("storage content")?
            .split(',')
            .filter(|c| !c.is_empty())
            .collect();
        let mut spec = StorageSpec::new(id, kind, &content);
        for extra in parts {
            if extra == "shared" {
                spec.shared = true;
            } else {
                spec.total_bytes = parse_bytes(extra, GIB)?;
            }
        }
        Ok(spec)
    }
}

/// How long things take inside the simulated cluster.
#[derive(Debug, Clone)]
pub struct Timings {
    /// Duration of a task when its type has no entry in `tasks`.
    pub task: Duration,
    /// Per task type (`qmclone`, `qmstart`, `imgcopy`…).
    pub tasks: BTreeMap<String, Duration>,
    /// From `qmstart` finishing to the guest having read its NoCloud data
    /// and its agent answering.
    pub guest_boot: Duration,
    /// How long cloud-init keeps running after the agent answers (on a
    /// guest OS that has cloud-init): `cloud-init status` says `running`
    /// until then, `done` after.
    pub cloud_init: Duration,
    /// How long an ACPI shutdown/reboot waits for a guest that ignores it.
    pub shutdown_timeout: Duration,
    /// PVE delays every 401 answer by 3 s to slow down password guessing.
    pub auth_failure_delay: Duration,
}

impl Timings {
    /// Short enough for tests, still ordered like the real thing.
    pub fn for_tests() -> Self {
        Self {
            task: Duration::from_millis(30),
            tasks: [("qmclone", 300), ("qmcreate", 50), ("imgcopy", 50)]
                .into_iter()
                .map(|(t, ms)| (t.to_string(), Duration::from_millis(ms)))
                .collect(),
            guest_boot: Duration::from_millis(200),
            cloud_init: Duration::ZERO,
            shutdown_timeout: Duration::from_millis(500),
            auth_failure_delay: Duration::from_millis(200),
        }
    }

    /// Closer to a small real cluster, for the sandbox and manual use.
    pub fn standalone() -> Self {
        Self {
            task: Duration::from_millis(500),
            tasks: [("qmclone", 3000), ("qmcreate", 1000), ("imgcopy", 500)]
                .into_iter()
                .map(|(t, ms)| (t.to_string(), Duration::from_millis(ms)))
                .collect(),
            guest_boot: Duration::from_secs(5),
            cloud_init: Duration::from_secs(3),
            shutdown_timeout: Duration::from_secs(10),
            auth_failure_delay: Duration::from_secs(3),
        }
    }

    pub fn task_duration(&self, task_type: &str) -> Duration {
        self.tasks.get(task_type).copied().unwrap_or(self.task)
    }
}

/// What the guest agent's `get-osinfo` reports, and whether the image runs
/// cloud-init (Talos reads its NoCloud seed itself and has no `cloud-init`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestOsInfo {
    pub id: String,
    pub name: String,
    pub pretty_name: String,
    pub version: String,
    pub version_id: String,
    pub kernel_release: String,
    pub cloud_init: bool,
}

impl GuestOsInfo {
    /// An Ubuntu cloud image: cloud-init reads the NoCloud seed.
    pub fn ubuntu() -> Self {
        Self {
            id: "ubuntu".into(),
            name: "Ubuntu".into(),
            pretty_name: "Ubuntu 24.04.3 LTS".into(),
            version: "24.04.3 LTS (Noble Numbat)".into(),
            version_id: "24.04".into(),
            kernel_release: "6.8.0-85-generic".into(),
            cloud_init: true,
        }
    }
}

impl Default for GuestOsInfo {
    fn default() -> Self {
        Self {
            id: "talos".into(),
            name: "Talos".into(),
            pretty_name: "Talos (v1.11.0)".into(),
            version: "v1.11.0".into(),
            version_id: "1.11.0".into(),
            kernel_release: "6.12.43-talos".into(),
            cloud_init: false,
        }
    }
}

/// Everything the simulator starts with.
#[derive(Debug, Clone)]
pub struct PveSimConfig {
    /// Loopback by default; port 0 picks a free one.
    pub listen: SocketAddr,
    pub nodes: Vec<NodeSpec>,
    pub storages: Vec<StorageSpec>,
    /// Name of the one `root@pam` API token the simulator starts with.
    pub root_token_name: String,
    pub timings: Timings,
    /// Seeds MACs, UUIDs, token secrets and fault probabilities.
    pub seed: u64,
    /// `None`: a single node without a cluster, as after a fresh install.
    pub cluster_name: Option<String>,
    /// What `/version` reports.
    pub version: String,
    pub guest_os: GuestOsInfo,
    /// Faults active from the start (standalone mode).
    pub faults: Vec<FaultSpec>,
}

impl PveSimConfig {
    /// One node `pve` with `local` (dir: iso, vztmpl, backup, images) and
    /// `local-lvm` (lvmthin: images, rootdir) — a default PVE install —
    /// with test timings.
    pub fn for_tests() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            nodes: vec![NodeSpec::new("pve", 16, 64)],
            storages: default_storages(),
            root_token_name: "sim".into(),
            timings: Timings::for_tests(),
            seed: 0x5eed,
            cluster_name: None,
            version: "9.0.10".into(),
            guest_os: GuestOsInfo::default(),
            faults: Vec::new(),
        }
    }

    pub fn standalone() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8006)),
            timings: Timings::standalone(),
            ..Self::for_tests()
        }
    }

    pub fn with_nodes(mut self, nodes: Vec<NodeSpec>) -> Self {
        if nodes.len() > 1 && self.cluster_name.is_none() {
            self.cluster_name = Some("pve-sim".into());
        }
        self.nodes = nodes;
        self
    }

    pub fn with_storages(mut self, storages: Vec<StorageSpec>) -> Self {
        self.storages = storages;
        self
    }

    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.nodes.is_empty() {
            bail!("a PVE cluster needs at least one node");
        }
        let mut seen = std::collections::BTreeSet::new();
        for node in &self.nodes {
            if !seen.insert(&node.name) {
                bail!("node {} defined twice", node.name);
            }
        }
        let mut storage_ids = std::collections::BTreeSet::new();
        for storage in &self.storages {
            if !storage_ids.insert(&storage.id) {
                bail!("storage {} defined twice", storage.id);
            }
            storage.validate()?;
            if let Some(nodes) = &storage.nodes {
                for node in nodes {
                    if !seen.contains(node) {
                        bail!("storage {} names unknown node {node}", storage.id);
                    }
                }
            }
        }
        if !super::permissions::valid_token_name(&self.root_token_name) {
            bail!("invalid root token name {:?}", self.root_token_name);
        }
        Ok(())
    }

    /// Reads a YAML config file (see the module README for the format) on
    /// top of the standalone defaults.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let file: FileConfig =
            serde_norway::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        file.apply(Self::standalone())
    }
}

impl Default for PveSimConfig {
    fn default() -> Self {
        Self::for_tests()
    }
}

fn default_storages() -> Vec<StorageSpec> {
    vec![
        StorageSpec::new(
            "local",
            StorageType::Dir,
            &["iso", "vztmpl", "backup", "images", "snippets", "import"],
        ),
        StorageSpec::new("local-lvm", StorageType::Lvmthin, &["images", "rootdir"]),
    ]
}

/// Sizes like `64G`, `512M`, `2T`; a bare number is in `default_unit` bytes.
pub fn parse_bytes(text: &str, default_unit: u64) -> anyhow::Result<u64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((index, _)) => (&text[..index], &text[index..]),
        None => (text, ""),
    };
    let number: u64 = number
        .parse()
        .with_context(|| format!("invalid size {text:?}"))?;
    let factor = match unit.trim_end_matches("iB").trim_end_matches('B') {
        "" => default_unit,
        "K" | "k" => 1024,
        "M" => 1024 * 1024,
        "G" => GIB,
        "T" => 1024 * GIB,
        other => bail!("unknown size unit {other:?}"),
    };
    Ok(number * factor)
}

/// The YAML file of standalone mode.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub cluster_name: Option<String>,
    pub seed: Option<u64>,
    pub root_token_name: Option<String>,
    #[serde(default)]
    pub nodes: Vec<FileNode>,
    #[serde(default)]
    pub storages: Vec<FileStorage>,
    pub timings: Option<FileTimings>,
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileNode {
    pub name: String,
    #[serde(default = "default_cpus")]
    pub cpus: u32,
    #[serde(default = "default_memory")]
    pub memory: String,
}

fn default_cpus() -> u32 {
    8
}

fn default_memory() -> String {
    "32G".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileStorage {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: StorageType,
    pub content: Vec<String>,
    pub shared: Option<bool>,
    pub nodes: Option<Vec<String>>,
    pub size: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileTimings {
    pub task_ms: Option<u64>,
    #[serde(default)]
    pub tasks_ms: BTreeMap<String, u64>,
    pub guest_boot_ms: Option<u64>,
    pub cloud_init_ms: Option<u64>,
    pub shutdown_timeout_ms: Option<u64>,
    pub auth_failure_delay_ms: Option<u64>,
}

impl FileConfig {
    pub fn apply(self, mut config: PveSimConfig) -> anyhow::Result<PveSimConfig> {
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(name) = self.cluster_name {
            config.cluster_name = Some(name);
        }
        if let Some(seed) = self.seed {
            config.seed = seed;
        }
        if let Some(name) = self.root_token_name {
            config.root_token_name = name;
        }
        if !self.nodes.is_empty() {
            let nodes = self
                .nodes
                .into_iter()
                .map(|n| {
                    Ok(NodeSpec {
                        name: n.name,
                        cpus: n.cpus,
                        memory_bytes: parse_bytes(&n.memory, GIB)?,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            config = config.with_nodes(nodes);
        }
        if !self.storages.is_empty() {
            config.storages = self
                .storages
                .into_iter()
                .map(|s| {
                    let content: Vec<&str> = s.content.iter().map(String::as_str).collect();
                    let mut spec = StorageSpec::new(s.id, s.kind, &content);
                    if let Some(shared) = s.shared {
                        spec.shared = shared;
                    }
                    spec.nodes = s.nodes;
                    if let Some(size) = s.size {
                        spec.total_bytes = parse_bytes(&size, GIB)?;
                    }
                    Ok(spec)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
        }
        if let Some(t) = self.timings {
            let ms = Duration::from_millis;
            if let Some(v) = t.task_ms {
                config.timings.task = ms(v);
            }
            for (task, v) in t.tasks_ms {
                config.timings.tasks.insert(task, ms(v));
            }
            if let Some(v) = t.guest_boot_ms {
                config.timings.guest_boot = ms(v);
            }
            if let Some(v) = t.cloud_init_ms {
                config.timings.cloud_init = ms(v);
            }
            if let Some(v) = t.shutdown_timeout_ms {
                config.timings.shutdown_timeout = ms(v);
            }
            if let Some(v) = t.auth_failure_delay_ms {
                config.timings.auth_failure_delay = ms(v);
            }
        }
        config.faults.extend(self.faults);
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_and_storage_specs_parse_from_flags() {
        let node: NodeSpec = "pve2:4:16G".parse().unwrap();
        assert_eq!(node, NodeSpec::new("pve2", 4, 16));
        let storage: StorageSpec = "ceph:rbd:images:shared:2T".parse().unwrap();
        assert!(storage.shared);
        assert_eq!(storage.total_bytes, 2048 * GIB);
        assert_eq!(storage.content, vec!["images".to_string()]);
        let iso: StorageSpec = "local:dir:iso,images".parse().unwrap();
        assert!(!iso.shared);
    }

    #[test]
    fn readme_config_file_parses() {
        let readme = include_str!("README.md");
        let yaml = readme
            .split("```yaml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("README has a YAML example");
        let file: FileConfig = serde_norway::from_str(yaml).unwrap();
        let config = file.apply(PveSimConfig::standalone()).unwrap();
        config.validate().unwrap();
        assert_eq!(config.nodes.len(), 2);
        assert_eq!(config.cluster_name.as_deref(), Some("lab"));
        assert!(config.storages.iter().any(|s| s.id == "ceph" && s.shared));
        assert_eq!(config.faults.len(), 7);
        assert_eq!(
            config.timings.task_duration("qmclone"),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn lvmthin_cannot_hold_isos() {
        let config =
            PveSimConfig::for_tests().with_storages(vec!["thin:lvmthin:iso".parse().unwrap()]);
        assert!(config.validate().is_err());
    }
}
