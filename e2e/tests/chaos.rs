//! Chaos tests (see `src/chaos/README.md`): tenantry killed, the hypervisor
//! failing, the apiserver restarting — no machine lost, none duplicated,
//! nothing orphaned, and the system converges. A test target with its own
//! `main`, so that it always prints its counts.
//!
//! `CHAOS_SEED=<n>` replays a run, `CHAOS_SCALE=full` runs the big sizes;
//! arguments pick scenarios (`crash-storm`, `proxmox`,
//! `hypervisor-faults/proxmox`, …).

use std::process::ExitCode;

use tenantry_e2e::chaos::{self, ChaosConfig, Scale};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            // The harness's own clients log each failed request while an
            // apiserver starts or restarts; the outcomes say what failed.
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "warn,kube_client::client=error,kube_client::client::builder=off".into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("chaos: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let seed = chaos::seed_from_env()?;
    let scale = Scale::from_env()?;
    // The seed first: whatever happens next, the run can be replayed.
    println!("chaos seed: {seed} (replay: CHAOS_SEED={seed})");
    println!("chaos scale: {}", scale.name());
    let config = ChaosConfig {
        seed,
        scale,
        sizes: scale.sizes(),
        tenantry: env!("CARGO_BIN_EXE_tenantry-under-test").into(),
        // Arguments cargo's own harness would take (`--nocapture`, …) are
        // not scenario names.
        only: std::env::args()
            .skip(1)
            .filter(|arg| !arg.starts_with('-'))
            .collect(),
    };
    let started = std::time::Instant::now();
    let outcomes = tokio::runtime::Runtime::new()?.block_on(chaos::run(&config));
    println!(
        "chaos summary (seed {seed}, scale {}, {:.0} s):",
        scale.name(),
        started.elapsed().as_secs_f64()
    );
    println!("{}", chaos::table(&outcomes));
    let failed: Vec<_> = outcomes.iter().filter(|o| !o.passed()).collect();
    for outcome in &failed {
        for failure in &outcome.failures {
            println!(
                "FAILED {} / {}: {failure}",
                outcome.scenario,
                outcome.substrate.name()
            );
        }
    }
    if outcomes.is_empty() {
        println!("no scenario matched {:?}", config.only);
        return Ok(false);
    }
    if !failed.is_empty() {
        println!(
            "replay: CHAOS_SEED={seed} CHAOS_SCALE={} cargo test -p tenantry-e2e --test chaos",
            scale.name()
        );
    }
    Ok(failed.is_empty())
}
