//! `bench`: tenantry side by side with the Go providers on the same harness.
//! See `docs/performance.md`; `hack/bench.sh` builds everything and runs it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use tenantry_e2e::Upstream;
use tenantry_e2e::bench::report::{self, Report};
use tenantry_e2e::bench::{self, BenchConfig, Binaries, Provider};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Substrate {
    Kubevirt,
    Proxmox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CapiMode {
    Off,
    On,
    Both,
}

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "tenantry against CAPK and capmox, side by side"
)]
struct Args {
    /// Substrates to run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Substrate::Kubevirt, Substrate::Proxmox])]
    substrates: Vec<Substrate>,
    /// Wave sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 500])]
    machines: Vec<usize>,
    /// Runs per provider and setting; absolute figures are their medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// With the Cluster API core manager off (providers driven directly),
    /// on (a MachineDeployment scaled 0 → N), or both.
    #[arg(long, value_enum, default_value_t = CapiMode::Both)]
    capi: CapiMode,
    /// Leave the peers out (tenantry alone, e.g. while profiling).
    #[arg(long)]
    no_peers: bool,
    /// The tenantry binary (a release build).
    #[arg(long)]
    tenantry: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results.json")]
    json: PathBuf,
    /// Concurrent requests of the benchmark's own object creation.
    #[arg(long, default_value_t = 16)]
    create_concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = BenchConfig {
        binaries: Binaries {
            tenantry: args
                .tenantry
                .clone()
                .unwrap_or_else(bench::providers::default_tenantry_binary),
            upstream: Upstream::locate()?.root().to_path_buf(),
        },
        deadline: Duration::from_secs(120),
        create_concurrency: args.create_concurrency,
    };
    anyhow::ensure!(
        config.binaries.tenantry.exists(),
        "no tenantry binary at {} (cargo build --release -p tenantry-provider)",
        config.binaries.tenantry.display()
    );
    let modes: &[bool] = match args.capi {
        CapiMode::Off => &[false],
        CapiMode::On => &[true],
        CapiMode::Both => &[false, true],
    };
    let mut runs = Vec::new();
    for substrate in &args.substrates {
        let peer = match substrate {
            Substrate::Kubevirt => Provider::Capk,
            Substrate::Proxmox => Provider::Capmox,
        };
        let mut providers = vec![Provider::Tenantry];
        if !args.no_peers {
            providers.push(peer);
        }
        for &with_capi in modes {
            for &machines in &args.machines {
                // Alternate the providers run by run, so that drift of the
                // machine (thermal, page cache) hits both alike.
                for round in 0..args.runs {
                    for &provider in &providers {
                        eprintln!(
                            "==> {substrate:?} · CAPI {} · {machines} machines · {} · run {}/{}",
                            if with_capi { "on" } else { "off" },
                            provider.name(),
                            round + 1,
                            args.runs
                        );
                        let result = match substrate {
                            Substrate::Kubevirt => {
                                bench::kubevirt::run(&config, provider, with_capi, machines).await
                            }
                            Substrate::Proxmox => {
                                bench::proxmox::run(&config, provider, with_capi, machines).await
                            }
                        }
                        .with_context(|| {
                            format!("{} on {substrate:?}, {machines} machines", provider.name())
                        })?;
                        eprintln!(
                            "    provisioned in {:.1}s ({:.1} req/machine), deleted in {:.1}s, peak RSS {:.0} MiB",
                            result.provision.wall_seconds,
                            result.provision.requests_per_machine,
                            result.delete.wall_seconds,
                            result.peak_rss_mib
                        );
                        runs.push(result);
                    }
                }
            }
        }
    }
    let comparisons = report::compare(&runs);
    print!("{}", report::table(&comparisons));
    let report = Report {
        generated: chrono::Utc::now().to_rfc3339(),
        host: format!(
            "{} cores, {}",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            std::env::consts::ARCH
        ),
        runs,
        comparisons,
    };
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", args.json.display()))?;
    eprintln!("\nJSON: {}", args.json.display());
    Ok(())
}
