//! `tenantry`: the manager binary.

use clap::Parser;
use tenantry_provider::telemetry::{self, LogFormat};

/// Cluster API infrastructure provider for KubeVirt and Proxmox VE, and the
/// tenant companion controller for Kamaji control planes.
#[derive(Parser, Debug)]
#[command(name = "tenantry", version, about)]
struct Args {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "TENANTRY_LOG_FORMAT")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);
    let client = kube::Client::try_default().await?;
    let version = client.apiserver_version().await?;
    tracing::info!(
        apiserver = %version.git_version,
        "connected; no controllers are registered in this build yet"
    );
    Ok(())
}
