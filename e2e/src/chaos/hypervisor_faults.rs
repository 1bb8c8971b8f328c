//! Hypervisor faults: a wave of machines is provisioned while Proxmox VE
//! misbehaves — calls answer 5xx, tasks fail, answers come late or stop
//! halfway, a node drops out of the cluster and comes back. While it does,
//! every machine not yet provisioned must say what it waits for or what
//! failed (`Ready=False` with a reason and a message); once the faults
//! stop, the wave must converge with exactly one VM per machine and no
//! address leased twice, and delete cleanly.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::StdRng;
use tenantry_provider::proxmox::machine::status::Reason;

use super::lab::{Lab, ManagerSetup};
use super::proxmox::ProxmoxLab;
use super::scenario::{self, Wave};
use super::{ChaosConfig, Outcome, Sizes, pause};
use crate::sim::proxmox::{DropMode, FaultId, Faults, RequestMatch, Trigger};

pub(super) const NAME: &str = "hypervisor-faults";

/// The node that drops out for a while (the template lives on `pve1`).
const OFFLINE_NODE: &str = "pve2";
/// A machine gets this long after the wave starts before its conditions
/// are checked: its first reconcile may itself meet a fault.
const FIRST_LOOK: Duration = Duration::from_secs(10);
/// How often the machines' conditions are looked at while faults are on.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The task types the wave runs (`qmresize` answers at once here).
const TASK_TYPES: [&str; 7] = [
    "qmclone",
    "qmconfig",
    "imgcopy",
    "qmstart",
    "qmstop",
    "qmdestroy",
    "imgdel",
];

/// Proxmox only: the faults are the simulator's.
pub(super) async fn run(config: &ChaosConfig, outcome: &mut Outcome) -> anyhow::Result<()> {
    let mut rng = config.rng(NAME, "proxmox");
    let lab = ProxmoxLab::start(
        config,
        "chaos-faults-proxmox",
        &ManagerSetup::single(),
        rng.random(),
    )
    .await?;
    let result = faults(&lab, &config.sizes, &mut rng, outcome).await;
    scenario::conclude(&lab, config.seed, outcome, result)
}

/// The faults installed, by what a report calls them.
struct Installed(Vec<(&'static str, FaultId)>);

impl Installed {
    /// About 10 % of calls answer 5xx (half 500 with PVE's text, half 503),
    /// 3 % of answers stop halfway, 10 % come 0.5 s late and 3 % 2 s late;
    /// 10 % of tasks of each type fail.
    fn install(faults: &Faults) -> Self {
        let any = RequestMatch::everything;
        let mut installed = vec![
            (
                "5xx answers",
                faults.http_error(
                    any(),
                    500,
                    "Internal Server Error",
                    Trigger::Probability(0.05),
                ),
            ),
            (
                "5xx answers",
                faults.http_error(
                    any(),
                    503,
                    "Service Unavailable",
                    Trigger::Probability(0.05),
                ),
            ),
            (
                "answers cut off mid-response",
                faults.drop_connection(any(), DropMode::MidResponse, Trigger::Probability(0.03)),
            ),
            (
                "answers delayed (0.5 s or 2 s)",
                faults.latency(
                    any(),
                    Duration::from_millis(500),
                    Trigger::Probability(0.10),
                ),
            ),
            (
                "answers delayed (0.5 s or 2 s)",
                faults.latency(any(), Duration::from_secs(2), Trigger::Probability(0.03)),
            ),
        ];
        for task in TASK_TYPES {
            installed.push((
                "tasks failed",
                faults.fail_tasks(
                    task,
                    &format!("{task}: command failed: exit code 1 (injected)"),
                    Trigger::Probability(0.10),
                ),
            ));
        }
        Self(installed)
    }

    /// How often each kind fired.
    fn fired(&self, faults: &Faults) -> BTreeMap<&'static str, u64> {
        let mut fired = BTreeMap::new();
        for (kind, id) in &self.0 {
            *fired.entry(*kind).or_default() += faults.fired(*id);
        }
        fired
    }
}

/// What the machines said while the faults were on.
#[derive(Default)]
struct Sampled {
    /// Machine-moments looked at.
    samples: usize,
    /// Ready reasons seen, with how many machine-moments showed each.
    reasons: BTreeMap<String, usize>,
    /// Machine-moments without a `Ready=False` naming a reason and saying
    /// something.
    silent: Vec<String>,
    /// Ready reasons of machines on the offline node, once it had been
    /// offline for a while.
    on_offline_node: BTreeMap<String, usize>,
    /// An example message per reason.
    examples: BTreeMap<String, String>,
}

impl Sampled {
    async fn take(&mut self, lab: &ProxmoxLab, node_offline_long: bool) -> anyhow::Result<usize> {
        let machines = lab.machines().await?;
        let mut provisioned = 0;
        for machine in &machines {
            if crate::bench::infrastructure_provisioned(machine) {
                provisioned += 1;
                continue;
            }
            self.samples += 1;
            let name = machine.metadata.name.clone().unwrap_or_default();
            let ready = machine.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready");
            let Some(ready) = ready else {
                self.silent.push(format!("{name}: no Ready condition"));
                continue;
            };
            let status = ready["status"].as_str().unwrap_or_default();
            let reason = ready["reason"].as_str().unwrap_or_default().to_string();
            let message = ready["message"].as_str().unwrap_or_default();
            if status != "False" || reason.is_empty() || message.is_empty() {
                self.silent.push(format!(
                    "{name}: Ready={status:?} reason={reason:?} message={message:?}"
                ));
                continue;
            }
            *self.reasons.entry(reason.clone()).or_default() += 1;
            self.examples
                .entry(reason.clone())
                .or_insert_with(|| message.to_string());
            if node_offline_long && machine.data["status"]["proxmoxNode"] == OFFLINE_NODE {
                *self.on_offline_node.entry(reason).or_default() += 1;
            }
        }
        Ok(provisioned)
    }
}

async fn faults(
    lab: &ProxmoxLab,
    sizes: &Sizes,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let wave = Wave::new(sizes.fault_machines, sizes.converge_deadline);
    let machines = wave.machines;
    outcome.count("machines asked for", machines);
    let faults = lab.sim().faults();
    let installed = Installed::install(&faults);

    let started = Instant::now();
    let wall = wave.create(lab).await?;
    let offline_after = Duration::from_millis(rng.random_range(2_000..=5_000));
    let mut offline_since: Option<Instant> = None;
    let mut offline_total = Duration::ZERO;
    let mut sampled = Sampled::default();
    loop {
        pause(rng, SAMPLE_EVERY..=SAMPLE_EVERY).await;
        let elapsed = started.elapsed();
        match offline_since {
            None if offline_total.is_zero() && elapsed >= offline_after => {
                faults.set_node_online(OFFLINE_NODE, false)?;
                offline_since = Some(Instant::now());
            }
            Some(since) if since.elapsed() >= sizes.node_offline => {
                faults.set_node_online(OFFLINE_NODE, true)?;
                offline_total = since.elapsed();
                offline_since = None;
            }
            _ => {}
        }
        if elapsed < FIRST_LOOK {
            continue;
        }
        let offline_long = offline_since.is_some_and(|s| s.elapsed() >= FIRST_LOOK);
        let provisioned = sampled.take(lab, offline_long).await?;
        if elapsed >= sizes.fault_window || provisioned >= machines {
            break;
        }
    }
    if let Some(since) = offline_since {
        offline_total = since.elapsed();
    }
    let fired = installed.fired(&faults);
    faults.clear();
    let window = started.elapsed();

    outcome.count("fault window (s)", format!("{:.0}", window.as_secs_f64()));
    for (kind, count) in &fired {
        outcome.count(kind, count);
    }
    outcome.count(
        &format!("node {OFFLINE_NODE} offline (s)"),
        format!("{:.0}", offline_total.as_secs_f64()),
    );
    outcome.count("machine-moments looked at", sampled.samples);
    outcome.count("distinct Ready reasons seen", sampled.reasons.len());
    outcome.note(format!(
        "Ready reasons while faults were on (machine-moments): {}",
        tally(&sampled.reasons)
    ));
    for (reason, example) in &sampled.examples {
        outcome.note(format!("e.g. {reason}: {example}"));
    }
    outcome.note(format!(
        "Ready reasons of unprovisioned machines on {OFFLINE_NODE} while it was offline: {}",
        tally(&sampled.on_offline_node)
    ));
    outcome.none(
        "machine-moments without a Ready=False reason",
        &sampled.silent,
    );
    let failures_shown: usize = sampled
        .reasons
        .iter()
        .filter(|(reason, _)| Reason::parse(reason).is_some_and(Reason::is_failure))
        .map(|(_, n)| n)
        .sum();
    outcome.count("machine-moments naming a failure", failures_shown);
    let failed_tasks = fired.get("tasks failed").copied().unwrap_or(0)
        + fired.get("5xx answers").copied().unwrap_or(0);
    outcome.check(failed_tasks == 0 || failures_shown > 0, || {
        format!(
            "{failed_tasks} tasks and calls failed, yet no machine ever said a step failed (reasons seen: {:?})",
            sampled.reasons.keys().collect::<Vec<_>>()
        )
    });

    let converged = wave
        .wait_provisioned(lab, outcome, wall, "provisioning after the faults stopped")
        .await;
    if let Some(after) = converged {
        outcome.seconds("converged after faults stopped (s)", after);
    }
    lab.count_provisioned(machines, outcome).await?;

    wave.delete_and_count_leftovers(lab, outcome, "deletion")
        .await
}

/// Reasons with how often each was seen, as `reason n, reason n`.
fn tally(reasons: &BTreeMap<String, usize>) -> String {
    reasons
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
