//! How long a warm `ControlPlane::start()` takes (binaries built, caches hot).
//!
//! `cargo bench -p tenantry-e2e --bench control_plane_start [-- <runs>]`
//! prints a table: the time until kube-apiserver's `/readyz` answers `ok`,
//! and the time a graceful stop takes.

use std::time::{Duration, Instant};

use tenantry_e2e::{ControlPlane, ControlPlaneOptions};

struct Figures {
    label: &'static str,
    start: Vec<Duration>,
    stop: Vec<Duration>,
}

fn summary(samples: &[Duration]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let secs = |d: Duration| d.as_secs_f64();
    format!(
        "{:>7.2} {:>7.2} {:>7.2}",
        secs(sorted[0]),
        secs(sorted[sorted.len() / 2]),
        secs(sorted[sorted.len() - 1])
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; a bare number sets the run count.
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    let variants = [
        ("etcd + kube-apiserver", false),
        ("etcd + kube-apiserver + kube-controller-manager", true),
    ];
    // One unmeasured start warms the page cache for the binaries.
    ControlPlane::start().await?.stop();

    let mut table = Vec::new();
    for (label, controller_manager) in variants {
        let mut figures = Figures {
            label,
            start: Vec::new(),
            stop: Vec::new(),
        };
        for _ in 0..runs {
            let began = Instant::now();
            let control_plane = ControlPlane::start_with(ControlPlaneOptions {
                name: "bench".into(),
                controller_manager,
                ..Default::default()
            })
            .await?;
            figures.start.push(began.elapsed());
            let began = Instant::now();
            control_plane.stop();
            figures.stop.push(began.elapsed());
        }
        table.push(figures);
    }

    println!("\nControlPlane::start() until /readyz, warm, {runs} runs (seconds)");
    println!(
        "{:<50} {:>7} {:>7} {:>7}   stop: {:>5} {:>7} {:>7}",
        "variant", "min", "median", "max", "min", "median", "max"
    );
    for figures in &table {
        println!(
            "{:<50} {}   stop: {}",
            figures.label,
            summary(&figures.start),
            summary(&figures.stop)
        );
    }
    Ok(())
}
