//! One Proxmox VE run: tenantry or capmox provisions and deletes a wave of
//! ProxmoxMachines against the PVE simulator.
//!
//! Both providers get the same world: a fresh control plane, the real
//! in-cluster IPAM provider (both take each machine's address from an
//! `InClusterIPPool` they derive from `ProxmoxCluster.spec.ipv4Config`), and
//! the PVE simulator set up as `docs/proxmox.md` sets up a tenant: a template
//! in a `templates` pool, a pool `bench` with its own disk and ISO storages,
//! and a privilege-separated token holding the least privileges tenantry
//! documents. Tasks finish in 5 ms and guests boot in 10 ms, so the
//! provider is what is measured; the guests (an Ubuntu cloud image, since
//! the bootstrap data is a cloud-config) still read their NoCloud seed,
//! configure their address, start their agent and run cloud-init for 10 ms
//! more, which is what the providers wait for (tenantry: the agent reporting
//! the addresses; capmox: the agent's `get-osinfo`, then `cloud-init status`
//! through `agent/exec` saying `done`).
//!
//! capmox v0.9 runs one reconcile at a time (no concurrency flag) and, inside
//! it, waits for the seed upload and the seed mount through go-proxmox's task
//! poll, which looks again after a whole second when the task still runs at
//! its first two looks; deleting a machine waits so for the seed's deletion.
//! Its waves therefore take about 2 s per machine to provision and 1 s to
//! delete, however fast the hypervisor answers: that is capmox as released,
//! not the simulator.
//!
//! Both read the same objects: one ProxmoxCluster spec (endpoint, IPv4 pool,
//! nameserver, both nodes allowed, `credentialsRef` to one Secret with
//! capmox's keys, which tenantry also reads) and one ProxmoxMachine spec
//! (full clone of template 9000 into pool `bench` on `bench-disks`, sized,
//! boot disk grown, `net0` on `vmbr0` taking the cluster's IPv4 pool), with
//! bootstrap data in a `format: cloud-config` Secret. Worth knowing:
//!
//! - `net0` says `defaultIPv4: true`: capmox's defaulting webhook would set
//!   it, and its webhooks do not run here; tenantry reads it the same way.
//! - capmox takes the credentials from the Secret too (no `PROXMOX_*`
//!   environment), as a platform with a token per tenant runs it. It then
//!   builds a new PVE client, with its own TLS connection and a `GET
//!   /version`, in every reconcile of a ProxmoxCluster or ProxmoxMachine;
//!   that is its cost in this setting, counted in its PVE calls.
//! - The Secret sets `insecure: "false"` and `root_ca`, so both verify the
//!   simulator's certificate (capmox would skip verification without the
//!   key).
//! - No node ever joins, so capmox never unmounts and deletes a machine's
//!   seed ISO (it does once the Machine has a `nodeRef`): its deletion wave
//!   deletes the seeds, tenantry's provisioning wave already did.
//! - The nodes and the disk storage are far larger than the lab's, so that
//!   neither scheduler (capmox's by memory, tenantry's by memory and CPUs)
//!   runs out of room in a large wave.
//!
//! `BENCH_PROVIDER_LOGS=<folder>` keeps each run's provider log there.
//!
//! The requests counted for the provider include the in-cluster IPAM
//! provider's (one IPAddressClaim per machine for both) and, with Cluster
//! API on, the core manager's, as the KubeVirt half counts them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::process_stats::{self, ProcessStats};
use super::providers::{self, Provider, ProviderLaunch, RunningProvider};
use super::requests::{self, RequestTally};
use super::{
    BenchConfig, NAMESPACE, PhaseResult, RunResult, Window, capi, follow,
    infrastructure_provisioned, latencies, machine_provisioned, phase, resource, run_bounded,
    wait_for,
};
use crate::pve_lab::{PveLab, TEMPLATE, TEMPLATE_NODE, lab_config};
use crate::sim::proxmox::{
    ApiToken, CallCounts, ClusterSnapshot, GuestOsInfo, NodeSpec, PveSimConfig, Timings,
};
use crate::{ClusterApiManager, ControlPlane, ControlPlaneOptions, UpstreamManager};

const CLUSTER: &str = "bench";
const DEPLOYMENT: &str = "bench-md";
const TEMPLATE_NAME: &str = "bench-worker";
const SHARED_BOOTSTRAP: &str = "bench-bootstrap";
const CREDENTIALS: &str = "bench-pve-credentials";
/// The PVE tenant: pool, user `bench@pve`, storages `bench-disks` and
/// `bench-iso`.
const TENANT: &str = "bench";
const GROUP: &str = "infrastructure.cluster.x-k8s.io";
const VERSION: &str = "v1alpha2";
const GIB: u64 = 1024 * 1024 * 1024;

pub(crate) fn proxmox_machines() -> kube::api::ApiResource {
    resource(GROUP, VERSION, "ProxmoxMachine", "proxmoxmachines")
}

fn proxmox_clusters() -> kube::api::ApiResource {
    resource(GROUP, VERSION, "ProxmoxCluster", "proxmoxclusters")
}

pub(crate) fn ip_address_claims() -> kube::api::ApiResource {
    resource(
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddressClaim",
        "ipaddressclaims",
    )
}

/// The lab of the Proxmox tests with one tenant, answering at once, and
/// room for any wave on both nodes and the tenant's disk storage.
pub(crate) fn sim_config() -> PveSimConfig {
    let mut config = lab_config(&[TENANT]);
    config.nodes = vec![
        NodeSpec::new("pve1", 2048, 8192),
        NodeSpec::new("pve2", 2048, 8192),
    ];
    for storage in &mut config.storages {
        storage.total_bytes = 64 * 1024 * GIB;
    }
    // The provider is measured, not the hypervisor: every task takes 5 ms,
    // a guest boots (reads its seed, starts its agent) in 10 ms and its
    // cloud-init finishes 10 ms later.
    config.timings = Timings {
        task: Duration::from_millis(5),
        tasks: BTreeMap::new(),
        guest_boot: Duration::from_millis(10),
        cloud_init: Duration::from_millis(10),
        shutdown_timeout: Duration::from_millis(100),
        auth_failure_delay: Duration::from_millis(100),
    };
    // The bootstrap data is a cloud-config, so the image runs cloud-init.
    config.guest_os = GuestOsInfo::ubuntu();
    config
}

/// Upper bound for a wave, never measured: the shared one plus 3 s per
/// machine, because capmox reconciles one machine at a time and go-proxmox
/// polls every task it waits for once a second (the seed upload and its
/// mount when provisioning, the seed's deletion when deleting), so its
/// waves take at least 2 s per machine however fast the hypervisor is.
fn wave_deadline(config: &BenchConfig, machines: usize) -> Duration {
    config.wave_deadline(machines) + Duration::from_secs(3 * machines as u64)
}

/// The machine both providers accept (see the module doc).
pub(crate) fn machine_spec() -> Value {
    json!({
        "sourceNode": TEMPLATE_NODE,
        "templateID": TEMPLATE,
        "pool": TENANT,
        "full": true,
        "storage": format!("{TENANT}-disks"),
        "numSockets": 1,
        "numCores": 2,
        "memoryMiB": 2048,
        "disks": { "bootVolume": { "disk": "scsi0", "sizeGb": 10 } },
        "description": "bench worker",
        "network": { "networkDevices": [{
            "name": "net0", "bridge": "vmbr0", "model": "virtio", "defaultIPv4": true
        }] }
    })
}

fn bootstrap_secret(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "type": "cluster.x-k8s.io/secret",
        "stringData": {
            "value": "#cloud-config\nruncmd:\n  - echo joined > /run/cluster-api/bootstrap-success.complete\n",
            "format": "cloud-config"
        }
    })
}

/// What a run holds while it runs: `provider` is the provider process of
/// a benchmark, or whatever runs the provider for another user of this
/// world (the chaos tests' replicas). Field order is drop order: the
/// provider stops before what it talks to.
pub(crate) struct World<P = RunningProvider> {
    pub(crate) provider: P,
    pub(crate) ipam: UpstreamManager,
    pub(crate) pve: PveLab,
    _capi: Option<ClusterApiManager>,
    pub(crate) control_plane: ControlPlane,
    pub(crate) client: kube::Client,
    pub(crate) tally: RequestTally,
    pub(crate) token: ApiToken,
}

/// A [`Window`] plus the simulator's call counters.
struct PveWindow {
    window: Window,
    calls: CallCounts,
}

impl<P> World<P> {
    pub(crate) fn api(&self, resource: &kube::api::ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NAMESPACE, resource)
    }

    async fn create(
        &self,
        resource: &kube::api::ApiResource,
        body: Value,
    ) -> anyhow::Result<DynamicObject> {
        let object: DynamicObject = serde_json::from_value(body)?;
        let name = object.metadata.name.clone().unwrap_or_default();
        self.api(resource)
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("create {} {name}", resource.kind))
    }

    /// The same world with `provider` running the provider.
    pub(crate) fn with_provider<Q>(self, provider: Q) -> World<Q> {
        World {
            provider,
            ipam: self.ipam,
            pve: self.pve,
            _capi: self._capi,
            control_plane: self.control_plane,
            client: self.client,
            tally: self.tally,
            token: self.token,
        }
    }
}

impl World {
    fn stats(&self) -> anyhow::Result<ProcessStats> {
        process_stats::read(self.provider.process.pid())
    }

    async fn window(&self) -> anyhow::Result<PveWindow> {
        Ok(PveWindow {
            window: Window {
                samples: requests::scrape(&self.client).await?,
                own: self.tally.snapshot(),
                stats: self.stats()?,
            },
            calls: self.pve.sim.call_counts(),
        })
    }

    /// The phase between two windows, with the PVE calls the provider's
    /// token made.
    fn phase(
        &self,
        start: &PveWindow,
        end: &PveWindow,
        machines: usize,
        wall: Duration,
        latencies: Vec<Duration>,
    ) -> PhaseResult {
        let mut result = phase(&start.window, &end.window, machines, wall, latencies);
        let calls = end.calls.since(&start.calls);
        result.pve_calls = calls
            .by_caller_endpoint
            .iter()
            .filter(|((caller, _), _)| *caller == self.token.id)
            .map(|((_, endpoint), n)| (endpoint.clone(), *n))
            .collect();
        result.pve_calls_per_machine =
            Some(result.pve_calls.values().sum::<u64>() as f64 / machines as f64);
        result
    }

    /// The wave's guests on the hypervisor (everything but templates).
    fn guests(&self) -> usize {
        guests(&self.pve.sim.snapshot())
    }

    fn fail(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!(
            "---- {} log ----\n{}\n---- in-cluster IPAM provider log ----\n{}",
            self.provider.process.name(),
            self.provider.process.log_tail(30),
            self.ipam.log_tail(10)
        ))
    }
}

fn guests(snapshot: &ClusterSnapshot) -> usize {
    snapshot.vms.iter().filter(|vm| !vm.template).count()
}

/// Provisions and deletes `machines` ProxmoxMachines with `provider`.
pub async fn run(
    config: &BenchConfig,
    provider: Provider,
    with_capi: bool,
    machines: usize,
) -> anyhow::Result<RunResult> {
    let world = start(config, provider, with_capi).await?;
    let result = measure(config, &world, provider, with_capi, machines)
        .await
        .map_err(|e| world.fail(e));
    let stats = world.stats();
    keep_provider_log(&world, provider, with_capi, machines);
    let World {
        mut provider,
        control_plane,
        ..
    } = world;
    provider.process.stop(Duration::from_secs(5));
    let mut result = result?;
    let stats = stats?;
    result.peak_rss_mib = stats.peak_rss_mib;
    result.cpu_seconds = stats.cpu_seconds;
    control_plane.stop();
    Ok(result)
}

/// With `BENCH_PROVIDER_LOGS=<folder>`, copies the provider's log there
/// before the run's folder goes, for finding where a wave's time went.
fn keep_provider_log(world: &World, provider: Provider, with_capi: bool, machines: usize) {
    let Some(folder) = std::env::var_os("BENCH_PROVIDER_LOGS") else {
        return;
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let name = format!(
        "proxmox-{}-capi-{}-{machines}-{stamp}.log",
        provider.name(),
        if with_capi { "on" } else { "off" }
    );
    let target = std::path::Path::new(&folder).join(name);
    if let Err(error) = std::fs::copy(world.provider.process.log_path(), &target) {
        eprintln!(
            "    could not keep the provider log at {}: {error}",
            target.display()
        );
    }
}

async fn start(config: &BenchConfig, provider: Provider, with_capi: bool) -> anyhow::Result<World> {
    let world = stage(
        config,
        provider,
        with_capi,
        &format!("bench-proxmox-{}", provider.name()),
        Vec::new(),
        sim_config(),
    )
    .await?;
    let mut running = providers::start(
        provider,
        ProviderLaunch {
            binaries: &config.binaries,
            control_plane: &world.control_plane,
            env: Vec::new(),
            args: Vec::new(),
            instance: None,
        },
    )?;
    running.wait_healthy(Duration::from_secs(60)).await?;
    Ok(world.with_provider(running))
}

/// Everything of a run but the provider: a fresh control plane named
/// `name`, the Cluster API CRDs (or manager), the in-cluster IPAM provider,
/// `provider`'s CRDs, and the PVE simulator with `sim` set up as the lab
/// with the one tenant.
pub(crate) async fn stage(
    config: &BenchConfig,
    provider: Provider,
    with_capi: bool,
    name: &str,
    extra_apiserver_args: Vec<String>,
    sim: PveSimConfig,
) -> anyhow::Result<World<()>> {
    let control_plane = ControlPlane::start_with(ControlPlaneOptions {
        name: name.to_string(),
        extra_apiserver_args,
        ..Default::default()
    })
    .await
    .context("start the control plane")?;
    let tally = RequestTally::default();
    let kube_config = super::admin_config(&control_plane).await?;
    let client = tally.client(kube_config)?;
    let capi_manager = if with_capi {
        Some(
            ClusterApiManager::start(&control_plane)
                .await
                .context("start the Cluster API manager")?,
        )
    } else {
        crate::manifests::apply_crds(&client, super::cluster_api_crds(provider.capi_version())?)
            .await
            .context("install the Cluster API CRDs")?;
        None
    };
    let ipam = UpstreamManager::start_ipam_in_cluster(&control_plane)
        .await
        .context("start the in-cluster IPAM provider")?;
    crate::manifests::apply_crds(
        &client,
        providers::provider_crds(&config.binaries, provider)?,
    )
    .await
    .with_context(|| format!("install {}'s CRDs", provider.name()))?;
    let pve = PveLab::start(sim).await;
    let token = pve.tenant(TENANT, &[]).await;
    Ok(World {
        provider: (),
        ipam,
        pve,
        _capi: capi_manager,
        control_plane,
        client,
        tally,
        token,
    })
}

async fn measure(
    config: &BenchConfig,
    world: &World,
    provider: Provider,
    with_capi: bool,
    machines: usize,
) -> anyhow::Result<RunResult> {
    let capi_version = if with_capi {
        "v1beta2"
    } else {
        provider.capi_version()
    };
    create_cluster(world, capi_version, with_capi, config).await?;

    // Provisioning.
    let followed = if with_capi {
        capi("v1beta2", "Machine", "machines")
    } else {
        proxmox_machines()
    };
    let (timeline, follower) = follow(
        world.api(&followed),
        if with_capi {
            machine_provisioned
        } else {
            infrastructure_provisioned
        },
    );
    let requested = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let before = world.window().await?;
    let started = Instant::now();
    if with_capi {
        scale(world, machines).await?;
    } else {
        create_machines(world, capi_version, machines, config, &requested).await?;
    }
    wait_for(
        &timeline,
        "provisioning",
        wave_deadline(config, machines),
        |t| t.provisioned.len() >= machines,
    )
    .await?;
    let provisioned_wall = started.elapsed();
    let after = world.window().await?;
    let provision_latencies = {
        let timeline = timeline.lock().expect("timeline");
        let requested = requested.lock().expect("requested");
        // A Machine's wave starts when CAPI creates it; one the benchmark
        // creates, when its ProxmoxMachine is created.
        let from = |name: &str| {
            if with_capi {
                timeline.seen.get(name).copied()
            } else {
                requested.get(name).copied()
            }
        };
        latencies(&timeline.provisioned, from, started)
    };
    let provision = world.phase(
        &before,
        &after,
        machines,
        provisioned_wall,
        provision_latencies,
    );
    let guests_up = world.guests();
    anyhow::ensure!(
        guests_up == machines,
        "{guests_up} guests on the hypervisor for {machines} provisioned machines"
    );

    // Deletion.
    let before = after;
    let started = Instant::now();
    let delete_requested = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    if with_capi {
        scale(world, 0).await?;
    } else {
        let api = world.api(&proxmox_machines());
        let names: Vec<String> = timeline
            .lock()
            .expect("timeline")
            .provisioned
            .keys()
            .cloned()
            .collect();
        let tasks = names.into_iter().map(|name| {
            let api = api.clone();
            let delete_requested = delete_requested.clone();
            async move {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .with_context(|| format!("delete ProxmoxMachine {name}"))?;
                delete_requested
                    .lock()
                    .expect("requested")
                    .insert(name, Instant::now());
                Ok(())
            }
        });
        run_bounded(config.create_concurrency, tasks.collect()).await?;
    }
    wait_for(
        &timeline,
        "deletion",
        wave_deadline(config, machines),
        |t| t.gone.len() >= machines,
    )
    .await?;
    // Done when the hypervisor holds no guest either; the snapshot is read
    // in-process, so polling it often costs the apiserver nothing.
    let deadline = started + wave_deadline(config, machines);
    while world.guests() > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "deletion: {} guests still on the hypervisor",
            world.guests()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deleted_wall = started.elapsed();
    let after = world.window().await?;
    follower.abort();
    let delete_latencies = {
        let timeline = timeline.lock().expect("timeline");
        let requested = delete_requested.lock().expect("requested");
        latencies(&timeline.gone, |name| requested.get(name).copied(), started)
    };
    let delete = world.phase(&before, &after, machines, deleted_wall, delete_latencies);
    report_leftovers(world, provider).await?;
    Ok(RunResult {
        provider: provider.name().into(),
        substrate: "proxmox".into(),
        capi: with_capi,
        machines,
        provision,
        delete,
        peak_rss_mib: 0.0,
        cpu_seconds: 0.0,
    })
}

/// What a finished deletion left behind: live IPAddressClaims, seed ISOs
/// and tasks still running. A claim being deleted is not left behind: the
/// in-cluster IPAM provider holds it (finalizer
/// `ipam.cluster.x-k8s.io/ReleaseAddress`) for the pool's
/// `addressReuseGracePeriodSeconds`, 60 s in the pools both providers make.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    /// IPAddressClaims not being deleted.
    pub(crate) claims: Vec<String>,
    /// IPAddressClaims being deleted, held for the reuse grace period.
    pub(crate) releasing_claims: usize,
    /// ISO volumes on any storage (the seeds).
    pub(crate) isos: Vec<String>,
    /// Tasks still running.
    pub(crate) running_tasks: Vec<String>,
}

impl Leftovers {
    pub(crate) fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.isos.is_empty() && self.running_tasks.is_empty()
    }

    fn describe(&self) -> Vec<String> {
        let claims = self.claims.iter().map(|c| format!("IPAddressClaim {c}"));
        let isos = self.isos.iter().map(|v| format!("ISO {v}"));
        let tasks = self
            .running_tasks
            .iter()
            .map(|t| format!("running task {t}"));
        claims.chain(isos).chain(tasks).collect()
    }
}

/// The [`Leftovers`] of a deletion, looked at again for up to `grace` while
/// there are any (the garbage collector removes the claims the provider
/// owns, so they get a few seconds).
pub(crate) async fn leftovers<P>(world: &World<P>, grace: Duration) -> anyhow::Result<Leftovers> {
    let claims = world.api(&ip_address_claims());
    let until = Instant::now() + grace;
    loop {
        let mut left = Leftovers::default();
        for claim in claims
            .list(&ListParams::default())
            .await
            .context("list IPAddressClaims")?
            .items
        {
            if claim.metadata.deletion_timestamp.is_some() {
                left.releasing_claims += 1;
            } else {
                left.claims.push(claim.metadata.name.unwrap_or_default());
            }
        }
        let snapshot = world.pve.sim.snapshot();
        left.isos = snapshot
            .volumes
            .iter()
            .filter(|volume| volume.content == "iso")
            .map(|volume| volume.volid.clone())
            .collect();
        left.running_tasks = snapshot
            .tasks
            .iter()
            .filter(|task| task.exitstatus.is_none())
            .map(|task| task.upid.clone())
            .collect();
        if left.is_empty() || Instant::now() > until {
            return Ok(left);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Prints the [`Leftovers`] of a finished deletion, after the measurement:
/// not failed on, it is a finding.
async fn report_leftovers(world: &World, provider: Provider) -> anyhow::Result<()> {
    let left = leftovers(world, Duration::from_secs(15)).await?;
    if left.is_empty() {
        eprintln!(
            "    {}: nothing left after deletion ({} IPAddressClaims releasing their address after the pool's reuse grace period)",
            provider.name(),
            left.releasing_claims
        );
    } else {
        let described = left.describe();
        eprintln!(
            "    {}: left after deletion ({}): {}",
            provider.name(),
            described.len(),
            described.join(", ")
        );
    }
    Ok(())
}

/// The credentials Secret, the Cluster and its ProxmoxCluster; waits until
/// the provider made the ProxmoxCluster ready (which shows its controllers
/// run), and without the Cluster API manager sets the Cluster's status as
/// it would.
pub(crate) async fn create_cluster<P>(
    world: &World<P>,
    capi_version: &str,
    with_capi: bool,
    config: &BenchConfig,
) -> anyhow::Result<()> {
    let secrets = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    world
        .create(
            &secrets,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": CREDENTIALS, "namespace": NAMESPACE },
                "stringData": {
                    "url": world.pve.sim.url().as_str(),
                    "token": world.token.id,
                    "secret": world.token.secret,
                    "root_ca": world.pve.sim.ca_pem(),
                    "insecure": "false",
                }
            }),
        )
        .await?;
    let clusters = capi(capi_version, "Cluster", "clusters");
    let cluster = world
        .create(
            &clusters,
            json!({
                "apiVersion": format!("cluster.x-k8s.io/{capi_version}"),
                "kind": "Cluster",
                "metadata": { "name": CLUSTER, "namespace": NAMESPACE },
                "spec": {
                    "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] }, "services": { "cidrBlocks": ["10.95.0.0/16"] } },
                    "controlPlaneEndpoint": { "host": "10.20.0.5", "port": 6443 },
                    "infrastructureRef": { "apiGroup": GROUP, "kind": "ProxmoxCluster", "name": CLUSTER }
                }
            }),
        )
        .await?;
    let owner = if with_capi {
        json!([])
    } else {
        json!([{
            "apiVersion": format!("cluster.x-k8s.io/{capi_version}"),
            "kind": "Cluster",
            "name": CLUSTER,
            "uid": cluster.metadata.uid,
        }])
    };
    world
        .create(
            &proxmox_clusters(),
            json!({
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": "ProxmoxCluster",
                "metadata": { "name": CLUSTER, "namespace": NAMESPACE, "ownerReferences": owner },
                "spec": {
                    "controlPlaneEndpoint": { "host": "10.20.0.5", "port": 6443 },
                    // Room for the largest wave, with released addresses
                    // held back for the pool's reuse grace period.
                    "ipv4Config": { "addresses": ["10.20.1.0-10.20.255.254"], "prefix": 16, "gateway": "10.20.0.1" },
                    "dnsServers": ["10.20.0.53"],
                    "allowedNodes": ["pve1", "pve2"],
                    "credentialsRef": { "name": CREDENTIALS }
                }
            }),
        )
        .await?;
    let infra = world.api(&proxmox_clusters());
    crate::wait::until("the ProxmoxCluster to be ready", config.deadline, || {
        let infra = infra.clone();
        async move { Ok(infrastructure_provisioned(&infra.get(CLUSTER).await?).then_some(())) }
    })
    .await?;
    let clusters_api = world.api(&clusters);
    if with_capi {
        crate::wait::until(
            "the Cluster's infrastructure to be provisioned",
            config.deadline,
            || {
                let clusters_api = clusters_api.clone();
                async move {
                    let cluster = clusters_api.get(CLUSTER).await?;
                    Ok(
                        (cluster.data["status"]["initialization"]["infrastructureProvisioned"]
                            == true)
                            .then_some(()),
                    )
                }
            },
        )
        .await?;
        world
            .create(&secrets, bootstrap_secret(SHARED_BOOTSTRAP))
            .await?;
        create_deployment(world).await?;
    } else {
        let status = json!({ "status": { "initialization": { "infrastructureProvisioned": true, "controlPlaneInitialized": true } } });
        clusters_api
            .patch_status(CLUSTER, &PatchParams::default(), &Patch::Merge(status))
            .await
            .context("set the Cluster's status")?;
    }
    Ok(())
}

/// A MachineDeployment at zero replicas whose Machines take a ready
/// bootstrap Secret, and its ProxmoxMachineTemplate.
async fn create_deployment<P>(world: &World<P>) -> anyhow::Result<()> {
    world
        .create(
            &resource(
                GROUP,
                VERSION,
                "ProxmoxMachineTemplate",
                "proxmoxmachinetemplates",
            ),
            json!({
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": "ProxmoxMachineTemplate",
                "metadata": { "name": TEMPLATE_NAME, "namespace": NAMESPACE },
                "spec": { "template": { "spec": machine_spec() } }
            }),
        )
        .await?;
    world
        .create(
            &capi("v1beta2", "MachineDeployment", "machinedeployments"),
            super::machine_deployment(
                DEPLOYMENT,
                CLUSTER,
                SHARED_BOOTSTRAP,
                "ProxmoxMachineTemplate",
                TEMPLATE_NAME,
            ),
        )
        .await?;
    Ok(())
}

async fn scale(world: &World, replicas: usize) -> anyhow::Result<()> {
    super::scale_deployment(&world.client, DEPLOYMENT, replicas).await
}

/// Per machine, as a MachineSet would make it: its bootstrap Secret, the
/// Machine, and the ProxmoxMachine the Machine owns.
pub(crate) async fn create_machines<P>(
    world: &World<P>,
    capi_version: &str,
    machines: usize,
    config: &BenchConfig,
    requested: &Arc<Mutex<HashMap<String, Instant>>>,
) -> anyhow::Result<()> {
    let secrets = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    let machine_api = capi(capi_version, "Machine", "machines");
    let tasks = (0..machines).map(|i| {
        let name = format!("bench-{i:05}");
        let secrets = secrets.clone();
        let machine_api = machine_api.clone();
        let requested = requested.clone();
        async move {
            let bootstrap = format!("{name}-bootstrap");
            world.create(&secrets, bootstrap_secret(&bootstrap)).await?;
            let labels = json!({ "cluster.x-k8s.io/cluster-name": CLUSTER });
            let machine = world
                .create(
                    &machine_api,
                    json!({
                        "apiVersion": format!("cluster.x-k8s.io/{capi_version}"),
                        "kind": "Machine",
                        "metadata": { "name": name, "namespace": NAMESPACE, "labels": labels },
                        "spec": {
                            "clusterName": CLUSTER,
                            "version": "v1.35.0",
                            "bootstrap": { "dataSecretName": bootstrap },
                            "infrastructureRef": { "apiGroup": GROUP, "kind": "ProxmoxMachine", "name": name }
                        }
                    }),
                )
                .await?;
            world
                .create(
                    &proxmox_machines(),
                    json!({
                        "apiVersion": format!("{GROUP}/{VERSION}"),
                        "kind": "ProxmoxMachine",
                        "metadata": {
                            "name": name,
                            "namespace": NAMESPACE,
                            "labels": labels,
                            "ownerReferences": [{
                                "apiVersion": format!("cluster.x-k8s.io/{capi_version}"),
                                "kind": "Machine",
                                "name": name,
                                "uid": machine.metadata.uid,
                                "controller": true,
                                "blockOwnerDeletion": true
                            }]
                        },
                        "spec": machine_spec()
                    }),
                )
                .await?;
            requested
                .lock()
                .expect("requested")
                .insert(name, Instant::now());
            Ok(())
        }
    });
    run_bounded(config.create_concurrency, tasks.collect()).await
}
