//! Crash storm: tenantry is killed with SIGKILL at random moments while a
//! wave of machines is provisioned, and again while it is deleted, and
//! started again each time. Every step of a reconcile is recorded before the
//! next, so each new process must pick up where the last one stopped:
//! every machine gets exactly one VM, and deleting leaves nothing behind.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::StdRng;

use super::lab::{self, Lab, Progress};
use super::scenario::{Scenario, Wave};
use super::{Outcome, Sizes, millis, pause};

/// The quiet moment before each kill: long enough for a new process to get
/// some work done, short enough for the kills to land within a wave.
const BETWEEN_KILLS: RangeInclusive<Duration> = millis(100, 800);
/// The moment after a kill point is reached and before the kill, so each
/// new process starts some work before it dies.
const AFTER_THRESHOLD: RangeInclusive<Duration> = millis(100, 500);
/// How often the wave's progress is read while waiting for a kill point.
const PROGRESS_POLL: Duration = Duration::from_millis(100);
/// The longest a kill waits for its point: a restarted manager can finish
/// dozens of machines at once, and a wave that outruns its kill points
/// would end with kills unspent.
const POINT_WAIT: Duration = Duration::from_millis(600);

pub(super) struct CrashStorm;

impl Scenario for CrashStorm {
    const NAME: &'static str = "crash-storm";
    const WORLD: &'static str = "chaos-storm";

    async fn steps(
        lab: &mut impl Lab,
        sizes: &Sizes,
        rng: &mut StdRng,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        let wave = Wave::new(sizes.storm_machines, sizes.converge_deadline);
        let machines = wave.machines;
        outcome.count("machines asked for", machines);

        let wall = wave.create(lab).await?;
        let kills =
            kill_while(lab, rng, sizes.kills_provisioning, &wave, |p| p.provisioned).await?;
        kills.record(outcome, "provisioning", sizes.kills_provisioning, machines);
        wave.wait_provisioned(lab, outcome, wall, "provisioning under kills")
            .await;
        lab.count_provisioned(machines, outcome).await?;

        let wall = wave.delete(lab).await?;
        let kills = kill_while(lab, rng, sizes.kills_deleting, &wave, |p| {
            machines.saturating_sub(p.machines)
        })
        .await?;
        kills.record(outcome, "deletion", sizes.kills_deleting, machines);
        wave.wait_deleted(lab, outcome, wall, "deletion under kills")
            .await;
        lab.count_leftovers(outcome).await
    }
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
        outcome.seconds(
            &format!("slowest restart during {wave} (s)"),
            self.slowest_restart,
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
                "only {} of {asked} kills during {wave}: the wave was done (or past its deadline) before the rest",
                self.at.len()
            ));
        }
    }
}

/// Kills tenantry (replica 0) up to `kills` times, restarting it right away
/// each time, while the wave runs. A third of the kills fall at random
/// moments before any machine is done (clones, DataVolumes and seeds are
/// made then); the rest wait (at most [`POINT_WAIT`]) for random points of
/// the wave (`done` of its machines), so kills are spread over all of it
/// rather than all landing in its first seconds. Past the wave's deadline it
/// stops killing.
async fn kill_while(
    lab: &mut impl Lab,
    rng: &mut StdRng,
    kills: usize,
    wave: &Wave,
    done: impl Fn(&Progress) -> usize,
) -> anyhow::Result<Kills> {
    let (machines, deadline) = (wave.machines, wave.deadline);
    let mut result = Kills {
        at: Vec::new(),
        slowest_restart: Duration::ZERO,
    };
    let early = kills.div_ceil(3);
    let mut points: Vec<usize> = (0..kills)
        .map(|i| {
            if i < early || machines < 2 {
                0
            } else {
                rng.random_range(1..machines)
            }
        })
        .collect();
    points.sort_unstable();
    let started = Instant::now();
    for point in points {
        if point == 0 {
            pause(rng, BETWEEN_KILLS).await;
        } else {
            // A stalled wave is the caller's to report; stop killing.
            let waiting = Instant::now();
            loop {
                let now = lab::progress(lab).await?;
                if done(&now) >= point
                    || waiting.elapsed() > POINT_WAIT
                    || started.elapsed() > deadline
                {
                    break;
                }
                tokio::time::sleep(PROGRESS_POLL).await;
            }
            pause(rng, AFTER_THRESHOLD).await;
        }
        let now = lab::progress(lab).await?;
        if done(&now) >= machines || started.elapsed() > deadline {
            break;
        }
        let restart = lab.kill_and_restart(0).await?;
        result.slowest_restart = result.slowest_restart.max(restart);
        result.at.push(now);
    }
    Ok(result)
}
