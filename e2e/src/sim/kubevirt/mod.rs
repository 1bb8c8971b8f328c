//! KubeVirt + CDI simulator (virt-controller, virt-handler, CDI importer).
//!
//! KubeVirt's controllers and CDI's importer need nodes, pods and a
//! hypervisor, none of which run in the test harness. This simulator plays
//! their part as far as a controller can see through the Kubernetes API: it
//! watches `VirtualMachine`, `VirtualMachineInstance`,
//! `VirtualMachineInstanceMigration`, `DataVolume` and `PersistentVolumeClaim`
//! objects of a real kube-apiserver and writes back the objects and status
//! that KubeVirt v1.8/v1.9 and CDI v1.64+ would. `README.md` next to this file
//! lists what it copies from upstream and what it leaves out.
//!
//! Everything is level-triggered: the state lives in the API objects (phase
//! transition timestamps, PVC annotations as CDI keeps them), so a simulator
//! that restarts, or a second one started after the first was stopped,
//! carries on where the first left off without duplicating anything.
//!
//! ```no_run
//! # async fn example(client: kube::Client) -> anyhow::Result<()> {
//! use tenantry_e2e::sim::kubevirt::{ImageFactory, KubevirtSimConfig, KubevirtSimulator};
//! let images = ImageFactory::start(Default::default()).await?;
//! let sim = KubevirtSimulator::start(client, KubevirtSimConfig::fast()).await?;
//! // create VirtualMachines whose DataVolumes import from images.base_url() ...
//! # drop((images, sim)); Ok(()) }
//! ```

mod cdi;
mod faults;
mod guest;
mod image_factory;
mod importer;
mod ip_pool;
mod kubelet;
mod migration;
mod resources;
mod virt_controller;
mod virt_handler;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use tokio::task::JoinHandle;

pub use faults::{Fault, FaultId, FaultTarget, Faults};
pub use guest::{BOOTSTRAP_SENTINEL, SshGuestConfig};
pub use image_factory::{DEFAULT_SCHEMATIC, ImageFactory, ImageFactoryConfig};

use crate::control_plane::ControlPlane;
use crate::kubevirt_upstream::{VirtApi, VirtController};
use crate::manifests;

/// Annotation keys that inject faults. Put them on the object named in each
/// key's documentation (`kubectl annotate ...` works in the sandbox); the Rust
/// equivalent is [`Faults::inject`] or a method of [`KubevirtSimulator`].
pub mod annotations {
    /// On a VirtualMachine (or its VMI, or `spec.template.metadata`): the
    /// virt-launcher pod cannot be scheduled. The VMI stays `Scheduling` with
    /// condition `PodScheduled=False, reason=Unschedulable`; the value is the
    /// scheduler's message (a default one when empty). The VM reports
    /// `printableStatus: ErrorUnschedulable`. Removing the annotation lets the
    /// VMI schedule.
    pub const UNSCHEDULABLE: &str = "sim.tenantry.dev/unschedulable";
    /// On a VirtualMachine (or its VMI): every VMI fails before it runs
    /// (phase `Failed` from `Scheduled`), so the VM goes into KubeVirt's start
    /// back-off (`status.startFailure`, `printableStatus: CrashLoopBackOff`).
    pub const FAIL_AT_START: &str = "sim.tenantry.dev/fail-at-start";
    /// On a VirtualMachine (or its VMI): the images of `containerDisk`
    /// volumes cannot be pulled. The VMI stays `Scheduling` with
    /// `Synchronized=False, reason=ErrImagePull`, then `ImagePullBackOff`; the
    /// value is the runtime's message (a default one when empty). No effect
    /// on a VMI without containerDisk volumes.
    pub const IMAGE_PULL_ERROR: &str = "sim.tenantry.dev/image-pull-error";
    /// On a VirtualMachine (or its VMI): the guest hangs while booting. The
    /// VMI is `Running` with its interfaces, but `Ready` stays False
    /// (`ContainersNotReady`) and the guest agent never connects.
    pub const HUNG_GUEST: &str = "sim.tenantry.dev/hung-guest";
    /// On a VMI, once: the guest crashes (`Scheduled`/`Running` → `Failed`).
    /// The VM then restarts it per its run strategy.
    pub const FAIL: &str = "sim.tenantry.dev/fail";
    /// On a VMI, once: the guest powers itself off (→ `Succeeded`).
    pub const SHUTDOWN: &str = "sim.tenantry.dev/shutdown";
    /// On a VMI, once: the node it runs on is drained. What follows depends
    /// on the VMI's `spec.evictionStrategy` (default: the simulator's
    /// [`KubevirtSimConfig::default_eviction_strategy`]): `External` sets
    /// `status.evacuationNodeName` and condition `EvictionRequested`;
    /// `LiveMigrate`/`LiveMigrateIfPossible` also create an evacuation
    /// `VirtualMachineInstanceMigration` when the VMI is live-migratable; `None`
    /// (or a non-migratable VMI with `LiveMigrateIfPossible`) evicts the
    /// virt-launcher pod, so the VMI fails.
    pub const EVICT: &str = "sim.tenantry.dev/evict";
    /// On a VirtualMachine or VMI: how long the guest takes to shut down
    /// after its VMI is deleted (a duration such as `5s` or `500ms`),
    /// overriding [`super::KubevirtSimConfig::shutdown_grace`].
    pub const SHUTDOWN_GRACE: &str = "sim.tenantry.dev/shutdown-grace";
    /// On a DataVolume (or the VM owning it, or the DataVolumeTemplate's
    /// metadata): the importer fails with this message and is restarted, as
    /// CDI does for transient errors (phase stays `ImportInProgress`,
    /// `Running=False, reason=Error`, `restartCount` grows).
    pub const IMPORT_ERROR: &str = "sim.tenantry.dev/import-error";
    /// Like [`IMPORT_ERROR`], but fatal: the DataVolume goes `Failed`, as CDI
    /// does for a checksum mismatch.
    pub const IMPORT_FATAL: &str = "sim.tenantry.dev/import-fatal";
    /// On a DataVolume (or its VM): the import takes at least this long
    /// (a duration such as `20s`), reporting progress along the way.
    pub const IMPORT_DURATION: &str = "sim.tenantry.dev/import-duration";
    /// On a VirtualMachine (or its VMI), with SSH guests: the guest's
    /// bootstrap never writes CAPI's sentinel
    /// `/run/cluster-api/bootstrap-success.complete`, as when `kubeadm join`
    /// fails before `echo success`.
    pub const BOOTSTRAP_SENTINEL_ABSENT: &str = "sim.tenantry.dev/bootstrap-sentinel-absent";
    /// On a VirtualMachine (or its VMI), with SSH guests: the sentinel holds
    /// this value instead of `success`.
    pub const BOOTSTRAP_SENTINEL: &str = "sim.tenantry.dev/bootstrap-sentinel";
    /// On a VirtualMachine (or its VMI), with SSH guests: the guest's
    /// bootstrap takes this long (a duration such as `5s`), overriding
    /// [`super::SshGuestConfig::bootstrap_duration`].
    pub const BOOTSTRAP_DURATION: &str = "sim.tenantry.dev/bootstrap-duration";
}

/// Annotations the simulator writes on a PVC after a successful import, so
/// tests can check that the data really arrived.
pub mod imported {
    /// Bytes of the decompressed disk image.
    pub const SIZE: &str = "sim.tenantry.dev/imported-size";
    /// Hex SHA-256 of the decompressed disk image.
    pub const SHA256: &str = "sim.tenantry.dev/imported-sha256";
    /// The compression the source had: `none`, `xz` or `gz`.
    pub const COMPRESSION: &str = "sim.tenantry.dev/imported-compression";
}

/// A pool of loopback addresses for VMIs whose guests run SSH servers
/// (Linux routes all of 127.0.0.0/8 to loopback). Simulators may share it:
/// an address whose SSH port is taken is skipped.
pub const LOOPBACK_IP_POOL: &str = "127.10.0.0/16";

/// How the simulator behaves. [`KubevirtSimConfig::default`] is paced like a
/// small real cluster; [`KubevirtSimConfig::fast`] suits tests.
#[derive(Clone, Debug)]
pub struct KubevirtSimConfig {
    /// Name for logs and field managers (`<name>-virt-controller`, ...).
    pub name: String,
    /// Install the KubeVirt and CDI CRDs from `e2e/fixtures/upstream` first.
    pub install_crds: bool,
    /// Simulated infra node names; VMIs are spread over them.
    pub nodes: Vec<String>,
    /// IPv4 pool (CIDR) the VMI interfaces get their addresses from, one per
    /// interface. Give several simulators disjoint pools.
    pub ip_pool: String,
    /// Time between two simulated steps: VMI phases, PVC binding, importer
    /// scheduling, migration phases.
    pub step: Duration,
    /// How long a guest takes to shut down once its VMI is deleted; the VMI
    /// keeps its finalizers meanwhile.
    pub shutdown_grace: Duration,
    /// First importer restart delay after a failed import; doubles up to
    /// [`Self::import_retry_max`] like kubelet's CrashLoopBackOff.
    pub import_retry: Duration,
    /// Longest importer restart delay.
    pub import_retry_max: Duration,
    /// Base of KubeVirt's VM start back-off (upstream: 10s × failures², at
    /// most 300s; the maximum here is 30 × this base).
    pub start_backoff_base: Duration,
    /// How long a failed image pull shows `ErrImagePull` before
    /// `ImagePullBackOff`.
    pub image_pull_backoff: Duration,
    /// Eviction strategy of a VMI whose spec has none (KubeVirt's cluster
    /// default).
    pub default_eviction_strategy: String,
    /// Whether running guests report through a guest agent (`AgentConnected`,
    /// `guestOSInfo`).
    pub guest_agent: bool,
    /// `status.guestOSInfo` of running guests.
    pub guest_os: serde_json::Value,
    /// `status.launcherContainerImageVersion` of scheduled VMIs.
    pub launcher_image: String,
    /// Guests that read their cloud-init users and run an SSH server on the
    /// VMI's first IP (see `README.md`); `None`: no guest listens. Needs
    /// `ip_pool` inside 127.0.0.0/8; see [`KubevirtSimConfig::with_ssh_guests`].
    pub ssh_guests: Option<SshGuestConfig>,
}

impl Default for KubevirtSimConfig {
    fn default() -> Self {
        Self {
            name: "kubevirt-sim".into(),
            install_crds: true,
            nodes: vec![
                "infra-node-1".into(),
                "infra-node-2".into(),
                "infra-node-3".into(),
            ],
            ip_pool: "10.244.0.0/16".into(),
            step: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
            import_retry: Duration::from_secs(10),
            import_retry_max: Duration::from_secs(300),
            start_backoff_base: Duration::from_secs(10),
            image_pull_backoff: Duration::from_secs(10),
            default_eviction_strategy: "None".into(),
            guest_agent: true,
            guest_os: serde_json::json!({
                "id": "talos",
                "name": "Talos",
                "prettyName": "Talos (v1.11.0)",
                "version": "v1.11.0",
                "versionId": "v1.11.0",
                "kernelRelease": "6.12.43-talos",
                "kernelVersion": "#1 SMP",
                "machine": "x86_64",
            }),
            launcher_image: "quay.io/kubevirt/virt-launcher:v1.9.0".into(),
            ssh_guests: None,
        }
    }
}

impl KubevirtSimConfig {
    /// Short steps and back-offs for tests.
    pub fn fast() -> Self {
        Self {
            step: Duration::from_millis(100),
            shutdown_grace: Duration::from_millis(500),
            import_retry: Duration::from_millis(500),
            import_retry_max: Duration::from_secs(2),
            start_backoff_base: Duration::from_millis(300),
            image_pull_backoff: Duration::from_millis(500),
            ..Self::default()
        }
    }

    /// Guests run SSH servers, on loopback addresses from
    /// [`LOOPBACK_IP_POOL`].
    pub fn with_ssh_guests(self, guests: SshGuestConfig) -> Self {
        Self {
            ip_pool: LOOPBACK_IP_POOL.into(),
            ssh_guests: Some(guests),
            ..self
        }
    }
}

/// The folders of the upstream CRDs this simulator acts on.
pub fn crd_paths() -> Vec<PathBuf> {
    let upstream = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream");
    vec![upstream.join("kubevirt"), upstream.join("cdi")]
}

/// Installs the KubeVirt (VirtualMachine, VirtualMachineInstance,
/// VirtualMachineInstanceMigration) and CDI (DataVolume) CRDs and waits until
/// they are Established. Also useful on a management cluster whose KubeVirt
/// runs elsewhere (CAPK needs the CRDs there too).
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    manifests::install_crds(client, &crd_paths()).await
}

/// A running simulator. Dropping it stops every task it started.
pub struct KubevirtSimulator {
    context: Arc<resources::Context>,
    tasks: Vec<JoinHandle<()>>,
    /// KubeVirt's own virt-api and virt-controller, when they run
    /// ([`Self::start_with_kubevirt`]); declared after the tasks, so they
    /// stop after them.
    kubevirt: Option<(VirtApi, VirtController)>,
}

impl std::fmt::Debug for KubevirtSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubevirtSimulator")
            .field("name", &self.context.config.name)
            .finish_non_exhaustive()
    }
}

impl KubevirtSimulator {
    /// Installs the CRDs (unless told not to) and starts virt-controller,
    /// virt-handler, the migration controller and CDI against `client`.
    pub async fn start(client: kube::Client, config: KubevirtSimConfig) -> anyhow::Result<Self> {
        if config.install_crds {
            install_crds(&client)
                .await
                .context("install KubeVirt and CDI CRDs")?;
        }
        let ips = ip_pool::IpPool::parse(&config.ip_pool)?;
        if config.nodes.is_empty() {
            anyhow::bail!("the simulator needs at least one node name");
        }
        let context = resources::Context::new(client, None, config, ips);
        Self::start_tasks(context, None).await
    }

    /// KubeVirt's own virt-api and virt-controller on `control_plane`
    /// ([`VirtApi`], [`VirtController`]: KubeVirt v1.8.4's CRDs, webhooks
    /// and controllers), and the simulator for what cannot run here: the
    /// kubelet of launcher pods, virt-handler (writing as its
    /// ServiceAccount), the guests and CDI. `config.install_crds` is
    /// ignored: KubeVirt's and CDI's own CRDs are installed. Live migration
    /// is left out (virt-controller's migration controller would wait for
    /// virt-handler's part of it, which is not simulated).
    pub async fn start_with_kubevirt(
        control_plane: &ControlPlane,
        config: KubevirtSimConfig,
    ) -> anyhow::Result<Self> {
        let virt_api = VirtApi::start(control_plane).await?;
        let virt_controller = VirtController::start(control_plane, &virt_api).await?;
        let handler = control_plane
            .user_client(
                crate::kubevirt_upstream::VIRT_HANDLER_USER,
                &crate::kubevirt_upstream::SERVICE_ACCOUNT_GROUPS,
            )
            .await?;
        let ips = ip_pool::IpPool::parse(&config.ip_pool)?;
        let context = resources::Context::new(control_plane.client(), Some(handler), config, ips);
        kubelet::register_nodes(&context)
            .await
            .context("register the nodes")?;
        Self::start_tasks(context, Some((virt_api, virt_controller))).await
    }

    async fn start_tasks(
        context: Arc<resources::Context>,
        kubevirt: Option<(VirtApi, VirtController)>,
    ) -> anyhow::Result<Self> {
        context.guests.check_pool(&context.config.ip_pool)?;
        context
            .ips
            .seed_from_cluster(&context.client)
            .await
            .context("read the IPs of existing VMIs")?;
        let mut tasks = vec![
            tokio::spawn(virt_handler::run(context.clone())),
            tokio::spawn(cdi::run(context.clone())),
            tokio::spawn(cdi::run_pvc_protection(context.clone())),
        ];
        if context.real_controller {
            tasks.push(tokio::spawn(kubelet::run(context.clone())));
            tasks.push(tokio::spawn(kubelet::run_pod_deletion(context.clone())));
        } else {
            tasks.push(tokio::spawn(virt_controller::run(context.clone())));
            tasks.push(tokio::spawn(migration::run(context.clone())));
        }
        tracing::info!(name = %context.config.name, "KubeVirt/CDI simulator started");
        Ok(Self {
            context,
            tasks,
            kubevirt,
        })
    }

    /// The last lines of virt-controller's log, when it runs.
    pub fn virt_controller_log(&self, lines: usize) -> Option<String> {
        self.kubevirt
            .as_ref()
            .map(|(_, controller)| controller.log_tail(lines))
    }

    /// Faults injected from Rust, by VM or DataVolume name.
    pub fn faults(&self) -> &Faults {
        &self.context.faults
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &KubevirtSimConfig {
        &self.context.config
    }

    /// The console log of the guests of VM `namespace/name` (SSH guests
    /// only): cloud-init's users, sshd's logins and commands, and why sshd
    /// could not listen, if it could not.
    pub fn guest_log(&self, namespace: &str, name: &str) -> Vec<String> {
        self.context.guests.log(namespace, name)
    }

    /// How many imports (including restarts) the CDI importer has started.
    pub fn imports_started(&self) -> u64 {
        self.context.imports.started()
    }

    /// The guest of a running VMI crashes: the VMI goes `Failed` (then the
    /// VM restarts it per its run strategy).
    pub async fn fail_vmi(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        self.annotate_vmi(namespace, name, annotations::FAIL, "requested by test")
            .await
    }

    /// The guest of a VMI powers off: the VMI goes `Succeeded`.
    pub async fn shutdown_guest(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        self.annotate_vmi(namespace, name, annotations::SHUTDOWN, "requested by test")
            .await
    }

    /// The node of a VMI is drained; see [`annotations::EVICT`].
    pub async fn evict_vmi(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        self.annotate_vmi(namespace, name, annotations::EVICT, "requested by test")
            .await
    }

    async fn annotate_vmi(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> anyhow::Result<()> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.context.client.clone(),
            namespace,
            &resources::vmi_resource(),
        );
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .with_context(|| format!("annotate VMI {namespace}/{name} with {key}"))?;
        Ok(())
    }

    /// Stops every task and waits until they are gone, so nothing this
    /// simulator started writes to the cluster after this returns.
    pub async fn stop(mut self) {
        self.context.imports.abort_all();
        self.context.guests.stop_all();
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        tracing::info!(name = %self.context.config.name, "KubeVirt/CDI simulator stopped");
    }
}

impl Drop for KubevirtSimulator {
    fn drop(&mut self) {
        self.context.imports.abort_all();
        self.context.guests.stop_all();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Drives a controller stream until the task is aborted, logging reconcile
/// errors at debug level (conflicts are routine: the objects are shared with
/// the code under test).
async fn drive<S, T, E>(what: &'static str, stream: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    stream
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(controller = what, %error, "reconcile failed");
            }
        })
        .await;
}
