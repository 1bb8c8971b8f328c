//! Kamaji, as Cluster API sees it: the control plane provider for
//! `KamajiControlPlane` (`controlplane.cluster.x-k8s.io/v1alpha2`) and the
//! tenant control plane behind it.
//!
//! Kamaji's CAPI provider turns a KamajiControlPlane into a Kamaji
//! `TenantControlPlane`, whose kube-apiserver runs as pods; once it answers,
//! the provider writes the `<cluster>-kubeconfig` Secret, sets
//! `spec.controlPlaneEndpoint` and reports the v1beta2 control plane
//! contract in status. Here the tenant's kube-apiserver is a harness
//! [`ControlPlane`] process instead of pods, and this simulator does the
//! provider's part directly on the KamajiControlPlane.
//!
//! One simulator can serve several management clusters
//! ([`KamajiControlPlaneSimulator::serve`]). A tenant control plane belongs
//! to its Cluster's namespace and name, not to one KamajiControlPlane
//! object, so when `clusterctl move` recreates the objects in another
//! management cluster and deletes the originals, the tenant keeps running
//! (as Kamaji's tenant control planes do, hosted apart from the CAPI
//! objects); it stops when no management cluster holds its
//! KamajiControlPlane any more. Left out: the
//! TenantControlPlane object, Kamaji's datastores, addons (CoreDNS,
//! kube-proxy, konnectivity), version upgrades and replicas (the tenant has
//! one kube-apiserver whatever `spec.replicas` says).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::{TenantCluster, TenantClusters};
use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::manifests;

/// The kind this simulator serves.
pub const KAMAJI_CONTROL_PLANE_KIND: &str = "KamajiControlPlane";
const GROUP: &str = "controlplane.cluster.x-k8s.io";
const VERSION: &str = "v1alpha2";
/// The provider's release labels its CRD with the contract it implements.
const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
const FIELD_MANAGER: &str = "sim-kamaji-control-plane-provider";
/// How often the simulator looks at KamajiControlPlanes.
const POLL: Duration = Duration::from_millis(500);

/// How the tenant control planes run.
#[derive(Clone, Debug)]
pub struct TenantControlPlaneOptions {
    /// Passed to each tenant's kube-controller-manager: how long a Node may
    /// go without a heartbeat before its `Ready` turns `Unknown`. Real
    /// clusters use 50 s; tests use a few seconds.
    pub node_monitor_grace_period: Duration,
}

impl Default for TenantControlPlaneOptions {
    fn default() -> Self {
        Self {
            node_monitor_grace_period: Duration::from_secs(10),
        }
    }
}

fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, KAMAJI_CONTROL_PLANE_KIND),
        "kamajicontrolplanes",
    )
}

/// The KamajiControlPlane CRD this simulator acts on.
pub fn crd_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/upstream/kamaji-cp-provider/crds")
        .join("controlplane.cluster.x-k8s.io_kamajicontrolplanes.yaml")
}

/// Installs the KamajiControlPlane CRD with the contract label the
/// provider's release adds, so CAPI reads it as a v1beta2 control plane,
/// and the labels `clusterctl init --control-plane kamaji` adds, so
/// `clusterctl move` moves KamajiControlPlanes with their Clusters.
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let mut crds = manifests::crds_of(manifests::read_documents(&crd_path())?)?;
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(CONTRACT_LABEL.into(), VERSION.into());
        labels.insert("clusterctl.cluster.x-k8s.io".into(), String::new());
        labels.insert(
            "cluster.x-k8s.io/provider".into(),
            "control-plane-kamaji".into(),
        );
    }
    manifests::apply_crds(client, crds).await
}

/// A tenant control plane that runs for one KamajiControlPlane.
struct Running {
    control_plane: ControlPlane,
    endpoint: String,
}

struct Shared {
    /// The management clusters served.
    clients: std::sync::Mutex<Vec<kube::Client>>,
    tenants: TenantClusters,
    options: TenantControlPlaneOptions,
    /// By `namespace/cluster`.
    running: Mutex<HashMap<String, Running>>,
}

/// A running simulator. Dropping it stops its loop and every tenant
/// control plane it started.
pub struct KamajiControlPlaneSimulator {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl KamajiControlPlaneSimulator {
    /// Installs the CRD and starts serving KamajiControlPlanes of the
    /// management cluster behind `client`. Tenants it starts are published
    /// in `tenants`.
    pub async fn start(
        client: kube::Client,
        tenants: TenantClusters,
        options: TenantControlPlaneOptions,
    ) -> anyhow::Result<Self> {
        install_crds(&client)
            .await
            .context("install the KamajiControlPlane CRD")?;
        let shared = Arc::new(Shared {
            clients: std::sync::Mutex::new(vec![client]),
            tenants,
            options,
            running: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(run(shared.clone()));
        Ok(Self { shared, task })
    }

    /// Serves the KamajiControlPlanes of another management cluster too
    /// (installing the CRD there).
    pub async fn serve(&self, client: kube::Client) -> anyhow::Result<()> {
        install_crds(&client)
            .await
            .context("install the KamajiControlPlane CRD")?;
        self.shared
            .clients
            .lock()
            .expect("clients lock")
            .push(client);
        Ok(())
    }

    /// Stops serving every management cluster but the one behind `client`
    /// (already served): the source of a finished `clusterctl move`, whose
    /// objects are gone, goes away.
    pub fn serve_only(&self, client: kube::Client) {
        *self.shared.clients.lock().expect("clients lock") = vec![client];
    }

    /// The tenant control plane of a CAPI Cluster, once it runs.
    pub fn tenant(&self, namespace: &str, cluster: &str) -> Option<TenantCluster> {
        self.shared.tenants.get(namespace, cluster)
    }

    /// How many tenant control planes run now.
    pub async fn running(&self) -> usize {
        self.shared.running.lock().await.len()
    }

    /// Stops the loop and every tenant control plane.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
        let running: Vec<Running> = self
            .shared
            .running
            .lock()
            .await
            .drain()
            .map(|(_, r)| r)
            .collect();
        for tenant in running {
            self.shared.tenants.remove(&tenant.endpoint);
            stop_control_plane(tenant.control_plane).await;
        }
    }
}

impl Drop for KamajiControlPlaneSimulator {
    fn drop(&mut self) {
        self.task.abort();
        // Control planes still in `running` die with the Arc (their
        // processes are killed on drop).
    }
}

async fn stop_control_plane(control_plane: ControlPlane) {
    // Graceful stop waits on the processes; keep it off the runtime threads.
    let _ = tokio::task::spawn_blocking(move || control_plane.stop()).await;
}

async fn run(shared: Arc<Shared>) {
    loop {
        if let Err(error) = reconcile_all(&shared).await {
            tracing::debug!(error = format!("{error:#}"), "KamajiControlPlane simulator");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn reconcile_all(shared: &Shared) -> anyhow::Result<()> {
    let clients = shared.clients.lock().expect("clients lock").clone();
    let mut live: Vec<(kube::Client, String, DynamicObject)> = Vec::new();
    let mut all_answered = true;
    for client in clients {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
        // A management cluster that stopped answering (the source of a
        // finished move) must not hold up the others.
        let objects = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(error) => {
                tracing::debug!(%error, "a management cluster does not answer");
                all_answered = false;
                continue;
            }
        };
        for object in objects {
            if object.metadata.deletion_timestamp.is_some() {
                continue;
            }
            // Kamaji's provider does nothing until CAPI's Cluster controller
            // has made the Cluster the owner.
            let Some(cluster) = owner_cluster(&object) else {
                continue;
            };
            let key = format!(
                "{}/{cluster}",
                object.metadata.namespace.as_deref().unwrap_or_default()
            );
            live.push((client.clone(), key, object));
        }
    }

    // A tenant whose KamajiControlPlane is gone everywhere stops. Only
    // when every management cluster answered: one that did not may still
    // hold it.
    let gone: Vec<(String, Running)> = if !all_answered {
        Vec::new()
    } else {
        let mut running = shared.running.lock().await;
        let keys: Vec<String> = running
            .keys()
            .filter(|key| !live.iter().any(|(_, k, _)| k == *key))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|key| running.remove(&key).map(|r| (key, r)))
            .collect()
    };
    for (key, tenant) in gone {
        tracing::info!(cluster = %key, endpoint = %tenant.endpoint, "tenant control plane stopped");
        shared.tenants.remove(&tenant.endpoint);
        stop_control_plane(tenant.control_plane).await;
    }

    for (client, key, object) in &live {
        if let Err(error) = reconcile(shared, client, key, object).await {
            tracing::warn!(
                name = object.metadata.name.as_deref().unwrap_or_default(),
                error = format!("{error:#}"),
                "KamajiControlPlane not reconciled"
            );
        }
    }
    Ok(())
}

/// The CAPI Cluster owning `object`, as the provider waits for it.
fn owner_cluster(object: &DynamicObject) -> Option<String> {
    object
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
}

async fn reconcile(
    shared: &Shared,
    client: &kube::Client,
    key: &str,
    object: &DynamicObject,
) -> anyhow::Result<()> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let cluster = owner_cluster(object).context("no owning Cluster")?;
    let endpoint = {
        let mut running = shared.running.lock().await;
        match running.get(key) {
            Some(tenant) => tenant.endpoint.clone(),
            None => {
                let control_plane = ControlPlane::start_with(ControlPlaneOptions {
                    name: format!("tenant-{cluster}"),
                    node_monitor_grace_period: Some(shared.options.node_monitor_grace_period),
                    ..Default::default()
                })
                .await
                .with_context(|| {
                    format!("start the tenant control plane of {namespace}/{cluster}")
                })?;
                let endpoint = control_plane.server_url().to_string();
                shared.tenants.insert(TenantCluster {
                    namespace: namespace.clone(),
                    name: cluster.clone(),
                    endpoint: endpoint.clone(),
                    client: control_plane.client(),
                });
                tracing::info!(%namespace, %cluster, %endpoint, "tenant control plane running");
                running.insert(
                    key.to_string(),
                    Running {
                        control_plane,
                        endpoint: endpoint.clone(),
                    },
                );
                endpoint
            }
        }
    };
    let kubeconfig = {
        let running = shared.running.lock().await;
        let tenant = running.get(key).context("tenant control plane vanished")?;
        std::fs::read_to_string(tenant.control_plane.kubeconfig_path())
            .context("read the tenant's admin kubeconfig")?
    };
    ensure_kubeconfig_secret(client, object, &namespace, &cluster, &kubeconfig).await?;

    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &api_resource());
    let (host, port) = split_endpoint(&endpoint)?;
    if object.data["spec"]["controlPlaneEndpoint"]["host"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        api.patch(
            &name,
            &patch_params(),
            &Patch::Merge(
                json!({ "spec": { "controlPlaneEndpoint": { "host": host, "port": port } } }),
            ),
        )
        .await
        .context("set spec.controlPlaneEndpoint")?;
    }
    let status = desired_status(object);
    if !status_matches(&object.data["status"], &status) {
        api.patch_status(
            &name,
            &patch_params(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .context("patch status")?;
    }
    Ok(())
}

/// The Secret CAPI's ClusterCache reads (`<cluster>-kubeconfig`, key
/// `value`), owned by the KamajiControlPlane as the provider makes it.
async fn ensure_kubeconfig_secret(
    client: &kube::Client,
    owner: &DynamicObject,
    namespace: &str,
    cluster: &str,
    kubeconfig: &str,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = format!("{cluster}-kubeconfig");
    if let Some(existing) = secrets.get_opt(&name).await? {
        let current = existing
            .data
            .as_ref()
            .and_then(|d| d.get("value"))
            .map(|v| v.0.as_slice());
        if current == Some(kubeconfig.as_bytes()) {
            return Ok(());
        }
        secrets
            .patch(
                &name,
                &patch_params(),
                &Patch::Merge(json!({ "stringData": { "value": kubeconfig } })),
            )
            .await
            .context("update the kubeconfig Secret")?;
        return Ok(());
    }
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { "cluster.x-k8s.io/cluster-name": cluster },
            "ownerReferences": [{
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": KAMAJI_CONTROL_PLANE_KIND,
                "name": owner.metadata.name,
                "uid": owner.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "type": "cluster.x-k8s.io/secret",
        "stringData": { "value": kubeconfig },
    }))?;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .context("create the kubeconfig Secret")?;
    Ok(())
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn split_endpoint(endpoint: &str) -> anyhow::Result<(String, u16)> {
    let authority = endpoint.trim_start_matches("https://");
    let (host, port) = authority
        .rsplit_once(':')
        .with_context(|| format!("endpoint {endpoint} has no port"))?;
    Ok((host.to_string(), port.parse()?))
}

/// The v1beta2 control plane contract status, as Kamaji's provider reports
/// it for a tenant whose kube-apiserver answers.
fn desired_status(object: &DynamicObject) -> Value {
    let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(2);
    let version = object.data["spec"]["version"].as_str().unwrap_or_default();
    let generation = object.metadata.generation.unwrap_or_default();
    let since = object.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .map(str::to_string)
        .unwrap_or_else(now);
    json!({
        "externalManagedControlPlane": true,
        "initialization": { "controlPlaneInitialized": true },
        "ready": true,
        "version": version,
        "replicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "upToDateReplicas": replicas,
        "conditions": [{
            "type": "Available",
            "status": "True",
            "reason": "Available",
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }],
    })
}

fn status_matches(current: &Value, desired: &Value) -> bool {
    desired
        .as_object()
        .is_some_and(|fields| fields.iter().all(|(k, v)| &current[k] == v))
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_splits_into_host_and_port() {
        assert_eq!(
            split_endpoint("https://127.0.0.1:41234").unwrap(),
            ("127.0.0.1".to_string(), 41234)
        );
        assert!(split_endpoint("https://127.0.0.1").is_err());
    }

    #[test]
    fn status_is_stable_once_written() {
        let mut object = DynamicObject::new("demo", &api_resource());
        object.data = json!({ "spec": { "version": "v1.35.0", "replicas": 2 } });
        let first = desired_status(&object);
        object.data["status"] = first.clone();
        assert!(status_matches(
            &object.data["status"],
            &desired_status(&object)
        ));
    }
}
