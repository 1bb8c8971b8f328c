//! Tenantry as separate processes, one per replica, that a test can kill
//! with SIGKILL and start again: the benchmark's launcher
//! ([`crate::bench::providers::start`]) with the test's own arguments.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::bench::providers::{self, ProviderLaunch, RunningProvider};
use crate::bench::{Binaries, Provider};
use crate::control_plane::ControlPlane;

/// How long a started replica may take to answer `/healthz`.
const HEALTHY_DEADLINE: Duration = Duration::from_secs(60);

/// The running replicas of `tenantry run`. Dropping it kills them.
pub struct Replicas {
    binaries: Binaries,
    args: Vec<String>,
    /// Replica `i` authenticates with `kubeconfigs[i]` when there is one,
    /// else as the control plane's admin.
    kubeconfigs: Vec<PathBuf>,
    running: Vec<RunningProvider>,
    kills: usize,
}

impl Replicas {
    /// Starts `count` replicas of `tenantry run --no-webhooks` (what the
    /// benchmark runs) with `args` appended, each with its own health port,
    /// log (`tenantry-<n>.log` in the control plane's folder) and
    /// `POD_NAME=tenantry-<n>` (the identity a leader election uses), and
    /// waits until each answers `/healthz`. Replica `i` authenticates with
    /// `kubeconfigs[i]` when given (a user of its own), else as the admin.
    /// `CHAOS_TENANTRY_LOG` replaces their `RUST_LOG` (`info`).
    pub async fn start(
        binaries: Binaries,
        control_plane: &ControlPlane,
        count: usize,
        args: Vec<String>,
        kubeconfigs: Vec<PathBuf>,
    ) -> anyhow::Result<Self> {
        let mut replicas = Self {
            binaries,
            args,
            kubeconfigs,
            running: Vec::new(),
            kills: 0,
        };
        for replica in 0..count {
            let started = replicas.spawn(control_plane, replica).await?;
            replicas.running.push(started);
        }
        Ok(replicas)
    }

    async fn spawn(
        &self,
        control_plane: &ControlPlane,
        replica: usize,
    ) -> anyhow::Result<RunningProvider> {
        let instance = (replica + 1).to_string();
        let mut env = Vec::new();
        env.push(("POD_NAME".into(), format!("tenantry-{instance}")));
        if let Some(kubeconfig) = self.kubeconfigs.get(replica) {
            env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        }
        // Tenantry's own log filter, for digging into a failure.
        if let Ok(filter) = std::env::var("CHAOS_TENANTRY_LOG") {
            env.push(("RUST_LOG".into(), filter));
        }
        let mut running = providers::start(
            Provider::Tenantry,
            ProviderLaunch {
                binaries: &self.binaries,
                control_plane,
                env,
                args: self.args.clone(),
                instance: Some(instance),
            },
        )?;
        running.wait_healthy(HEALTHY_DEADLINE).await?;
        Ok(running)
    }

    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The process ids, by replica.
    pub fn pids(&self) -> Vec<u32> {
        self.running.iter().map(|r| r.process.pid()).collect()
    }

    /// Whether every replica still runs.
    pub fn all_alive(&mut self) -> bool {
        self.running
            .iter_mut()
            .all(|r| r.process.exit_status().is_none())
    }

    /// Kills replica `replica` with SIGKILL: nothing gets to finish.
    pub fn kill(&mut self, replica: usize) {
        self.running[replica].process.kill();
        self.kills += 1;
    }

    /// Starts replica `replica` again (same arguments, same log) and waits
    /// until it answers `/healthz`.
    pub async fn start_again(
        &mut self,
        control_plane: &ControlPlane,
        replica: usize,
    ) -> anyhow::Result<()> {
        self.running[replica] = self.spawn(control_plane, replica).await?;
        Ok(())
    }

    /// Kills replica `replica` and starts it again right away; returns how
    /// long it took until the new process answered `/healthz`.
    pub async fn kill_and_restart(
        &mut self,
        control_plane: &ControlPlane,
        replica: usize,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.kill(replica);
        self.start_again(control_plane, replica).await?;
        Ok(started.elapsed())
    }

    /// How many kills so far.
    pub fn kills(&self) -> usize {
        self.kills
    }

    /// The last lines of every replica's log, for a failure report.
    pub fn log_tails(&self, lines: usize) -> String {
        self.running
            .iter()
            .map(|r| {
                format!(
                    "---- {} log ----\n{}",
                    r.process.name(),
                    r.process.log_tail(lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Where each replica's log is (every life of a replica appends to one).
    pub fn log_paths(&self) -> Vec<std::path::PathBuf> {
        self.running
            .iter()
            .map(|r| r.process.log_path().to_path_buf())
            .collect()
    }

    /// Stops every replica (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        for replica in &mut self.running {
            replica.process.stop(grace);
        }
    }
}
