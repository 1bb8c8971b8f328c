//! `pve-sim`: the Proxmox VE API simulator as a standalone HTTPS server.
//!
//! It starts like a freshly installed cluster — the nodes and storages given
//! by flags or a YAML file, one `root@pam` API token — and prints its URL,
//! the CA certificate path and that token. Everything else (users, tokens,
//! roles, ACLs, pools, templates) is created through the PVE API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tenantry_e2e::sim::proxmox::{NodeSpec, PveSimConfig, PveSimulator, StorageSpec};

#[derive(Debug, Parser)]
#[command(
    name = "pve-sim",
    about = "Proxmox VE API simulator (HTTPS, /api2/json)"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "PVE_SIM_LISTEN")]
    listen: Option<SocketAddr>,

    /// YAML config file (nodes, storages, timings, faults); flags override it.
    #[arg(long, env = "PVE_SIM_CONFIG")]
    config: Option<PathBuf>,

    /// Nodes as `name[:cpus[:memory]]`, comma-separated, e.g. `pve1:16:64G,pve2`.
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<NodeSpec>,

    /// Storages as `id:type:content[:shared][:size]` with content
    /// comma-separated; repeat the flag or separate storages with `;`,
    /// e.g. `local:dir:iso,images;ceph:rbd:images:shared`.
    #[arg(long, value_delimiter = ';')]
    storages: Vec<StorageSpec>,

    /// Delay of every 401 answer, in milliseconds (PVE: 3000).
    #[arg(long)]
    auth_delay_ms: Option<u64>,

    /// Default task duration, in milliseconds.
    #[arg(long)]
    task_ms: Option<u64>,

    /// Time from `qmstart` finishing to the guest agent answering, in ms.
    #[arg(long)]
    guest_boot_ms: Option<u64>,

    /// Seed for MACs, UUIDs, token secrets and fault probabilities.
    #[arg(long)]
    seed: Option<u64>,

    /// Name of the root@pam API token created at start.
    #[arg(long)]
    root_token_name: Option<String>,

    /// Directory for `ca.pem` and `credentials.env` (default: a new
    /// directory under the system temp dir).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let mut config = match &args.config {
        Some(path) => PveSimConfig::from_file(path)?,
        None => PveSimConfig::standalone(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if !args.nodes.is_empty() {
        config = config.with_nodes(args.nodes);
    }
    if !args.storages.is_empty() {
        config = config.with_storages(args.storages);
    }
    if let Some(ms) = args.auth_delay_ms {
        config.timings.auth_failure_delay = Duration::from_millis(ms);
    }
    if let Some(ms) = args.task_ms {
        config.timings.task = Duration::from_millis(ms);
    }
    if let Some(ms) = args.guest_boot_ms {
        config.timings.guest_boot = Duration::from_millis(ms);
    }
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    if let Some(name) = args.root_token_name {
        config.root_token_name = name;
    }

    let simulator = PveSimulator::start(config).await?;
    let state_dir = match args.state_dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("pve-sim-{}", simulator.local_addr().port())),
    };
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("create {}", state_dir.display()))?;
    let ca_path = state_dir.join("ca.pem");
    std::fs::write(&ca_path, simulator.ca_pem())
        .with_context(|| format!("write {}", ca_path.display()))?;
    let token = simulator.root_token();
    let base_url = simulator.url().as_str().trim_end_matches('/').to_string();
    let credentials = format!(
        "PROXMOX_URL={base_url}\nPROXMOX_TOKEN={}\nPROXMOX_SECRET={}\nPROXMOX_ROOT_CA={}\n",
        token.id,
        token.secret,
        ca_path.display()
    );
    let credentials_path = state_dir.join("credentials.env");
    tenantry_e2e::pki::write_private(&credentials_path, &credentials)?;

    println!("pve-sim listening on {}", simulator.api_url());
    println!("CA certificate: {}", ca_path.display());
    println!("credentials: {}", credentials_path.display());
    print!("{credentials}");

    tokio::signal::ctrl_c().await.context("wait for Ctrl-C")?;
    tracing::info!("pve-sim stopping");
    drop(simulator);
    Ok(())
}
