//! One KubeVirt run: tenantry or CAPK provisions and deletes a wave of
//! KubevirtMachines against the KubeVirt simulator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::process_stats::{self, ProcessStats};
use super::providers::{self, Provider, ProviderLaunch, RunningProvider};
use super::requests::{self, RequestTally};
use super::{
    BenchConfig, NAMESPACE, RunResult, Window, capi, follow, infrastructure_provisioned, latencies,
    machine_provisioned, phase, resource, run_bounded, wait_for,
};
use crate::sim::kubevirt::{KubevirtSimConfig, KubevirtSimulator};
use crate::{ClusterApiManager, ControlPlane, ControlPlaneOptions};

const CLUSTER: &str = "bench";
const DEPLOYMENT: &str = "bench-md";
const TEMPLATE: &str = "bench-worker";
const SHARED_BOOTSTRAP: &str = "bench-bootstrap";
const GROUP: &str = "infrastructure.cluster.x-k8s.io";

pub(crate) fn kubevirt_machines() -> kube::api::ApiResource {
    resource(GROUP, "v1alpha1", "KubevirtMachine", "kubevirtmachines")
}

fn kubevirt_clusters() -> kube::api::ApiResource {
    resource(GROUP, "v1alpha1", "KubevirtCluster", "kubevirtclusters")
}

pub(crate) fn virtual_machines() -> kube::api::ApiResource {
    resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines")
}

/// The machine both providers accept: a container-disk VM (no import), no
/// bootstrap check (no guest to reach), as CAPK's own templates write it.
pub(crate) fn machine_spec() -> Value {
    json!({
        "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
        "virtualMachineTemplate": { "spec": {
            "runStrategy": "Always",
            "template": { "spec": {
                "domain": {
                    "cpu": { "cores": 1 },
                    "memory": { "guest": "1Gi" },
                    "devices": {
                        "disks": [{ "name": "containervolume", "disk": { "bus": "virtio" } }],
                        "interfaces": [{ "name": "default", "bridge": {} }]
                    }
                },
                "networks": [{ "name": "default", "pod": {} }],
                "volumes": [{ "name": "containervolume", "containerDisk": { "image": "quay.io/capk/ubuntu-2404-container-disk:v1.34.1" } }]
            }}
        }}
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
/// world (the chaos tests' replicas). Field order is drop order.
pub(crate) struct World<P = RunningProvider> {
    pub(crate) provider: P,
    pub(crate) sim: KubevirtSimulator,
    _capi: Option<ClusterApiManager>,
    pub(crate) control_plane: ControlPlane,
    pub(crate) client: kube::Client,
    pub(crate) tally: RequestTally,
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
            sim: self.sim,
            _capi: self._capi,
            control_plane: self.control_plane,
            client: self.client,
            tally: self.tally,
        }
    }
}

impl World {
    fn stats(&self) -> anyhow::Result<ProcessStats> {
        process_stats::read(self.provider.process.pid())
    }

    async fn window(&self) -> anyhow::Result<Window> {
        Ok(Window {
            samples: requests::scrape(&self.client).await?,
            own: self.tally.snapshot(),
            stats: self.stats()?,
        })
    }

    fn fail(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!(
            "---- {} log ----\n{}",
            self.provider.process.name(),
            self.provider.process.log_tail(30)
        ))
    }
}

/// Provisions and deletes `machines` KubevirtMachines with `provider`.
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

/// The KubeVirt simulator of a benchmark: it answers at once, since the
/// provider is measured, not the hypervisor.
pub(crate) fn sim_config() -> KubevirtSimConfig {
    KubevirtSimConfig {
        step: Duration::from_millis(10),
        shutdown_grace: Duration::from_millis(10),
        ip_pool: "10.128.0.0/12".into(),
        ..KubevirtSimConfig::fast()
    }
}

async fn start(config: &BenchConfig, provider: Provider, with_capi: bool) -> anyhow::Result<World> {
    let world = stage(
        config,
        provider,
        with_capi,
        &format!("bench-kubevirt-{}", provider.name()),
        Vec::new(),
        Kubevirt::Simulated,
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

/// What plays KubeVirt in a world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kubevirt {
    /// The simulator alone: it answers at the pace its config sets, so a
    /// benchmark measures the provider, not KubeVirt.
    Simulated,
    /// KubeVirt's own virt-api and virt-controller, the simulator for the
    /// rest ([`KubevirtSimulator::start_with_kubevirt`]).
    Real,
}

/// Everything of a run but the provider: a fresh control plane named
/// `name`, the Cluster API CRDs (or manager), `provider`'s CRDs and KubeVirt
/// as `kubevirt` says, the simulator with `sim`.
pub(crate) async fn stage(
    config: &BenchConfig,
    provider: Provider,
    with_capi: bool,
    name: &str,
    extra_apiserver_args: Vec<String>,
    kubevirt: Kubevirt,
    sim: KubevirtSimConfig,
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
    let client = tally.client(kube_config.clone())?;
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
    crate::manifests::apply_crds(
        &client,
        providers::provider_crds(&config.binaries, provider)?,
    )
    .await
    .with_context(|| format!("install {}'s CRDs", provider.name()))?;
    let sim = match kubevirt {
        Kubevirt::Simulated => KubevirtSimulator::start(tally.client(kube_config)?, sim)
            .await
            .context("start the KubeVirt simulator")?,
        Kubevirt::Real => KubevirtSimulator::start_with_kubevirt(&control_plane, sim)
            .await
            .context("start KubeVirt")?,
    };
    Ok(World {
        provider: (),
        sim,
        _capi: capi_manager,
        control_plane,
        client,
        tally,
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
        kubevirt_machines()
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
        create_machines(
            world,
            capi_version,
            machines,
            &machine_spec(),
            config,
            &requested,
        )
        .await?;
    }
    wait_for(
        &timeline,
        "provisioning",
        config.wave_deadline(machines),
        |t| t.provisioned.len() >= machines,
    )
    .await?;
    let provisioned_wall = started.elapsed();
    let after = world.window().await?;
    let provision_latencies = {
        let timeline = timeline.lock().expect("timeline");
        let requested = requested.lock().expect("requested");
        // A Machine's wave starts when CAPI creates it; one the benchmark
        // creates, when its KubevirtMachine is created.
        let from = |name: &str| {
            if with_capi {
                timeline.seen.get(name).copied()
            } else {
                requested.get(name).copied()
            }
        };
        latencies(&timeline.provisioned, from, started)
    };
    let provision = phase(
        &before,
        &after,
        machines,
        provisioned_wall,
        provision_latencies,
    );

    // Deletion.
    let before = after;
    let started = Instant::now();
    let delete_requested = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    if with_capi {
        scale(world, 0).await?;
    } else {
        let api = world.api(&kubevirt_machines());
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
                    .with_context(|| format!("delete KubevirtMachine {name}"))?;
                delete_requested
                    .lock()
                    .expect("requested")
                    .insert(name, Instant::now());
                Ok(())
            }
        });
        run_bounded(config.create_concurrency, tasks.collect()).await?;
    }
    wait_for(&timeline, "deletion", config.wave_deadline(machines), |t| {
        t.gone.len() >= machines
    })
    .await?;
    // Done when the hypervisor has no VM left either.
    let vms = world.api(&virtual_machines());
    let deadline = config.wave_deadline(machines);
    crate::wait::until("every VirtualMachine to be gone", deadline, || {
        let vms = vms.clone();
        async move {
            let left = vms.list(&ListParams::default()).await?.items.len();
            Ok((left == 0).then_some(()))
        }
    })
    .await?;
    let deleted_wall = started.elapsed();
    let after = world.window().await?;
    follower.abort();
    let delete_latencies = {
        let timeline = timeline.lock().expect("timeline");
        let requested = delete_requested.lock().expect("requested");
        latencies(&timeline.gone, |name| requested.get(name).copied(), started)
    };
    let delete = phase(&before, &after, machines, deleted_wall, delete_latencies);
    Ok(RunResult {
        provider: provider.name().into(),
        substrate: "kubevirt".into(),
        capi: with_capi,
        machines,
        provision,
        delete,
        peak_rss_mib: 0.0,
        cpu_seconds: 0.0,
    })
}

/// The Cluster and its KubevirtCluster; waits until the provider made the
/// KubevirtCluster ready (which shows its controllers run), and without the
/// Cluster API manager sets the Cluster's status as it would.
pub(crate) async fn create_cluster<P>(
    world: &World<P>,
    capi_version: &str,
    with_capi: bool,
    config: &BenchConfig,
) -> anyhow::Result<()> {
    let infrastructure_ref = if capi_version == "v1beta1" {
        json!({ "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "KubevirtCluster", "name": CLUSTER, "namespace": NAMESPACE })
    } else {
        json!({ "apiGroup": GROUP, "kind": "KubevirtCluster", "name": CLUSTER })
    };
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
                    "controlPlaneEndpoint": { "host": "10.95.0.1", "port": 6443 },
                    "infrastructureRef": infrastructure_ref
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
            &kubevirt_clusters(),
            json!({
                "apiVersion": format!("{GROUP}/v1alpha1"),
                "kind": "KubevirtCluster",
                "metadata": { "name": CLUSTER, "namespace": NAMESPACE, "ownerReferences": owner },
                "spec": { "controlPlaneServiceTemplate": { "spec": { "type": "ClusterIP" } } }
            }),
        )
        .await?;
    let infra = world.api(&kubevirt_clusters());
    crate::wait::until("the KubevirtCluster to be ready", config.deadline, || {
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
            .create(
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
                bootstrap_secret(SHARED_BOOTSTRAP),
            )
            .await?;
        create_deployment(world).await?;
    } else {
        let status = if capi_version == "v1beta1" {
            json!({ "status": { "infrastructureReady": true, "controlPlaneReady": true } })
        } else {
            json!({ "status": { "initialization": { "infrastructureProvisioned": true, "controlPlaneInitialized": true } } })
        };
        clusters_api
            .patch_status(CLUSTER, &PatchParams::default(), &Patch::Merge(status))
            .await
            .context("set the Cluster's status")?;
    }
    Ok(())
}

/// A MachineDeployment at zero replicas whose Machines take a ready
/// bootstrap Secret, and its KubevirtMachineTemplate.
async fn create_deployment<P>(world: &World<P>) -> anyhow::Result<()> {
    world
        .create(
            &resource(
                GROUP,
                "v1alpha1",
                "KubevirtMachineTemplate",
                "kubevirtmachinetemplates",
            ),
            json!({
                "apiVersion": format!("{GROUP}/v1alpha1"),
                "kind": "KubevirtMachineTemplate",
                "metadata": { "name": TEMPLATE, "namespace": NAMESPACE },
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
                "KubevirtMachineTemplate",
                TEMPLATE,
            ),
        )
        .await?;
    Ok(())
}

async fn scale(world: &World, replicas: usize) -> anyhow::Result<()> {
    super::scale_deployment(&world.client, DEPLOYMENT, replicas).await
}

/// Per machine, as a MachineSet would make it: its bootstrap Secret, the
/// Machine, and the KubevirtMachine with `spec` the Machine owns.
pub(crate) async fn create_machines<P>(
    world: &World<P>,
    capi_version: &str,
    machines: usize,
    spec: &Value,
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
            let infrastructure_ref = if capi_version == "v1beta1" {
                json!({ "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "KubevirtMachine", "name": name, "namespace": NAMESPACE })
            } else {
                json!({ "apiGroup": GROUP, "kind": "KubevirtMachine", "name": name })
            };
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
                            "bootstrap": { "dataSecretName": bootstrap },
                            "infrastructureRef": infrastructure_ref
                        }
                    }),
                )
                .await?;
            world
                .create(
                    &kubevirt_machines(),
                    json!({
                        "apiVersion": format!("{GROUP}/v1alpha1"),
                        "kind": "KubevirtMachine",
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
                        "spec": spec
                    }),
                )
                .await?;
            requested.lock().expect("requested").insert(name, Instant::now());
            Ok(())
        }
    });
    run_bounded(config.create_concurrency, tasks.collect()).await
}
