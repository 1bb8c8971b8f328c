//! The side-by-side benchmark: tenantry against the Go providers (CAPK on
//! KubeVirt, capmox on Proxmox VE) on the same harness — a fresh real
//! control plane per run, the same simulators answering at once — measuring
//! what a provider costs a management cluster: time to provision and delete
//! a wave of machines, apiserver requests per machine, peak memory, CPU, and
//! hypervisor calls. `hack/bench.sh` runs it; `docs/performance.md` holds
//! the figures.

pub mod kubevirt;
pub mod process_stats;
pub mod providers;
pub mod proxmox;
pub mod report;
pub mod requests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use serde::Serialize;

use crate::upstream::Upstream;
pub use providers::{Binaries, Provider};
pub use requests::VerbCounts;

/// The namespace every benchmark object lives in.
pub const NAMESPACE: &str = "default";

/// What one provisioning or deletion wave cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseResult {
    /// From the first request of the wave until every machine got there.
    pub wall_seconds: f64,
    /// Per machine, from its request to its provisioned (or gone) state.
    pub p50_seconds: f64,
    pub p99_seconds: f64,
    /// Requests the provider side caused (see [`requests`]), by verb, watches
    /// left out.
    pub requests: VerbCounts,
    /// The same by `verb resource[/subresource]`, everything counted by the
    /// apiserver minus nothing: for profiling.
    pub requests_by_resource: BTreeMap<String, u64>,
    pub requests_per_machine: f64,
    /// CPU seconds the provider process spent in this wave.
    pub cpu_seconds: f64,
    /// Proxmox VE API calls per machine (Proxmox only).
    pub pve_calls_per_machine: Option<f64>,
    pub pve_calls: BTreeMap<String, u64>,
}

/// One provider, one wave size, one run.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub provider: String,
    pub substrate: String,
    /// Whether the Cluster API core manager ran (machines from a
    /// MachineDeployment) or the benchmark drove the provider directly.
    pub capi: bool,
    pub machines: usize,
    pub provision: PhaseResult,
    pub delete: PhaseResult,
    /// Peak resident memory of the provider process over the whole run.
    pub peak_rss_mib: f64,
    /// CPU seconds of the provider process over the whole run.
    pub cpu_seconds: f64,
}

/// Settings shared by every run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub binaries: Binaries,
    /// Upper bound for a wave; a run that needs longer fails.
    pub deadline: Duration,
    /// Concurrent requests of the benchmark's own object creation.
    pub create_concurrency: usize,
}

impl BenchConfig {
    /// Upper bound for a wave of `machines`: generous, never measured.
    pub fn wave_deadline(&self, machines: usize) -> Duration {
        self.deadline + Duration::from_millis(500 * machines as u64)
    }
}

/// The Cluster API CRDs as the manager would serve them, for runs without
/// the manager: no conversion webhook, and stored in the version the
/// provider reads (the benchmark writes that version only).
pub fn cluster_api_crds(storage_version: &str) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let dir = Upstream::locate()?.cluster_api_config()?.join("crd");
    let mut crds = crate::manifests::crds_of(crate::manifests::read_documents(&dir)?)?;
    for crd in &mut crds {
        crd.spec.conversion = Some(CustomResourceConversion {
            strategy: "None".into(),
            webhook: None,
        });
        let has_version = crd.spec.versions.iter().any(|v| v.name == storage_version);
        for version in &mut crd.spec.versions {
            if has_version {
                version.storage = version.name == storage_version;
            }
        }
    }
    Ok(crds)
}

/// An `ApiResource` for a dynamic API.
pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// A Cluster API core kind in `version`.
pub fn capi(version: &str, kind: &str, plural: &str) -> ApiResource {
    resource("cluster.x-k8s.io", version, kind, plural)
}

/// Whether an infrastructure object reports itself provisioned, in either
/// contract (`status.initialization.provisioned` or `status.ready`).
pub fn infrastructure_provisioned(object: &DynamicObject) -> bool {
    let status = &object.data["status"];
    status["initialization"]["provisioned"] == true || status["ready"] == true
}

/// Whether a Cluster API Machine (v1beta2) has its infrastructure.
pub fn machine_provisioned(object: &DynamicObject) -> bool {
    let status = &object.data["status"];
    status["initialization"]["infrastructureProvisioned"] == true
        || matches!(status["phase"].as_str(), Some("Provisioned" | "Running"))
}

/// When each object of a kind was first seen, got provisioned, and went
/// away, as a watch tells it.
#[derive(Default)]
pub struct Timeline {
    pub seen: HashMap<String, Instant>,
    pub provisioned: HashMap<String, Instant>,
    pub gone: HashMap<String, Instant>,
}

/// Follows `api` in the background, recording a [`Timeline`] with
/// `is_provisioned` deciding the provisioned moment.
pub fn follow(
    api: Api<DynamicObject>,
    is_provisioned: fn(&DynamicObject) -> bool,
) -> (Arc<Mutex<Timeline>>, tokio::task::JoinHandle<()>) {
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let shared = timeline.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let mut timeline = shared.lock().expect("timeline");
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    let name = object.metadata.name.clone().unwrap_or_default();
                    timeline.seen.entry(name.clone()).or_insert(now);
                    if is_provisioned(&object) {
                        timeline.provisioned.entry(name).or_insert(now);
                    }
                }
                Ok(watcher::Event::Delete(object)) => {
                    let name = object.metadata.name.clone().unwrap_or_default();
                    timeline.gone.entry(name).or_insert(now);
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "benchmark watch"),
            }
        }
    });
    (timeline, task)
}

/// Waits until `done` holds for the timeline, checking every 50 ms (no
/// requests: the watch fills the timeline).
pub async fn wait_for(
    timeline: &Arc<Mutex<Timeline>>,
    what: &str,
    deadline: Duration,
    done: impl Fn(&Timeline) -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if done(&timeline.lock().expect("timeline")) {
            return Ok(());
        }
        if started.elapsed() > deadline {
            let timeline = timeline.lock().expect("timeline");
            anyhow::bail!(
                "{what}: not done within {deadline:?} (seen {}, provisioned {}, gone {})",
                timeline.seen.len(),
                timeline.provisioned.len(),
                timeline.gone.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// p50 and p99 of durations, in seconds (nearest rank).
pub fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    samples.sort();
    let rank = |p: f64| {
        let index = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index].as_secs_f64()
    };
    (rank(0.50), rank(0.99))
}

/// Runs `tasks` futures at most `concurrency` at a time, failing on the
/// first error.
pub async fn run_bounded<F>(concurrency: usize, tasks: Vec<F>) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut stream = futures::stream::iter(tasks).buffer_unordered(concurrency.max(1));
    while let Some(result) = stream.next().await {
        result?;
    }
    Ok(())
}

/// A measurement point: the apiserver's counts, ours, the provider's CPU.
pub struct Window {
    pub samples: Vec<requests::RequestSample>,
    pub own: VerbCounts,
    pub stats: process_stats::ProcessStats,
}

pub fn phase(
    start: &Window,
    end: &Window,
    machines: usize,
    wall: Duration,
    latencies: Vec<Duration>,
) -> PhaseResult {
    let total = requests::by_verb(&start.samples, &end.samples);
    let own = requests::subtract(&end.own, &start.own);
    let mut provider_requests = requests::subtract(&total, &own);
    provider_requests.remove("WATCH");
    let (p50, p99) = percentiles(latencies);
    PhaseResult {
        wall_seconds: wall.as_secs_f64(),
        p50_seconds: p50,
        p99_seconds: p99,
        requests_per_machine: requests::reported_total(&provider_requests) as f64 / machines as f64,
        requests: provider_requests,
        requests_by_resource: requests::by_resource(&start.samples, &end.samples),
        cpu_seconds: end.stats.cpu_seconds - start.stats.cpu_seconds,
        pve_calls_per_machine: None,
        pve_calls: Default::default(),
    }
}

/// Per machine: from `from` (its request, or when it was first seen) or
/// else the wave's start, to the moment `reached` recorded.
pub fn latencies(
    reached: &HashMap<String, Instant>,
    from: impl Fn(&str) -> Option<Instant>,
    wave_start: Instant,
) -> Vec<Duration> {
    reached
        .iter()
        .map(|(name, at)| at.saturating_duration_since(from(name).unwrap_or(wave_start)))
        .collect()
}

/// The MachineDeployment of a Cluster API core run: `name` in cluster
/// `cluster`, at zero replicas, Machines taking the ready bootstrap Secret
/// `bootstrap` and infrastructure from the `template_kind` `template`.
pub fn machine_deployment(
    name: &str,
    cluster: &str,
    bootstrap: &str,
    template_kind: &str,
    template: &str,
) -> serde_json::Value {
    let labels = serde_json::json!({ "cluster.x-k8s.io/deployment-name": name });
    serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "clusterName": cluster,
            "replicas": 0,
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "clusterName": cluster,
                    "version": "v1.35.0",
                    "bootstrap": { "dataSecretName": bootstrap },
                    "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": template_kind, "name": template }
                }
            }
        }
    })
}

/// Scales the MachineDeployment `name` to `replicas`.
pub async fn scale_deployment(
    client: &kube::Client,
    name: &str,
    replicas: usize,
) -> anyhow::Result<()> {
    Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NAMESPACE,
        &capi("v1beta2", "MachineDeployment", "machinedeployments"),
    )
    .patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({ "spec": { "replicas": replicas } })),
    )
    .await
    .context("scale the MachineDeployment")?;
    Ok(())
}

/// A kube config for the control plane's admin, for clients counted by a
/// [`requests::RequestTally`].
pub async fn admin_config(control_plane: &crate::ControlPlane) -> anyhow::Result<kube::Config> {
    kube::Config::from_custom_kubeconfig(
        control_plane.kubeconfig().clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("kube config of the control plane")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(percentiles(samples), (50.0, 99.0));
        assert_eq!(percentiles(vec![Duration::from_secs(3)]), (3.0, 3.0));
        assert_eq!(percentiles(Vec::new()), (0.0, 0.0));
    }
}
