//! The local sandbox: a real control plane with the Cluster API core manager,
//! running until Ctrl-C or SIGTERM. `hack/sandbox.sh` builds what is missing
//! and runs this.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tenantry_e2e::{
    ClusterApiManager, ControlPlane, ControlPlaneOptions, Upstream, upstream::Binary,
};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(about = "Run tenantry's local sandbox until Ctrl-C or SIGTERM")]
struct Args {
    /// Where to write the admin kubeconfig.
    #[arg(long, default_value = ".sandbox/kubeconfig")]
    kubeconfig: PathBuf,
    /// Start only the control plane, without the Cluster API manager.
    #[arg(long)]
    no_cluster_api: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // kube's client logs every failed request at error level; while the
    // apiserver comes up those failures are expected polling, not news.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube_client::client::builder=off".into());
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
    println!("sandbox running; Ctrl-C to stop");

    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    println!("stopping");
    if let Some(manager) = cluster_api {
        manager.stop();
    }
    control_plane.stop();
    let _ = std::fs::remove_file(&args.kubeconfig);
    println!("stopped");
    Ok(())
}
