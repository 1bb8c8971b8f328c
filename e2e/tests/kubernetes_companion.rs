//! The companion end to end: a `Kubernetes` object becomes an etcd, a
//! DataStore, a CAPI Cluster with its KamajiControlPlane, and a live tenant
//! kube-apiserver of the requested version; a version change rolls it; a
//! deletion leaves nothing behind. Real kube-apiserver, real CAPI core
//! manager, tenantry with its webhooks; Kamaji and etcd-operator simulated
//! (`e2e/src/sim/tenant/`), the tenant's apiserver a real one of the
//! requested minor. Once with the pinned Cluster API and KamajiControlPlane
//! v1alpha2, once with what the platform runs: Cluster API v1.10 (v1beta1
//! only), KamajiControlPlane v1alpha1, and the oldest tenant minor.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use tenantry_api::tenant::Kubernetes;
use tenantry_e2e::bench::resource;
use tenantry_e2e::cluster_api::ClusterApiRelease;
use tenantry_e2e::fixtures;
use tenantry_e2e::sim::tenant::{EtcdFault, KamajiApi, TenantControlPlaneOptions};
use tenantry_e2e::upstream::{Binary, Upstream};
use tenantry_e2e::wait;

const NAMESPACE: &str = "tenant-a";
const NAME: &str = "demo";
/// Generous upper bound for a step; never the thing measured.
const DEADLINE: Duration = Duration::from_secs(240);

/// The management cluster with the real Cluster API manager, Kamaji and
/// etcd-operator simulated, and tenantry with its webhooks.
struct World {
    parts: tenantry_e2e::World,
}

impl World {
    async fn start() -> Self {
        Self::start_on(ClusterApiRelease::Pinned, KamajiApi::V1alpha2).await
    }

    /// With the Cluster API release and the KamajiControlPlane API given.
    async fn start_on(release: ClusterApiRelease, kamaji: KamajiApi) -> Self {
        let parts = tenantry_e2e::World::builder("management")
            .cluster_api_release(release)
            .kamaji(TenantControlPlaneOptions {
                api: kamaji,
                ..Default::default()
            })
            // As under Kamaji: no tenant control plane before its DataStore.
            .kamaji_waits_for_data_stores()
            .etcd()
            .tenantry()
            .webhooks()
            .start()
            .await;
        parts.create_namespace(NAMESPACE).await;
        Self { parts }
    }

    fn client(&self) -> kube::Client {
        self.parts.client()
    }

    fn kubernetes(&self) -> Api<Kubernetes> {
        Api::namespaced(self.client(), NAMESPACE)
    }

    fn fail(&self, error: anyhow::Error, status: Option<Value>) -> ! {
        panic!(
            "{error:#}\n---- Kubernetes status ----\n{}{}",
            status.map(|s| s.to_string()).unwrap_or_default(),
            self.parts.diagnostics()
        )
    }

    /// Waits until the object's condition `Ready` is True and `check`
    /// holds on it.
    async fn wait_ready(&self, what: &str, check: impl Fn(&Kubernetes) -> bool) -> Kubernetes {
        let api = self.kubernetes();
        let check = &check;
        let result = wait::until(what, DEADLINE, || {
            let api = api.clone();
            async move {
                let object = api.get(NAME).await?;
                let ready = object
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                    .is_some_and(|c| c.status == "True");
                Ok((ready && check(&object)).then_some(object))
            }
        })
        .await;
        match result {
            Ok(object) => object,
            Err(error) => {
                let status = api
                    .get(NAME)
                    .await
                    .ok()
                    .and_then(|o| serde_json::to_value(o.status).ok());
                self.fail(error, status)
            }
        }
    }

    /// `kubectl --kubeconfig <admin.conf> get --raw /version`, as a user would.
    async fn tenant_version(&self) -> String {
        let secrets: Api<Secret> = Api::namespaced(self.client(), NAMESPACE);
        let secret = secrets
            .get("kubernetes-demo-admin-kubeconfig")
            .await
            .expect("admin kubeconfig Secret");
        let data = secret.data.expect("Secret data");
        for key in [
            "admin.conf",
            "admin.svc",
            "super-admin.conf",
            "super-admin.svc",
        ] {
            assert!(data.contains_key(key), "the Secret lacks {key}");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("admin.conf");
        std::fs::write(&path, &data["admin.conf"].0).expect("write admin.conf");
        let kubectl = Upstream::locate()
            .and_then(|u| u.binary(Binary::Kubectl))
            .expect("kubectl");
        let output = tokio::process::Command::new(kubectl)
            .args([
                "--kubeconfig",
                &path.display().to_string(),
                "get",
                "--raw",
                "/version",
            ])
            .output()
            .await
            .expect("run kubectl");
        assert!(
            output.status.success(),
            "kubectl failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let version: Value = serde_json::from_slice(&output.stdout).expect("version JSON");
        version["gitVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Deletes the `Kubernetes` object and waits until it is gone.
    async fn delete_and_wait_gone(&self) {
        self.kubernetes()
            .delete(NAME, &DeleteParams::default())
            .await
            .expect("delete");
        fixtures::wait_for_absence(
            &self.kubernetes(),
            NAME,
            "the Kubernetes object to be gone",
            DEADLINE,
        )
        .await
        .unwrap_or_else(|e| self.fail(e, None));
    }

    async fn names(&self, resource: &ApiResource) -> Vec<String> {
        fixtures::dynamic_names(&self.client(), NAMESPACE, resource).await
    }
}

#[tokio::test]
async fn a_kubernetes_object_runs_upgrades_and_goes_without_a_trace() {
    let world = World::start().await;
    let kubernetes: Kubernetes = serde_json::from_value(json!({
        "apiVersion": "apps.tenantry.dev/v1alpha1",
        "kind": "Kubernetes",
        "metadata": { "name": NAME, "namespace": NAMESPACE },
        "spec": { "version": "v1.34", "controlPlane": { "apiServer": {
            "extraArgs": ["--enable-admission-plugins=NodeRestriction"],
        } } },
    }))
    .expect("object");
    world
        .kubernetes()
        .create(&PostParams::default(), &kubernetes)
        .await
        .expect("create Kubernetes");

    // Up: etcd, the control plane, the kubeconfig, the requested minor.
    let ready = world
        .wait_ready("the cluster to be Ready on v1.34", |k| {
            k.status.as_ref().and_then(|s| s.version.as_deref()) == Some("v1.34.9")
        })
        .await;
    let status = ready.status.expect("status");
    assert_eq!(
        status.admin_kubeconfig_secret_name.as_deref(),
        Some("kubernetes-demo-admin-kubeconfig")
    );
    assert!(
        status
            .endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("https://"))
    );
    let version = world.tenant_version().await;
    assert!(version.starts_with("v1.34."), "the tenant serves {version}");
    // The moved flag reached the control plane as a field.
    let kcps = Api::<DynamicObject>::namespaced_with(
        world.client(),
        NAMESPACE,
        &resource(
            "controlplane.cluster.x-k8s.io",
            "v1alpha2",
            "KamajiControlPlane",
            "kamajicontrolplanes",
        ),
    );
    let kcp = kcps
        .get("kubernetes-demo")
        .await
        .expect("KamajiControlPlane");
    assert_eq!(
        kcp.data["spec"]["admissionControllers"],
        json!(["NodeRestriction"])
    );
    assert_eq!(kcp.data["spec"]["dataStoreName"], NAMESPACE);

    // etcd losing quorum shows on the object, and recovery clears it.
    world
        .parts
        .etcd()
        .inject_fault(NAMESPACE, "etcd", EtcdFault::QuorumLost);
    wait::until("EtcdReady to turn False", DEADLINE, || async {
        let object = world.kubernetes().get(NAME).await?;
        let etcd = object
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "EtcdReady"));
        Ok(etcd
            .filter(|c| c.status == "False" && c.message.contains("QuorumLost"))
            .map(|_| ()))
    })
    .await
    .unwrap_or_else(|e| world.fail(e, None));
    world.parts.etcd().clear_fault(NAMESPACE, "etcd");
    world
        .wait_ready("the cluster to be Ready again", |_| true)
        .await;

    // A minor upgrade rolls the control plane.
    world
        .kubernetes()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "version": "v1.35" } })),
        )
        .await
        .expect("upgrade");
    world
        .wait_ready("the cluster to be Ready on v1.35", |k| {
            k.status.as_ref().and_then(|s| s.version.as_deref()) == Some("v1.35.6")
        })
        .await;
    let version = world.tenant_version().await;
    assert!(version.starts_with("v1.35."), "the tenant serves {version}");
    assert!(
        world
            .parts
            .kamaji()
            .tenant("tenant-a", "kubernetes-demo")
            .is_some()
    );

    // Deletion: nothing of the cluster or its etcd is left.
    world.delete_and_wait_gone().await;
    let leftovers = [
        resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
        resource(
            "controlplane.cluster.x-k8s.io",
            "v1alpha2",
            "KamajiControlPlane",
            "kamajicontrolplanes",
        ),
        resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            "KubevirtCluster",
            "kubevirtclusters",
        ),
        resource(
            "etcd-operator.cozystack.io",
            "v1alpha2",
            "EtcdCluster",
            "etcdclusters",
        ),
    ];
    wait::until(
        "every object of the cluster to be gone",
        DEADLINE,
        || async {
            let mut left = Vec::new();
            for resource in &leftovers {
                left.extend(
                    world
                        .names(resource)
                        .await
                        .into_iter()
                        .map(|n| format!("{}/{n}", resource.kind)),
                );
            }
            let secrets: Api<Secret> = Api::namespaced(world.client(), NAMESPACE);
            left.extend(
                secrets
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|s| s.metadata.name)
                    .map(|n| format!("Secret/{n}")),
            );
            let stores: Api<DynamicObject> = Api::all_with(
                world.client(),
                &resource("kamaji.clastix.io", "v1alpha1", "DataStore", "datastores"),
            );
            if stores.get_opt(NAMESPACE).await?.is_some() {
                left.push(format!("DataStore/{NAMESPACE}"));
            }
            Ok(left.is_empty().then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e, None));
    assert_eq!(
        world.parts.kamaji().running().await,
        0,
        "the tenant control plane stopped"
    );
}

#[tokio::test]
async fn a_kubernetes_object_runs_on_cluster_api_v1_10_and_kamaji_v1alpha1() {
    let world = World::start_on(ClusterApiRelease::V1_10, KamajiApi::V1alpha1).await;
    let kubernetes: Kubernetes = serde_json::from_value(json!({
        "apiVersion": "apps.tenantry.dev/v1alpha1",
        "kind": "Kubernetes",
        "metadata": { "name": NAME, "namespace": NAMESPACE },
        "spec": { "version": "v1.31" },
    }))
    .expect("object");
    world
        .kubernetes()
        .create(&PostParams::default(), &kubernetes)
        .await
        .expect("create Kubernetes");
    world
        .wait_ready("the cluster to be Ready on v1.31", |k| {
            k.status.as_ref().and_then(|s| s.version.as_deref()) == Some("v1.31.14")
        })
        .await;
    let version = world.tenant_version().await;
    assert!(version.starts_with("v1.31."), "the tenant serves {version}");

    // Written in the versions served: a v1beta1 Cluster naming a v1alpha1
    // KamajiControlPlane, which Cluster API v1.10 reports ready.
    let cluster = Api::<DynamicObject>::namespaced_with(
        world.client(),
        NAMESPACE,
        &resource("cluster.x-k8s.io", "v1beta1", "Cluster", "clusters"),
    )
    .get("kubernetes-demo")
    .await
    .expect("Cluster");
    assert_eq!(
        cluster.data["spec"]["controlPlaneRef"]["apiVersion"],
        "controlplane.cluster.x-k8s.io/v1alpha1"
    );
    assert_eq!(
        cluster.data["status"]["controlPlaneReady"], true,
        "{}",
        cluster.data["status"]
    );
    let kcp = Api::<DynamicObject>::namespaced_with(
        world.client(),
        NAMESPACE,
        &resource(
            "controlplane.cluster.x-k8s.io",
            "v1alpha1",
            "KamajiControlPlane",
            "kamajicontrolplanes",
        ),
    )
    .get("kubernetes-demo")
    .await
    .expect("KamajiControlPlane v1alpha1");
    assert_eq!(kcp.data["spec"]["version"], "v1.31.14");
    assert_eq!(
        kcp.data["spec"]["network"]["additionalServicePorts"][0]["name"],
        "talos-trustd"
    );

    world.delete_and_wait_gone().await;
    assert_eq!(
        world.parts.kamaji().running().await,
        0,
        "the tenant control plane stopped"
    );
}
