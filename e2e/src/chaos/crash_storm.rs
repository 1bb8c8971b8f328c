//! Crash storm: tenantry is killed with SIGKILL at random moments while a
//! wave of machines is provisioned, and again while it is deleted, and
//! started again each time. Every step of a reconcile is recorded before the
//! next, so each new process must pick up where the last one stopped:
//! every machine gets exactly one VM, and deleting leaves nothing behind.

use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::StdRng;

use super::kubevirt::KubevirtLab;
use super::lab::{self, Lab, ManagerSetup, Progress};
use super::proxmox::ProxmoxLab;
use super::{ChaosConfig, Outcome, Substrate, pause};

pub(super) const NAME: &str = "crash-storm";

/// The quiet moment before each kill: long enough for a new process to get
/// some work done, short enough for the kills to land within a wave.
const BETWEEN_KILLS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(200)..=Duration::from_millis(1500);

pub(super) async fn run(
    config: &ChaosConfig,
    substrate: Substrate,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let mut rng = config.rng(NAME, substrate.name());
    let name = format!("chaos-storm-{}", substrate.name());
    match substrate {
        Substrate::Kubevirt => {
            let mut lab = KubevirtLab::start(config, &name, &ManagerSetup::single()).await?;
            storm(&mut lab, config, &mut rng, outcome).await
        }
        Substrate::Proxmox => {
            let sim_seed = rng.random();
            let mut lab =
                ProxmoxLab::start(config, &name, &ManagerSetup::single(), sim_seed).await?;
            storm(&mut lab, config, &mut rng, outcome).await
        }
    }
}

async fn storm(
    lab: &mut impl Lab,
    config: &ChaosConfig,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let result = storm_steps(lab, config, rng, outcome).await;
    let failed = result.is_err() || !outcome.passed();
    lab::report_logs(lab, config.seed, outcome, failed);
    result
}

async fn storm_steps(
    lab: &mut impl Lab,
    config: &ChaosConfig,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let sizes = &config.sizes;
    let machines = sizes.storm_machines;
    outcome.count("machines asked for", machines);

    let started = Instant::now();
    lab.create_machines(machines).await?;
    let kills = kill_while(lab, rng, sizes.kills_provisioning, |p| {
        p.provisioned >= machines
    })
    .await?;
    kills.record(outcome, "provisioning", sizes.kills_provisioning, machines);
    match lab::wait_provisioned(lab, machines, sizes.converge_deadline).await {
        Ok(_) => outcome.count(
            "provisioning wall (s)",
            format!("{:.1}", started.elapsed().as_secs_f64()),
        ),
        Err(error) => outcome.fail(error.context("provisioning under kills")),
    }
    lab.count_provisioned(machines, outcome).await?;

    let started = Instant::now();
    lab.delete_machines().await?;
    let kills = kill_while(lab, rng, sizes.kills_deleting, |p| p.machines == 0).await?;
    kills.record(outcome, "deletion", sizes.kills_deleting, machines);
    match lab::wait_deleted(lab, sizes.converge_deadline).await {
        Ok(_) => outcome.count(
            "deletion wall (s)",
            format!("{:.1}", started.elapsed().as_secs_f64()),
        ),
        Err(error) => outcome.fail(error.context("deletion under kills")),
    }
    lab.count_leftovers(outcome).await?;
    Ok(())
}

/// The kills of one wave.
struct Kills {
    /// How far the wave was at each kill.
    at: Vec<Progress>,
    /// The longest a restarted process took to answer `/healthz`.
    slowest_restart: Duration,
}

impl Kills {
    fn record(&self, outcome: &mut Outcome, wave: &str, asked: usize, machines: usize) {
        outcome.count(&format!("kills during {wave}"), self.at.len());
        outcome.count(
            &format!("slowest restart during {wave} (s)"),
            format!("{:.1}", self.slowest_restart.as_secs_f64()),
        );
        let moments: Vec<String> = self
            .at
            .iter()
            .map(|p| {
                if wave == "deletion" {
                    format!("{} left", p.machines)
                } else {
                    format!("{}/{machines} provisioned", p.provisioned)
                }
            })
            .collect();
        outcome.note(format!("{wave} kills at: {}", moments.join(", ")));
        if self.at.len() < asked {
            outcome.note(format!(
                "only {} of {asked} kills during {wave}: the wave was done before the rest",
                self.at.len()
            ));
        }
    }
}

/// Kills tenantry (replica 0) up to `kills` times at random moments,
/// restarting it right away each time, until `done` holds for the wave.
async fn kill_while(
    lab: &mut impl Lab,
    rng: &mut StdRng,
    kills: usize,
    done: impl Fn(&Progress) -> bool,
) -> anyhow::Result<Kills> {
    let mut result = Kills {
        at: Vec::new(),
        slowest_restart: Duration::ZERO,
    };
    for _ in 0..kills {
        pause(rng, BETWEEN_KILLS).await;
        let now = lab::progress(lab).await?;
        if done(&now) {
            break;
        }
        let restart = lab.kill_and_restart(0).await?;
        result.slowest_restart = result.slowest_restart.max(restart);
        result.at.push(now);
    }
    Ok(result)
}
