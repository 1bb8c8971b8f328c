//! The local sandbox: a real control plane with the Cluster API core
//! manager, tenantry, CABPT, KubeVirt's own virt-api and virt-controller
//! (the KubeVirt simulator plays the kubelet, virt-handler, the guests and
//! CDI), Kamaji and etcd-operator (simulated) and a demo tenant cluster — a
//! `Kubernetes` object and a `KubernetesNodes` pool whose Talos workers join
//! it — running until Ctrl-C or SIGTERM. `hack/sandbox.sh` builds what is
//! missing and runs this.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use tenantry_e2e::clusterctl::Clusterctl;
use tenantry_e2e::demo::DemoCluster;
use tenantry_e2e::management::ManagementCluster;
use tenantry_e2e::sim::kubevirt::{
    DEFAULT_SCHEMATIC, ImageFactory, ImageFactoryConfig, KubevirtSimConfig, KubevirtSimulator,
};
use tenantry_e2e::sim::tenant::{
    EtcdSimulator, KamajiControlPlaneSimulator, NodeSimConfig, NodeSimulator, TenantClusters,
    TenantControlPlaneOptions,
};
use tenantry_e2e::tenantry::{TenantryManager, out_of_cluster};
use tenantry_e2e::{
    ClusterApiManager, ControlPlane, ControlPlaneOptions, Upstream, UpstreamManager,
    upstream::Binary,
};
use tenantry_provider::reconciler::ManagerConfig;
use tokio::signal::unix::{SignalKind, signal};

const KUBERNETES_VERSION: &str = "v1.35";
const TALOS_VERSION: &str = "v1.13.6";

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
    /// Workers of the demo cluster's pool (its minReplicas).
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// Run Cluster API and tenantry as a cluster runs them: installed by
    /// `clusterctl init` from this build's release components into a
    /// management cluster whose pods run (the e2e pod runner), tenantry
    /// from its image (`hack/image.sh`), with the real cert-manager. Needs
    /// root.
    #[arg(long)]
    deployed: bool,
}

/// Everything the demo runs besides the control plane and CAPI. Field
/// order is stop order.
struct Demo {
    nodes: NodeSimulator,
    cabpt: UpstreamManager,
    /// In-process, unless deployed (then its pod runs in the cluster).
    _tenantry: Option<TenantryManager>,
    _clusterctl: Option<Clusterctl>,
    etcd: EtcdSimulator,
    kamaji: KamajiControlPlaneSimulator,
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
    let (management, plain) = if args.deployed {
        let management = ManagementCluster::start("sandbox").await?;
        println!(
            "management cluster (pods run on node {}, address {}) with cert-manager",
            management.runner.node_name(),
            management.node_ip()
        );
        (Some(management), None)
    } else {
        let control_plane = ControlPlane::start_with(ControlPlaneOptions {
            name: "sandbox".into(),
            ..Default::default()
        })
        .await?;
        (None, Some(control_plane))
    };
    let control_plane: &ControlPlane = match (&management, &plain) {
        (Some(management), _) => &management.control_plane,
        (None, Some(control_plane)) => control_plane,
        (None, None) => unreachable!("one or the other"),
    };
    println!(
        "control plane up at {} in {:.1}s",
        control_plane.server_url(),
        started.elapsed().as_secs_f64()
    );
    // Deployed, clusterctl installs Cluster API with tenantry (below).
    let cluster_api = if args.no_cluster_api || args.deployed {
        None
    } else {
        let started = std::time::Instant::now();
        let manager = ClusterApiManager::start(control_plane).await?;
        println!(
            "Cluster API core manager ready in {:.1}s (log: {})",
            started.elapsed().as_secs_f64(),
            manager.log_path().display()
        );
        Some(manager)
    };

    let demo = match (&cluster_api, &management) {
        (Some(_), _) => Some(start_demo_world(control_plane, None).await?),
        (None, Some(management)) if !args.no_cluster_api => {
            Some(start_demo_world(control_plane, Some(management)).await?)
        }
        _ => None,
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
                result = run_demo(control_plane, demo, &cluster, &kubectl, &kubeconfig_dir) => {
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
        demo.cabpt.stop();
        demo.etcd.stop().await;
        demo.kamaji.stop().await;
    }
    if let Some(manager) = cluster_api {
        manager.stop();
    }
    if let Some(control_plane) = plain {
        control_plane.stop();
    }
    // A management cluster stops its pods, cert-manager and control plane
    // and removes its node network when dropped.
    drop(management);
    let _ = std::fs::remove_file(&args.kubeconfig);
    if let Some(dir) = args.kubeconfig.parent() {
        let _ = std::fs::remove_file(dir.join("demo.kubeconfig"));
    }
    println!("stopped");
    Ok(())
}

/// tenantry, the KubeVirt/CDI simulator, an image factory, Kamaji and the
/// tenant nodes' kubelets. With a management cluster, Cluster API and
/// tenantry are installed into it by clusterctl and run as its pods;
/// otherwise tenantry runs in this process.
async fn start_demo_world(
    control_plane: &ControlPlane,
    management: Option<&ManagementCluster>,
) -> anyhow::Result<Demo> {
    let client = control_plane.client();
    if management.is_none() {
        tenantry_e2e::manifests::apply_crds(&client, tenantry_api::crds::all())
            .await
            .context("install tenantry's CRDs")?;
    }
    let kubevirt = match management {
        None => KubevirtSimulator::start_with_kubevirt(control_plane, KubevirtSimConfig::default())
            .await
            .context("start KubeVirt (virt-api, virt-controller and the simulator)")?,
        // A management cluster's kube-scheduler and pod runner would take
        // virt-controller's launcher pods from the simulated kubelet, so its
        // sandbox keeps the simulator's own VM controller.
        Some(_) => KubevirtSimulator::start(client.clone(), KubevirtSimConfig::default())
            .await
            .context("start the KubeVirt simulator")?,
    };
    let factory = ImageFactory::start(ImageFactoryConfig {
        // The demo's schematic, and the one a `Kubernetes` object that names
        // none gets.
        schematics: vec![
            DEFAULT_SCHEMATIC.into(),
            tenantry_api::tenant::DEFAULT_TALOS_SCHEMATIC_ID.into(),
        ],
        versions: vec![TALOS_VERSION.into(), "v1.13.7".into()],
        ..Default::default()
    })
    .await
    .context("start the image factory")?;
    let tenants = TenantClusters::new();
    let kamaji = KamajiControlPlaneSimulator::start(
        client.clone(),
        tenants.clone(),
        TenantControlPlaneOptions {
            // Deployed managers reach tenants through Kamaji's Service.
            address: management.map(ManagementCluster::node_ip),
            ..Default::default()
        },
    )
    .await
    .context("start the Kamaji simulator")?;
    kamaji.wait_for_data_stores(true);
    let etcd = EtcdSimulator::start(client.clone())
        .await
        .context("start the etcd simulator")?;
    let cabpt = UpstreamManager::start_cabpt(control_plane)
        .await
        .context("start CABPT")?;
    let nodes = NodeSimulator::start(
        tenants,
        NodeSimConfig {
            verify_join: true,
            ..Default::default()
        },
    );
    nodes.follow_kubevirt(client.clone());
    // The public factory is out of reach here: objects that name no factory
    // boot from the sandbox's.
    let factory_url = factory.base_url().trim_end_matches('/').to_string();
    let (tenantry, clusterctl) = match management {
        None => {
            let config = ManagerConfig {
                talos_image_factory_url: Some(factory_url),
                ..out_of_cluster()
            };
            let tenantry = TenantryManager::start_with_webhooks_and(control_plane, config)
                .await
                .context("start tenantry")?;
            (Some(tenantry), None)
        }
        Some(management) => {
            let started = std::time::Instant::now();
            let variables = BTreeMap::from([("TALOS_IMAGE_FACTORY_URL".to_string(), factory_url)]);
            let clusterctl = management
                .install_with_clusterctl(&variables, Duration::from_secs(300))
                .await
                .context("clusterctl init of Cluster API and tenantry")?;
            println!(
                "clusterctl installed Cluster API and tenantry ({}) in {:.1}s; their pods run",
                tenantry_e2e::management::tenantry_image_reference()?,
                started.elapsed().as_secs_f64()
            );
            (None, Some(clusterctl))
        }
    };
    println!(
        "tenantry, CABPT, KubeVirt ({}), CDI, Kamaji, etcd and kubelet simulators running",
        if management.is_none() {
            "virt-api and virt-controller; simulated kubelet and virt-handler"
        } else {
            "simulated"
        }
    );
    Ok(Demo {
        nodes,
        cabpt,
        _tenantry: tenantry,
        _clusterctl: clusterctl,
        etcd,
        kamaji,
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
    tenantry_e2e::manifests::apply_object(&client, &cluster.kubernetes(), &cluster.namespace)
        .await?;
    tenantry_e2e::manifests::apply_object(&client, &cluster.nodes(), &cluster.namespace).await?;
    println!(
        "Kubernetes {ns}/{name} and its pool {ns}/{pool} ({workers} workers) created; waiting for the control plane",
        ns = cluster.namespace,
        name = cluster.name,
        pool = cluster.pool(),
        workers = cluster.workers,
    );
    let tenant = loop {
        if let Some(tenant) = demo
            .kamaji
            .tenant(&cluster.namespace, &cluster.capi_cluster())
        {
            break tenant;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // What a user downloads: admin.conf from the admin kubeconfig Secret.
    let tenant_kubeconfig = kubeconfig_dir.join(format!("{}.kubeconfig", cluster.name));
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &cluster.namespace);
    let value = loop {
        if let Some(value) = secrets
            .get_opt(&cluster.admin_kubeconfig_secret())
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get("admin.conf").cloned())
        {
            break value;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    std::fs::write(&tenant_kubeconfig, value.0)
        .with_context(|| format!("write {}", tenant_kubeconfig.display()))?;
    println!("tenant control plane at {}", tenant.endpoint);

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
        "all {} workers are up. Try:\n  {kubectl} get kubernetes,kubernetesnodes,machinedeployment,machines,kubevirtmachines,vms\n  {kubectl} --kubeconfig {} get nodes -o wide\nadd workers:\n  {kubectl} patch kubernetesnodes {} --type merge -p '{{\"spec\":{{\"minReplicas\":5}}}}'\nroll them to another Talos:\n  {kubectl} patch kubernetes {} --type merge -p '{{\"spec\":{{\"talos\":{{\"version\":\"v1.13.7\"}}}}}}'\ninject a fault:\n  {kubectl} annotate vmi <worker> sim.tenantry.dev/fail=",
        cluster.workers,
        tenant_kubeconfig.display(),
        cluster.pool(),
        cluster.name,
    );
    Ok(())
}
