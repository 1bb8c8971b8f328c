//! The real Cluster API core manager runs against the harness and reconciles.
//! Everything asserted here is written by the manager, never by the test:
//! its finalizer, its conditions and phase, the owner reference it puts on
//! the infrastructure cluster, and the cascade when the Cluster is deleted.

use std::path::Path;
use std::time::Duration;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use tenantry_e2e::cluster_api::ClusterApiRelease;
use tenantry_e2e::manifests::install_crds;
use tenantry_e2e::process::is_alive;
use tenantry_e2e::{ControlPlaneOptions, World, wait};

const DEADLINE: Duration = Duration::from_secs(90);
const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";

fn api(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a serde_json::Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn has_condition(object: &DynamicObject, type_: &str, status: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == status)
}

#[tokio::test]
async fn cluster_api_manager_reconciles_and_deletes_a_cluster() {
    let mut world = World::builder("harness")
        .without_tenantry_crds()
        .cluster_api()
        .start()
        .await;
    let client = world.client();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/test-infrastructure-cluster-crd.yaml");
    install_crds(&client, &[fixture])
        .await
        .expect("install TestCluster CRD");
    let clusters = api(
        &client,
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
        "clusters",
    );
    let infra_clusters = api(
        &client,
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "TestCluster",
        "testclusters",
    );
    let fail = |e: anyhow::Error| -> ! { world.fail(e) };

    let infra: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "TestCluster",
        "metadata": { "name": "demo" },
        "spec": { "controlPlaneEndpoint": { "host": "demo.example", "port": 6443 } }
    }))
    .expect("TestCluster object");
    infra_clusters
        .create(&PostParams::default(), &infra)
        .await
        .expect("create TestCluster");
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": "demo" },
        "spec": {
            "clusterNetwork": {
                "pods": { "cidrBlocks": ["10.243.0.0/16"] },
                "services": { "cidrBlocks": ["10.95.0.0/16"] }
            },
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "TestCluster",
                "name": "demo"
            }
        }
    }))
    .expect("Cluster object");
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create Cluster");

    // The manager adds its finalizer, reports that infrastructure is not
    // provisioned yet, and takes ownership of the infrastructure cluster.
    wait::until("the manager to reconcile the new Cluster", DEADLINE, || {
        let (clusters, infra_clusters) = (clusters.clone(), infra_clusters.clone());
        async move {
            let cluster = clusters.get("demo").await?;
            let infra = infra_clusters.get("demo").await?;
            let finalized = cluster
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == CLUSTER_FINALIZER);
            let owned = infra
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Cluster" && o.name == "demo");
            Ok(
                (finalized && owned && has_condition(&cluster, "InfrastructureReady", "False"))
                    .then_some(()),
            )
        }
    })
    .await
    .unwrap_or_else(|e| fail(e));

    // The infrastructure provider's side of the v1beta2 contract: once the
    // infrastructure cluster reports provisioned, CAPI follows.
    infra_clusters
        .patch_status(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "initialization": { "provisioned": true } } })),
        )
        .await
        .expect("mark TestCluster provisioned");
    let provisioned = wait::until(
        "the Cluster to see its infrastructure provisioned",
        DEADLINE,
        || {
            let clusters = clusters.clone();
            async move {
                let cluster = clusters.get("demo").await?;
                // CAPI may write the condition and the initialization flag in
                // separate patches; wait for the state a user ends up seeing.
                let provisioned =
                    cluster.data["status"]["initialization"]["infrastructureProvisioned"] == true;
                let ready = has_condition(&cluster, "InfrastructureReady", "True");
                Ok((provisioned && ready).then_some(cluster))
            }
        },
    )
    .await
    .unwrap_or_else(|e| fail(e));
    assert_eq!(
        provisioned.data["spec"]["controlPlaneEndpoint"]["host"],
        "demo.example"
    );
    assert!(has_condition(&provisioned, "Paused", "False"));

    // Deletion completes only because the manager deletes the infrastructure
    // cluster and then removes its own finalizer.
    clusters
        .delete("demo", &DeleteParams::default())
        .await
        .expect("delete Cluster");
    wait::until(
        "the manager to delete the Cluster and its infrastructure",
        DEADLINE,
        || {
            let (clusters, infra_clusters) = (clusters.clone(), infra_clusters.clone());
            async move {
                let gone = clusters.get_opt("demo").await?.is_none()
                    && infra_clusters.get_opt("demo").await?.is_none();
                Ok(gone.then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| fail(e));

    // The manager reports the pinned release (it has no --version flag).
    let log = std::fs::read_to_string(world.capi().log_path()).expect("manager log");
    let pinned = tenantry_e2e::clusterctl::pinned_cluster_api_version().expect("pinned version");
    assert!(
        log.contains(&format!("Version: {pinned}")),
        "manager log does not report {pinned}"
    );

    let manager = world.take_capi();
    let pid = manager.pid();
    manager.stop();
    assert!(
        !is_alive(pid),
        "Cluster API manager still running after stop"
    );
}

/// Cluster API v1.10, the generation before v1beta2, runs in the harness
/// too: the apiserver serves its `v1beta1` API alone, its webhooks admit a
/// v1beta1 Cluster, its manager puts its finalizer on it, and the audit log
/// shows that write, made by the manager.
#[tokio::test]
async fn cluster_api_v1_10_serves_v1beta1_only_and_the_audit_log_shows_its_manager() {
    let world = World::builder("harness")
        .control_plane(ControlPlaneOptions {
            name: "harness".into(),
            controller_manager: false,
            audit_log: true,
            ..Default::default()
        })
        .without_tenantry_crds()
        .cluster_api_release(ClusterApiRelease::V1_10)
        .start()
        .await;
    assert_eq!(world.capi_release(), ClusterApiRelease::V1_10);
    let client = world.client();
    let fail = |e: anyhow::Error| -> ! { world.fail(e) };

    let groups = client.list_api_groups().await.expect("API discovery");
    let capi = groups
        .groups
        .iter()
        .find(|g| g.name == "cluster.x-k8s.io")
        .expect("cluster.x-k8s.io served");
    let versions: Vec<&str> = capi.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(
        versions,
        [ClusterApiRelease::V1_10.api_version()],
        "v1.10 serves v1beta1 alone, no v1beta2"
    );

    let clusters = api(
        &client,
        "cluster.x-k8s.io",
        "v1beta1",
        "Cluster",
        "clusters",
    );
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Cluster",
        "metadata": { "name": "demo" },
        "spec": { "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] } } }
    }))
    .expect("Cluster object");
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create v1beta1 Cluster");

    // The manager names itself and its release in its User-Agent
    // (`<binary>/v1.10.1 cluster-api-controller-manager (linux/amd64) …`).
    let version = ClusterApiRelease::V1_10.version().expect("v1.10 version");
    let agent = format!("/{version} cluster-api-controller-manager ");
    let control_plane = world.control_plane();
    let write = wait::until(
        "the manager's finalizer write on the Cluster in the audit log",
        DEADLINE,
        || {
            let agent = agent.clone();
            async move {
                let events = control_plane.audit_events()?;
                Ok(events.into_iter().find(|event| {
                    let object = event.object_ref.clone().unwrap_or_default();
                    event
                        .user_agent
                        .as_deref()
                        .unwrap_or_default()
                        .contains(&agent)
                        && matches!(event.verb.as_str(), "patch" | "update")
                        && object.api_group.as_deref() == Some("cluster.x-k8s.io")
                        && object.resource.as_deref() == Some("clusters")
                        && object.name.as_deref() == Some("demo")
                }))
            }
        },
    )
    .await
    .unwrap_or_else(|e| fail(e));
    let object = write.object_ref.expect("object reference");
    assert_eq!(object.api_version.as_deref(), Some("v1beta1"));
    assert_eq!(object.namespace.as_deref(), Some("default"));
    assert_eq!(write.response_status.map(|s| s.code), Some(200));
    assert_eq!(write.user.username, tenantry_e2e::control_plane::ADMIN_USER);
    let finalized = clusters.get("demo").await.expect("get Cluster");
    assert!(
        finalized
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == CLUSTER_FINALIZER),
        "the manager's write is its finalizer"
    );
}

/// The real in-cluster IPAM provider fulfils a CAPI IPAddressClaim from an
/// InClusterIPPool: the contract the Proxmox machines get their IPs through.
#[tokio::test]
async fn in_cluster_ipam_provider_allocates_an_address_for_a_claim() {
    let world = World::builder("harness")
        .without_tenantry_crds()
        .cluster_api()
        .ipam()
        .start()
        .await;
    let client = world.client();
    let pools = api(
        &client,
        "ipam.cluster.x-k8s.io",
        "v1alpha2",
        "InClusterIPPool",
        "inclusterippools",
    );
    let claims = api(
        &client,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddressClaim",
        "ipaddressclaims",
    );
    let addresses = api(
        &client,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddress",
        "ipaddresses",
    );
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2",
        "kind": "InClusterIPPool",
        "metadata": { "name": "workers" },
        "spec": { "addresses": ["10.10.10.10-10.10.10.20"], "prefix": 24, "gateway": "10.10.10.1" }
    }))
    .unwrap();
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create pool");
    let claim: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": { "name": "worker-1-net0" },
        "spec": { "poolRef": { "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "workers" } }
    }))
    .unwrap();
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    let address_name = wait::until("the claim to be fulfilled", DEADLINE, || {
        let claims = claims.clone();
        async move {
            let claim = claims.get("worker-1-net0").await?;
            Ok(claim.data["status"]["addressRef"]["name"]
                .as_str()
                .map(str::to_string))
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    let address = addresses.get(&address_name).await.expect("IPAddress");
    assert_eq!(address.data["spec"]["address"], "10.10.10.10");
    assert_eq!(address.data["spec"]["prefix"], 24);
    assert_eq!(address.data["spec"]["gateway"], "10.10.10.1");
}
