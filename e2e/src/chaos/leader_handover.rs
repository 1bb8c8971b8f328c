//! Two replicas with leader election: while a wave is provisioned, the
//! replica holding the Lease is killed with SIGKILL (and started again as a
//! follower) a few times. The other must take over within the lease
//! duration (plus one retry period, how often a follower looks), only the
//! holder of the Lease may write, and no VM may be made twice.
//!
//! Each replica authenticates as a user of its own, so kube-apiserver's
//! audit log says which replica sent each write; the holder of a moment is
//! the replica whose last successful write to the Lease completed before it.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use rand::rngs::StdRng;

use super::audit;
use super::lab::{self, LEASE, Lab, ManagerSetup, REPLICA_POD_PREFIX, REPLICA_USER_PREFIX};
use super::scenario::{Scenario, Wave, note_unspent};
use super::{Outcome, Sizes, millis};
use crate::bench::NAMESPACE;

/// Tenantry's defaults (`--leader-elect-lease-duration`,
/// `--leader-elect-retry-period`), which the replicas run with.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// How closely the harness watches the Lease.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// The moment before each kill: the new leader gets some work done first.
const BEFORE_KILL: RangeInclusive<Duration> = millis(300, 2500);

/// The Lease's holder now: the replica's index (from `tenantry-<n>_…`),
/// and when it was acquired and last renewed.
struct Holder {
    identity: String,
    replica: usize,
    acquired: Option<chrono::DateTime<chrono::Utc>>,
    renewed: Option<chrono::DateTime<chrono::Utc>>,
}

async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<Holder>> {
    let Some(lease) = leases.get_opt(LEASE).await? else {
        return Ok(None);
    };
    let spec = lease.spec.unwrap_or_default();
    let Some(identity) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        return Ok(None);
    };
    let replica = identity
        .strip_prefix(REPLICA_POD_PREFIX)
        .and_then(|rest| rest.split('_').next())
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| n.checked_sub(1))
        .with_context(|| format!("the Lease names {identity}, not a replica"))?;
    Ok(Some(Holder {
        identity,
        replica,
        acquired: spec.acquire_time.and_then(|t| utc(t.0)),
        renewed: spec.renew_time.and_then(|t| utc(t.0)),
    }))
}

fn utc(timestamp: k8s_openapi::jiff::Timestamp) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp_micros(timestamp.as_microsecond())
}

/// Waits until the Lease names a holder other than `not` (any holder when
/// `None`), up to `deadline`.
async fn wait_holder(
    leases: &Api<Lease>,
    not: Option<&str>,
    deadline: Duration,
) -> anyhow::Result<Holder> {
    let started = Instant::now();
    loop {
        // A failed read is "not yet": the harness is not what is judged.
        if let Ok(Some(now)) = holder(leases).await
            && Some(now.identity.as_str()) != not
        {
            return Ok(now);
        }
        anyhow::ensure!(
            started.elapsed() < deadline,
            "no replica took the Lease within {deadline:?} (the old holder: {not:?})"
        );
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

pub(super) struct LeaderHandover;

impl Scenario for LeaderHandover {
    const NAME: &'static str = "leader-handover";
    const WORLD: &'static str = "chaos-leader";

    fn setup() -> ManagerSetup {
        ManagerSetup {
            replicas: 2,
            own_identity: true,
            leader_election: true,
            audit: true,
        }
    }

    async fn steps(
        lab: &mut impl Lab,
        sizes: &Sizes,
        rng: &mut StdRng,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        let wave = Wave::new(sizes.handover_machines, sizes.converge_deadline);
        let machines = wave.machines;
        let leases = Api::<Lease>::namespaced(lab.control_plane().client(), NAMESPACE);
        outcome.count("replicas", lab.replicas().len());
        outcome.count("machines asked for", machines);
        wait_holder(&leases, None, LEASE_DURATION * 2).await?;

        let wall = wave.create(lab).await?;
        let mut moments = Vec::new();
        let mut slowest = Duration::ZERO;
        let mut latest_after_expiry = Duration::ZERO;
        for _ in 0..sizes.handovers {
            let Some(now) = wave.still_provisioning(lab, rng, BEFORE_KILL).await? else {
                break;
            };
            let old = holder(&leases).await?.context("the Lease has no holder")?;
            lab.replicas().kill(old.replica);
            let killed = Instant::now();
            let new = wait_holder(&leases, Some(&old.identity), LEASE_DURATION * 3).await?;
            let handover = killed.elapsed();
            slowest = slowest.max(handover);
            // From the moment the old holder's Lease ran out to the new
            // holder's acquisition, on the Lease's own clock.
            if let (Some(renewed), Some(acquired)) = (old.renewed, new.acquired) {
                let expiry = renewed + chrono::Duration::from_std(LEASE_DURATION)?;
                let after = (acquired - expiry).to_std().unwrap_or(Duration::ZERO);
                latest_after_expiry = latest_after_expiry.max(after);
            }
            moments.push(format!(
                "{}/{machines} provisioned: replica {} → {} in {:.1} s",
                now.provisioned,
                old.replica + 1,
                new.replica + 1,
                handover.as_secs_f64()
            ));
            lab.start_again(old.replica).await?;
        }
        outcome.count("leader kills during provisioning", moments.len());
        outcome.seconds("slowest handover after a kill (s)", slowest);
        outcome.seconds(
            "latest takeover after the Lease ran out (s)",
            latest_after_expiry,
        );
        let bound = LEASE_DURATION + RETRY_PERIOD;
        outcome.check(slowest <= bound, || {
            format!(
                "a handover took {:.1} s, more than the lease duration and one retry period ({:.0} s)",
                slowest.as_secs_f64(),
                bound.as_secs_f64()
            )
        });
        outcome.note(format!("leader kills at: {}", moments.join("; ")));
        note_unspent(
            outcome,
            "kills during provisioning",
            moments.len(),
            sizes.handovers,
        );
        wave.wait_provisioned(lab, outcome, wall, "provisioning across leader kills")
            .await;
        lab.count_provisioned(machines, outcome).await?;
        // No VM made twice, counted where the substrate keeps the truth.
        let (made, count) = lab.vms_made();
        outcome.exactly(made, count, machines);

        wave.delete_and_count_leftovers(lab, outcome, "deletion after leader kills")
            .await?;

        let writes = lab
            .audit()
            .context("the lab keeps no audit log")?
            .writes()?;
        let judged = audit::leadership(&writes, LEASE, REPLICA_USER_PREFIX);
        outcome.count("Lease changes of holder", judged.changes);
        outcome.count(
            "writes by the Lease holder",
            judged.writes_per_user.values().sum::<usize>() - judged.by_non_leaders.len(),
        );
        outcome.zero(
            "writes by a replica not holding the Lease",
            judged.by_non_leaders.len(),
            || lab::some_of(&judged.by_non_leaders, 5),
        );
        Ok(())
    }
}
