//! The local sandbox: a real control plane with the Cluster API core
//! manager, tenantry, the KubeVirt/CDI simulator, Kamaji (simulated) and a
//! demo workload cluster whose MachineDeployment runs Talos workers,
//! running until Ctrl-C or SIGTERM. `hack/sandbox.sh` builds what is
//! missing and runs this.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use tenantry_e2e::demo::DemoCluster;
use tenantry_e2e::sim::kubevirt::{
    DEFAULT_SCHEMATIC, ImageFactory, ImageFactoryConfig, KubevirtSimConfig, KubevirtSimulator,
};
use tenantry_e2e::sim::tenant::{
    KamajiControlPlaneSimulator, NodeSimConfig, NodeSimulator, TenantClusters,
    TenantControlPlaneOptions,
};
use tenantry_e2e::tenantry::TenantryManager;
use tenantry_e2e::{
    ClusterApiManager, ControlPlane, ControlPlaneOptions, Upstream, upstream::Binary,
};
use tokio::signal::unix::{SignalKind, signal};

const KUBERNETES_VERSION: &str = "v1.35.0";
const TALOS_VERSION: &str = "v1.13.0";

#[derive(Parser, Debug)]
#[command(about = "Run tenantry's local sandbox until Ctrl-C or SIGTERM")]
struct Args {
    /// Where to write the admin kubeconfig.
    #[arg(long, default_value = ".sandbox/kubeconfig")]
    kubeconfig: PathBuf,
    /// Start only the control plane, without the Cluster API manager,
    /// tenantry or the demo.
    #[arg(long)]
    no_cluster_api: bool,
    /// Start the control plane, Cluster API, tenantry and the simulators,
    /// but create no demo cluster.
    #[arg(long)]
    no_demo: bool,
    /// Workers of the demo cluster's MachineDeployment.
    #[arg(long, default_value_t = 3)]
    workers: u32,
}

/// Everything the demo runs besides the control plane and CAPI. Field
/// order is stop order.
struct Demo {
    nodes: NodeSimulator,
    kamaji: KamajiControlPlaneSimulator,
    _tenantry: TenantryManager,
    _kubevirt: KubevirtSimulator,
    factory: ImageFactory,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // kube's client logs every failed request at error level; while the
    // apiserver comes up those failures are expected polling, not news.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube_client::client::builder=off,kube_runtime=warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).init();
    // Install the handlers first, so a signal during start-up still stops
    // everything in order.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;

    let started = std::time::Instant::now();
    let control_plane = ControlPlane::start_with(ControlPlaneOptions {
        name: "sandbox".into(),
        ..Default::default()
    })
    .await?;
    println!(
        "control plane up at {} in {:.1}s",
        control_plane.server_url(),
        started.elapsed().as_secs_f64()
    );
    let cluster_api = if args.no_cluster_api {
        None
    } else {
        let started = std::time::Instant::now();
        let manager = ClusterApiManager::start(&control_plane).await?;
        println!(
            "Cluster API core manager ready in {:.1}s (log: {})",
            started.elapsed().as_secs_f64(),
            manager.log_path().display()
        );
        Some(manager)
    };

    let demo = match &cluster_api {
        Some(_) => Some(start_demo_world(&control_plane).await?),
        None => None,
    };

    if let Some(parent) = args
        .kubeconfig
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    std::fs::copy(control_plane.kubeconfig_path(), &args.kubeconfig)
        .with_context(|| format!("write {}", args.kubeconfig.display()))?;
    let kubeconfig = std::fs::canonicalize(&args.kubeconfig)?;
    let kubectl = Upstream::locate()?.binary(Binary::Kubectl)?;
    println!("kubeconfig: {}", kubeconfig.display());
    println!(
        "try:\n  export KUBECONFIG={}\n  {} get crds",
        kubeconfig.display(),
        kubectl.display()
    );

    let interrupted = match (&demo, args.no_demo) {
        (Some(demo), false) => {
            let kubeconfig_dir = kubeconfig.parent().unwrap_or(Path::new(".")).to_path_buf();
            let cluster = DemoCluster {
                namespace: "default".into(),
                name: "demo".into(),
                kubernetes_version: KUBERNETES_VERSION.into(),
                talos_version: TALOS_VERSION.into(),
                schematic: DEFAULT_SCHEMATIC.into(),
                image_factory_url: demo.factory.base_url().to_string(),
                workers: args.workers,
            };
            tokio::select! {
                result = run_demo(&control_plane, demo, &cluster, &kubectl, &kubeconfig_dir) => {
                    result?;
                    false
                }
                _ = interrupt.recv() => true,
                _ = terminate.recv() => true,
            }
        }
        _ => false,
    };
    if !interrupted {
        println!("sandbox running; Ctrl-C to stop");
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
    println!("stopping");
    if let Some(demo) = demo {
        demo.nodes.stop().await;
        demo.kamaji.stop().await;
    }
    if let Some(manager) = cluster_api {
        manager.stop();
    }
    control_plane.stop();
    let _ = std::fs::remove_file(&args.kubeconfig);
    if let Some(dir) = args.kubeconfig.parent() {
        let _ = std::fs::remove_file(dir.join("demo.kubeconfig"));
    }
    println!("stopped");
    Ok(())
}

/// tenantry, the KubeVirt/CDI simulator, an image factory, Kamaji and the
/// tenant nodes' kubelets.
async fn start_demo_world(control_plane: &ControlPlane) -> anyhow::Result<Demo> {
    let client = control_plane.client();
    tenantry_e2e::manifests::apply_crds(&client, tenantry_api::crds::all())
        .await
        .context("install tenantry's CRDs")?;
    let kubevirt = KubevirtSimulator::start(client.clone(), KubevirtSimConfig::default())
        .await
        .context("start the KubeVirt simulator")?;
    let factory = ImageFactory::start(ImageFactoryConfig {
        versions: vec![TALOS_VERSION.into()],
        ..Default::default()
    })
    .await
    .context("start the image factory")?;
    let tenants = TenantClusters::new();
    let kamaji = KamajiControlPlaneSimulator::start(
        client.clone(),
        tenants.clone(),
        TenantControlPlaneOptions::default(),
    )
    .await
    .context("start the Kamaji simulator")?;
    let nodes = NodeSimulator::start(tenants, NodeSimConfig::default());
    nodes.follow_kubevirt(client.clone());
    let tenantry = TenantryManager::start(client);
    println!("tenantry, KubeVirt/CDI, Kamaji and kubelet simulators running");
    Ok(Demo {
        nodes,
        kamaji,
        _tenantry: tenantry,
        _kubevirt: kubevirt,
        factory,
    })
}

/// Creates the demo cluster and reports its workers' progress until every
/// one runs with a Node, then says how to scale it.
async fn run_demo(
    control_plane: &ControlPlane,
    demo: &Demo,
    cluster: &DemoCluster,
    kubectl: &Path,
    kubeconfig_dir: &Path,
) -> anyhow::Result<()> {
    let client = control_plane.client();
    for document in cluster.cluster_documents() {
        tenantry_e2e::manifests::apply_object(&client, &document, &cluster.namespace).await?;
    }
    println!(
        "demo cluster {}/{}: waiting for its Kamaji control plane",
        cluster.namespace, cluster.name
    );
    let tenant = loop {
        if let Some(tenant) = demo.kamaji.tenant(&cluster.namespace, &cluster.name) {
            break tenant;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let tenant_kubeconfig = kubeconfig_dir.join(format!("{}.kubeconfig", cluster.name));
    let secret: k8s_openapi::api::core::v1::Secret = loop {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(client.clone(), &cluster.namespace);
        if let Some(secret) = secrets
            .get_opt(&format!("{}-kubeconfig", cluster.name))
            .await?
        {
            break secret;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let value = secret
        .data
        .and_then(|d| d.get("value").cloned())
        .context("kubeconfig Secret without value")?;
    std::fs::write(&tenant_kubeconfig, value.0)
        .with_context(|| format!("write {}", tenant_kubeconfig.display()))?;
    println!("tenant control plane at {}", tenant.endpoint);
    for document in cluster.worker_documents(&tenant.endpoint) {
        tenantry_e2e::manifests::apply_object(&client, &document, &cluster.namespace).await?;
    }
    println!(
        "MachineDeployment {} with {} KubeVirt workers created",
        cluster.deployment(),
        cluster.workers
    );

    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &cluster.namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
            "machines",
        ),
    );
    let selector = format!("cluster.x-k8s.io/deployment-name={}", cluster.deployment());
    let mut last = None;
    loop {
        let list = machines
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let provisioned = list
            .iter()
            .filter(|m| m.data["status"]["initialization"]["infrastructureProvisioned"] == true)
            .count();
        let running = list
            .iter()
            .filter(|m| m.data["status"]["phase"] == "Running")
            .count();
        let nodes = Api::<Node>::all(tenant.client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or_default();
        let progress = (list.len(), provisioned, running, nodes);
        if last != Some(progress) {
            println!(
                "  machines: {} created, {provisioned} provisioned, {running} running; tenant nodes: {nodes}",
                list.len()
            );
            last = Some(progress);
        }
        if running == cluster.workers as usize && nodes == running {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let kubectl = kubectl.display();
    println!(
        "all {} workers are up. Try:\n  {kubectl} get cluster,machinedeployment,machines,kubevirtmachines,vms\n  {kubectl} --kubeconfig {} get nodes -o wide\nscale the workers:\n  {kubectl} scale machinedeployment {} --replicas=5\ninject a fault:\n  {kubectl} annotate vmi <worker> sim.tenantry.dev/fail=",
        cluster.workers,
        tenant_kubeconfig.display(),
        cluster.deployment(),
    );
    Ok(())
}
