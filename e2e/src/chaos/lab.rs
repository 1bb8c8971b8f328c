//! What the scenarios do the same way on both substrates: a world with
//! tenantry running as replicas, a wave of machines, and the counts taken
//! while they are provisioned and after they are deleted.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams};

use super::audit::AuditLog;
use super::{Outcome, Replicas};
use crate::bench::Binaries;
use crate::control_plane::ControlPlane;

/// The user a replica authenticates as when it has an identity of its own
/// (`chaos-replica-<n>`; its `POD_NAME` is `tenantry-<n>`).
pub(crate) fn replica_user(replica: usize) -> String {
    format!("{REPLICA_USER_PREFIX}{}", replica + 1)
}

/// The prefix of every replica user (not the harness's `tenantry-admin`).
pub(crate) const REPLICA_USER_PREFIX: &str = "chaos-replica-";

/// The prefix of every replica's `POD_NAME`, which begins its Lease
/// identity (`tenantry-<n>_<uuid>`).
pub(crate) const REPLICA_POD_PREFIX: &str = "tenantry-";

/// The name of the leader Lease (tenantry's default election id).
pub(crate) const LEASE: &str = "tenantry-manager-leader";

/// How tenantry runs in a lab.
#[derive(Debug, Default)]
pub(crate) struct ManagerSetup {
    pub replicas: usize,
    /// Each replica authenticates as a user of its own
    /// ([`replica_user`]) bound to the release's ClusterRole, instead of
    /// as the cluster admin.
    pub own_identity: bool,
    /// `--leader-elect`, the Lease in the world's namespace.
    pub leader_election: bool,
    /// kube-apiserver keeps an audit log of writes.
    pub audit: bool,
}

impl ManagerSetup {
    /// One replica, as the cluster admin.
    pub(crate) fn single() -> Self {
        Self {
            replicas: 1,
            ..Self::default()
        }
    }

    /// The audit log to start the control plane with, if any, and the
    /// kube-apiserver arguments that keep it.
    pub(crate) fn audit_log(&self) -> anyhow::Result<(Option<AuditLog>, Vec<String>)> {
        let audit = self.audit.then(AuditLog::new).transpose()?;
        let apiserver_args = audit
            .as_ref()
            .map(AuditLog::apiserver_args)
            .unwrap_or_default();
        Ok((audit, apiserver_args))
    }

    /// Grants the replicas' users their role and starts the replicas
    /// against `control_plane`, the Lease (if any) in `namespace`.
    pub(crate) async fn start_replicas(
        &self,
        binaries: Binaries,
        control_plane: &ControlPlane,
        namespace: &str,
    ) -> anyhow::Result<Replicas> {
        let (args, kubeconfigs) = self.prepare(control_plane, namespace).await?;
        Replicas::start(binaries, control_plane, self.replicas, args, kubeconfigs).await
    }

    /// Grants the replicas' users their role, and returns the replicas'
    /// extra arguments and kubeconfigs.
    async fn prepare(
        &self,
        control_plane: &ControlPlane,
        namespace: &str,
    ) -> anyhow::Result<(Vec<String>, Vec<std::path::PathBuf>)> {
        let mut kubeconfigs = Vec::new();
        if self.own_identity {
            for replica in 0..self.replicas {
                let user = replica_user(replica);
                super::identity::grant_release_role(&control_plane.client(), &user).await?;
                kubeconfigs.push(control_plane.user_kubeconfig(&user, &[])?);
            }
        }
        let args = if self.leader_election {
            vec![
                "--leader-elect".to_string(),
                format!("--leader-election-namespace={namespace}"),
                format!("--leader-election-id={LEASE}"),
            ]
        } else {
            Vec::new()
        };
        Ok((args, kubeconfigs))
    }
}

/// How often the scenarios look at the machines while waiting.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// How far a wave got.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Progress {
    /// Infrastructure machines that exist.
    pub machines: usize,
    /// Of those, the ones that say they are provisioned.
    pub provisioned: usize,
}

/// One substrate's world with tenantry running as [`Replicas`].
pub(crate) trait Lab {
    /// The control plane tenantry runs against.
    fn control_plane(&self) -> &ControlPlane;

    /// The tenantry replicas and the control plane they run against,
    /// borrowed together so that a replica can be started against it.
    fn replicas_and_control_plane(&mut self) -> (&mut Replicas, &mut ControlPlane);

    /// The tenantry replicas.
    fn replicas(&mut self) -> &mut Replicas {
        self.replicas_and_control_plane().0
    }

    /// Starts replica `replica` again after it was killed.
    async fn start_again(&mut self, replica: usize) -> anyhow::Result<()> {
        let (replicas, control_plane) = self.replicas_and_control_plane();
        replicas.start_again(control_plane, replica).await
    }

    /// How many VMs were made since the lab started, counted where the
    /// substrate keeps the truth, and what was counted (Proxmox: clone
    /// tasks; KubeVirt: VirtualMachine UIDs).
    fn vms_made(&self) -> (&'static str, usize);

    /// kube-apiserver's audit log of writes, when the lab keeps one.
    fn audit(&self) -> Option<&AuditLog>;

    /// Kills tenantry replica `replica` with SIGKILL and starts it again
    /// right away; returns how long until it answered `/healthz`.
    async fn kill_and_restart(&mut self, replica: usize) -> anyhow::Result<Duration> {
        let (replicas, control_plane) = self.replicas_and_control_plane();
        replicas.kill_and_restart(control_plane, replica).await
    }

    /// The tenantry processes' ids, and whether all of them still run.
    fn tenantry_pids(&mut self) -> (Vec<u32>, bool) {
        let replicas = self.replicas();
        let alive = replicas.all_alive();
        (replicas.pids(), alive)
    }

    /// Restarts kube-apiserver on the same etcd; returns how long it was
    /// away.
    async fn restart_apiserver(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.replicas_and_control_plane()
            .1
            .restart_apiserver()
            .await?;
        Ok(started.elapsed())
    }

    /// Creates `machines` infrastructure machines, each owned by a Machine
    /// with ready bootstrap data.
    async fn create_machines(&self, machines: usize) -> anyhow::Result<()>;

    /// The infrastructure machines' kind (`KubevirtMachine`, …).
    fn machine_resource() -> ApiResource;

    /// The objects of `resource` in the world's namespace, as the admin.
    fn api(&self, resource: &ApiResource) -> kube::Api<DynamicObject>;

    /// Deletes every infrastructure machine (as Cluster API does when a
    /// Machine goes).
    async fn delete_machines(&self) -> anyhow::Result<()> {
        let resource = Self::machine_resource();
        self.api(&resource)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .with_context(|| format!("delete the {}s", resource.kind))?;
        Ok(())
    }

    /// The infrastructure machines as the apiserver has them now.
    async fn machines(&self) -> anyhow::Result<Vec<DynamicObject>> {
        list(&self.api(&Self::machine_resource())).await
    }

    /// Counts what exists once every machine is provisioned, and checks it:
    /// one VM per machine, nothing else.
    async fn count_provisioned(&self, machines: usize, outcome: &mut Outcome)
    -> anyhow::Result<()>;

    /// Counts what is left once every machine is deleted, and checks that
    /// nothing is.
    async fn count_leftovers(&self, outcome: &mut Outcome) -> anyhow::Result<()>;

    /// The tenantry logs' last lines, for a failure report.
    fn log_tails(&self) -> String;

    /// The tenantry logs and the apiserver's, whole.
    fn log_paths(&self) -> Vec<std::path::PathBuf>;
}

/// After a scenario: prints the tenantry logs' tails when it failed, and
/// then (or always, with `CHAOS_KEEP_LOGS` set) keeps the whole logs,
/// tenantry's and kube-apiserver's (which go with the control plane's
/// folder), in `$TMPDIR/tenantry-chaos-<seed>/`.
pub(crate) fn report_logs(lab: &impl Lab, seed: u64, outcome: &mut Outcome, failed: bool) {
    if failed {
        eprintln!("{}", lab.log_tails());
    } else if std::env::var_os("CHAOS_KEEP_LOGS").is_none() {
        return;
    }
    let folder = std::env::temp_dir().join(format!("tenantry-chaos-{seed}"));
    if let Err(error) = std::fs::create_dir_all(&folder) {
        outcome.note(format!("could not keep the logs: {error}"));
        return;
    }
    for path in lab.log_paths() {
        let name = format!(
            "{}-{}-{}",
            outcome.scenario,
            outcome.substrate.name(),
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("tenantry.log")
        );
        let kept = folder.join(name);
        match std::fs::copy(&path, &kept) {
            Ok(_) => outcome.note(format!("log kept at {}", kept.display())),
            Err(error) => outcome.note(format!("could not keep {}: {error}", path.display())),
        }
    }
}

/// The progress of a wave.
pub(crate) async fn progress(lab: &impl Lab) -> anyhow::Result<Progress> {
    let machines = lab.machines().await?;
    Ok(Progress {
        machines: machines.len(),
        provisioned: machines
            .iter()
            .filter(|m| crate::bench::infrastructure_provisioned(m))
            .count(),
    })
}

/// Waits until `machines` machines are provisioned; returns how long that
/// took, or fails after `deadline` saying how far the wave got. Errors of
/// the apiserver (a restarting one) count as "not yet".
pub(crate) async fn wait_provisioned(
    lab: &impl Lab,
    machines: usize,
    deadline: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut last = Progress::default();
    loop {
        if let Ok(now) = progress(lab).await {
            last = now;
            if now.provisioned >= machines {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > deadline {
            let waiting = match lab.machines().await {
                Ok(machines) => ready_reasons(&machines),
                Err(error) => format!("(cannot list the machines: {error})"),
            };
            anyhow::bail!(
                "did not converge: {} of {machines} machines provisioned after {deadline:?}; the others say {waiting}",
                last.provisioned
            );
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Counts the machines and those provisioned, each checked against
/// `expected`; returns how many are provisioned.
pub(crate) fn count_machines(
    machines: &[DynamicObject],
    expected: usize,
    outcome: &mut Outcome,
) -> usize {
    outcome.exactly("machines", machines.len(), expected);
    let provisioned = machines
        .iter()
        .filter(|m| crate::bench::infrastructure_provisioned(m))
        .count();
    outcome.exactly("machines provisioned", provisioned, expected);
    provisioned
}

/// The machines still holding `finalizer`.
pub(crate) fn holding(machines: &[DynamicObject], finalizer: &str) -> usize {
    machines
        .iter()
        .filter(|m| {
            m.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == finalizer))
        })
        .count()
}

/// Counts the machines left after deletion (`left`, by name) and those of
/// them still holding the finalizer, and fails unless there are none.
pub(crate) fn count_machines_left(outcome: &mut Outcome, left: &[String], finalized: usize) {
    outcome.none("machines left", left);
    outcome.zero("machines still holding the finalizer", finalized, || {
        some_of(left, 5)
    });
}

/// The `Ready` reasons of the machines not provisioned, with how many say
/// each and one message.
pub(crate) fn ready_reasons(machines: &[DynamicObject]) -> String {
    let mut reasons = std::collections::BTreeMap::<String, (usize, String)>::new();
    for machine in machines
        .iter()
        .filter(|m| !crate::bench::infrastructure_provisioned(m))
    {
        let ready = machine.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready");
        let (reason, message) = match ready {
            Some(c) => (
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            ),
            None => ("(no Ready condition)".to_string(), String::new()),
        };
        let entry = reasons.entry(reason).or_insert((0, message));
        entry.0 += 1;
    }
    reasons
        .iter()
        .map(|(reason, (n, message))| format!("{reason} ×{n} (e.g. {message:?})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until no infrastructure machine is left; returns how long that
/// took, or fails after `deadline` saying how many are.
pub(crate) async fn wait_deleted(lab: &impl Lab, deadline: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut left = usize::MAX;
    loop {
        if let Ok(machines) = lab.machines().await {
            left = machines.len();
            if left == 0 {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > deadline {
            anyhow::bail!("did not converge: {left} machines still there after {deadline:?}");
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// The names of the objects of a list.
pub(crate) fn names(objects: &[DynamicObject]) -> Vec<String> {
    objects
        .iter()
        .map(|o| o.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// Lists `api`, everything.
pub(crate) async fn list(api: &kube::Api<DynamicObject>) -> anyhow::Result<Vec<DynamicObject>> {
    Ok(api.list(&ListParams::default()).await?.items)
}

/// Up to `shown` of `items`, for a failure message.
pub(crate) fn some_of(items: &[String], shown: usize) -> String {
    let mut text = items
        .iter()
        .take(shown)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > shown {
        text.push_str(&format!(" and {} more", items.len() - shown));
    }
    text
}

/// How many values occur more than once, counting each extra occurrence.
pub(crate) fn extra_occurrences<T: Ord>(values: impl IntoIterator<Item = T>) -> usize {
    repeated(values).iter().map(|(_, n)| n - 1).sum()
}

/// The values that occur more than once, with how often.
pub(crate) fn repeated<T: Ord>(values: impl IntoIterator<Item = T>) -> Vec<(T, usize)> {
    let mut seen = std::collections::BTreeMap::<T, usize>::new();
    for value in values {
        *seen.entry(value).or_default() += 1;
    }
    seen.into_iter().filter(|(_, n)| *n > 1).collect()
}

/// Waits up to `grace` until `check` finds nothing left, returning what
/// it found last: leftovers a garbage collector or a last reconcile
/// removes a moment after the machines are gone are not left behind.
pub(crate) async fn settle<T, F, Fut>(grace: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(T, bool)>>,
{
    let until = Instant::now() + grace;
    loop {
        let (found, clean) = check().await?;
        if clean || Instant::now() > until {
            return Ok(found);
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}
