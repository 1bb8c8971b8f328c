//! Chaos tests: whatever fails — the manager killed with SIGKILL, the
//! hypervisor answering errors, slowly or not at all, the apiserver
//! restarting — no machine is lost, none is duplicated, nothing is orphaned,
//! and the system converges. `README.md` next to this file says what each
//! scenario does and checks; `tests/chaos.rs` runs them and prints the
//! counts.
//!
//! The worlds are the benchmark's (`crate::bench`): a fresh control plane,
//! the simulator, a Cluster with its infrastructure cluster, and machines
//! owned by Cluster API Machines with ready bootstrap data (Cluster API core
//! off). Tenantry runs as separate processes ([`Replicas`]) so it can be
//! killed.

mod apiserver_restart;
mod audit;
mod crash_storm;
mod hypervisor_faults;
mod identity;
mod kubevirt;
mod lab;
mod leader_handover;
mod proxmox;
mod rbac_revoke;
mod replicas;
mod scenario;

use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng as _;
use rand::rngs::StdRng;

pub use replicas::Replicas;

use apiserver_restart::ApiserverRestart;
use crash_storm::CrashStorm;
use leader_handover::LeaderHandover;
use rbac_revoke::RbacRevoke;
use scenario::Scenario as _;

/// How big a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// For CI: well within 8 minutes on two cores.
    Small,
    /// For a manual run (`CHAOS_SCALE=full`, with `--release`).
    Full,
}

/// The sizes of a run.
#[derive(Clone, Debug)]
pub struct Sizes {
    /// Machines of a crash storm.
    pub storm_machines: usize,
    /// Kills while the storm's machines are provisioned.
    pub kills_provisioning: usize,
    /// Kills while they are deleted.
    pub kills_deleting: usize,
    /// Machines provisioned under hypervisor faults.
    pub fault_machines: usize,
    /// How long the faults last (shorter when every machine is provisioned
    /// before).
    pub fault_window: Duration,
    /// How long one node stays offline within the fault window.
    pub node_offline: Duration,
    /// Machines provisioned while the apiserver restarts.
    pub restart_machines: usize,
    /// Apiserver restarts while they are provisioned.
    pub apiserver_restarts: usize,
    /// Machines provisioned and deleted while tenantry's RBAC is revoked
    /// and restored.
    pub revoke_machines: usize,
    /// How long each revocation lasts.
    pub revoke_window: Duration,
    /// Machines provisioned while the leader replica is killed.
    pub handover_machines: usize,
    /// Leader kills while they are provisioned.
    pub handovers: usize,
    /// Upper bound for a wave to converge: generous, never measured.
    pub converge_deadline: Duration,
}

impl Scale {
    /// `CHAOS_SCALE`: `full`, or small when unset.
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var("CHAOS_SCALE").as_deref() {
            Err(_) | Ok("" | "small") => Ok(Scale::Small),
            Ok("full") => Ok(Scale::Full),
            Ok(other) => anyhow::bail!("CHAOS_SCALE={other}: expected small or full"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::Small => "small",
            Scale::Full => "full",
        }
    }

    pub fn sizes(self) -> Sizes {
        match self {
            Scale::Small => Sizes {
                storm_machines: 20,
                kills_provisioning: 6,
                kills_deleting: 3,
                fault_machines: 20,
                fault_window: Duration::from_secs(30),
                node_offline: Duration::from_secs(12),
                restart_machines: 20,
                apiserver_restarts: 2,
                revoke_machines: 20,
                revoke_window: Duration::from_secs(10),
                handover_machines: 20,
                handovers: 2,
                // An upper bound, not a figure: on a loaded machine the
                // restarts alone take minutes.
                converge_deadline: Duration::from_secs(300),
            },
            Scale::Full => Sizes {
                storm_machines: 100,
                kills_provisioning: 20,
                kills_deleting: 10,
                fault_machines: 100,
                fault_window: Duration::from_secs(90),
                node_offline: Duration::from_secs(30),
                restart_machines: 100,
                apiserver_restarts: 2,
                revoke_machines: 100,
                revoke_window: Duration::from_secs(30),
                handover_machines: 100,
                handovers: 4,
                converge_deadline: Duration::from_secs(600),
            },
        }
    }
}

/// `CHAOS_SEED`, or one from the clock.
pub fn seed_from_env() -> anyhow::Result<u64> {
    match std::env::var("CHAOS_SEED") {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("CHAOS_SEED={text}: {e}")),
        _ => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default()),
    }
}

/// What a run needs.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    /// Every random choice follows from it (see [`ChaosConfig::rng`]).
    pub seed: u64,
    pub scale: Scale,
    pub sizes: Sizes,
    /// The `tenantry` command line (`tenantry-under-test`).
    pub tenantry: PathBuf,
    /// Runs only scenarios whose `scenario/substrate` contains one of these;
    /// all when empty.
    pub only: Vec<String>,
}

impl ChaosConfig {
    /// The random choices of one scenario on one substrate: its own stream
    /// of the seed, so that running it alone replays it.
    fn rng(&self, scenario: &str, substrate: &str) -> StdRng {
        StdRng::seed_from_u64(self.seed ^ fnv1a(&format!("{scenario}/{substrate}")))
    }

    fn selected(&self, scenario: &str, substrate: &str) -> bool {
        let id = format!("{scenario}/{substrate}");
        self.only.is_empty() || self.only.iter().any(|f| id.contains(f.as_str()))
    }

    /// The benchmark's settings, for its world-building functions.
    fn bench(&self) -> anyhow::Result<crate::bench::BenchConfig> {
        Ok(crate::bench::BenchConfig {
            binaries: crate::bench::Binaries {
                tenantry: self.tenantry.clone(),
                upstream: crate::Upstream::locate()?.root().to_path_buf(),
            },
            deadline: Duration::from_secs(120),
            create_concurrency: 8,
        })
    }
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The substrates a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Substrate {
    Kubevirt,
    Proxmox,
}

impl Substrate {
    pub fn name(self) -> &'static str {
        match self {
            Substrate::Kubevirt => "kubevirt",
            Substrate::Proxmox => "proxmox",
        }
    }
}

/// What one scenario on one substrate counted and whether its checks held.
#[derive(Debug)]
pub struct Outcome {
    pub scenario: &'static str,
    pub substrate: Substrate,
    /// Counts in the order they were taken.
    pub counts: Vec<(String, String)>,
    /// Checks that failed, each saying what was expected and found.
    pub failures: Vec<String>,
    /// What is worth knowing but no check (e.g. fewer kills landed than
    /// asked for, because the wave was done first).
    pub notes: Vec<String>,
    pub elapsed: Duration,
}

impl Outcome {
    fn new(scenario: &'static str, substrate: Substrate) -> Self {
        Self {
            scenario,
            substrate,
            counts: Vec::new(),
            failures: Vec::new(),
            notes: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    fn count(&mut self, name: &str, value: impl std::fmt::Display) {
        self.counts.push((name.to_string(), value.to_string()));
    }

    /// Counts `value` and fails unless it is zero.
    fn zero(&mut self, name: &str, value: usize, detail: impl FnOnce() -> String) {
        self.count(name, value);
        if value != 0 {
            self.failures
                .push(format!("{name}: {value} ({})", detail()));
        }
    }

    /// Counts `value` and fails unless it is `expected`.
    fn exactly(&mut self, name: &str, value: usize, expected: usize) {
        self.count(name, value);
        if value != expected {
            self.failures
                .push(format!("{name}: {value}, expected {expected}"));
        }
    }

    /// Counts `items` and fails unless there are none, naming up to five.
    fn none(&mut self, name: &str, items: &[String]) {
        self.zero(name, items.len(), || lab::some_of(items, 5));
    }

    /// Counts a span of time in seconds, to a tenth.
    fn seconds(&mut self, name: &str, elapsed: Duration) {
        self.count(name, format!("{:.1}", elapsed.as_secs_f64()));
    }

    fn check(&mut self, holds: bool, failure: impl FnOnce() -> String) {
        if !holds {
            self.failures.push(failure());
        }
    }

    fn fail(&mut self, error: anyhow::Error) {
        self.failures.push(format!("{error:#}"));
    }

    fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The counts as one block, printed when the scenario ends.
    pub fn render(&self) -> String {
        let mut text = format!(
            "--- {} / {}: {} in {:.0} s\n",
            self.scenario,
            self.substrate.name(),
            if self.passed() { "PASS" } else { "FAIL" },
            self.elapsed.as_secs_f64()
        );
        let width = self.counts.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        for (name, value) in &self.counts {
            let _ = writeln!(text, "    {name:<width$}  {value}");
        }
        for note in &self.notes {
            let _ = writeln!(text, "    note: {note}");
        }
        for failure in &self.failures {
            let _ = writeln!(text, "    FAILED: {failure}");
        }
        text
    }
}

/// All outcomes as one table: a row per count, a column per scenario and
/// substrate.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut rows: Vec<String> = Vec::new();
    for outcome in outcomes {
        for (name, _) in &outcome.counts {
            if !rows.contains(name) {
                rows.push(name.clone());
            }
        }
    }
    let headers: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{} {}", o.scenario, o.substrate.name()))
        .collect();
    let cell = |outcome: &Outcome, row: &str| {
        outcome
            .counts
            .iter()
            .find(|(name, _)| name == row)
            .map_or_else(|| "-".to_string(), |(_, value)| value.clone())
    };
    let label_width = rows
        .iter()
        .map(String::len)
        .chain(["result".len()])
        .max()
        .unwrap_or(0);
    let widths: Vec<usize> = outcomes
        .iter()
        .zip(&headers)
        .map(|(outcome, header)| {
            rows.iter()
                .map(|row| cell(outcome, row).len())
                .chain([header.len(), 4])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    let line = |label: &str, cells: Vec<String>| {
        let mut line = format!("| {label:<label_width$} |");
        for (cell, width) in cells.iter().zip(&widths) {
            let _ = write!(line, " {cell:>width$} |");
        }
        line.push('\n');
        line
    };
    text.push_str(&line("", headers.clone()));
    let mut rule = format!("|{}|", "-".repeat(label_width + 2));
    for width in &widths {
        let _ = write!(rule, "{}:|", "-".repeat(width + 1));
    }
    text.push_str(&rule);
    text.push('\n');
    for row in &rows {
        text.push_str(&line(row, outcomes.iter().map(|o| cell(o, row)).collect()));
    }
    text.push_str(&line(
        "seconds",
        outcomes
            .iter()
            .map(|o| format!("{:.0}", o.elapsed.as_secs_f64()))
            .collect(),
    ));
    text.push_str(&line(
        "result",
        outcomes
            .iter()
            .map(|o| if o.passed() { "PASS" } else { "FAIL" }.to_string())
            .collect(),
    ));
    text
}

/// Runs the selected scenarios one after the other, printing each one's
/// counts as it ends.
pub async fn run(config: &ChaosConfig) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let plan: [(&'static str, Substrate); 9] = [
        (CrashStorm::NAME, Substrate::Kubevirt),
        (CrashStorm::NAME, Substrate::Proxmox),
        (hypervisor_faults::NAME, Substrate::Proxmox),
        (ApiserverRestart::NAME, Substrate::Kubevirt),
        (ApiserverRestart::NAME, Substrate::Proxmox),
        (RbacRevoke::NAME, Substrate::Kubevirt),
        (RbacRevoke::NAME, Substrate::Proxmox),
        (LeaderHandover::NAME, Substrate::Kubevirt),
        (LeaderHandover::NAME, Substrate::Proxmox),
    ];
    for (scenario, substrate) in plan {
        if !config.selected(scenario, substrate.name()) {
            continue;
        }
        eprintln!("==> {scenario} / {}", substrate.name());
        let started = Instant::now();
        let mut outcome = Outcome::new(scenario, substrate);
        let result = match scenario {
            CrashStorm::NAME => scenario::run::<CrashStorm>(config, substrate, &mut outcome).await,
            hypervisor_faults::NAME => hypervisor_faults::run(config, &mut outcome).await,
            ApiserverRestart::NAME => {
                scenario::run::<ApiserverRestart>(config, substrate, &mut outcome).await
            }
            RbacRevoke::NAME => scenario::run::<RbacRevoke>(config, substrate, &mut outcome).await,
            _ => scenario::run::<LeaderHandover>(config, substrate, &mut outcome).await,
        };
        if let Err(error) = result {
            outcome.fail(error);
        }
        outcome.elapsed = started.elapsed();
        println!("{}", outcome.render());
        outcomes.push(outcome);
    }
    outcomes
}

/// The bounds of a random moment, in milliseconds (for [`pause`]).
const fn millis(low: u64, high: u64) -> RangeInclusive<Duration> {
    Duration::from_millis(low)..=Duration::from_millis(high)
}

/// Sleeps for a random moment in `range`.
async fn pause(rng: &mut StdRng, range: RangeInclusive<Duration>) {
    use rand::Rng as _;
    let (low, high) = (range.start().as_millis(), range.end().as_millis());
    let millis = rng.random_range(low..=high.max(low));
    tokio::time::sleep(Duration::from_millis(millis as u64)).await;
}
