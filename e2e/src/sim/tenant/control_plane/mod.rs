//! Kamaji, as Cluster API sees it: the control plane provider for
//! `KamajiControlPlane` (`controlplane.cluster.x-k8s.io/v1alpha2`, or
//! `v1alpha1`, see below) and the tenant control plane behind it.
//!
//! Kamaji's CAPI provider turns a KamajiControlPlane into a Kamaji
//! `TenantControlPlane` of the same name, whose kube-apiserver runs as pods;
//! Kamaji writes the TCP's Secrets, and once the apiserver answers the
//! provider copies two of them into the CAPI Secrets, sets
//! `spec.controlPlaneEndpoint` and reports the v1beta2 control plane contract
//! in status. Here the tenant's kube-apiserver is a harness [`ControlPlane`]
//! process instead of pods, and this simulator does Kamaji's and the
//! provider's part directly on the KamajiControlPlane.
//!
//! What it copies:
//!
//! - **Versions.** The tenant kube-apiserver is a real build of the minor
//!   `spec.version` asks for ([`apiserver_for_version`]: v1.35 → the pinned
//!   `kube-apiserver`, v1.34 → `kube-apiserver-v1.34`), so `/version` answers
//!   that minor; the patch is whatever `hack/upstream/` pins. Any other minor
//!   starts nothing and reports `TenantControlPlaneCreated=False` (reason
//!   `Failed`, as the provider reports a TCP that Kamaji's webhook refused)
//!   with a message naming the version and the supported ones.
//! - **Upgrades.** A new minor in `spec.version` of a running tenant restarts
//!   its kube-apiserver with the other build on the same etcd data,
//!   certificates and port, so kubeconfigs keep working (Kamaji rolls the
//!   apiserver pods of the same TCP); `status.version` moves once the new
//!   apiserver answers `/version` with the new minor. As Kamaji's version
//!   webhook, it refuses downgrades and skipping a minor
//!   ([`version_change`]); the tenant keeps running the old version.
//! - **Secrets**, each owned by the KamajiControlPlane (standing in for the
//!   TCP that owns Kamaji's own) so they go with it:
//!   `<kcp>-admin-kubeconfig` with `admin.conf` and `super-admin.conf` (the
//!   public endpoint, i.e. the harness apiserver URL) and `admin.svc`,
//!   `super-admin.svc` (`https://<kcp>.<ns>.svc:<port>`, the TCP Service, port
//!   from the Cluster's `clusterNetwork.apiServerPort`, default 6443), as
//!   kubeadm writes them (users `kubernetes-admin` in group
//!   `kubeadm:cluster-admins`, bound to `cluster-admin` in the tenant as
//!   Kamaji's kubeadm phase does, and `kubernetes-super-admin` in
//!   `system:masters`); `<cluster>-kubeconfig` (key `value`, what CAPI's
//!   ClusterCache reads); `<cluster>-ca` (`tls.crt`/`tls.key`, the tenant
//!   CA, as the provider copies it from `<tcp>-ca`). The apiserver's serving
//!   certificate also names `<kcp>.<ns>.svc` and friends, as Kamaji's does,
//!   and `spec.network.certSANs`; with `spec.network.ingress` the public
//!   kubeconfigs and the endpoint name the ingress host, and Kamaji's
//!   Ingress exists (see `exposure.rs`).
//! - **The TCP Service**: `<kcp>` in the KamajiControlPlane's namespace,
//!   owned by it, as Kamaji writes it from what the provider copies out of
//!   `spec.network`: port `kube-apiserver` (the Service port above), then
//!   `additionalServicePorts` (e.g. `talos-trustd` 50001), of `serviceType`
//!   (default `LoadBalancer`), with `serviceLabels`/`serviceAnnotations`;
//!   deleted when the tenant stops. The management apiserver allocates its
//!   ClusterIP, but nothing routes to it and no pod backs it: workers reach
//!   the tenant because [`TenantClusters`](super::TenantClusters) also
//!   registers it under `<kcp>.<ns>.svc:<port>` and
//!   `<kcp>.<ns>.svc.cluster.local:<port>`, playing the part of a worker's
//!   hosts entry (Talos `machine.network.extraHostEntries` mapping the
//!   ClusterIP to that name) and of the Service together.
//! - **`spec.apiServer.extraArgs`**: flags Kamaji sets itself are dropped, as
//!   Kamaji's `mergeAPIServerArgs` does ([`KAMAJI_OWNED_APISERVER_FLAGS`]);
//!   the simulator logs what it dropped. The rest reach the tenant
//!   kube-apiserver, except where the harness cannot honour them
//!   ([`split_extra_args`]): flags the harness apiserver needs for its own
//!   wiring, and flags naming files that do not exist on this machine
//!   (production mounts them through `extraVolumes`, which nothing mounts
//!   here). If the apiserver still refuses to start with the user's flags, it
//!   is started without them and that is logged; a test reads the outcome
//!   with [`KamajiControlPlaneSimulator::tenant_apiserver`]. Kamaji rolls
//!   the apiserver pods when extraArgs change; here they are read once, when
//!   the tenant starts (an upgrade restarts with the same flags).
//! - **Status**: the provider's condition types (`TenantControlPlaneCreated`,
//!   `TenantControlPlaneAddressReady`, `ControlPlaneEndpointPatched`,
//!   `KamajiControlPlaneIsInitialized`, `KubeadmResourcesCreated`,
//!   `KamajiControlPlaneIsReady` with reasons `Succeeded`/`Failed`, and
//!   `Available`); in v1alpha2 `initialization.controlPlaneInitialized`,
//!   `ready`, `version` and the replica counts.
//! - **The v1alpha1 API** ([`KamajiApi::V1alpha1`]), as provider v0.19.0
//!   serves it and Cozystack deploys it (the CRD from
//!   `fixtures/upstream/cozystack/deployed-crds/`, which adds
//!   `spec.network.additionalServicePorts`): the same spec fields mean the
//!   same; status follows the v1beta1 contract, with `initialized` (set when
//!   the tenant apiserver first answers, never cleared) instead of
//!   `initialization`, `updatedReplicas`/`unavailableReplicas` instead of
//!   `upToDateReplicas`/`availableReplicas`, and `selector` (the
//!   KamajiControlPlane's labels), the same conditions (v0.19 writes no
//!   `Available`; it is kept so tests read both alike). Owner references
//!   name the version served. Either way, Clusters are read in the newest
//!   `cluster.x-k8s.io` version the management apiserver serves (`v1beta2`,
//!   else `v1beta1` as under Cluster API v1.10).
//! - **DataStores**, on demand
//!   ([`KamajiControlPlaneSimulator::wait_for_data_stores`]): Kamaji does not
//!   reconcile a TCP until its DataStore (`spec.dataStoreName`) exists and
//!   is `status.ready`; the simulator then waits likewise, reporting
//!   `TenantControlPlaneAddressReady=False`. Off by default, because most
//!   tests name a DataStore (`default`) that nothing creates.
//!
//! One simulator can serve several management clusters
//! ([`KamajiControlPlaneSimulator::serve`]). A tenant control plane belongs
//! to its Cluster's namespace and name, not to one KamajiControlPlane
//! object, so when `clusterctl move` recreates the objects in another
//! management cluster and deletes the originals, the tenant keeps running
//! (as Kamaji's tenant control planes do, hosted apart from the CAPI
//! objects); it stops when no management cluster holds its
//! KamajiControlPlane any more.
//!
//! Left out: the TenantControlPlane object and its other Secrets
//! (`<tcp>-ca`, certificates, the component kubeconfigs), the konnectivity
//! port of the Service, `serviceAddress` and LoadBalancer ingress (no load
//! balancer controller runs), the tenant's data
//! living in the DataStore (each tenant has its own harness etcd), addons
//! (CoreDNS, kube-proxy, konnectivity), `admissionControllers` (the harness
//! apiserver keeps its own plugin set), kube-scheduler, certificate
//! rotation, patching infrastructure clusters other than externally managed
//! KubevirtClusters (see `patch_infrastructure_cluster`), and replicas (the tenant
//! has one kube-apiserver whatever `spec.replicas` says; status reports
//! `spec.replicas` as ready). For v1alpha1, also v0.19's
//! `InfrastructureClusterPatched` condition, `failureReason`/`failureMessage`,
//! and its waiting for the Cluster's `infrastructureReady`; the
//! KamajiControlPlaneTemplate CRD is not installed in either API.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::exposure::{self, IngressSpec};
use super::{TenantCluster, TenantClusters};
use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::manifests;
use crate::pki::CertificateAuthority;
use crate::upstream::{Binary, KUBE_APISERVER_MINORS};

mod apiserver;
mod secrets;
mod service;
mod status;

pub use apiserver::*;
use secrets::*;
use service::*;
use status::*;

/// The kind this simulator serves.
pub const KAMAJI_CONTROL_PLANE_KIND: &str = "KamajiControlPlane";
const GROUP: &str = "controlplane.cluster.x-k8s.io";
const CAPI_GROUP: &str = "cluster.x-k8s.io";
const FIELD_MANAGER: &str = "sim-kamaji-control-plane-provider";
/// How often the simulator looks at KamajiControlPlanes.
const POLL: Duration = Duration::from_millis(500);
/// The TCP Service port when the Cluster does not set
/// `clusterNetwork.apiServerPort` (Kamaji's `networkProfile.port` default).
const DEFAULT_SERVICE_PORT: u16 = 6443;

/// How the tenant control planes run.
#[derive(Clone, Debug)]
pub struct TenantControlPlaneOptions {
    /// Passed to each tenant's kube-controller-manager: how long a Node may
    /// go without a heartbeat before its `Ready` turns `Unknown`. Real
    /// clusters use 50 s; tests use a few seconds.
    pub node_monitor_grace_period: Duration,
    /// Where pods of the management cluster reach tenant apiservers (its
    /// node address, [`crate::management::ManagementCluster::node_ip`]):
    /// each tenant kube-apiserver listens there too, its public endpoint
    /// (`super-admin.conf`, `<cluster>-kubeconfig`) names it, and the TCP
    /// Service gets an EndpointSlice pointing at it, as Kamaji's Service
    /// has the TCP pods as endpoints. Loopback only when unset.
    pub address: Option<std::net::Ipv4Addr>,
    /// Which KamajiControlPlane API the simulated provider serves.
    pub api: KamajiApi,
}

impl Default for TenantControlPlaneOptions {
    fn default() -> Self {
        Self {
            node_monitor_grace_period: Duration::from_secs(10),
            address: None,
            api: KamajiApi::default(),
        }
    }
}

/// The KamajiControlPlane API generation a provider release serves: each
/// serves one, with no conversion between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KamajiApi {
    /// `v1alpha2`, the Cluster API v1beta2 control plane contract (provider
    /// v0.20.0 and later).
    #[default]
    V1alpha2,
    /// `v1alpha1`, the v1beta1 contract, as provider v0.19.0 serves it and
    /// Cozystack deploys it (with `spec.network.additionalServicePorts`).
    V1alpha1,
}

impl KamajiApi {
    /// The API version: `v1alpha2` or `v1alpha1`.
    pub fn version(self) -> &'static str {
        match self {
            Self::V1alpha2 => "v1alpha2",
            Self::V1alpha1 => "v1alpha1",
        }
    }

    /// The label the provider's release puts on its CRD, naming the
    /// Cluster API contract it implements (its value is [`Self::version`]).
    fn contract_label(self) -> &'static str {
        match self {
            Self::V1alpha2 => "cluster.x-k8s.io/v1beta2",
            Self::V1alpha1 => "cluster.x-k8s.io/v1beta1",
        }
    }

    /// The KamajiControlPlane CRD of this API.
    pub fn crd_path(self) -> PathBuf {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream");
        let folder = match self {
            Self::V1alpha2 => fixtures.join("kamaji-cp-provider/crds"),
            Self::V1alpha1 => fixtures.join("cozystack/deployed-crds"),
        };
        folder.join("controlplane.cluster.x-k8s.io_kamajicontrolplanes.yaml")
    }

    pub(super) fn api_version(self) -> String {
        format!("{GROUP}/{}", self.version())
    }

    fn resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, self.version(), KAMAJI_CONTROL_PLANE_KIND),
            "kamajicontrolplanes",
        )
    }
}

/// The kube-apiserver of a running tenant, as the simulator runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantApiServer {
    /// The build running now.
    pub binary: Binary,
    /// The `spec.version` it serves (`status.version`).
    pub version: String,
    /// What became of `spec.apiServer.extraArgs`.
    pub extra_args: ExtraArgs,
}

/// The Cluster API version to read Clusters in, of those the management
/// apiserver serves: `v1beta2` (Cluster API v1.11 and later), else `v1beta1`
/// (v1.10, as Cozystack runs it). The fields read have the same paths in both.
fn capi_version<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let served: Vec<&str> = served.into_iter().collect();
    ["v1beta2", "v1beta1"]
        .into_iter()
        .find(|version| served.contains(version))
}

async fn discover_cluster_resource(client: &kube::Client) -> anyhow::Result<ApiResource> {
    let groups = client
        .list_api_groups()
        .await
        .context("list the API groups")?;
    let served = groups
        .groups
        .iter()
        .filter(|group| group.name == CAPI_GROUP)
        .flat_map(|group| group.versions.iter().map(|v| v.version.as_str()));
    let version = capi_version(served)
        .with_context(|| format!("{CAPI_GROUP} v1beta2 or v1beta1 is not served"))?;
    Ok(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CAPI_GROUP, version, "Cluster"),
        "clusters",
    ))
}

fn data_store_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kamaji.clastix.io", "v1alpha1", "DataStore"),
        "datastores",
    )
}

/// Installs the default ([`KamajiApi::V1alpha2`]) KamajiControlPlane CRD;
/// see [`install_crds_for`].
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    install_crds_for(client, KamajiApi::default()).await
}

/// Installs the KamajiControlPlane CRD of `api` with the contract label the
/// provider's release adds, so CAPI reads it as a control plane of that
/// contract, and the labels `clusterctl init --control-plane kamaji` adds,
/// so `clusterctl move` moves KamajiControlPlanes with their Clusters. The
/// template CRD is left out: nothing here reads templates.
pub async fn install_crds_for(
    client: &kube::Client,
    api: KamajiApi,
) -> anyhow::Result<Vec<String>> {
    let mut crds = manifests::crds_of(manifests::read_documents(&api.crd_path())?)?;
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(api.contract_label().into(), api.version().into());
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
    /// The KamajiControlPlane's name, which its Service bears.
    kcp: String,
    /// The port of its Service (`clusterNetwork.apiServerPort`).
    service_port: u16,
    /// The `spec.version` it serves.
    version: String,
    extra_args: ExtraArgs,
    /// The `<kcp>-admin-kubeconfig` data, rendered once at start.
    admin_kubeconfigs: BTreeMap<String, String>,
    /// The SANs of its serving certificate besides the Service names
    /// ([`exposure::cert_sans`]).
    cert_sans: Vec<String>,
    /// Where the public kubeconfigs point: the ingress, when there is one.
    public_endpoint: Option<(String, u16)>,
    /// A `spec.version` the tenant failed to upgrade to, and why; not tried
    /// again until `spec.version` changes.
    failed_upgrade: Option<(String, String)>,
}

/// A management cluster served, and the Cluster API version its apiserver
/// serves, discovered on first use: by then a Cluster owns a
/// KamajiControlPlane, so Cluster API is installed.
#[derive(Clone)]
struct Management {
    client: kube::Client,
    clusters: Arc<tokio::sync::OnceCell<ApiResource>>,
}

impl Management {
    fn new(client: kube::Client) -> Self {
        Self {
            client,
            clusters: Arc::default(),
        }
    }

    /// Clusters (`cluster.x-k8s.io`) in the version this apiserver serves.
    async fn cluster_resource(&self) -> anyhow::Result<ApiResource> {
        self.clusters
            .get_or_try_init(|| discover_cluster_resource(&self.client))
            .await
            .cloned()
    }
}

struct Shared {
    /// The management clusters served.
    managements: std::sync::Mutex<Vec<Management>>,
    tenants: TenantClusters,
    options: TenantControlPlaneOptions,
    wait_for_data_stores: AtomicBool,
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
        install_crds_for(&client, options.api)
            .await
            .context("install the KamajiControlPlane CRD")?;
        let shared = Arc::new(Shared {
            managements: std::sync::Mutex::new(vec![Management::new(client)]),
            tenants,
            options,
            wait_for_data_stores: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(run(shared.clone()));
        Ok(Self { shared, task })
    }

    /// Serves the KamajiControlPlanes of another management cluster too
    /// (installing the CRD there).
    pub async fn serve(&self, client: kube::Client) -> anyhow::Result<()> {
        install_crds_for(&client, self.shared.options.api)
            .await
            .context("install the KamajiControlPlane CRD")?;
        self.shared
            .managements
            .lock()
            .expect("managements lock")
            .push(Management::new(client));
        Ok(())
    }

    /// Stops serving every management cluster but the one behind `client`
    /// (already served): the source of a finished `clusterctl move`, whose
    /// objects are gone, goes away.
    pub fn serve_only(&self, client: kube::Client) {
        *self.shared.managements.lock().expect("managements lock") = vec![Management::new(client)];
    }

    /// Whether a tenant waits, as under Kamaji, until the DataStore its
    /// KamajiControlPlane names (`spec.dataStoreName`) exists and is
    /// `status.ready` before it starts. Off by default. Needs the DataStore
    /// CRD (see [`super::EtcdSimulator`]).
    pub fn wait_for_data_stores(&self, wait: bool) {
        self.shared
            .wait_for_data_stores
            .store(wait, Ordering::Relaxed);
    }

    /// The tenant control plane of a CAPI Cluster, once it runs.
    pub fn tenant(&self, namespace: &str, cluster: &str) -> Option<TenantCluster> {
        self.shared.tenants.get(namespace, cluster)
    }

    /// The kube-apiserver of the CAPI Cluster's tenant, once it runs: which
    /// build, which version it serves, what became of the extraArgs.
    pub async fn tenant_apiserver(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Option<TenantApiServer> {
        let running = self.shared.running.lock().await;
        running
            .get(&format!("{namespace}/{cluster}"))
            .map(|tenant| TenantApiServer {
                binary: tenant.control_plane.apiserver_binary(),
                version: tenant.version.clone(),
                extra_args: tenant.extra_args.clone(),
            })
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
    let managements = shared.managements.lock().expect("managements lock").clone();
    let mut live: Vec<(Management, String, DynamicObject)> = Vec::new();
    let mut all_answered = true;
    for management in managements {
        let api: Api<DynamicObject> =
            Api::all_with(management.client.clone(), &shared.options.api.resource());
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
            live.push((management.clone(), key, object));
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
        let namespace = key.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
        let managements = shared.managements.lock().expect("managements lock").clone();
        for management in managements {
            delete_service(&management.client, namespace, &tenant.kcp).await;
        }
        stop_control_plane(tenant.control_plane).await;
    }

    for (management, key, object) in &live {
        if let Err(error) = reconcile(shared, management, key, object).await {
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

/// Where a KamajiControlPlane stands, for its status.
#[derive(Clone, Debug, PartialEq)]
enum Observed {
    /// The tenant kube-apiserver serves `version`; `refused` says why a
    /// newer `spec.version` was not rolled out.
    Serving {
        version: String,
        refused: Option<String>,
    },
    /// Nothing started: `spec.version` is not one the simulator runs.
    Refused { message: String },
    /// Nothing started: its DataStore is missing or not ready.
    WaitingForDataStore { message: String },
}

async fn reconcile(
    shared: &Shared,
    management: &Management,
    key: &str,
    object: &DynamicObject,
) -> anyhow::Result<()> {
    let client = &management.client;
    let kamaji_api = shared.options.api;
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let cluster = owner_cluster(object).context("no owning Cluster")?;
    let spec_version = object.data["spec"]["version"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &kamaji_api.resource());
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &management
            .cluster_resource()
            .await
            .context("discover the Cluster API version")?,
    );

    let observed = {
        let mut running = shared.running.lock().await;
        match running.get_mut(key) {
            Some(tenant) => {
                let refused = roll_version(tenant, &spec_version, &namespace, &cluster).await;
                roll_certificate(tenant, object, &namespace, &cluster).await?;
                Observed::Serving {
                    refused,
                    version: tenant.version.clone(),
                }
            }
            None => match apiserver_for_version(&spec_version) {
                Err(message) => Observed::Refused { message },
                Ok(binary) => match data_store_not_ready(shared, client, object).await {
                    Some(message) => Observed::WaitingForDataStore { message },
                    None => {
                        let port = service_port(&clusters, &cluster).await;
                        let tenant =
                            start_tenant(shared, object, &cluster, &spec_version, binary, port)
                                .await?;
                        let endpoint = tenant.endpoint.clone();
                        shared.tenants.insert(TenantCluster {
                            namespace: namespace.clone(),
                            name: cluster.clone(),
                            endpoint: endpoint.clone(),
                            ca_pem: tenant.control_plane.ca().cert_pem(),
                            client: tenant.control_plane.client(),
                        });
                        for alias in service_endpoints(&name, &namespace, tenant.service_port) {
                            shared.tenants.alias(&endpoint, &alias);
                        }
                        if let Some((host, port)) = &tenant.public_endpoint {
                            shared.tenants.alias(&endpoint, &format!("{host}:{port}"));
                        }
                        tracing::info!(
                            %namespace, %cluster, %endpoint, version = %spec_version,
                            "tenant control plane running"
                        );
                        running.insert(key.to_string(), tenant);
                        Observed::Serving {
                            version: spec_version.clone(),
                            refused: None,
                        }
                    }
                },
            },
        }
    };

    if let Observed::Serving { .. } = observed {
        let (endpoint, kubeconfig, admin_kubeconfigs, ca_cert, ca_key, service_port, public) = {
            let running = shared.running.lock().await;
            let tenant = running.get(key).context("tenant control plane vanished")?;
            let kubeconfig = std::fs::read_to_string(tenant.control_plane.kubeconfig_path())
                .context("read the tenant's admin kubeconfig")?;
            let ca = tenant.control_plane.ca();
            (
                tenant.endpoint.clone(),
                kubeconfig,
                tenant.admin_kubeconfigs.clone(),
                ca.cert_pem(),
                ca.key_pem(),
                tenant.service_port,
                tenant.public_endpoint.clone(),
            )
        };
        ensure_service(client, kamaji_api, object, service_port)
            .await
            .context("the tenant control plane Service")?;
        exposure::reconcile_ingress(client, kamaji_api, object, service_port, FIELD_MANAGER)
            .await
            .context("the tenant control plane Ingress")?;
        if let Some(address) = shared.options.address {
            ensure_endpoint_slice(client, kamaji_api, object, address, &endpoint)
                .await
                .context("the tenant control plane Service's endpoints")?;
        }
        let secrets = Secrets {
            client,
            api: kamaji_api,
            owner: object,
            namespace: &namespace,
        };
        // Kamaji writes the TCP's admin kubeconfig; the provider copies from
        // it into the CAPI Secrets.
        secrets
            .ensure(
                &format!("{name}-admin-kubeconfig"),
                None,
                kamaji_labels(&name, "admin-kubeconfig"),
                &admin_kubeconfigs,
            )
            .await
            .context("the admin kubeconfig Secret")?;
        secrets
            .ensure(
                &format!("{cluster}-kubeconfig"),
                Some("cluster.x-k8s.io/secret"),
                capi_labels(&cluster, &name, "kubeconfig"),
                &BTreeMap::from([("value".to_string(), kubeconfig)]),
            )
            .await
            .context("the kubeconfig Secret")?;
        secrets
            .ensure(
                &format!("{cluster}-ca"),
                Some("cluster.x-k8s.io/secret"),
                capi_labels(&cluster, &name, "ca"),
                &BTreeMap::from([
                    ("tls.crt".to_string(), ca_cert),
                    ("tls.key".to_string(), ca_key),
                ]),
            )
            .await
            .context("the CA Secret")?;

        // The provider writes the ingress hostname (port 443 unless it
        // names one) as the endpoint when there is one.
        let (host, port) = match public {
            Some(public) => public,
            None => split_endpoint(&endpoint)?,
        };
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
        patch_infrastructure_cluster(client, &clusters, &namespace, &cluster, &host, port)
            .await
            .context("patch the infrastructure cluster")?;
    }

    let status = desired_status(object, &observed, kamaji_api);
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

/// Moves a running tenant to `spec_version` if it can; returns why not.
async fn roll_version(
    tenant: &mut Running,
    spec_version: &str,
    namespace: &str,
    cluster: &str,
) -> Option<String> {
    if let Some((version, error)) = &tenant.failed_upgrade {
        if version == spec_version {
            return Some(error.clone());
        }
        tenant.failed_upgrade = None;
    }
    let running_binary = tenant.control_plane.apiserver_binary();
    match version_change(&tenant.version, running_binary, spec_version) {
        VersionChange::None => None,
        VersionChange::Refused(message) => Some(message),
        VersionChange::Patch => {
            // Same minor, same build: only the version reported moves.
            tenant.version = spec_version.to_string();
            None
        }
        VersionChange::Upgrade(binary) => {
            tracing::info!(
                %namespace, %cluster, from = %tenant.version, to = %spec_version,
                "upgrading the tenant kube-apiserver"
            );
            let upgraded = async {
                tenant.control_plane.restart_apiserver_with(binary).await?;
                verify_minor(&tenant.control_plane, binary).await
            }
            .await;
            match upgraded {
                Ok(()) => {
                    tracing::info!(%namespace, %cluster, version = %spec_version, "tenant kube-apiserver upgraded");
                    tenant.version = spec_version.to_string();
                    None
                }
                Err(error) => {
                    let message = format!("upgrade to {spec_version} failed: {error:#}");
                    tracing::warn!(%namespace, %cluster, %message);
                    // Keep the tenant serving its old version, as Kamaji's
                    // blue/green rollout keeps the old pods.
                    if let Err(error) = tenant
                        .control_plane
                        .restart_apiserver_with(running_binary)
                        .await
                    {
                        tracing::warn!(%namespace, %cluster, error = format!("{error:#}"), "rolling back the tenant kube-apiserver failed");
                    }
                    tenant.failed_upgrade = Some((spec_version.to_string(), message.clone()));
                    Some(message)
                }
            }
        }
    }
}

/// Starts the tenant control plane of a KamajiControlPlane and renders its
/// admin kubeconfigs.
async fn start_tenant(
    shared: &Shared,
    object: &DynamicObject,
    cluster: &str,
    version: &str,
    binary: Binary,
    port: u16,
) -> anyhow::Result<Running> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let user_args: Vec<String> = object.data["spec"]["apiServer"]["extraArgs"]
        .as_array()
        .map(|args| {
            args.iter()
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut extra_args = split_extra_args(&user_args, |path| Path::new(path).exists());
    if !extra_args.owned_by_kamaji.is_empty() {
        tracing::info!(
            %namespace, kcp = %name, dropped = ?extra_args.owned_by_kamaji,
            "dropped apiServer extraArgs Kamaji owns"
        );
    }
    if !extra_args.kept_by_harness.is_empty() || !extra_args.missing_files.is_empty() {
        tracing::info!(
            %namespace, kcp = %name,
            kept_by_harness = ?extra_args.kept_by_harness,
            missing_files = ?extra_args.missing_files,
            "apiServer extraArgs the harness kube-apiserver cannot take"
        );
    }
    let kcp_value = serde_json::to_value(object)?;
    let cert_sans = exposure::cert_sans(&kcp_value);
    let ingress = IngressSpec::of(&kcp_value);
    let options = |args: Vec<String>| ControlPlaneOptions {
        name: format!("tenant-{cluster}"),
        node_monitor_grace_period: Some(shared.options.node_monitor_grace_period),
        extra_apiserver_args: args,
        apiserver_binary: binary,
        extra_serving_names: service_names(&name, &namespace)
            .into_iter()
            .chain(cert_sans.iter().cloned())
            .collect(),
        address: shared.options.address,
        ..Default::default()
    };
    let starting = || format!("start the tenant control plane of {namespace}/{cluster}");
    let control_plane = match ControlPlane::start_with(options(extra_args.passed.clone())).await {
        Ok(control_plane) => control_plane,
        Err(error) if !extra_args.passed.is_empty() => {
            tracing::warn!(
                %namespace, kcp = %name, args = ?extra_args.passed, error = format!("{error:#}"),
                "the tenant kube-apiserver refused the apiServer extraArgs; starting it without them"
            );
            extra_args.refused_by_apiserver = std::mem::take(&mut extra_args.passed);
            ControlPlane::start_with(options(Vec::new()))
                .await
                .with_context(starting)?
        }
        Err(error) => return Err(error.context(starting())),
    };
    verify_minor(&control_plane, binary).await?;

    // kubeadm's admin.conf user is in `kubeadm:cluster-admins`, bound to
    // cluster-admin by the kubeadm phase Kamaji runs in the tenant.
    ensure_cluster_admins_binding(&control_plane.client()).await?;
    let public_server = match &ingress {
        Some(ingress) => ingress.server(),
        None => control_plane.server_url().to_string(),
    };
    let admin_kubeconfigs =
        admin_kubeconfig_data(&name, &namespace, &public_server, port, control_plane.ca())?;
    Ok(Running {
        endpoint: control_plane.server_url().to_string(),
        kcp: name,
        service_port: port,
        control_plane,
        version: version.to_string(),
        extra_args,
        admin_kubeconfigs,
        cert_sans,
        public_endpoint: ingress.map(|i| (i.host, i.port)),
        failed_upgrade: None,
    })
}

/// Re-issues a running tenant's serving certificate when the SANs its
/// KamajiControlPlane asks for changed, as Kamaji rotates the apiserver
/// certificate and rolls the pods (the apiserver keeps serving).
async fn roll_certificate(
    tenant: &mut Running,
    object: &DynamicObject,
    namespace: &str,
    cluster: &str,
) -> anyhow::Result<()> {
    let wanted = exposure::cert_sans(&serde_json::to_value(object)?);
    if wanted == tenant.cert_sans {
        return Ok(());
    }
    tracing::info!(%namespace, %cluster, sans = ?wanted, "re-issuing the tenant apiserver certificate");
    let names: Vec<String> = service_names(&tenant.kcp, namespace)
        .into_iter()
        .chain(wanted.iter().cloned())
        .collect();
    tenant
        .control_plane
        .reissue_serving_certificate(&names)
        .with_context(|| format!("re-issue the apiserver certificate of {namespace}/{cluster}"))?;
    tenant.cert_sans = wanted;
    Ok(())
}

/// Checks that the apiserver answers `/version` with the minor of `binary`.
async fn verify_minor(control_plane: &ControlPlane, binary: Binary) -> anyhow::Result<()> {
    let answered = control_plane.server_version().await?;
    let expected = binary.kube_apiserver_minor();
    let minor = parse_version(&answered).map(|(_, minor, _)| minor);
    if minor.is_none() || minor != expected {
        anyhow::bail!(
            "{} answers /version with {answered}, not v1.{}",
            binary.file_name(),
            expected.unwrap_or_default()
        );
    }
    Ok(())
}

/// Why the KamajiControlPlane's DataStore keeps Kamaji from reconciling
/// its TCP, when the simulator waits for DataStores.
async fn data_store_not_ready(
    shared: &Shared,
    client: &kube::Client,
    object: &DynamicObject,
) -> Option<String> {
    if !shared.wait_for_data_stores.load(Ordering::Relaxed) {
        return None;
    }
    let name = object.data["spec"]["dataStoreName"]
        .as_str()
        .unwrap_or_default();
    if name.is_empty() {
        // Kamaji then uses its --datastore default, which is not simulated.
        return None;
    }
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &data_store_resource());
    match api.get_opt(name).await {
        Ok(Some(data_store)) if data_store.data["status"]["ready"] == true => None,
        Ok(Some(_)) => Some(format!("DataStore {name} is not ready")),
        Ok(None) => Some(format!("DataStore {name} does not exist")),
        Err(error) => Some(format!("DataStore {name}: {error}")),
    }
}

/// The TCP Service port: the Cluster's `clusterNetwork.apiServerPort`, as
/// the provider copies it into the TCP's `networkProfile.port`.
async fn service_port(clusters: &Api<DynamicObject>, cluster: &str) -> u16 {
    clusters
        .get_opt(cluster)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data["spec"]["clusterNetwork"]["apiServerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(DEFAULT_SERVICE_PORT)
}

async fn ensure_cluster_admins_binding(tenant: &kube::Client) -> anyhow::Result<()> {
    let api: Api<ClusterRoleBinding> = Api::all(tenant.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "kubeadm:cluster-admins" },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Group",
            "name": "kubeadm:cluster-admins",
        }],
    }))?;
    api.patch(
        "kubeadm:cluster-admins",
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&binding),
    )
    .await
    .context("bind kubeadm:cluster-admins to cluster-admin in the tenant")?;
    Ok(())
}

/// Kamaji's infrastructure-cluster patch, for a KubevirtCluster that
/// carries CAPI's externally-managed annotation (`cluster.x-k8s.io/managed-by`,
/// as the platform creates it): its `spec.controlPlaneEndpoint` and
/// `status.ready=true`, as Kamaji's provider does for KubevirtClusters. A
/// KubevirtCluster without the annotation is left to its infrastructure
/// provider here (real Kamaji would patch its endpoint too, fighting the
/// provider over it; tests that run one that way want the provider's).
/// Other kinds (ProxmoxCluster: `externalManagedControlPlane`) are not
/// patched; their provider marks them ready.
async fn patch_infrastructure_cluster(
    client: &kube::Client,
    clusters: &Api<DynamicObject>,
    namespace: &str,
    cluster: &str,
    host: &str,
    port: u16,
) -> anyhow::Result<()> {
    // `spec.infrastructureRef` has `kind` and `name` in both Cluster API
    // versions (an ObjectReference in v1beta1, a contract-versioned one in
    // v1beta2).
    let Some(object) = clusters.get_opt(cluster).await? else {
        return Ok(());
    };
    let reference = &object.data["spec"]["infrastructureRef"];
    if reference["kind"] != "KubevirtCluster" {
        return Ok(());
    }
    let name = reference["name"].as_str().unwrap_or_default();
    let infra: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "infrastructure.cluster.x-k8s.io",
                "v1alpha1",
                "KubevirtCluster",
            ),
            "kubevirtclusters",
        ),
    );
    let Some(kubevirt_cluster) = infra.get_opt(name).await? else {
        return Ok(());
    };
    let managed = kubevirt_cluster
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("cluster.x-k8s.io/managed-by"));
    if !managed {
        return Ok(());
    }
    if kubevirt_cluster.data["spec"]["controlPlaneEndpoint"]["host"] != host {
        infra
            .patch(
                name,
                &patch_params(),
                &Patch::Merge(
                    json!({ "spec": { "controlPlaneEndpoint": { "host": host, "port": port } } }),
                ),
            )
            .await?;
    }
    if kubevirt_cluster.data["status"]["ready"] != true {
        infra
            .patch_status(
                name,
                &patch_params(),
                &Patch::Merge(json!({ "status": { "ready": true } })),
            )
            .await?;
    }
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

    fn kcp(version: &str) -> DynamicObject {
        let mut object = DynamicObject::new("demo", &KamajiApi::V1alpha2.resource());
        object.data = json!({ "spec": { "version": version, "replicas": 2 } });
        object
    }

    #[test]
    fn status_is_stable_once_written() {
        let mut object = kcp("v1.35.0");
        let observed = Observed::Serving {
            version: "v1.35.0".into(),
            refused: None,
        };
        let first = desired_status(&object, &observed, KamajiApi::V1alpha2);
        object.data["status"] = first.clone();
        assert!(status_matches(
            &object.data["status"],
            &desired_status(&object, &observed, KamajiApi::V1alpha2)
        ));
    }

    #[test]
    fn serving_status_reports_the_served_version_and_a_refused_upgrade() {
        let object = kcp("v1.33.0");
        let status = desired_status(
            &object,
            &Observed::Serving {
                version: "v1.34.2".into(),
                refused: Some("no build".into()),
            },
            KamajiApi::V1alpha2,
        );
        assert_eq!(status["version"], "v1.34.2");
        assert_eq!(status["ready"], true);
        let conditions = status["conditions"].as_array().unwrap();
        let created = conditions
            .iter()
            .find(|c| c["type"] == "TenantControlPlaneCreated")
            .unwrap();
        assert_eq!(created["status"], "False");
        assert_eq!(created["reason"], "Failed");
        assert_eq!(created["message"], "no build");
        let available = conditions
            .iter()
            .find(|c| c["type"] == "Available")
            .unwrap();
        assert_eq!(available["status"], "True");
    }

    /// The status schema of `api`'s KamajiControlPlane CRD.
    fn status_schema(api: KamajiApi) -> Value {
        let crd = manifests::read_documents(&api.crd_path())
            .unwrap()
            .into_iter()
            .find(|d| d["kind"] == "CustomResourceDefinition")
            .unwrap();
        let version = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == api.version())
            .unwrap()
            .clone();
        version["schema"]["openAPIV3Schema"]["properties"]["status"].clone()
    }

    /// Every field the CRD requires is there, and nothing it would prune.
    fn assert_fits(status: &Value, schema: &Value) {
        for required in schema["required"].as_array().unwrap() {
            let field = required.as_str().unwrap();
            assert!(status.get(field).is_some(), "{field} missing in {status}");
        }
        for field in status.as_object().unwrap().keys() {
            assert!(
                schema["properties"].get(field).is_some(),
                "{field} is not in the CRD"
            );
        }
    }

    fn every_observation() -> [Observed; 3] {
        [
            Observed::Serving {
                version: "v1.35.0".into(),
                refused: None,
            },
            Observed::Refused {
                message: "no build".into(),
            },
            Observed::WaitingForDataStore {
                message: "DataStore default does not exist".into(),
            },
        ]
    }

    fn condition_types(status: &Value) -> Vec<(String, String)> {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["type"].to_string(), c["reason"].to_string()))
            .collect()
    }

    #[test]
    fn each_api_writes_what_its_crd_holds() {
        for api in [KamajiApi::V1alpha2, KamajiApi::V1alpha1] {
            let schema = status_schema(api);
            for observed in every_observation() {
                assert_fits(&desired_status(&kcp("v1.35.0"), &observed, api), &schema);
            }
        }
    }

    #[test]
    fn v1alpha1_status_is_the_v1beta1_contract() {
        let mut object = kcp("v1.35.0");
        object.metadata.labels = Some(BTreeMap::from([
            ("team".to_string(), "a".to_string()),
            (
                "cluster.x-k8s.io/cluster-name".to_string(),
                "demo".to_string(),
            ),
        ]));
        let observed = Observed::Serving {
            version: "v1.35.0".into(),
            refused: None,
        };
        let status = desired_status(&object, &observed, KamajiApi::V1alpha1);
        assert_eq!(status["ready"], true);
        assert_eq!(status["initialized"], true);
        assert_eq!(status["externalManagedControlPlane"], true);
        assert_eq!(status["version"], "v1.35.0");
        assert_eq!(status["replicas"], 2);
        assert_eq!(status["readyReplicas"], 2);
        assert_eq!(status["updatedReplicas"], 2);
        assert_eq!(status["unavailableReplicas"], 0);
        assert_eq!(
            status["selector"],
            "cluster.x-k8s.io/cluster-name=demo,team=a"
        );
        for v1beta2_only in ["initialization", "availableReplicas", "upToDateReplicas"] {
            assert!(status.get(v1beta2_only).is_none(), "{v1beta2_only}");
        }
        // The same conditions as v1alpha2.
        let v1alpha2 = desired_status(&object, &observed, KamajiApi::V1alpha2);
        assert_eq!(condition_types(&status), condition_types(&v1alpha2));
        assert!(v1alpha2.get("initialized").is_none());
        assert_eq!(v1alpha2["initialization"]["controlPlaneInitialized"], true);

        object.metadata.labels = None;
        let status = desired_status(&object, &observed, KamajiApi::V1alpha1);
        assert_eq!(status["selector"], "<none>");
    }

    #[test]
    fn v1alpha1_initialized_stays_true_once_set() {
        let mut object = kcp("v1.35.0");
        for observed in &every_observation()[1..] {
            let status = desired_status(&object, observed, KamajiApi::V1alpha1);
            assert_eq!(status["initialized"], false, "{observed:?}");
            assert_eq!(status["ready"], false);
        }
        object.data["status"] = desired_status(
            &object,
            &Observed::Serving {
                version: "v1.35.0".into(),
                refused: None,
            },
            KamajiApi::V1alpha1,
        );
        for observed in &every_observation()[1..] {
            let status = desired_status(&object, observed, KamajiApi::V1alpha1);
            assert_eq!(status["initialized"], true, "{observed:?}");
            assert_eq!(status["ready"], false);
        }
    }

    #[test]
    fn v1alpha1_status_is_stable_once_written() {
        let mut object = kcp("v1.35.0");
        for observed in every_observation() {
            object.data["status"] = desired_status(&object, &observed, KamajiApi::V1alpha1);
            assert!(status_matches(
                &object.data["status"],
                &desired_status(&object, &observed, KamajiApi::V1alpha1)
            ));
        }
    }

    #[test]
    fn owned_objects_name_the_kamaji_api_served() {
        let mut object =
            DynamicObject::new("kubernetes-demo", &KamajiApi::V1alpha1.resource()).within("t");
        object.data = json!({ "spec": {} });
        for api in [KamajiApi::V1alpha2, KamajiApi::V1alpha1] {
            let service = desired_service(&object, 6443, api);
            assert_eq!(
                service["metadata"]["ownerReferences"][0]["apiVersion"],
                format!("controlplane.cluster.x-k8s.io/{}", api.version())
            );
        }
    }

    #[test]
    fn the_v1alpha1_crd_has_the_spec_fields_the_simulator_reads() {
        let crd = manifests::read_documents(&KamajiApi::V1alpha1.crd_path())
            .unwrap()
            .remove(0);
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for path in [
            "version",
            "replicas",
            "dataStoreName",
            "controlPlaneEndpoint",
            "apiServer.extraArgs",
            "network.serviceType",
            "network.serviceLabels",
            "network.serviceAnnotations",
            "network.additionalServicePorts",
            "network.loadBalancerConfig",
        ] {
            let mut field = spec;
            for (i, part) in path.split('.').enumerate() {
                if i > 0 {
                    field = &field["properties"];
                }
                field = &field[part];
            }
            assert!(field.is_object(), "spec.{path} is not in the v1alpha1 CRD");
        }
        assert_eq!(
            crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta1"],
            "v1alpha1"
        );
    }

    #[test]
    fn clusters_are_read_in_the_newest_cluster_api_version_served() {
        assert_eq!(capi_version(["v1beta1", "v1beta2"]), Some("v1beta2"));
        assert_eq!(capi_version(["v1beta1"]), Some("v1beta1"));
        assert_eq!(capi_version(["v1alpha4"]), None);
    }

    #[test]
    fn an_unsupported_version_starts_nothing_and_says_what_runs() {
        let message = apiserver_for_version("v1.33.4").unwrap_err();
        assert!(message.contains("v1.33.4"), "{message}");
        assert!(message.contains("v1.34, v1.35"), "{message}");
        let status = desired_status(
            &kcp("v1.33.4"),
            &Observed::Refused { message },
            KamajiApi::V1alpha2,
        );
        assert_eq!(status["ready"], false);
        assert_eq!(status["version"], "");
        assert!(status.get("initialization").is_none());
        let conditions = status["conditions"].as_array().unwrap();
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == "Available" && c["status"] == "False")
        );
        assert!(apiserver_for_version("2.35.0").is_err());
        assert!(apiserver_for_version("").is_err());
    }

    #[test]
    fn each_minor_picks_its_build() {
        assert_eq!(apiserver_for_version("v1.35.0"), Ok(Binary::KubeApiserver));
        assert_eq!(apiserver_for_version("1.35.4"), Ok(Binary::KubeApiserver));
        assert_eq!(
            apiserver_for_version("v1.34.2"),
            Ok(Binary::KubeApiserverV1_34)
        );
        assert_eq!(
            apiserver_for_version("v1.34"),
            Ok(Binary::KubeApiserverV1_34)
        );
        assert_eq!(parse_version("v1.35.0-rc.1"), Some((1, 35, 0)));
        assert_eq!(parse_version("v1.35.0.1"), None);
    }

    #[test]
    fn version_changes_follow_kamajis_webhook() {
        let v134 = Binary::KubeApiserverV1_34;
        assert_eq!(
            version_change("v1.34.2", v134, "v1.34.2"),
            VersionChange::None
        );
        assert_eq!(
            version_change("v1.34.2", v134, "v1.34.4"),
            VersionChange::Patch
        );
        assert_eq!(
            version_change("v1.34.2", v134, "v1.35.0"),
            VersionChange::Upgrade(Binary::KubeApiserver)
        );
        let VersionChange::Refused(message) =
            version_change("v1.35.0", Binary::KubeApiserver, "v1.34.2")
        else {
            panic!("a downgrade is refused");
        };
        assert!(message.contains("downgrade"), "{message}");
        let VersionChange::Refused(message) = version_change("v1.34.2", v134, "v1.36.0") else {
            panic!("an unsupported minor is refused");
        };
        assert!(message.contains("v1.36.0"), "{message}");
    }

    #[test]
    fn extra_args_kamaji_owns_are_dropped() {
        let args: Vec<String> = [
            "--etcd-servers=https://elsewhere:2379",
            "--enable-admission-plugins=NodeRestriction",
            "--secure-port=443",
            "--feature-gates=SomeGate=true",
            "--authorization-mode=Node,RBAC",
            "--audit-policy-file=/etc/kubernetes/audit/policy.yaml",
            "--audit-log-maxage=3",
            "--tls-sni-cert-key=/tmp/present.crt,/tmp/present.key",
        ]
        .map(String::from)
        .to_vec();
        let split = split_extra_args(&args, |path| path.starts_with("/tmp/"));
        assert_eq!(
            split.owned_by_kamaji,
            [
                "--etcd-servers=https://elsewhere:2379",
                "--enable-admission-plugins=NodeRestriction",
                "--secure-port=443"
            ]
        );
        assert_eq!(split.kept_by_harness, ["--authorization-mode=Node,RBAC"]);
        assert_eq!(
            split.missing_files,
            ["--audit-policy-file=/etc/kubernetes/audit/policy.yaml"]
        );
        assert_eq!(
            split.passed,
            [
                "--feature-gates=SomeGate=true",
                "--audit-log-maxage=3",
                "--tls-sni-cert-key=/tmp/present.crt,/tmp/present.key"
            ]
        );
        assert!(split.refused_by_apiserver.is_empty());
    }

    #[test]
    fn the_service_fronts_the_apiserver_and_the_additional_ports() {
        let mut object = DynamicObject::new("kubernetes-demo", &KamajiApi::V1alpha2.resource())
            .within("tenant-a");
        object.metadata.uid = Some("kcp-uid".into());
        object.data = json!({ "spec": { "network": {
            "serviceType": "ClusterIP",
            "serviceLabels": { "team": "a" },
            "additionalServicePorts": [{
                "name": "talos-trustd", "port": 50001, "protocol": "TCP", "targetPort": 50001,
            }],
        }}});
        let service = desired_service(&object, 6443, KamajiApi::V1alpha2);
        assert_eq!(service["metadata"]["name"], "kubernetes-demo");
        assert_eq!(service["metadata"]["namespace"], "tenant-a");
        assert_eq!(service["metadata"]["labels"]["team"], "a");
        assert_eq!(
            service["metadata"]["labels"]["kamaji.clastix.io/component"],
            "service"
        );
        let owner = &service["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "KamajiControlPlane");
        assert_eq!(owner["uid"], "kcp-uid");
        assert_eq!(owner["controller"], true);
        assert_eq!(service["spec"]["type"], "ClusterIP");
        assert_eq!(
            service["spec"]["ports"],
            json!([
                { "name": "kube-apiserver", "protocol": "TCP", "port": 6443, "targetPort": 6443 },
                { "name": "talos-trustd", "protocol": "TCP", "port": 50001, "targetPort": 50001 },
            ])
        );

        // What the apiserver returns has more; it still matches.
        let mut stored = service.clone();
        stored["spec"]["clusterIP"] = json!("10.96.4.7");
        stored["spec"]["ports"][0]["appProtocol"] = json!("https");
        stored["metadata"]["labels"]["added-by-someone"] = json!("x");
        assert!(service_matches(&stored, &service));
        stored["spec"]["ports"].as_array_mut().unwrap().pop();
        assert!(!service_matches(&stored, &service));
    }

    #[test]
    fn the_service_defaults_to_a_load_balancer_as_kamaji_does() {
        let mut object = DynamicObject::new("kubernetes-demo", &KamajiApi::V1alpha2.resource())
            .within("tenant-a");
        object.data = json!({ "spec": {} });
        let service = desired_service(&object, 443, KamajiApi::V1alpha2);
        assert_eq!(service["spec"]["type"], "LoadBalancer");
        assert_eq!(service["spec"]["allocateLoadBalancerNodePorts"], true);
        assert_eq!(service["spec"]["ports"][0]["port"], 443);
        assert_eq!(
            service_endpoints("kubernetes-demo", "tenant-a", 443),
            [
                "kubernetes-demo.tenant-a.svc:443",
                "kubernetes-demo.tenant-a.svc.cluster.local:443"
            ]
        );
    }

    #[test]
    fn admin_kubeconfigs_point_at_the_endpoint_and_the_service() {
        let ca = CertificateAuthority::new("test-ca").unwrap();
        let data = admin_kubeconfig_data(
            "kubernetes-a",
            "tenant-x",
            "https://127.0.0.1:40001",
            6443,
            &ca,
        )
        .unwrap();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            [
                "admin.conf",
                "admin.svc",
                "super-admin.conf",
                "super-admin.svc"
            ]
        );
        for (key, server, user) in [
            ("admin.conf", "https://127.0.0.1:40001", "kubernetes-admin"),
            (
                "admin.svc",
                "https://kubernetes-a.tenant-x.svc:6443",
                "kubernetes-admin",
            ),
            (
                "super-admin.conf",
                "https://127.0.0.1:40001",
                "kubernetes-super-admin",
            ),
            (
                "super-admin.svc",
                "https://kubernetes-a.tenant-x.svc:6443",
                "kubernetes-super-admin",
            ),
        ] {
            let config = kube::config::Kubeconfig::from_yaml(&data[key]).unwrap();
            let cluster = config.clusters[0].cluster.as_ref().unwrap();
            assert_eq!(cluster.server.as_deref(), Some(server), "{key}");
            assert_eq!(config.clusters[0].name, "kubernetes-a");
            assert_eq!(config.auth_infos[0].name, user, "{key}");
            assert_eq!(
                config.current_context.as_deref(),
                Some(format!("{user}@kubernetes-a").as_str())
            );
            let ca_data = cluster.certificate_authority_data.as_deref().unwrap();
            assert_eq!(BASE64.decode(ca_data).unwrap(), ca.cert_pem().as_bytes());
        }
    }
}
