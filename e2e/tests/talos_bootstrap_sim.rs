//! The Talos bootstrap simulator (CABPT) and the tenant control plane's
//! Service, against a real management apiserver and the real CAPI core
//! manager: a worker's TalosConfig stays unready until the Cluster's
//! infrastructure is provisioned, then its machine config lands in the
//! Machine's bootstrap data Secret and CAPI reads it through the v1beta2
//! contract; the KamajiControlPlane's Service gets a ClusterIP, and the
//! tenant answers at the Service name a Talos worker config names.

use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tenantry_e2e::cluster_api::ClusterApiManager;
use tenantry_e2e::control_plane::{ControlPlane, ControlPlaneOptions};
use tenantry_e2e::sim::tenant::{
    KamajiControlPlaneSimulator, TalosBootstrapSimulator, TalosJoin, TenantClusters,
    TenantControlPlaneOptions, check_cluster_ca,
};
use tenantry_e2e::wait;

const NAMESPACE: &str = "tenant-a";
const CLUSTER: &str = "kubernetes-demo";
const SERVICE_ENDPOINT: &str = "https://kubernetes-demo.tenant-a.svc:6443";
/// Generous upper bound for a step; never the thing measured.
const DEADLINE: Duration = Duration::from_secs(120);

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn talos_configs() -> ApiResource {
    resource(
        "bootstrap.cluster.x-k8s.io",
        "v1beta1",
        "TalosConfig",
        "talosconfigs",
    )
}

struct World {
    // Field order is drop order: controllers before the apiserver.
    cabpt: TalosBootstrapSimulator,
    _kamaji: KamajiControlPlaneSimulator,
    tenants: TenantClusters,
    capi: ClusterApiManager,
    control_plane: ControlPlane,
}

impl World {
    async fn start() -> Self {
        let control_plane = ControlPlane::start_with(ControlPlaneOptions {
            name: "management".into(),
            ..Default::default()
        })
        .await
        .expect("start control plane");
        let client = control_plane.client();
        // KubevirtCluster, with the contract labels CAPI reads.
        tenantry_e2e::manifests::apply_crds(&client, tenantry_api::crds::all())
            .await
            .expect("install tenantry CRDs");
        let capi = ClusterApiManager::start(&control_plane)
            .await
            .expect("start the Cluster API manager");
        let tenants = TenantClusters::new();
        let kamaji = KamajiControlPlaneSimulator::start(
            client.clone(),
            tenants.clone(),
            TenantControlPlaneOptions::default(),
        )
        .await
        .expect("start the Kamaji simulator");
        let cabpt = TalosBootstrapSimulator::start(client.clone())
            .await
            .expect("start the Talos bootstrap simulator");
        Api::<Namespace>::all(client)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": NAMESPACE } })).unwrap(),
            )
            .await
            .expect("create namespace");
        Self {
            cabpt,
            _kamaji: kamaji,
            tenants,
            capi,
            control_plane,
        }
    }

    fn client(&self) -> kube::Client {
        self.control_plane.client()
    }

    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), NAMESPACE, resource)
    }

    async fn create(&self, document: Value) -> DynamicObject {
        tenantry_e2e::manifests::create_object(&self.client(), &document, NAMESPACE)
            .await
            .unwrap_or_else(|e| self.fail(e))
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        panic!(
            "{error:#}\n---- Cluster API manager log ----\n{}",
            self.capi.log_tail(30)
        )
    }

    /// A Machine of the cluster whose bootstrap config is the TalosConfig
    /// `name`, and that TalosConfig, owned by the Machine as CAPI's
    /// MachineSet makes them. The infrastructure machine does not exist:
    /// nothing here provisions one.
    async fn worker(&self, name: &str, config: &str) {
        let machine = self
            .create(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Machine",
                "metadata": { "name": name, "labels": { "cluster.x-k8s.io/cluster-name": CLUSTER } },
                "spec": {
                    "clusterName": CLUSTER,
                    "bootstrap": { "configRef": {
                        "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "TalosConfig", "name": name,
                    } },
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachine", "name": name,
                    },
                },
            }))
            .await;
        self.create(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1",
            "kind": "TalosConfig",
            "metadata": {
                "name": name,
                "labels": { "cluster.x-k8s.io/cluster-name": CLUSTER },
                "ownerReferences": [{
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "name": name, "uid": machine.metadata.uid, "controller": true,
                }],
            },
            "spec": { "generateType": "none", "data": config },
        }))
        .await;
    }

    /// The TalosConfig once `check` holds on it.
    async fn wait_talos_config(
        &self,
        what: &str,
        name: &str,
        check: impl Fn(&Value) -> bool,
    ) -> DynamicObject {
        let api = self.api(&talos_configs());
        let check = &check;
        wait::until(what, DEADLINE, || {
            let api = api.clone();
            async move {
                let config = api.get(name).await?;
                Ok(check(&config.data["status"]).then_some(config))
            }
        })
        .await
        .unwrap_or_else(|e| self.fail(e))
    }
}

/// The `DataSecretAvailable` condition of a TalosConfig status.
fn data_secret_available(status: &Value) -> Option<&Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "DataSecretAvailable")
}

/// A Talos worker machine config as tenantry's pools render it, trimmed.
fn worker_config(ca_pem: &str) -> String {
    format!(
        "version: v1alpha1
machine:
  type: worker
  token: trustd-token
  network:
    extraHostEntries:
      - ip: 10.96.0.10
        aliases: [kubernetes-demo.tenant-a.svc]
cluster:
  controlPlane:
    endpoint: {SERVICE_ENDPOINT}
  token: abcdef.0123456789abcdef
  ca:
    crt: {}
    key: \"\"
",
        base64::engine::general_purpose::STANDARD.encode(ca_pem)
    )
}

#[tokio::test]
async fn worker_bootstrap_data_waits_for_the_infrastructure_and_names_the_tenant_service() {
    let world = World::start().await;
    world
        .create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtCluster",
            "metadata": { "name": CLUSTER },
            "spec": {},
        }))
        .await;
    world
        .create(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2",
            "kind": "KamajiControlPlane",
            "metadata": { "name": CLUSTER },
            "spec": {
                "version": "v1.35.0",
                "replicas": 1,
                "dataStoreName": "default",
                "network": {
                    "serviceType": "ClusterIP",
                    "additionalServicePorts": [{
                        "name": "talos-trustd", "port": 50001, "protocol": "TCP", "targetPort": 50001,
                    }],
                },
            },
        }))
        .await;
    world
        .create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": CLUSTER },
            "spec": {
                "clusterNetwork": {
                    "pods": { "cidrBlocks": ["10.243.0.0/16"] },
                    "services": { "cidrBlocks": ["10.95.0.0/16"] },
                },
                "controlPlaneRef": {
                    "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KamajiControlPlane", "name": CLUSTER,
                },
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": CLUSTER,
                },
            },
        }))
        .await;

    // The tenant runs and answers at its Service name.
    let tenants = &world.tenants;
    let tenant = wait::until(
        "the tenant to answer at its Service name",
        DEADLINE,
        || async { Ok(tenants.by_endpoint(SERVICE_ENDPOINT)) },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        (tenant.namespace.as_str(), tenant.name.as_str()),
        (NAMESPACE, CLUSTER)
    );
    assert!(
        tenants
            .by_endpoint("kubernetes-demo.tenant-a.svc.cluster.local:6443")
            .is_some()
    );
    let services: Api<Service> = Api::namespaced(world.client(), NAMESPACE);
    let service = wait::until("the control plane Service", DEADLINE, || async {
        Ok(services.get_opt(CLUSTER).await?)
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    let spec = service.spec.expect("Service spec");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert!(
        spec.cluster_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.96.")),
        "ClusterIP {:?}",
        spec.cluster_ip
    );
    let ports: Vec<(Option<String>, i32)> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.port))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("kube-apiserver".into()), 6443),
            (Some("talos-trustd".into()), 50001)
        ]
    );
    let owner = &service.metadata.owner_references.expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("KamajiControlPlane", CLUSTER)
    );

    // CAPI sees the control plane initialized; the infrastructure is not
    // provisioned yet.
    let clusters = world.api(&resource(
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
        "clusters",
    ));
    wait::until("the control plane to be initialized", DEADLINE, || async {
        let cluster = clusters.get(CLUSTER).await?;
        Ok(
            (cluster.data["status"]["initialization"]["controlPlaneInitialized"] == true)
                .then_some(()),
        )
    })
    .await
    .unwrap_or_else(|e| world.fail(e));

    let ca_pem = {
        let secrets: Api<Secret> = Api::namespaced(world.client(), NAMESPACE);
        let ca = secrets
            .get("kubernetes-demo-ca")
            .await
            .expect("<cluster>-ca");
        String::from_utf8(ca.data.expect("data")["tls.crt"].0.clone()).expect("PEM")
    };
    let config = worker_config(&ca_pem);
    world.worker("demo-pool-0", &config).await;
    world.worker("demo-pool-1", &config).await;
    world.cabpt.hold(NAMESPACE, "demo-pool-1");

    // CABPT waits for the cluster infrastructure, whatever the control plane.
    let waiting = world
        .wait_talos_config(
            "demo-pool-0 to wait for the infrastructure",
            "demo-pool-0",
            |status| {
                data_secret_available(status).is_some_and(|c| {
                    c["status"] == "False"
                        && c["message"] == "Waiting for the cluster infrastructure to be ready"
                })
            },
        )
        .await;
    assert_ne!(
        waiting.data["status"]["initialization"]["dataSecretCreated"],
        true
    );
    let secrets: Api<Secret> = Api::namespaced(world.client(), NAMESPACE);
    assert!(
        secrets
            .get_opt("demo-pool-0-bootstrap-data")
            .await
            .expect("get Secret")
            .is_none()
    );

    // The infrastructure provider reports the cluster provisioned.
    world
        .api(&resource(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            "KubevirtCluster",
            "kubevirtclusters",
        ))
        .patch_status(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "status": { "ready": true, "initialization": { "provisioned": true } } }),
            ),
        )
        .await
        .expect("provision the KubevirtCluster");

    let rendered = world
        .wait_talos_config("demo-pool-0 to be rendered", "demo-pool-0", |status| {
            status["initialization"]["dataSecretCreated"] == true
        })
        .await;
    let status = &rendered.data["status"];
    assert_eq!(status["dataSecretName"], "demo-pool-0-bootstrap-data");
    assert_eq!(
        data_secret_available(status).map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    let secret = secrets
        .get("demo-pool-0-bootstrap-data")
        .await
        .expect("the bootstrap data Secret");
    let value = String::from_utf8(secret.data.expect("data")["value"].0.clone()).expect("UTF-8");
    assert_eq!(value, config);
    assert_eq!(
        secret
            .metadata
            .labels
            .unwrap_or_default()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some(CLUSTER)
    );
    let owner = &secret.metadata.owner_references.expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("TalosConfig", "demo-pool-0", Some(true))
    );

    // CAPI reads it through the v1beta2 bootstrap contract.
    let machines = world.api(&resource(
        "cluster.x-k8s.io",
        "v1beta2",
        "Machine",
        "machines",
    ));
    wait::until(
        "the Machine to name its bootstrap data",
        DEADLINE,
        || async {
            let machine = machines.get("demo-pool-0").await?;
            Ok((machine.data["spec"]["bootstrap"]["dataSecretName"]
                == "demo-pool-0-bootstrap-data"
                && machine.data["status"]["initialization"]["bootstrapDataSecretCreated"] == true)
                .then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));

    // What the worker boots names a tenant that runs, with its CA.
    let join = TalosJoin::parse(&value).expect("a Talos config");
    let joined = tenants.by_endpoint(&join.endpoint).expect("the tenant");
    assert_eq!(
        check_cluster_ca(join.cluster_ca_pem.as_deref(), &joined.ca_pem),
        Ok(())
    );

    // A held config stays unready until released.
    let held = world
        .api(&talos_configs())
        .get("demo-pool-1")
        .await
        .expect("get");
    assert!(
        held.data["status"].is_null() || held.data["status"]["initialization"].is_null(),
        "a held TalosConfig is left alone: {}",
        held.data["status"]
    );
    world.cabpt.release(NAMESPACE, "demo-pool-1");
    world
        .wait_talos_config("demo-pool-1 to be rendered", "demo-pool-1", |status| {
            status["dataSecretName"] == "demo-pool-1-bootstrap-data"
        })
        .await;

    // The Service and the Service names go with the tenant.
    world
        .api(&resource(
            "controlplane.cluster.x-k8s.io",
            "v1alpha2",
            "KamajiControlPlane",
            "kamajicontrolplanes",
        ))
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .expect("delete the KamajiControlPlane");
    wait::until(
        "the tenant and its Service to be gone",
        DEADLINE,
        || async {
            let gone = tenants.by_endpoint(SERVICE_ENDPOINT).is_none()
                && services.get_opt(CLUSTER).await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
}
