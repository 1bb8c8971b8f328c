//! RBAC revoked and restored: tenantry runs as a user of its own with the
//! release's ClusterRole; while a wave is provisioned, and again while it
//! is deleted, the binding is deleted for a while (every request answered
//! 403) and then created again, as an operator repairing RBAC would.
//! Tenantry must not exit, must do nothing it cannot finish, and must
//! converge once it may act again.

use std::ops::RangeInclusive;
use std::time::Duration;

use rand::rngs::StdRng;

use super::identity;
use super::lab::{self, Lab, ManagerSetup, Progress, replica_user};
use super::scenario::{Scenario, Stopwatch, Wave, count_tenantry_restarts};
use super::{Outcome, Sizes, millis, pause};

/// The moment before each revocation: the wave is under way.
const BEFORE_REVOKE: RangeInclusive<Duration> = millis(300, 2000);

pub(super) struct RbacRevoke;

impl Scenario for RbacRevoke {
    const NAME: &'static str = "rbac-revoke";
    const WORLD: &'static str = "chaos-rbac";

    fn setup() -> ManagerSetup {
        ManagerSetup {
            replicas: 1,
            own_identity: true,
            ..ManagerSetup::default()
        }
    }

    async fn steps(
        lab: &mut impl Lab,
        sizes: &Sizes,
        rng: &mut StdRng,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        let wave = Wave::new(sizes.revoke_machines, sizes.converge_deadline);
        let machines = wave.machines;
        let revocation = Revocation {
            admin: lab.control_plane().client(),
            user: replica_user(0),
            window: sizes.revoke_window,
        };
        outcome.count("machines asked for", machines);
        outcome.count("seconds revoked, each time", sizes.revoke_window.as_secs());
        let (pids_before, _) = lab.tenantry_pids();

        lab.create_machines(machines).await?;
        let (before, revoked) = revocation.revoke_and_restore(lab, rng).await?;
        let restored = Stopwatch::start("provisioned, seconds after restoring");
        outcome.note(format!(
            "revoked during provisioning at {}/{machines} provisioned, restored at {}/{machines}",
            before.provisioned, revoked.provisioned
        ));
        if before.provisioned >= machines {
            outcome.note("the wave was provisioned before the revocation".to_string());
        }
        wave.wait_provisioned(
            lab,
            outcome,
            restored,
            "provisioning after RBAC was restored",
        )
        .await;
        lab.count_provisioned(machines, outcome).await?;

        lab.delete_machines().await?;
        let (before, revoked) = revocation.revoke_and_restore(lab, rng).await?;
        let restored = Stopwatch::start("deleted, seconds after restoring");
        outcome.note(format!(
            "revoked during deletion with {} machines left, restored with {} left",
            before.machines, revoked.machines
        ));
        wave.wait_deleted(lab, outcome, restored, "deletion after RBAC was restored")
            .await;
        count_tenantry_restarts(lab, &pids_before, outcome);
        lab.count_leftovers(outcome).await
    }
}

/// Takes tenantry's rights away for a while, then gives them back.
struct Revocation {
    admin: kube::Client,
    user: String,
    window: Duration,
}

impl Revocation {
    /// After a random moment of [`BEFORE_REVOKE`], deletes the user's
    /// binding for the window and creates it again; returns how far the
    /// wave was when it was deleted and when it was restored.
    async fn revoke_and_restore(
        &self,
        lab: &impl Lab,
        rng: &mut StdRng,
    ) -> anyhow::Result<(Progress, Progress)> {
        pause(rng, BEFORE_REVOKE).await;
        let before = lab::progress(lab).await?;
        identity::revoke(&self.admin, &self.user).await?;
        tokio::time::sleep(self.window).await;
        let revoked = lab::progress(lab).await?;
        identity::restore(&self.admin, &self.user).await?;
        Ok((before, revoked))
    }
}
