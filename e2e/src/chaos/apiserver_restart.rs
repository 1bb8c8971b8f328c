//! Apiserver restart: kube-apiserver goes away and comes back on the same
//! etcd while a wave of machines is provisioned. Tenantry keeps running
//! (its watches and requests fail, then reconnect): it must not exit, and
//! the wave must converge with one VM per machine and delete cleanly.

use std::ops::RangeInclusive;
use std::time::Duration;

use rand::rngs::StdRng;

use super::lab::Lab;
use super::scenario::{Scenario, Wave, count_tenantry_restarts, note_unspent};
use super::{Outcome, Sizes, millis};

/// The moment before each restart.
const BEFORE_RESTART: RangeInclusive<Duration> = millis(300, 2500);

pub(super) struct ApiserverRestart;

impl Scenario for ApiserverRestart {
    const NAME: &'static str = "apiserver-restart";
    const WORLD: &'static str = "chaos-apiserver";

    async fn steps(
        lab: &mut impl Lab,
        sizes: &Sizes,
        rng: &mut StdRng,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        let wave = Wave::new(sizes.restart_machines, sizes.converge_deadline);
        let machines = wave.machines;
        outcome.count("machines asked for", machines);
        let (tenantry_before, _) = lab.tenantry_pids();

        let wall = wave.create(lab).await?;
        let mut moments = Vec::new();
        let mut longest_away = Duration::ZERO;
        for _ in 0..sizes.apiserver_restarts {
            let Some(now) = wave.still_provisioning(lab, rng, BEFORE_RESTART).await? else {
                break;
            };
            longest_away = longest_away.max(lab.restart_apiserver().await?);
            moments.push(format!("{}/{machines} provisioned", now.provisioned));
        }
        outcome.count("apiserver restarts during provisioning", moments.len());
        outcome.seconds("longest apiserver restart (s)", longest_away);
        outcome.note(format!("apiserver restarts at: {}", moments.join(", ")));
        note_unspent(
            outcome,
            "restarts during provisioning",
            moments.len(),
            sizes.apiserver_restarts,
        );
        wave.wait_provisioned(lab, outcome, wall, "provisioning across apiserver restarts")
            .await;
        count_tenantry_restarts(lab, &tenantry_before, outcome);
        lab.count_provisioned(machines, outcome).await?;

        wave.delete_and_count_leftovers(lab, outcome, "deletion after apiserver restarts")
            .await
    }
}
