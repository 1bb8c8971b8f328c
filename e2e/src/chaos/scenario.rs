//! What every scenario does the same way around its own disturbance: a
//! fresh lab on the substrate asked for, a wave of machines created, waited
//! for and deleted with each wait timed and checked, and the logs kept when
//! the scenario fails. A scenario's file keeps only what it does to the
//! wave and what it checks besides.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::StdRng;

use super::kubevirt::KubevirtLab;
use super::lab::{self, Lab, ManagerSetup, Progress};
use super::proxmox::ProxmoxLab;
use super::{ChaosConfig, Outcome, Sizes, Substrate, pause};

/// A scenario that runs the same steps on either substrate.
pub(super) trait Scenario {
    /// What arguments select it by (`scenario/substrate`); it also names
    /// its random stream.
    const NAME: &'static str;
    /// Its world's name, before `-<substrate>`.
    const WORLD: &'static str;

    /// How tenantry runs in its lab.
    fn setup() -> ManagerSetup {
        ManagerSetup::single()
    }

    /// What it does in the lab, and what it counts and checks.
    async fn steps(
        lab: &mut impl Lab,
        sizes: &Sizes,
        rng: &mut StdRng,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()>;
}

/// Runs scenario `S` on `substrate` in a fresh lab.
pub(super) async fn run<S: Scenario>(
    config: &ChaosConfig,
    substrate: Substrate,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let mut rng = config.rng(S::NAME, substrate.name());
    let name = format!("{}-{}", S::WORLD, substrate.name());
    match substrate {
        Substrate::Kubevirt => {
            let mut lab = KubevirtLab::start(config, &name, &S::setup()).await?;
            let result = S::steps(&mut lab, &config.sizes, &mut rng, outcome).await;
            conclude(&lab, config.seed, outcome, result)
        }
        Substrate::Proxmox => {
            // The simulator's faults are the stream's first draw.
            let sim_seed = rng.random();
            let mut lab = ProxmoxLab::start(config, &name, &S::setup(), sim_seed).await?;
            let result = S::steps(&mut lab, &config.sizes, &mut rng, outcome).await;
            conclude(&lab, config.seed, outcome, result)
        }
    }
}

/// Ends a scenario: keeps the logs (printing their tails when it failed,
/// by an error or a check) and passes its result on.
pub(super) fn conclude(
    lab: &impl Lab,
    seed: u64,
    outcome: &mut Outcome,
    result: anyhow::Result<()>,
) -> anyhow::Result<()> {
    let failed = result.is_err() || !outcome.passed();
    lab::report_logs(lab, seed, outcome, failed);
    result
}

/// Times a wave from a moment on; what it measured is counted under its
/// name once the wave converged.
pub(super) struct Stopwatch {
    count: &'static str,
    started: Instant,
}

impl Stopwatch {
    pub(super) fn start(count: &'static str) -> Self {
        Self {
            count,
            started: Instant::now(),
        }
    }

    fn count(&self, outcome: &mut Outcome) {
        outcome.seconds(self.count, self.started.elapsed());
    }
}

/// A wave of machines, and how long it may take to converge.
pub(super) struct Wave {
    pub machines: usize,
    pub deadline: Duration,
}

impl Wave {
    pub(super) fn new(machines: usize, deadline: Duration) -> Self {
        Self { machines, deadline }
    }

    /// Creates the machines; the stopwatch returned times the provisioning
    /// wall from before they were asked for.
    pub(super) async fn create(&self, lab: &impl Lab) -> anyhow::Result<Stopwatch> {
        let wall = Stopwatch::start("provisioning wall (s)");
        lab.create_machines(self.machines).await?;
        Ok(wall)
    }

    /// Waits a random moment of `range`, then reads how far the wave got:
    /// `None` once every machine is provisioned, when there is nothing left
    /// to disturb.
    pub(super) async fn still_provisioning(
        &self,
        lab: &impl Lab,
        rng: &mut StdRng,
        range: RangeInclusive<Duration>,
    ) -> anyhow::Result<Option<Progress>> {
        pause(rng, range).await;
        let now = lab::progress(lab).await?;
        Ok((now.provisioned < self.machines).then_some(now))
    }

    /// Waits until every machine is provisioned and counts what `wall`
    /// measured. A wave that does not converge within the deadline fails
    /// the outcome with `context` rather than ending the scenario: the
    /// counts that follow show how far it got. Returns how long the wait
    /// itself took, when the wave converged.
    pub(super) async fn wait_provisioned(
        &self,
        lab: &impl Lab,
        outcome: &mut Outcome,
        wall: Stopwatch,
        context: &'static str,
    ) -> Option<Duration> {
        match lab::wait_provisioned(lab, self.machines, self.deadline).await {
            Ok(waited) => {
                wall.count(outcome);
                Some(waited)
            }
            Err(error) => {
                outcome.fail(error.context(context));
                None
            }
        }
    }

    /// Deletes every machine; the stopwatch returned times the deletion
    /// wall from before they were deleted.
    pub(super) async fn delete(&self, lab: &impl Lab) -> anyhow::Result<Stopwatch> {
        let wall = Stopwatch::start("deletion wall (s)");
        lab.delete_machines().await?;
        Ok(wall)
    }

    /// Waits until no machine is left and counts what `wall` measured; as
    /// [`Wave::wait_provisioned`], a wave that does not converge fails the
    /// outcome with `context`.
    pub(super) async fn wait_deleted(
        &self,
        lab: &impl Lab,
        outcome: &mut Outcome,
        wall: Stopwatch,
        context: &'static str,
    ) {
        match lab::wait_deleted(lab, self.deadline).await {
            Ok(_) => wall.count(outcome),
            Err(error) => outcome.fail(error.context(context)),
        }
    }

    /// Deletes the wave with nothing disturbing it, waits until no machine
    /// is left and counts what is left behind.
    pub(super) async fn delete_and_count_leftovers(
        &self,
        lab: &impl Lab,
        outcome: &mut Outcome,
        context: &'static str,
    ) -> anyhow::Result<()> {
        let wall = self.delete(lab).await?;
        self.wait_deleted(lab, outcome, wall, context).await;
        lab.count_leftovers(outcome).await
    }
}

/// Counts the tenantry processes restarted (or exited) since they were
/// `before`, and fails unless none was: the scenario disturbed what
/// tenantry talks to, not tenantry.
pub(super) fn count_tenantry_restarts(lab: &mut impl Lab, before: &[u32], outcome: &mut Outcome) {
    let (after, alive) = lab.tenantry_pids();
    let restarted = before
        .iter()
        .zip(&after)
        .filter(|(before, after)| before != after)
        .count()
        + usize::from(!alive);
    outcome.zero("tenantry restarts", restarted, || {
        format!("pids {before:?} before, {after:?} after, all alive: {alive}")
    });
}

/// Notes when fewer disturbances (`what`, e.g. "kills during
/// provisioning") landed than were asked for.
pub(super) fn note_unspent(outcome: &mut Outcome, what: &str, landed: usize, asked: usize) {
    if landed < asked {
        outcome.note(format!(
            "only {landed} of {asked} {what}: the wave was done before the rest"
        ));
    }
}
