//! Cluster API upgraded under a running tenantry, as a platform moves from
//! v1.10 (what Cozystack runs, `cluster.x-k8s.io/v1beta1` only) to the
//! pinned v1.14 (v1beta2): tenantry found v1beta1 when it started and reads
//! every Cluster API kind in it; once the new core serves v1beta2, the
//! manager stops by itself (its caches and watches are in the old version)
//! so that its Deployment restarts it, and started again it reads v1beta2.
//! Both Cluster API managers are the real ones; the management apiserver's
//! audit log shows which version tenantry watched when.

use std::time::Duration;

use tenantry_e2e::cluster_api::ClusterApiRelease;
use tenantry_e2e::{ClusterApiManager, ControlPlaneOptions, World, wait};
use tenantry_provider::capi::CapiGeneration;

/// Generous upper bound for a step (the manager looks every 30 s).
const DEADLINE: Duration = Duration::from_secs(180);

/// Whether tenantry (kube-rs sends no User-Agent; the Go components all
/// do) has watched Machines in `version`.
fn tenantry_watched_machines_in(world: &World, version: &str) -> bool {
    world
        .control_plane()
        .audit_events()
        .expect("read the audit log")
        .iter()
        .any(|event| {
            event.verb == "watch"
                && event.object_ref.as_ref().is_some_and(|object| {
                    object.api_group.as_deref() == Some("cluster.x-k8s.io")
                        && object.api_version.as_deref() == Some(version)
                        && object.resource.as_deref() == Some("machines")
                })
                && event.user_agent.as_deref().unwrap_or_default().is_empty()
        })
}

async fn wait_watched(world: &World, version: &str) {
    wait::until(
        &format!("tenantry to watch Machines in {version}"),
        DEADLINE,
        || async { Ok(tenantry_watched_machines_in(world, version).then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", world.diagnostics()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenantry_restarts_into_v1beta2_when_cluster_api_is_upgraded() {
    let mut world = World::builder("management")
        .control_plane(ControlPlaneOptions {
            name: "management".into(),
            audit_log: true,
            ..Default::default()
        })
        .cluster_api_release(ClusterApiRelease::V1_10)
        .tenantry()
        .start()
        .await;
    wait_watched(&world, "v1beta1").await;
    assert!(!world.tenantry().has_stopped(), "tenantry stopped on v1.10");

    // The upgrade: v1.10's manager goes, v1.14's CRDs (v1beta2 stored,
    // v1beta1 still served) and manager come.
    world.take_capi().stop();
    let _upgraded = ClusterApiManager::start(world.control_plane())
        .await
        .expect("start Cluster API v1.14");
    assert_eq!(
        CapiGeneration::discover(&world.client())
            .await
            .expect("discovery"),
        Some(CapiGeneration::V1beta2)
    );

    wait::until(
        "tenantry's manager to stop for a restart",
        DEADLINE,
        || async { Ok(world.tenantry().has_stopped().then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", world.diagnostics()));

    // What the Deployment does: start it again.
    world.tenantry_mut().restart();
    wait_watched(&world, "v1beta2").await;
    assert!(
        !world.tenantry().has_stopped(),
        "the restarted manager runs on"
    );
}
