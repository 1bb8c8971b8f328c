//! Leader election on a real kube-apiserver: one replica leads at a time; a
//! leader that dies without releasing (kill -9) is replaced within the lease
//! duration; a leader that shuts down hands over at once; a leader whose
//! Lease is taken over steps down. (The two-process scenario with
//! reconciles, "only the leader writes, no double clone", is in the chaos
//! suite.)

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tenantry_e2e::World;
use tenantry_provider::leader::{self, LeaderElectionConfig, LeadershipLost};

const LEASE: &str = "tenantry-manager-leader";

/// Short leases, so a dead leader is replaced quickly.
fn config(identity: &str) -> LeaderElectionConfig {
    config_with_lease(identity, Duration::from_secs(4))
}

fn config_with_lease(identity: &str, lease_duration: Duration) -> LeaderElectionConfig {
    LeaderElectionConfig {
        namespace: "default".into(),
        name: LEASE.into(),
        identity: identity.into(),
        lease_duration,
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    }
}

async fn holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get_opt(LEASE)
        .await
        .expect("read the Lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn one_leader_at_a_time_and_handover() {
    let world = World::builder("harness")
        .without_controller_manager()
        .without_tenantry_crds()
        .start()
        .await;
    let client = world.client();

    let first = leader::acquire(client.clone(), config("replica-a"))
        .await
        .expect("the first replica leads");
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));

    // The second waits while the first leads and renews. Once it leads, it
    // holds a long Lease, so below a third replica that got it before the
    // Lease could expire can only have got it from the release.
    const LONG_LEASE: Duration = Duration::from_secs(90);
    let second = tokio::spawn(leader::acquire(
        client.clone(),
        config_with_lease("replica-b", LONG_LEASE),
    ));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !second.is_finished(),
        "the second replica must not lead while the first renews its Lease"
    );
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));

    // kill -9: the first stops renewing without releasing. Its tasks are
    // dropped with the runtime handle; here, aborting them is the same.
    let killed_at = Instant::now();
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second replica takes over")
        .expect("task")
        .expect("acquire");
    let handover = killed_at.elapsed();
    assert_eq!(holder(&client).await.as_deref(), Some("replica-b"));
    // The 4 s Lease expired and the follower took it: a generous bound
    // (a busy machine delays renewals and retries), not the figure.
    assert!(
        handover < Duration::from_secs(25),
        "handover took {handover:?}"
    );

    // A clean shutdown releases at once: a third replica leads right away.
    let third = tokio::spawn(leader::acquire(client.clone(), config("replica-c")));
    second.release().await;
    let released_at = Instant::now();
    let mut third = tokio::time::timeout(Duration::from_secs(60), third)
        .await
        .expect("a released Lease is taken without waiting for it to expire")
        .expect("task")
        .expect("acquire");
    assert!(
        released_at.elapsed() < LONG_LEASE,
        "a released Lease is taken without waiting for it to expire"
    );

    // Someone else in the Lease (an operator, a split brain): the leader
    // steps down.
    let lost = tokio::spawn(async move { third.lost().await });
    Api::<Lease>::namespaced(client.clone(), "default")
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "holderIdentity": "intruder" } })),
        )
        .await
        .expect("overwrite the holder");
    let lost = tokio::time::timeout(Duration::from_secs(30), lost)
        .await
        .expect("the leader notices")
        .expect("task");
    assert!(
        matches!(
            &lost,
            LeadershipLost::TakenOver(_, holder) if holder == "intruder"
        ) || matches!(lost, LeadershipLost::Stopped(_)),
        "{lost}"
    );
}
