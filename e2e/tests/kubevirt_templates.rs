//! KubevirtMachineTemplates through the real apiserver with tenantry's
//! webhooks and controllers: immutable except for CAPI's topology dry runs,
//! and a status the cluster autoscaler can scale from zero with.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tenantry_api::kubevirt::KubevirtMachineTemplate;
use tenantry_e2e::World;
use tenantry_e2e::fixtures::wait_for_object;

/// A control plane with tenantry and its webhooks, and the template
/// `workers` of `cores` cores created in it.
async fn world_with_template(cores: u32) -> (World, Api<KubevirtMachineTemplate>) {
    let world = World::builder("harness")
        .without_controller_manager()
        .tenantry()
        .webhooks()
        .start()
        .await;
    let api: Api<KubevirtMachineTemplate> = world.api("default");
    api.patch(
        "workers",
        &apply(false),
        &Patch::Apply(template(cores, json!({}))),
    )
    .await
    .expect("create template");
    (world, api)
}

fn template(cores: u32, annotations: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "KubevirtMachineTemplate",
        "metadata": { "name": "workers", "annotations": annotations },
        "spec": { "template": { "spec": {
            "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
            "virtualMachineTemplate": { "spec": { "runStrategy": "Always", "template": { "spec": { "domain": {
                "cpu": { "cores": cores, "sockets": 1 },
                "memory": { "guest": "4Gi" },
                "devices": {}
            }}}}}
        }}}
    })
}

fn apply(dry_run: bool) -> PatchParams {
    let mut params = PatchParams::apply("tester").force();
    params.dry_run = dry_run;
    params
}

#[tokio::test]
async fn template_spec_is_immutable_except_for_topology_dry_runs() {
    let (_world, api) = world_with_template(2).await;

    let refused = api
        .patch(
            "workers",
            &apply(false),
            &Patch::Apply(template(4, json!({}))),
        )
        .await
        .expect_err("changing the spec must be refused");
    let message = refused.to_string();
    assert!(
        message.contains("KubevirtMachineTemplate spec is immutable"),
        "{message}"
    );
    assert!(message.contains("domain.cpu.cores"), "{message}");

    // CAPI's topology controller computes diffs with annotated dry runs.
    let dry = json!({ "topology.cluster.x-k8s.io/dry-run": "" });
    let preview = api
        .patch(
            "workers",
            &apply(true),
            &Patch::Apply(template(4, dry.clone())),
        )
        .await
        .expect("annotated dry run is allowed");
    assert_eq!(
        serde_json::to_value(&preview.spec).unwrap()["template"]["spec"]["virtualMachineTemplate"]
            ["spec"]["template"]["spec"]["domain"]["cpu"]["cores"],
        4
    );
    // A dry run without the annotation, or the annotation without dry run, is not.
    assert!(
        api.patch(
            "workers",
            &apply(true),
            &Patch::Apply(template(4, json!({})))
        )
        .await
        .is_err()
    );
    assert!(
        api.patch("workers", &apply(false), &Patch::Apply(template(4, dry)))
            .await
            .is_err()
    );
    // Metadata stays editable.
    api.patch(
        "workers",
        &apply(false),
        &Patch::Apply(template(2, json!({ "team": "platform" }))),
    )
    .await
    .expect("metadata change is allowed");
}

#[tokio::test]
async fn template_status_reports_capacity_for_scale_from_zero() {
    let (_world, api) = world_with_template(3).await;
    let status = wait_for_object(
        &api,
        "workers",
        "the template's capacity",
        Duration::from_secs(60),
        |t| t.status.filter(|s| s.capacity.is_some()),
    )
    .await
    .expect("capacity reported");
    let capacity = status.capacity.unwrap();
    assert_eq!(capacity["cpu"].0, "3");
    assert_eq!(capacity["memory"].0, "4Gi");
    let info = status.node_info.unwrap();
    assert_eq!(info.architecture.as_deref(), Some("amd64"));
    assert_eq!(info.operating_system.as_deref(), Some("linux"));
}
