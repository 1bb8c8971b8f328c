//! `tenantry`: the manager binary.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tenantry_provider::runtime::ManagerConfig;
use tenantry_provider::telemetry::{self, LogFormat};
use tenantry_provider::webhook::WebhookConfig;

/// Cluster API infrastructure provider for KubeVirt and Proxmox VE, and the
/// tenant companion controller for Kamaji control planes.
#[derive(Parser, Debug)]
#[command(name = "tenantry", version, about)]
struct Args {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "TENANTRY_LOG_FORMAT", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controllers (and the admission webhooks) against the cluster
    /// of the ambient kubeconfig or in-cluster service account.
    Run(RunArgs),
    /// Print tenantry's CustomResourceDefinitions as YAML, or write one file
    /// per CRD into a folder.
    Crds {
        /// Folder to write `<group>_<plural>.yaml` files into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print clusterctl's `infrastructure-components.yaml`, or write it and
    /// `metadata.yaml` into a folder (see hack/release.sh).
    Components {
        /// Folder to write `infrastructure-components.yaml` and `metadata.yaml` into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Flags of `tenantry run`, named as Cluster API providers name them.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Watch only this namespace; all namespaces when unset or empty.
    #[arg(long, env = "TENANTRY_NAMESPACE")]
    namespace: Option<String>,
    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value>;
    /// all objects when unset or empty.
    #[arg(long)]
    watch_filter: Option<String>,
    /// Address of the admission webhook server.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_bind: SocketAddr,
    /// Folder with the webhook serving certificate (tls.crt, tls.key).
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs")]
    webhook_cert_dir: PathBuf,
    /// Do not serve admission webhooks.
    #[arg(long)]
    no_webhooks: bool,
    /// Address of the health endpoints (/healthz, /readyz).
    #[arg(long, default_value = "0.0.0.0:9440")]
    health_addr: SocketAddr,
    /// Key of Kamaji's <cluster>-admin-kubeconfig Secret used to reach
    /// tenant clusters: super-admin.svc inside the management cluster,
    /// super-admin.conf for a manager running outside it.
    #[arg(long, default_value = "super-admin.svc")]
    tenant_kubeconfig_key: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);
    match args.command {
        Command::Run(run) => tokio::runtime::Runtime::new()?.block_on(run_manager(run)),
        Command::Crds { out } => write_crds(out),
        Command::Components { out } => write_components(out),
    }
}

async fn run_manager(args: RunArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connect to the cluster")?;
    let version = client
        .apiserver_version()
        .await
        .context("read the apiserver version")?;
    tracing::info!(apiserver = %version.git_version, "connected");
    let config = ManagerConfig {
        // The release manifests pass `--namespace=` and `--watch-filter=` when
        // their clusterctl variables are left empty.
        namespace: args.namespace.filter(|n| !n.is_empty()),
        watch_filter: args.watch_filter.filter(|f| !f.is_empty()),
        instance: std::env::var("POD_NAME").ok(),
        webhook: (!args.no_webhooks).then_some(WebhookConfig {
            bind: args.webhook_bind,
            cert_dir: args.webhook_cert_dir,
        }),
        tenant_kubeconfig_key: Some(args.tenant_kubeconfig_key),
    };
    let health = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(args.health_addr)
        .await
        .with_context(|| format!("listen on {}", args.health_addr))?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, health).await {
            tracing::error!(%error, "health endpoints stopped");
        }
    });
    tenantry_provider::manager::run(client, config).await;
    tracing::info!("stopped");
    Ok(())
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    for crd in tenantry_api::crds::all() {
        let yaml = serde_norway::to_string(&crd)?;
        match &out {
            None => print!("---\n{yaml}"),
            Some(dir) => {
                let name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
                let path = dir.join(name);
                std::fs::create_dir_all(dir)?;
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn write_components(out: Option<PathBuf>) -> anyhow::Result<()> {
    use tenantry_provider::components;
    match out {
        None => print!("{}", components::infrastructure_components_yaml()),
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            for (name, text) in [
                (
                    "infrastructure-components.yaml",
                    components::infrastructure_components_yaml(),
                ),
                ("metadata.yaml", components::metadata_yaml()),
            ] {
                let path = dir.join(name);
                std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}
