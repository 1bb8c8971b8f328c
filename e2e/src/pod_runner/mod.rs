//! The management cluster's kubelet: runs the pods the real kube-scheduler
//! binds to its Node, each container as a local process started from its
//! image's root filesystem, so that tenantry (and the Cluster API manager)
//! run exactly as their manifests deploy them: entrypoint and args, env,
//! ServiceAccount token, mounted Secrets and ConfigMaps, security context,
//! probes, restarts, a pod address that the webhook Service's endpoints
//! name. Everything around it is real: Deployments, ReplicaSets,
//! EndpointSlices (kube-controller-manager), scheduling (kube-scheduler),
//! admission of the token volume (kube-apiserver's ServiceAccount plugin).
//!
//! What each part copies and leaves out is in its module and in
//! `README.md` next to this file:
//! [`network`] (the CNI plugin's part), [`container`] (runc's part),
//! [`volumes`] (volumes and environment), [`probes`], [`images`] (the
//! container runtime's image store), [`services`] (CoreDNS and
//! kube-proxy).

pub mod container;
pub mod images;
pub mod network;
pub mod probes;
pub mod services;
pub mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use images::{ImageStore, PulledImage};
use network::{NodeNetwork, PodSandbox};
use probes::{ProbeSpec, ProbeState};

/// How often a pod's containers, probes and volumes are looked at.
const SYNC_PERIOD: Duration = Duration::from_millis(500);
/// The kubelet's crash-loop back-off: 10 s doubling to 5 min, reset after
/// 10 min of running.
const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// How often mounted Secrets, ConfigMaps and tokens are re-read (the
/// kubelet's sync period is a minute; shorter here, tests wait for it).
const VOLUME_REFRESH: Duration = Duration::from_secs(5);

/// What the pod runner needs.
pub struct PodRunnerConfig {
    pub node_name: String,
    /// Working folder: pods' volumes, root filesystems, logs.
    pub dir: PathBuf,
    pub images: ImageStore,
    pub network: Arc<NodeNetwork>,
    /// The apiserver's port on the node address (`KUBERNETES_SERVICE_PORT`).
    pub apiserver_port: u16,
}

struct Shared {
    client: kube::Client,
    node_name: String,
    dir: PathBuf,
    images: ImageStore,
    network: Arc<NodeNetwork>,
    apiserver: (Ipv4Addr, u16),
    probe_client: reqwest::Client,
}

/// A running kubelet for one Node. Dropping it kills every container
/// (SIGKILL) and removes the pods' namespaces, as a node that vanished.
pub struct PodRunner {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl PodRunner {
    /// Registers the Node and starts running the pods bound to it.
    pub async fn start(client: kube::Client, config: PodRunnerConfig) -> anyhow::Result<Self> {
        std::fs::create_dir_all(config.dir.join("pods"))?;
        let shared = Arc::new(Shared {
            client: client.clone(),
            apiserver: (config.network.node_ip(), config.apiserver_port),
            node_name: config.node_name,
            dir: config.dir,
            images: config.images,
            network: config.network,
            probe_client: probes::client(),
        });
        register_node(&shared).await?;
        let shared_for_run = shared.clone();
        let heartbeat = tokio::spawn(renew_lease(shared.clone()));
        let task = tokio::spawn(async move {
            run(shared_for_run).await;
            heartbeat.abort();
        });
        Ok(Self { shared, task })
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.shared.node_name
    }

    /// The last lines of the logs of every container of the pods in
    /// `namespace` whose names start with `prefix` (what `kubectl logs`
    /// would show), for test failure messages.
    pub fn logs(&self, namespace: &str, prefix: &str, lines: usize) -> String {
        let mut out = String::new();
        let pods = self.shared.dir.join("pods");
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&pods)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for pod in entries {
            let name = pod
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if !name.starts_with(&format!("{namespace}_{prefix}")) {
                continue;
            }
            for log in std::fs::read_dir(&pod).into_iter().flatten().flatten() {
                let path = log.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
                    out.push_str(&format!(
                        "---- {name} {} ----\n",
                        path.file_name().unwrap_or_default().to_string_lossy()
                    ));
                    for line in tail.into_iter().rev() {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn register_node(shared: &Shared) -> anyhow::Result<()> {
    let node_ip = shared.apiserver.0.to_string();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": shared.node_name,
            "labels": {
                "kubernetes.io/hostname": shared.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
                "node-role.kubernetes.io/control-plane": "",
            },
        },
    });
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let node: Node = serde_json::from_value(node)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(error) => return Err(error).context("register the Node"),
    }
    let now = self::now();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let resources =
        json!({ "cpu": "2", "memory": "24Gi", "pods": "110", "ephemeral-storage": "100Gi" });
    let status = json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                { "type": "InternalIP", "address": node_ip },
                { "type": "Hostname", "address": shared.node_name },
            ],
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "the tenantry e2e pod runner is posting ready status"),
            ],
            "nodeInfo": {
                "machineID": "tenantry-e2e", "systemUUID": "tenantry-e2e", "bootID": "tenantry-e2e",
                "kernelVersion": "", "osImage": "tenantry e2e pod runner",
                "containerRuntimeVersion": "tenantry-pod-runner://0.1.0",
                "kubeletVersion": "v1.35.4", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": arch,
            },
        },
    });
    nodes
        .patch_status(
            &shared.node_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .context("post the Node status")?;
    Ok(())
}

/// The kubelet's heartbeat: the Node's Lease in `kube-node-lease`, renewed
/// every 10 s (the node lifecycle controller marks a node whose Lease
/// lapses for 40 s `Unknown` and taints it).
async fn renew_lease(shared: Arc<Shared>) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(shared.client.clone(), "kube-node-lease");
    loop {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": shared.node_name },
            "spec": {
                "holderIdentity": shared.node_name,
                "leaseDurationSeconds": 40,
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
            },
        });
        if let Err(error) = leases
            .patch(
                &shared.node_name,
                &PatchParams::apply("tenantry-pod-runner").force(),
                &Patch::Apply(&lease),
            )
            .await
        {
            tracing::debug!(%error, "node lease not renewed");
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// Watches the pods bound to the Node and keeps one worker per pod.
async fn run(shared: Arc<Shared>) {
    let (store, writer) = reflector::store::<Pod>();
    let pods: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", shared.node_name));
    let stream = watcher(pods, config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let mut stream = std::pin::pin!(stream);
    let mut workers: HashMap<String, (watch::Sender<Option<Pod>>, JoinHandle<()>)> = HashMap::new();
    loop {
        tokio::select! {
            event = stream.next() => {
                if event.is_none() {
                    return;
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        dispatch(&shared, &store, &mut workers);
    }
}

fn dispatch(
    shared: &Arc<Shared>,
    store: &Store<Pod>,
    workers: &mut HashMap<String, (watch::Sender<Option<Pod>>, JoinHandle<()>)>,
) {
    let mut seen = std::collections::HashSet::new();
    for pod in store.state() {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        seen.insert(uid.clone());
        match workers.get(&uid) {
            Some((sender, _)) => {
                sender.send_if_modified(|current| {
                    let changed = current
                        .as_ref()
                        .and_then(|p| p.metadata.resource_version.clone())
                        != pod.metadata.resource_version;
                    if changed {
                        *current = Some((*pod).clone());
                    }
                    changed
                });
            }
            None => {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if matches!(phase, Some("Succeeded" | "Failed")) {
                    continue;
                }
                let (sender, receiver) = watch::channel(Some((*pod).clone()));
                let task = tokio::spawn(PodWorker::run(shared.clone(), receiver));
                workers.insert(uid, (sender, task));
            }
        }
    }
    workers.retain(|uid, (sender, task)| {
        if !seen.contains(uid) {
            let _ = sender.send(None);
        }
        !task.is_finished()
    });
}

/// One container's life on the node.
struct ContainerRuntime {
    spec: Container,
    child: Option<tokio::process::Child>,
    image: Option<PulledImage>,
    container_id: String,
    started_at: Option<(Time, Instant)>,
    restart_count: i32,
    /// The state to report while not running.
    waiting: Option<(String, String)>,
    last_terminated: Option<Value>,
    next_start: Instant,
    backoff: Duration,
    ready: bool,
    started: bool,
    startup: Option<(ProbeSpec, ProbeState, Instant)>,
    liveness: Option<(ProbeSpec, ProbeState, Instant)>,
    readiness: Option<(ProbeSpec, ProbeState, Instant)>,
}

impl ContainerRuntime {
    fn new(spec: &Container) -> Self {
        Self {
            spec: spec.clone(),
            child: None,
            image: None,
            container_id: String::new(),
            started_at: None,
            restart_count: 0,
            waiting: Some(("ContainerCreating".into(), String::new())),
            last_terminated: None,
            next_start: Instant::now(),
            backoff: BACKOFF_START,
            ready: false,
            started: false,
            startup: None,
            liveness: None,
            readiness: None,
        }
    }
}

/// The kubelet's pod worker: sandbox, volumes, containers, probes, status,
/// and the final deletion.
struct PodWorker {
    shared: Arc<Shared>,
    pod: Pod,
    dir: PathBuf,
    sandbox: Option<PodSandbox>,
    volumes: BTreeMap<String, PathBuf>,
    volumes_refreshed: Option<Instant>,
    tokens: volumes::TokenCache,
    containers: Vec<ContainerRuntime>,
    /// Why the pod cannot start yet (volumes, sandbox), for its status.
    blocked: Option<(String, String)>,
    start_time: Time,
    reported: Option<Value>,
}

impl PodWorker {
    async fn run(shared: Arc<Shared>, mut updates: watch::Receiver<Option<Pod>>) {
        let Some(pod) = updates.borrow().clone() else {
            return;
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = shared
            .dir
            .join("pods")
            .join(format!("{namespace}_{name}_{uid}"));
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(ContainerRuntime::new).collect())
            .unwrap_or_default();
        let mut worker = PodWorker {
            shared,
            pod,
            dir,
            sandbox: None,
            volumes: BTreeMap::new(),
            volumes_refreshed: None,
            tokens: volumes::TokenCache::default(),
            containers,
            blocked: None,
            start_time: now(),
            reported: None,
        };
        loop {
            let latest = updates.borrow_and_update().clone();
            match latest {
                None => {
                    worker.stop_all(Duration::from_secs(2)).await;
                    worker.clean_up();
                    return;
                }
                Some(pod) => {
                    let terminating = pod.metadata.deletion_timestamp.is_some();
                    worker.pod = pod;
                    if terminating {
                        worker.terminate().await;
                        return;
                    }
                    worker.sync().await;
                    worker.report().await;
                }
            }
            tokio::select! {
                changed = updates.changed() => {
                    if changed.is_err() {
                        worker.stop_all(Duration::from_secs(2)).await;
                        worker.clean_up();
                        return;
                    }
                }
                _ = tokio::time::sleep(SYNC_PERIOD) => {}
            }
        }
    }

    fn name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
            self.pod.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// Brings the pod towards running: sandbox, volumes, then each
    /// container (start, restart after back-off, probes).
    async fn sync(&mut self) {
        if self.sandbox.is_none()
            && let Err(error) = self.create_sandbox()
        {
            tracing::warn!(pod = %self.name(), error = format!("{error:#}"), "pod sandbox not created");
            self.blocked = Some(("FailedCreatePodSandBox".into(), format!("{error:#}")));
            return;
        }
        let refresh = self
            .volumes_refreshed
            .is_none_or(|at| at.elapsed() >= VOLUME_REFRESH);
        if refresh {
            match volumes::prepare(
                &self.shared.client,
                &self.pod,
                &self.dir.join("volumes"),
                &mut self.tokens,
            )
            .await
            {
                Ok(folders) => {
                    self.volumes = folders;
                    self.volumes_refreshed = Some(Instant::now());
                    self.blocked = None;
                }
                Err(error) if self.volumes_refreshed.is_none() => {
                    self.blocked = Some((
                        "FailedMount".into(),
                        format!("MountVolume.SetUp failed: {error:#}"),
                    ));
                    return;
                }
                Err(error) => {
                    tracing::debug!(pod = %self.name(), error = format!("{error:#}"), "volume refresh failed");
                }
            }
        }
        for index in 0..self.containers.len() {
            self.sync_container(index).await;
        }
    }

    fn create_sandbox(&mut self) -> anyhow::Result<()> {
        let spec = self.pod.spec.as_ref().context("pod without spec")?;
        if spec.host_network == Some(true) {
            bail!("hostNetwork pods are not supported by the pod runner");
        }
        std::fs::create_dir_all(&self.dir)?;
        let sandbox = self.shared.network.create_sandbox()?;
        let hostname = self.pod.metadata.name.clone().unwrap_or_default();
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        std::fs::write(
            self.dir.join("hosts"),
            format!(
                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{hostname}\n",
                sandbox.ip
            ),
        )?;
        std::fs::write(self.dir.join("hostname"), format!("{hostname}\n"))?;
        std::fs::write(
            self.dir.join("resolv.conf"),
            services::resolv_conf(&namespace, self.shared.network.node_ip()),
        )?;
        self.sandbox = Some(sandbox);
        Ok(())
    }

    async fn sync_container(&mut self, index: usize) {
        let restart_policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let pod_ip = self.sandbox.as_ref().map(|s| s.ip);
        // Exited?
        let exited = {
            let runtime = &mut self.containers[index];
            match runtime.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => Some(status),
                _ => None,
            }
        };
        let pod_name = self.name();
        if let Some(status) = exited {
            let runtime = &mut self.containers[index];
            runtime.child = None;
            let code = status.code().unwrap_or_else(|| {
                use std::os::unix::process::ExitStatusExt as _;
                128 + status.signal().unwrap_or(0)
            });
            let ran = runtime.started_at.as_ref().map(|(_, at)| at.elapsed());
            runtime.last_terminated = Some(json!({
                "exitCode": code,
                "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": runtime.started_at.as_ref().map(|(t, _)| t.clone()),
                "finishedAt": now(),
                "containerID": runtime.container_id,
            }));
            runtime.ready = false;
            runtime.started = false;
            if ran.is_some_and(|r| r >= BACKOFF_RESET) {
                runtime.backoff = BACKOFF_START;
            }
            let restart = match restart_policy.as_str() {
                "Never" => false,
                "OnFailure" => code != 0,
                _ => true,
            };
            if restart {
                runtime.next_start = Instant::now() + runtime.backoff;
                runtime.waiting = Some((
                    "CrashLoopBackOff".into(),
                    format!(
                        "back-off {}s restarting failed container={} pod={}",
                        runtime.backoff.as_secs(),
                        runtime.spec.name,
                        self.pod.metadata.name.as_deref().unwrap_or_default()
                    ),
                ));
                runtime.backoff = (runtime.backoff * 2).min(BACKOFF_MAX);
            } else {
                runtime.waiting = None;
                runtime.next_start = Instant::now() + Duration::from_secs(365 * 24 * 3600);
            }
            tracing::info!(pod = %pod_name, container = %runtime.spec.name, code, "container exited");
        }
        let running = self.containers[index].child.is_some();
        if !running {
            let runtime = &self.containers[index];
            let never_again = runtime.last_terminated.is_some() && runtime.waiting.is_none();
            if !never_again
                && Instant::now() >= runtime.next_start
                && let Err(error) = self.start_container(index).await
            {
                let runtime = &mut self.containers[index];
                let (reason, message) = error;
                tracing::info!(pod = %pod_name, container = %runtime.spec.name, %reason, %message, "container not started");
                runtime.waiting = Some((reason, message));
                runtime.next_start = Instant::now() + runtime.backoff;
                runtime.backoff = (runtime.backoff * 2).min(BACKOFF_MAX);
            }
            return;
        }
        // Probes of a running container.
        let Some(pod_ip) = pod_ip else { return };
        let client = self.shared.probe_client.clone();
        let runtime = &mut self.containers[index];
        let now = Instant::now();
        if let Some((spec, state, next)) = runtime.startup.as_mut()
            && !runtime.started
        {
            if now >= *next {
                *next = now + spec.period;
                let result = probes::run(&client, spec, &runtime.spec, pod_ip).await;
                match state.record(spec, result) {
                    Some(true) => runtime.started = true,
                    Some(false) => {
                        tracing::info!(container = %runtime.spec.name, message = %state.last_message, "startup probe failed; restarting");
                        kill(runtime, Duration::from_secs(2)).await;
                    }
                    None => {}
                }
            }
            return;
        }
        runtime.started = true;
        if let Some((spec, state, next)) = runtime.liveness.as_mut()
            && now >= *next
        {
            *next = now + spec.period;
            let result = probes::run(&client, spec, &runtime.spec, pod_ip).await;
            if state.record(spec, result) == Some(false) {
                tracing::info!(container = %runtime.spec.name, message = %state.last_message, "liveness probe failed; restarting");
                kill(runtime, Duration::from_secs(2)).await;
                return;
            }
        }
        match runtime.readiness.as_mut() {
            None => runtime.ready = true,
            Some((spec, state, next)) => {
                if now >= *next {
                    *next = now + spec.period;
                    let result = probes::run(&client, spec, &runtime.spec, pod_ip).await;
                    if let Some(verdict) = state.record(spec, result) {
                        runtime.ready = verdict;
                    }
                }
            }
        }
    }

    /// Starts a container; on failure the waiting reason and message the
    /// kubelet would report.
    async fn start_container(&mut self, index: usize) -> Result<(), (String, String)> {
        if let Some((reason, message)) = &self.blocked {
            return Err((reason.clone(), message.clone()));
        }
        let spec = self.containers[index].spec.clone();
        let image_name = spec.image.clone().unwrap_or_default();
        let image = self
            .shared
            .images
            .pull(&image_name)
            .map_err(|e| ("ErrImagePull".to_string(), format!("{e:#}")))?;
        let config_error =
            |e: anyhow::Error| ("CreateContainerConfigError".to_string(), format!("{e:#}"));
        let env = volumes::environment(
            &self.shared.client,
            &self.pod,
            &spec,
            &image.config.env,
            self.shared.apiserver,
        )
        .await
        .map_err(config_error)?;
        let (uid, gid, groups) =
            identity(&self.pod, &spec, &image.config.user).map_err(config_error)?;
        let mut argv: Vec<String> = match &spec.command {
            Some(command) => command.clone(),
            None => image.config.entrypoint.clone(),
        };
        match &spec.args {
            Some(args) => argv.extend(args.iter().cloned()),
            None if spec.command.is_none() => argv.extend(image.config.cmd.iter().cloned()),
            None => {}
        }
        let argv: Vec<String> = argv.iter().map(|a| volumes::expand(a, &env)).collect();
        let mut mounts = vec![
            container::Mount {
                source: self.dir.join("hosts"),
                target: "/etc/hosts".into(),
                read_only: false,
            },
            container::Mount {
                source: self.dir.join("resolv.conf"),
                target: "/etc/resolv.conf".into(),
                read_only: false,
            },
            container::Mount {
                source: self.dir.join("hostname"),
                target: "/etc/hostname".into(),
                read_only: false,
            },
        ];
        for mount in spec.volume_mounts.as_deref().unwrap_or_default() {
            let source = self
                .volumes
                .get(&mount.name)
                .with_context(|| format!("volumeMount {} names no volume of the pod", mount.name))
                .map_err(config_error)?;
            let source = match mount.sub_path.as_deref().filter(|p| !p.is_empty()) {
                Some(sub) => source.join(sub),
                None => source.clone(),
            };
            mounts.push(container::Mount {
                source,
                target: mount.mount_path.clone(),
                read_only: mount.read_only.unwrap_or(false),
            });
        }
        let security = spec.security_context.clone().unwrap_or_default();
        let sandbox = self.sandbox.clone().expect("sandbox before containers");
        let pod_name = self.name();
        let runtime = &mut self.containers[index];
        let attempt = runtime.restart_count + i32::from(runtime.last_terminated.is_some());
        let container_dir = self.dir.join(format!("{}-{attempt}", spec.name));
        let rootfs = container_dir.join("rootfs");
        let _ = std::fs::remove_dir_all(&container_dir);
        container::clone_rootfs(&image.rootfs, &rootfs)
            .map_err(|e| ("CreateContainerError".to_string(), format!("{e:#}")))?;
        let working_dir = spec
            .working_dir
            .clone()
            .filter(|d| !d.is_empty())
            .or_else(|| Some(image.config.working_dir.clone()).filter(|d| !d.is_empty()))
            .unwrap_or_else(|| "/".into());
        let launch = container::Launch {
            rootfs,
            netns: sandbox.netns_path(),
            argv,
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            working_dir,
            uid,
            gid,
            supplemental_groups: groups,
            read_only_root: security.read_only_root_filesystem == Some(true),
            no_new_privileges: security.allow_privilege_escalation == Some(false),
            mounts,
        };
        let log_path = self.dir.join(format!("{}.log", spec.name));
        let mut log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?;
        {
            use std::io::Write as _;
            let _ = writeln!(
                log,
                "==== start {attempt} of {} ({}) ====",
                spec.name, image.image_id
            );
        }
        let child = container::spawn(&launch, log)
            .map_err(|e| ("CreateContainerError".to_string(), format!("{e:#}")))?;
        if runtime.last_terminated.is_some() || runtime.child.is_some() {
            runtime.restart_count += 1;
        }
        runtime.child = Some(child);
        runtime.container_id = format!(
            "tenantry-pod-runner://{}-{}-{attempt}",
            self.pod.metadata.uid.as_deref().unwrap_or_default(),
            spec.name
        );
        runtime.image = Some(image);
        runtime.started_at = Some((now(), Instant::now()));
        runtime.waiting = None;
        runtime.ready = false;
        runtime.started = runtime.spec.startup_probe.is_none();
        let now = Instant::now();
        let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
            p.as_ref().map(|p| {
                let spec = ProbeSpec::new(p);
                let first = now + spec.initial_delay;
                (spec, ProbeState::default(), first)
            })
        };
        runtime.startup = probe(&runtime.spec.startup_probe);
        runtime.liveness = probe(&runtime.spec.liveness_probe);
        runtime.readiness = probe(&runtime.spec.readiness_probe);
        tracing::info!(pod = %pod_name, container = %runtime.spec.name, attempt, "container started");
        Ok(())
    }

    /// The pod's status as the kubelet reports it, patched when it changed.
    async fn report(&mut self) {
        let now = self::now();
        let pod_ip = self.sandbox.as_ref().map(|s| s.ip.to_string());
        let host_ip = self.shared.apiserver.0.to_string();
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let state = match (&c.child, &c.waiting, &c.last_terminated) {
                    (Some(_), _, _) => json!({ "running": { "startedAt": c.started_at.as_ref().map(|(t, _)| t.clone()) } }),
                    (None, Some((reason, message)), _) => {
                        let (reason, message) = match &self.blocked {
                            Some((_, _)) if reason == "ContainerCreating" => ("ContainerCreating".to_string(), String::new()),
                            _ => (reason.clone(), message.clone()),
                        };
                        json!({ "waiting": { "reason": reason, "message": message } })
                    }
                    (None, None, Some(terminated)) => json!({ "terminated": terminated }),
                    (None, None, None) => json!({ "waiting": { "reason": "ContainerCreating" } }),
                };
                let last_state = match (&c.child, &c.last_terminated) {
                    (Some(_), Some(terminated)) => json!({ "terminated": terminated }),
                    (None, Some(terminated)) if c.waiting.is_some() => json!({ "terminated": terminated }),
                    _ => json!({}),
                };
                json!({
                    "name": c.spec.name,
                    "image": c.spec.image,
                    "imageID": c.image.as_ref().map(|i| i.image_id.clone()).unwrap_or_default(),
                    "containerID": (!c.container_id.is_empty()).then(|| c.container_id.clone()),
                    "ready": c.ready && c.child.is_some(),
                    "started": c.child.is_some() && c.started,
                    "restartCount": c.restart_count,
                    "state": state,
                    "lastState": last_state,
                })
            })
            .collect();
        let all_ready = !self.containers.is_empty()
            && self.containers.iter().all(|c| c.ready && c.child.is_some());
        let any_running = self.containers.iter().any(|c| c.child.is_some());
        let all_done = self
            .containers
            .iter()
            .all(|c| c.child.is_none() && c.waiting.is_none() && c.last_terminated.is_some());
        let phase = if all_done {
            let failed = self.containers.iter().any(|c| {
                c.last_terminated
                    .as_ref()
                    .and_then(|t| t["exitCode"].as_i64())
                    != Some(0)
            });
            if failed { "Failed" } else { "Succeeded" }
        } else if any_running || self.containers.iter().any(|c| c.last_terminated.is_some()) {
            "Running"
        } else {
            "Pending"
        };
        let previous = |type_: &str| -> Option<Value> {
            self.reported.as_ref().and_then(|r| {
                r["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
            })
        };
        let condition = |type_: &str, status: bool, reason: Option<&str>| {
            let status = if status { "True" } else { "False" };
            let since = previous(type_)
                .filter(|c| c["status"] == status)
                .map(|c| c["lastTransitionTime"].clone())
                .unwrap_or_else(|| json!(now));
            let mut c = json!({ "type": type_, "status": status, "lastTransitionTime": since, "lastProbeTime": null });
            if let Some(reason) = reason {
                c["reason"] = json!(reason);
            }
            c
        };
        let not_ready = (!all_ready).then_some("ContainersNotReady");
        let conditions = vec![
            condition("PodReadyToStartContainers", self.sandbox.is_some(), None),
            condition("Initialized", true, None),
            condition("ContainersReady", all_ready, not_ready),
            condition("Ready", all_ready, not_ready),
        ];
        let mut status = json!({
            "phase": phase,
            "conditions": conditions,
            "hostIP": host_ip,
            "hostIPs": [{ "ip": host_ip }],
            "startTime": self.start_time,
            "containerStatuses": statuses,
        });
        if let Some(ip) = &pod_ip {
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{ "ip": ip }]);
        }
        // Cleared (null removes them in a patch) once nothing blocks.
        let (reason, message) = match &self.blocked {
            Some((reason, message)) => (json!(reason), json!(message)),
            None => (Value::Null, Value::Null),
        };
        status["reason"] = reason;
        status["message"] = message;
        if self.reported.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(
            self.shared.client.clone(),
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        match api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(json!({ "status": status })),
            )
            .await
        {
            Ok(_) => self.reported = Some(status),
            Err(error) => tracing::debug!(pod = %self.name(), %error, "pod status not written"),
        }
    }

    /// Graceful deletion: SIGTERM, the grace period, SIGKILL; then the
    /// kubelet's final delete (grace 0, this pod's UID only).
    async fn terminate(&mut self) {
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .max(0) as u64;
        self.stop_all(Duration::from_secs(grace)).await;
        self.clean_up();
        let api: Api<Pod> = Api::namespaced(
            self.shared.client.clone(),
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: self.pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(error) = api.delete(&name, &params).await {
            tracing::debug!(pod = %self.name(), %error, "final pod delete failed");
        }
    }

    async fn stop_all(&mut self, grace: Duration) {
        let stops = self.containers.iter_mut().map(|c| kill(c, grace));
        futures::future::join_all(stops).await;
    }

    fn clean_up(&mut self) {
        if let Some(sandbox) = self.sandbox.take() {
            self.shared.network.remove_sandbox(&sandbox);
        }
        // Logs stay for diagnostics; root filesystems and volumes go.
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// SIGTERM, then SIGKILL after `grace`.
async fn kill(runtime: &mut ContainerRuntime, grace: Duration) {
    let Some(mut child) = runtime.child.take() else {
        return;
    };
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    };
    let code = status.and_then(|s| s.code()).unwrap_or(137);
    runtime.last_terminated = Some(json!({
        "exitCode": code,
        "reason": if code == 0 { "Completed" } else { "Error" },
        "startedAt": runtime.started_at.as_ref().map(|(t, _)| t.clone()),
        "finishedAt": now(),
        "containerID": runtime.container_id,
    }));
    runtime.ready = false;
    // Restarted on the next sync unless the pod is going away.
    runtime.waiting = Some(("ContainerCreating".into(), String::new()));
    runtime.next_start = Instant::now();
}

/// uid, gid and supplementary groups of a container, as the kubelet and
/// runc derive them: the container's security context, else the pod's,
/// else the image's `USER` (numeric only: the pod runner reads no
/// /etc/passwd). `runAsNonRoot` refuses uid 0 and non-numeric users.
fn identity(
    pod: &Pod,
    container: &Container,
    image_user: &str,
) -> anyhow::Result<(u32, u32, Vec<u32>)> {
    let pod_security = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let security = container.security_context.clone().unwrap_or_default();
    let (image_uid, image_gid) = match image_user.split_once(':') {
        Some((u, g)) => (u.to_string(), Some(g.to_string())),
        None => (image_user.to_string(), None),
    };
    let uid = match security.run_as_user.or(pod_security.run_as_user) {
        Some(uid) => Some(uid),
        None if image_uid.is_empty() || image_uid == "root" => Some(0),
        None => image_uid.parse::<i64>().ok(),
    };
    let non_root = security.run_as_non_root.or(pod_security.run_as_non_root) == Some(true);
    let Some(uid) = uid else {
        if non_root {
            bail!(
                "container has runAsNonRoot and image has non-numeric user ({image_uid}), cannot verify user is non-root"
            );
        }
        bail!("image user {image_uid} is not numeric; the pod runner reads no /etc/passwd");
    };
    if non_root && uid == 0 {
        bail!("container has runAsNonRoot and image will run as root");
    }
    let gid = security
        .run_as_group
        .or(pod_security.run_as_group)
        .or_else(|| image_gid.and_then(|g| g.parse().ok()))
        .unwrap_or(0);
    let mut groups: Vec<u32> = pod_security
        .supplemental_groups
        .unwrap_or_default()
        .into_iter()
        .map(|g| g as u32)
        .collect();
    groups.extend(pod_security.fs_group.map(|g| g as u32));
    Ok((uid as u32, gid as u32, groups))
}

/// Where [`PodRunner`] keeps unpacked images: shared by every runner of
/// this machine, next to the upstream binaries. Each build of tenantry adds
/// its image, so entries unpacked more than three days ago are removed
/// (containers run from hard-linked copies, which stay valid).
pub fn image_cache() -> anyhow::Result<PathBuf> {
    let dir = crate::Upstream::locate()?
        .root()
        .parent()
        .map(|p| p.join("pod-runner-images"))
        .context("cache root")?;
    std::fs::create_dir_all(&dir)?;
    let old = std::time::SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let created = entry.metadata().and_then(|m| m.modified());
        if created.is_ok_and(|t| t < old) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({ "metadata": { "name": "p" }, "spec": spec })).unwrap()
    }

    #[test]
    fn the_security_context_wins_over_the_image_user() {
        let container: Container = serde_json::from_value(json!({
            "name": "manager",
            "securityContext": { "runAsUser": 1000, "runAsGroup": 2000 },
        }))
        .unwrap();
        let p = pod(json!({ "containers": [], "securityContext": { "fsGroup": 3000 } }));
        assert_eq!(
            identity(&p, &container, "65532:65532").unwrap(),
            (1000, 2000, vec![3000])
        );
        let plain: Container = serde_json::from_value(json!({ "name": "manager" })).unwrap();
        assert_eq!(
            identity(&p, &plain, "65532:65532").unwrap(),
            (65532, 65532, vec![3000])
        );
    }

    #[test]
    fn run_as_non_root_refuses_root_images() {
        let container: Container = serde_json::from_value(json!({
            "name": "manager",
            "securityContext": { "runAsNonRoot": true },
        }))
        .unwrap();
        let p = pod(json!({ "containers": [] }));
        let error = identity(&p, &container, "").unwrap_err().to_string();
        assert!(
            error.contains("runAsNonRoot and image will run as root"),
            "{error}"
        );
        assert!(identity(&p, &container, "nonroot").is_err());
        assert!(identity(&p, &container, "65532").is_ok());
    }
}
