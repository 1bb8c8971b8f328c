//! The real CABPT (v0.6.12, the version Cozystack runs) next to the real
//! Cluster API core manager: a worker's TalosConfig (`generateType: none`,
//! as tenantry's pools write them) becomes the Machine's bootstrap data
//! Secret, which Talos's own validator accepts; a config Talos's loader
//! refuses leaves the TalosConfig and the Machine unready, in Talos's words.

use std::time::Duration;

use base64::Engine as _;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tenantry_e2e::talos_check::{self, TalosMode};
use tenantry_e2e::wait;

const NAMESPACE: &str = "default";
const CLUSTER: &str = "talos";
/// Generous upper bound for a step; never the thing measured.
const DEADLINE: Duration = Duration::from_secs(120);

/// A worker config as tenantry's pools render it, trimmed to what Talos
/// needs to accept it; `ca_pem` is the cluster (and machine) CA.
fn worker_config(ca_pem: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "version: v1alpha1
machine:
  type: worker
  token: abcdef.0123456789abcdef
  ca:
    crt: {ca}
    key: \"\"
  certSANs: []
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.35.4
  install:
    disk: /dev/vda
cluster:
  controlPlane:
    endpoint: https://talos.default.svc:6443
  clusterName: talos
  network:
    dnsDomain: cluster.local
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  token: abcdef.0123456789abcdef
  ca:
    crt: {ca}
    key: \"\"
"
    )
}

fn dynamic(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// The management cluster with the real Cluster API manager, CABPT and
/// tenantry.
struct World {
    parts: tenantry_e2e::World,
}

impl World {
    async fn start() -> Self {
        let parts = tenantry_e2e::World::builder("cabpt")
            .cluster_api()
            .cabpt()
            .tenantry()
            .start()
            .await;
        Self { parts }
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        self.parts.fail(error)
    }

    async fn create(&self, document: Value) {
        self.parts.create(NAMESPACE, document).await;
    }

    /// A Cluster whose infrastructure tenantry provisions (a KubevirtCluster
    /// needs only its control-plane Service), so CABPT gets to work.
    async fn create_cluster(&self) {
        self.create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtCluster",
            "metadata": { "name": CLUSTER, "namespace": NAMESPACE },
            "spec": {}
        }))
        .await;
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": CLUSTER, "namespace": NAMESPACE },
            "spec": {
                "clusterNetwork": { "pods": { "cidrBlocks": ["10.244.0.0/16"] } },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": CLUSTER }
            }
        }))
        .await;
    }

    /// A worker Machine whose bootstrap is a TalosConfig holding `data`. Its
    /// KubevirtMachine is never created: bootstrap does not wait for it.
    async fn create_worker(&self, name: &str, data: &str) {
        self.create(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1alpha3",
            "kind": "TalosConfig",
            "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "cluster.x-k8s.io/cluster-name": CLUSTER } },
            "spec": { "generateType": "none", "talosVersion": "v1.13", "data": data }
        }))
        .await;
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "cluster.x-k8s.io/cluster-name": CLUSTER } },
            "spec": {
                "clusterName": CLUSTER,
                "bootstrap": { "configRef": { "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "TalosConfig", "name": name } },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachine", "name": name }
            }
        }))
        .await;
    }

    fn talos_configs(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.parts.client(),
            NAMESPACE,
            &dynamic("bootstrap.cluster.x-k8s.io", "v1alpha3", "TalosConfig"),
        )
    }

    fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.parts.client(),
            NAMESPACE,
            &dynamic("cluster.x-k8s.io", "v1beta2", "Machine"),
        )
    }
}

fn condition<'a>(object: &'a Value, pointer: &str, type_: &str) -> Option<&'a Value> {
    object
        .pointer(pointer)?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[tokio::test]
async fn cabpt_renders_what_talos_accepts_and_names_what_it_refuses() {
    let world = World::start().await;
    let worker = worker_config(&world.parts.control_plane().ca().cert_pem());
    let version = talos_check::version()
        .await
        .expect("talos-config --version");
    assert!(version.contains("v1.13.6"), "{version}");
    assert_eq!(
        talos_check::validate(&worker, TalosMode::Cloud)
            .await
            .expect("run the validator"),
        Ok(()),
        "Talos accepts the worker config as written"
    );
    world.create_cluster().await;
    world.create_worker("good", &worker).await;
    // Talos's loader refuses keys it does not know.
    let unknown_key = worker.replace("  certSANs: []\n", "  certSANz: []\n");
    world.create_worker("bad", &unknown_key).await;

    // The good one: CAPI's Machine takes the Secret CABPT wrote, and what
    // CABPT wrote (re-encoded through Talos's loader) Talos still accepts.
    let machines = world.machines();
    let secret_name = wait::until("the Machine to take CABPT's data Secret", DEADLINE, || {
        let machines = machines.clone();
        async move {
            let machine = machines.get("good").await?;
            Ok(machine
                .data
                .pointer("/spec/bootstrap/dataSecretName")
                .and_then(Value::as_str)
                .map(str::to_string))
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    let secret = Api::<Secret>::namespaced(world.parts.client(), NAMESPACE)
        .get(&secret_name)
        .await
        .expect("bootstrap data Secret");
    let data = String::from_utf8(secret.data.expect("data")["value"].0.clone()).expect("utf-8");
    assert!(
        data.contains("endpoint: https://talos.default.svc:6443"),
        "{data}"
    );
    assert_eq!(
        talos_check::validate(&data, TalosMode::Cloud)
            .await
            .expect("run the validator"),
        Ok(()),
        "Talos accepts what CABPT wrote"
    );
    let good = world
        .talos_configs()
        .get("good")
        .await
        .expect("TalosConfig");
    assert_eq!(good.data.pointer("/status/ready"), Some(&json!(true)));

    // The bad one: no Secret, and the TalosConfig says why in Talos's words;
    // the Machine's bootstrap stays unready.
    let configs = world.talos_configs();
    let message = wait::until("CABPT to refuse the bad config", DEADLINE, || {
        let configs = configs.clone();
        async move {
            let config = configs.get("bad").await?;
            Ok(
                condition(&config.data, "/status/conditions", "DataSecretAvailable")
                    .filter(|c| c["status"] == "False")
                    .and_then(|c| c["message"].as_str())
                    .filter(|m| !m.is_empty())
                    .map(str::to_string),
            )
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert!(
        message.contains("certSANz"),
        "Talos names the key: {message}"
    );
    let bad = configs.get("bad").await.expect("TalosConfig");
    assert_ne!(bad.data.pointer("/status/ready"), Some(&json!(true)));
    let machine = machines.get("bad").await.expect("Machine");
    assert!(
        machine
            .data
            .pointer("/spec/bootstrap/dataSecretName")
            .is_none(),
        "no bootstrap data for a config Talos refuses"
    );
    // The Machine itself names Talos's reason, as `kubectl describe` shows
    // it (Cluster API mirrors the TalosConfig's condition).
    let bootstrap_ready = wait::until("the Machine to name Talos's reason", DEADLINE, || {
        let machines = machines.clone();
        async move {
            let machine = machines.get("bad").await?;
            Ok(
                condition(&machine.data, "/status/conditions", "BootstrapConfigReady")
                    .filter(|c| {
                        c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("certSANz"))
                    })
                    .cloned(),
            )
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(bootstrap_ready["status"], "False", "{bootstrap_ready}");
    assert_eq!(
        bootstrap_ready["reason"], "DataSecretGenerationFailed",
        "{bootstrap_ready}"
    );
}
