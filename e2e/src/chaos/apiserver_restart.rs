//! Apiserver restart: kube-apiserver goes away and comes back on the same
//! etcd while a wave of machines is provisioned. Tenantry keeps running
//! (its watches and requests fail, then reconnect): it must not exit, and
//! the wave must converge with one VM per machine and delete cleanly.

use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::StdRng;

use super::kubevirt::KubevirtLab;
use super::lab::{self, Lab, ManagerSetup};
use super::proxmox::ProxmoxLab;
use super::{ChaosConfig, Outcome, Substrate, pause};

pub(super) const NAME: &str = "apiserver-restart";

/// The moment before each restart.
const BEFORE_RESTART: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(300)..=Duration::from_millis(2500);

pub(super) async fn run(
    config: &ChaosConfig,
    substrate: Substrate,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let mut rng = config.rng(NAME, substrate.name());
    let name = format!("chaos-apiserver-{}", substrate.name());
    match substrate {
        Substrate::Kubevirt => {
            let mut lab = KubevirtLab::start(config, &name, &ManagerSetup::single()).await?;
            restarts(&mut lab, config, &mut rng, outcome).await
        }
        Substrate::Proxmox => {
            let sim_seed = rng.random();
            let mut lab =
                ProxmoxLab::start(config, &name, &ManagerSetup::single(), sim_seed).await?;
            restarts(&mut lab, config, &mut rng, outcome).await
        }
    }
}

async fn restarts(
    lab: &mut impl Lab,
    config: &ChaosConfig,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let result = restart_steps(lab, config, rng, outcome).await;
    let failed = result.is_err() || !outcome.passed();
    lab::report_logs(lab, config.seed, outcome, failed);
    result
}

async fn restart_steps(
    lab: &mut impl Lab,
    config: &ChaosConfig,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let sizes = &config.sizes;
    let machines = sizes.restart_machines;
    outcome.count("machines asked for", machines);
    let (tenantry_before, _) = lab.tenantry_pids();

    let started = Instant::now();
    lab.create_machines(machines).await?;
    let mut moments = Vec::new();
    let mut longest_away = Duration::ZERO;
    for _ in 0..sizes.apiserver_restarts {
        pause(rng, BEFORE_RESTART).await;
        let now = lab::progress(lab).await?;
        if now.provisioned >= machines {
            break;
        }
        longest_away = longest_away.max(lab.restart_apiserver().await?);
        moments.push(format!("{}/{machines} provisioned", now.provisioned));
    }
    outcome.count("apiserver restarts during provisioning", moments.len());
    outcome.count(
        "longest apiserver restart (s)",
        format!("{:.1}", longest_away.as_secs_f64()),
    );
    outcome.note(format!("apiserver restarts at: {}", moments.join(", ")));
    if moments.len() < sizes.apiserver_restarts {
        outcome.note(format!(
            "only {} of {} restarts during provisioning: the wave was done before the rest",
            moments.len(),
            sizes.apiserver_restarts
        ));
    }
    match lab::wait_provisioned(lab, machines, sizes.converge_deadline).await {
        Ok(_) => outcome.count(
            "provisioning wall (s)",
            format!("{:.1}", started.elapsed().as_secs_f64()),
        ),
        Err(error) => outcome.fail(error.context("provisioning across apiserver restarts")),
    }
    let (tenantry_after, alive) = lab.tenantry_pids();
    let restarted = tenantry_before
        .iter()
        .zip(&tenantry_after)
        .filter(|(before, after)| before != after)
        .count()
        + usize::from(!alive);
    outcome.zero("tenantry restarts", restarted, || {
        format!("pids {tenantry_before:?} before, {tenantry_after:?} after, all alive: {alive}")
    });
    lab.count_provisioned(machines, outcome).await?;

    let started = Instant::now();
    lab.delete_machines().await?;
    match lab::wait_deleted(lab, sizes.converge_deadline).await {
        Ok(_) => outcome.count(
            "deletion wall (s)",
            format!("{:.1}", started.elapsed().as_secs_f64()),
        ),
        Err(error) => outcome.fail(error.context("deletion after apiserver restarts")),
    }
    lab.count_leftovers(outcome).await?;
    Ok(())
}
