//! RBAC revoked and restored: tenantry runs as a user of its own with the
//! release's ClusterRole; while a wave is provisioned, and again while it
//! is deleted, the binding is deleted for a while (every request answered
//! 403) and then created again, as an operator repairing RBAC would.
//! Tenantry must not exit, must do nothing it cannot finish, and must
//! converge once it may act again.

use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::StdRng;

use super::identity;
use super::kubevirt::KubevirtLab;
use super::lab::{self, Lab, ManagerSetup, replica_user};
use super::proxmox::ProxmoxLab;
use super::{ChaosConfig, Outcome, Substrate, pause};

pub(super) const NAME: &str = "rbac-revoke";

/// The moment before each revocation: the wave is under way.
const BEFORE_REVOKE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(300)..=Duration::from_millis(2000);

fn setup() -> ManagerSetup {
    ManagerSetup {
        replicas: 1,
        own_identity: true,
        ..ManagerSetup::default()
    }
}

pub(super) async fn run(
    config: &ChaosConfig,
    substrate: Substrate,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let mut rng = config.rng(NAME, substrate.name());
    let name = format!("chaos-rbac-{}", substrate.name());
    match substrate {
        Substrate::Kubevirt => {
            let mut lab = KubevirtLab::start(config, &name, &setup()).await?;
            revocations(&mut lab, config, &mut rng, outcome).await
        }
        Substrate::Proxmox => {
            let sim_seed = rng.random();
            let mut lab = ProxmoxLab::start(config, &name, &setup(), sim_seed).await?;
            revocations(&mut lab, config, &mut rng, outcome).await
        }
    }
}

async fn revocations(
    lab: &mut impl Lab,
    config: &ChaosConfig,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let result = revocation_steps(lab, config, rng, outcome).await;
    let failed = result.is_err() || !outcome.passed();
    lab::report_logs(lab, config.seed, outcome, failed);
    result
}

async fn revocation_steps(
    lab: &mut impl Lab,
    config: &ChaosConfig,
    rng: &mut StdRng,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let sizes = &config.sizes;
    let machines = sizes.revoke_machines;
    let user = replica_user(0);
    let admin = lab.control_plane().client();
    outcome.count("machines asked for", machines);
    outcome.count("seconds revoked, each time", sizes.revoke_window.as_secs());
    let (pids_before, _) = lab.tenantry_pids();

    lab.create_machines(machines).await?;
    pause(rng, BEFORE_REVOKE).await;
    let before = lab::progress(lab).await?;
    identity::revoke(&admin, &user).await?;
    tokio::time::sleep(sizes.revoke_window).await;
    let revoked = lab::progress(lab).await?;
    identity::restore(&admin, &user).await?;
    let restored = Instant::now();
    outcome.note(format!(
        "revoked during provisioning at {}/{machines} provisioned, restored at {}/{machines}",
        before.provisioned, revoked.provisioned
    ));
    if before.provisioned >= machines {
        outcome.note("the wave was provisioned before the revocation".to_string());
    }
    match lab::wait_provisioned(lab, machines, sizes.converge_deadline).await {
        Ok(_) => outcome.count(
            "provisioned, seconds after restoring",
            format!("{:.1}", restored.elapsed().as_secs_f64()),
        ),
        Err(error) => outcome.fail(error.context("provisioning after RBAC was restored")),
    }
    lab.count_provisioned(machines, outcome).await?;

    lab.delete_machines().await?;
    pause(rng, BEFORE_REVOKE).await;
    let before = lab::progress(lab).await?;
    identity::revoke(&admin, &user).await?;
    tokio::time::sleep(sizes.revoke_window).await;
    let revoked = lab::progress(lab).await?;
    identity::restore(&admin, &user).await?;
    let restored = Instant::now();
    outcome.note(format!(
        "revoked during deletion with {} machines left, restored with {} left",
        before.machines, revoked.machines
    ));
    match lab::wait_deleted(lab, sizes.converge_deadline).await {
        Ok(_) => outcome.count(
            "deleted, seconds after restoring",
            format!("{:.1}", restored.elapsed().as_secs_f64()),
        ),
        Err(error) => outcome.fail(error.context("deletion after RBAC was restored")),
    }
    let (pids_after, alive) = lab.tenantry_pids();
    let restarted = pids_before
        .iter()
        .zip(&pids_after)
        .filter(|(before, after)| before != after)
        .count()
        + usize::from(!alive);
    outcome.zero("tenantry restarts", restarted, || {
        format!("pids {pids_before:?} before, {pids_after:?} after, all alive: {alive}")
    });
    lab.count_leftovers(outcome).await?;
    Ok(())
}
