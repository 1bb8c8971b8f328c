//! One way to set up what an e2e test runs against: a management cluster
//! (a real control plane) and whichever of its neighbours the test needs,
//! started in one order and stopped in the reverse one.
//!
//! ```ignore
//! let world = World::builder("management")
//!     .cluster_api()
//!     .ipam()
//!     .pve(lab_config(&["tenant-a"]))
//!     .tenantry()
//!     .start()
//!     .await;
//! ```
//!
//! A part the builder was not asked for is absent; its accessor panics
//! naming the part, so a test that forgot one fails at once and says why.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::Api;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tenantry_provider::reconciler::ManagerConfig;

use crate::cert_manager::CertManager;
use crate::cluster_api::{ClusterApiManager, ClusterApiRelease, UpstreamManager};
use crate::cluster_api_operator::ClusterApiOperator;
use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::kubevirt_upstream::VirtApi;
use crate::logs;
use crate::pve_lab::PveLab;
use crate::sim::ingress::IngressController;
use crate::sim::kubevirt::{
    ImageFactory, ImageFactoryConfig, KubevirtSimConfig, KubevirtSimulator,
};
use crate::sim::proxmox::PveSimConfig;
use crate::sim::tenant::{
    EtcdSimulator, KamajiControlPlaneSimulator, NodeSimConfig, NodeSimulator, TenantClusters,
    TenantControlPlaneOptions,
};
use crate::tenantry::{TenantryManager, out_of_cluster};

/// How KubeVirt is played.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kubevirt {
    /// KubeVirt's own virt-api and virt-controller, the simulator for the
    /// rest (kubelet, virt-handler, guests, CDI).
    Real,
    /// The simulator alone, its own virt-controller and migration included.
    Simulated,
}

/// How tenantry's manager runs.
#[derive(Clone, Debug)]
struct TenantryPart {
    config: ManagerConfig,
    webhooks: bool,
    /// The world's image factory becomes the default Talos image source.
    factory_as_default: bool,
}

/// Kamaji's control planes for tenants, and what may come with them.
#[derive(Clone, Debug)]
struct TenantSide {
    options: TenantControlPlaneOptions,
    wait_for_data_stores: bool,
    etcd: bool,
    nodes: Option<NodeSimConfig>,
    /// An SSL-passthrough ingress controller of this class (and the
    /// default class, when true) in front of the tenants.
    ingress: Option<(String, bool)>,
}

/// What [`World::start`] starts. Each part is off until asked for, except
/// the control plane and tenantry's CRDs.
#[must_use]
pub struct WorldBuilder {
    options: ControlPlaneOptions,
    tenantry_crds: bool,
    capture_logs: bool,
    cert_manager_crds: bool,
    cert_manager: bool,
    operator: bool,
    cluster_api: Option<ClusterApiRelease>,
    ipam: bool,
    cabpt: bool,
    virt_api: bool,
    kubevirt: Option<(Kubevirt, KubevirtSimConfig)>,
    image_factory: Option<ImageFactoryConfig>,
    pve: Option<PveSimConfig>,
    tenant_side: Option<TenantSide>,
    tenantry: Option<TenantryPart>,
}

/// A running world. Field order is drop order: tenant kubelets and
/// controllers stop before what they talk to, the control plane last.
pub struct World {
    ingress: Option<IngressController>,
    nodes: Option<NodeSimulator>,
    tenantry: Option<TenantryManager>,
    cabpt: Option<UpstreamManager>,
    etcd: Option<EtcdSimulator>,
    kamaji: Option<KamajiControlPlaneSimulator>,
    kubevirt: Option<KubevirtSimulator>,
    virt_api: Option<VirtApi>,
    factory: Option<ImageFactory>,
    pve: Option<PveLab>,
    ipam: Option<UpstreamManager>,
    capi: Option<ClusterApiManager>,
    capi_release: Option<ClusterApiRelease>,
    operator: Option<ClusterApiOperator>,
    cert_manager: Option<CertManager>,
    control_plane: ControlPlane,
}

impl WorldBuilder {
    /// Replaces the control plane's options (its name stays the builder's
    /// unless `options` names another).
    pub fn control_plane(mut self, options: ControlPlaneOptions) -> Self {
        self.options = options;
        self
    }

    /// No kube-controller-manager: nothing garbage-collects or deletes
    /// namespaces. Starts faster, for tests of admission and schemas.
    pub fn without_controller_manager(mut self) -> Self {
        self.options.controller_manager = false;
        self
    }

    /// Leaves tenantry's CRDs out (tests of installers that bring them).
    pub fn without_tenantry_crds(mut self) -> Self {
        self.tenantry_crds = false;
        self
    }

    /// Captures everything this process logs (see [`logs`]), for tests
    /// that check what tenantry writes to its log.
    pub fn capture_logs(mut self) -> Self {
        self.capture_logs = true;
        self
    }

    /// cert-manager's CRDs alone: enough to create the Issuers and
    /// Certificates of providers' components, nothing issues them.
    pub fn cert_manager_crds(mut self) -> Self {
        self.cert_manager_crds = true;
        self
    }

    /// The real cert-manager (controller, CA injector, webhook).
    pub fn cert_manager(mut self) -> Self {
        self.cert_manager = true;
        self
    }

    /// The real Cluster API Operator.
    pub fn cluster_api_operator(mut self) -> Self {
        self.operator = true;
        self
    }

    /// The real Cluster API core manager, of the pinned release unless
    /// [`Self::cluster_api_release`] asks for another.
    pub fn cluster_api(mut self) -> Self {
        self.cluster_api.get_or_insert_default();
        self
    }

    /// The real Cluster API core manager of `release` (with its CRDs and
    /// webhooks).
    pub fn cluster_api_release(mut self, release: ClusterApiRelease) -> Self {
        self.cluster_api = Some(release);
        self
    }

    /// The real in-cluster IPAM provider.
    pub fn ipam(mut self) -> Self {
        self.ipam = true;
        self
    }

    /// The real Talos bootstrap provider (CABPT).
    pub fn cabpt(mut self) -> Self {
        self.cabpt = true;
        self
    }

    /// KubeVirt's own virt-api alone (its CRDs and admission webhooks).
    pub fn virt_api(mut self) -> Self {
        self.virt_api = true;
        self
    }

    /// KubeVirt and CDI, played as `how` says.
    pub fn kubevirt(mut self, how: Kubevirt, config: KubevirtSimConfig) -> Self {
        self.kubevirt = Some((how, config));
        self
    }

    /// A Talos image factory.
    pub fn image_factory(mut self, config: ImageFactoryConfig) -> Self {
        self.image_factory = Some(config);
        self
    }

    /// The PVE simulator set up as a platform operator would
    /// ([`PveLab`]).
    pub fn pve(mut self, config: PveSimConfig) -> Self {
        self.pve = Some(config);
        self
    }

    /// Kamaji's control-plane side, simulated: a tenant control plane per
    /// `KamajiControlPlane`.
    pub fn kamaji(mut self, options: TenantControlPlaneOptions) -> Self {
        self.tenant_side = Some(TenantSide {
            options,
            wait_for_data_stores: false,
            etcd: false,
            nodes: None,
            ingress: None,
        });
        self
    }

    /// As under Kamaji: no tenant control plane before its DataStore.
    pub fn kamaji_waits_for_data_stores(mut self) -> Self {
        self.tenant_side_mut().wait_for_data_stores = true;
        self
    }

    /// etcd-operator's side, simulated.
    pub fn etcd(mut self) -> Self {
        self.tenant_side_mut().etcd = true;
        self
    }

    /// The tenant nodes' kubelets, following the world's VMs (KubeVirt's or
    /// the PVE simulator's).
    pub fn nodes(mut self, config: NodeSimConfig) -> Self {
        self.tenant_side_mut().nodes = Some(config);
        self
    }

    /// ingress-nginx with SSL passthrough for Ingresses of `class` (the
    /// cluster's default class when `default_class`), in front of the
    /// tenant apiservers ([`IngressController`]).
    pub fn ingress_controller(mut self, class: &str, default_class: bool) -> Self {
        self.tenant_side_mut().ingress = Some((class.to_string(), default_class));
        self
    }

    fn tenant_side_mut(&mut self) -> &mut TenantSide {
        self.tenant_side
            .as_mut()
            .expect("ask for .kamaji(…) before its companions")
    }

    /// Tenantry's manager as it runs outside a cluster.
    pub fn tenantry(self) -> Self {
        self.tenantry_with(out_of_cluster())
    }

    /// Tenantry's manager with these settings.
    pub fn tenantry_with(mut self, config: ManagerConfig) -> Self {
        self.tenantry = Some(TenantryPart {
            config,
            webhooks: false,
            factory_as_default: false,
        });
        self
    }

    /// Tenantry's admission webhooks too, served and registered with the
    /// apiserver by URL.
    pub fn webhooks(mut self) -> Self {
        self.tenantry_mut().webhooks = true;
        self
    }

    /// As a platform without the public factory runs tenantry: the world's
    /// image factory is the default of clusters that name none.
    pub fn factory_as_default(mut self) -> Self {
        self.tenantry_mut().factory_as_default = true;
        self
    }

    fn tenantry_mut(&mut self) -> &mut TenantryPart {
        self.tenantry.get_or_insert_with(|| TenantryPart {
            config: out_of_cluster(),
            webhooks: false,
            factory_as_default: false,
        })
    }

    /// Starts everything asked for; panics naming the part that failed.
    pub async fn start(self) -> World {
        self.start_after(async |_: &ControlPlane| {}).await
    }

    /// [`Self::start`], running `prepare` on the control plane once it and
    /// the CRDs asked for are up, before any other part starts: for a
    /// management cluster an installer sets up first, as `clusterctl init`
    /// does before its controllers run.
    pub async fn start_after(self, prepare: impl AsyncFnOnce(&ControlPlane)) -> World {
        if self.capture_logs {
            logs::capture();
        }
        let control_plane = ControlPlane::start_with(self.options)
            .await
            .unwrap_or_else(|e| panic!("start control plane: {e:#}"));
        let client = control_plane.client();
        if self.tenantry_crds {
            crate::manifests::apply_crds(&client, tenantry_api::crds::all())
                .await
                .unwrap_or_else(|e| panic!("install tenantry CRDs: {e:#}"));
        }
        if self.cert_manager_crds {
            crate::clusterctl::install_cert_manager_crds(&client)
                .await
                .unwrap_or_else(|e| panic!("install cert-manager CRDs: {e:#}"));
        }
        prepare(&control_plane).await;
        let cert_manager = match self.cert_manager {
            true => Some(started(
                "cert-manager",
                CertManager::start(&control_plane).await,
            )),
            false => None,
        };
        let operator = match self.operator {
            true => Some(started(
                "the Cluster API Operator",
                ClusterApiOperator::start(&control_plane).await,
            )),
            false => None,
        };
        let capi = match self.cluster_api {
            Some(release) => Some(started(
                "the Cluster API manager",
                ClusterApiManager::start_release(&control_plane, release).await,
            )),
            None => None,
        };
        let ipam = match self.ipam {
            true => Some(started(
                "the in-cluster IPAM provider",
                UpstreamManager::start_ipam_in_cluster(&control_plane).await,
            )),
            false => None,
        };
        let virt_api = match self.virt_api {
            true => Some(started("virt-api", VirtApi::start(&control_plane).await)),
            false => None,
        };
        let kubevirt = match self.kubevirt {
            Some((how, config)) => Some(start_kubevirt(&control_plane, how, config).await),
            None => None,
        };
        let factory = match self.image_factory {
            Some(config) => Some(started(
                "the image factory",
                ImageFactory::start(config).await,
            )),
            None => None,
        };
        let pve = match self.pve {
            Some(config) => Some(PveLab::start(config).await),
            None => None,
        };
        let (kamaji, etcd, nodes, ingress) = match self.tenant_side {
            Some(side) => {
                let tenants = TenantClusters::new();
                let kamaji = started(
                    "the Kamaji simulator",
                    KamajiControlPlaneSimulator::start(
                        client.clone(),
                        tenants.clone(),
                        side.options,
                    )
                    .await,
                );
                kamaji.wait_for_data_stores(side.wait_for_data_stores);
                let etcd = match side.etcd {
                    true => Some(started(
                        "the etcd simulator",
                        EtcdSimulator::start(client.clone()).await,
                    )),
                    false => None,
                };
                let ingress = match side.ingress {
                    Some((class, default_class)) => Some(started(
                        "the ingress controller",
                        IngressController::start(
                            client.clone(),
                            tenants.clone(),
                            &class,
                            default_class,
                        )
                        .await,
                    )),
                    None => None,
                };
                let nodes = side.nodes.map(|config| {
                    let nodes = NodeSimulator::start(tenants, config);
                    if kubevirt.is_some() {
                        nodes.follow_kubevirt(client.clone());
                    }
                    if let Some(pve) = &pve {
                        nodes.follow_proxmox(pve.sim.observer());
                    }
                    nodes
                });
                (Some(kamaji), etcd, nodes, ingress)
            }
            None => (None, None, None, None),
        };
        let cabpt = match self.cabpt {
            true => Some(started(
                "CABPT",
                UpstreamManager::start_cabpt(&control_plane).await,
            )),
            false => None,
        };
        let tenantry = match self.tenantry {
            Some(part) => {
                let mut config = part.config;
                if part.factory_as_default {
                    let factory = factory
                        .as_ref()
                        .expect("factory_as_default needs .image_factory(…)");
                    config.talos_image_factory_url =
                        Some(factory.base_url().trim_end_matches('/').into());
                }
                Some(match part.webhooks {
                    true => started(
                        "tenantry with webhooks",
                        TenantryManager::start_with_webhooks_and(&control_plane, config).await,
                    ),
                    false => TenantryManager::start_with(client, config),
                })
            }
            None => None,
        };
        World {
            ingress,
            nodes,
            tenantry,
            cabpt,
            etcd,
            kamaji,
            kubevirt,
            virt_api,
            factory,
            pve,
            ipam,
            capi,
            capi_release: self.cluster_api,
            operator,
            cert_manager,
            control_plane,
        }
    }
}

async fn start_kubevirt(
    control_plane: &ControlPlane,
    how: Kubevirt,
    config: KubevirtSimConfig,
) -> KubevirtSimulator {
    match how {
        Kubevirt::Real => started(
            "KubeVirt (virt-api, virt-controller) and its simulator",
            KubevirtSimulator::start_with_kubevirt(control_plane, config).await,
        ),
        Kubevirt::Simulated => started(
            "the KubeVirt simulator",
            KubevirtSimulator::start(control_plane.client(), config).await,
        ),
    }
}

fn started<T>(what: &str, result: anyhow::Result<T>) -> T {
    result.unwrap_or_else(|e| panic!("start {what}: {e:#}"))
}

fn part<'a, T>(part: &'a Option<T>, what: &str) -> &'a T {
    part.as_ref()
        .unwrap_or_else(|| panic!("this world was built without {what}"))
}

fn part_mut<'a, T>(part: &'a mut Option<T>, what: &str) -> &'a mut T {
    part.as_mut()
        .unwrap_or_else(|| panic!("this world was built without {what}"))
}

impl World {
    /// A world whose control plane is called `name`; nothing but it and
    /// tenantry's CRDs until asked for.
    pub fn builder(name: &str) -> WorldBuilder {
        WorldBuilder {
            options: ControlPlaneOptions {
                name: name.into(),
                ..Default::default()
            },
            tenantry_crds: true,
            capture_logs: false,
            cert_manager_crds: false,
            cert_manager: false,
            operator: false,
            cluster_api: None,
            ipam: false,
            cabpt: false,
            virt_api: false,
            kubevirt: None,
            image_factory: None,
            pve: None,
            tenant_side: None,
            tenantry: None,
        }
    }

    /// An admin client of the management cluster.
    pub fn client(&self) -> kube::Client {
        self.control_plane.client()
    }

    /// A namespaced API of the management cluster.
    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        Api::namespaced(self.client(), namespace)
    }

    /// Creates `document` in `namespace` (or where it names); panics with
    /// the apiserver's answer if refused.
    pub async fn create(&self, namespace: &str, document: Value) {
        crate::manifests::create_object(&self.client(), &document, namespace)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Creates the namespace `name`.
    pub async fn create_namespace(&self, name: &str) {
        let namespace: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
                .expect("a Namespace");
        Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client())
            .create(&Default::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    pub fn control_plane_mut(&mut self) -> &mut ControlPlane {
        &mut self.control_plane
    }

    pub fn capi(&self) -> &ClusterApiManager {
        part(&self.capi, "the Cluster API manager")
    }

    /// Which release of the Cluster API manager the world was started with.
    pub fn capi_release(&self) -> ClusterApiRelease {
        *part(&self.capi_release, "the Cluster API manager")
    }

    /// Takes the Cluster API manager out of the world, to stop it.
    pub fn take_capi(&mut self) -> ClusterApiManager {
        self.capi
            .take()
            .expect("this world was built without the Cluster API manager")
    }

    pub fn cert_manager(&self) -> &CertManager {
        part(&self.cert_manager, "cert-manager")
    }

    pub fn operator(&self) -> &ClusterApiOperator {
        part(&self.operator, "the Cluster API Operator")
    }

    pub fn ipam(&self) -> &UpstreamManager {
        part(&self.ipam, "the IPAM provider")
    }

    pub fn cabpt(&self) -> &UpstreamManager {
        part(&self.cabpt, "CABPT")
    }

    pub fn virt_api(&self) -> &VirtApi {
        part(&self.virt_api, "virt-api")
    }

    pub fn kubevirt(&self) -> &KubevirtSimulator {
        part(&self.kubevirt, "KubeVirt")
    }

    /// Stops KubeVirt's simulator and waits until nothing of it writes to
    /// the cluster any more, as a crash of virt-handler and CDI would.
    pub async fn stop_kubevirt(&mut self) {
        self.kubevirt
            .take()
            .expect("this world was built without KubeVirt, or it is stopped")
            .stop()
            .await;
    }

    /// Starts KubeVirt again after [`Self::stop_kubevirt`]: what the fresh
    /// one knows is what the apiserver holds.
    pub async fn start_kubevirt(&mut self, how: Kubevirt, config: KubevirtSimConfig) {
        assert!(self.kubevirt.is_none(), "KubeVirt runs already");
        self.kubevirt = Some(start_kubevirt(&self.control_plane, how, config).await);
    }

    pub fn factory(&self) -> &ImageFactory {
        part(&self.factory, "an image factory")
    }

    pub fn pve(&self) -> &PveLab {
        part(&self.pve, "the PVE simulator")
    }

    pub fn kamaji(&self) -> &KamajiControlPlaneSimulator {
        part(&self.kamaji, "Kamaji")
    }

    pub fn etcd(&self) -> &EtcdSimulator {
        part(&self.etcd, "etcd-operator")
    }

    pub fn nodes(&self) -> &NodeSimulator {
        part(&self.nodes, "tenant nodes")
    }

    pub fn ingress(&self) -> &IngressController {
        part(&self.ingress, "an ingress controller")
    }

    pub fn tenantry(&self) -> &TenantryManager {
        part(&self.tenantry, "tenantry")
    }

    pub fn tenantry_mut(&mut self) -> &mut TenantryManager {
        part_mut(&mut self.tenantry, "tenantry")
    }

    /// Installs tenantry's CRDs over whatever serves its kinds (a peer
    /// provider's CRDs, on a takeover) and starts its manager, in a world
    /// built without it.
    pub async fn start_tenantry(&mut self, config: ManagerConfig) {
        assert!(self.tenantry.is_none(), "tenantry runs already");
        crate::manifests::apply_crds(&self.client(), tenantry_api::crds::all())
            .await
            .unwrap_or_else(|e| panic!("install tenantry CRDs: {e:#}"));
        self.tenantry = Some(TenantryManager::start_with(self.client(), config));
    }

    /// Swaps the management side (control plane, Cluster API, IPAM,
    /// tenantry) with `other`'s, as `clusterctl move` hands workers over;
    /// `other` then holds the old side, to be stopped or dropped.
    pub fn swap_management(&mut self, other: &mut World) {
        std::mem::swap(&mut self.control_plane, &mut other.control_plane);
        std::mem::swap(&mut self.capi, &mut other.capi);
        std::mem::swap(&mut self.capi_release, &mut other.capi_release);
        std::mem::swap(&mut self.ipam, &mut other.ipam);
        std::mem::swap(&mut self.tenantry, &mut other.tenantry);
    }

    /// The last lines of each upstream controller's log, and what the
    /// simulated kubelets refused: what a failing test prints.
    pub fn diagnostics(&self) -> String {
        let mut text = String::new();
        let mut section = |title: &str, body: String| {
            if !body.trim().is_empty() {
                text.push_str(&format!("\n---- {title} ----\n{body}"));
            }
        };
        if let Some(operator) = &self.operator {
            section("Cluster API Operator log", operator.log_tail(40));
        }
        if let Some(cert_manager) = &self.cert_manager {
            section("cert-manager logs", cert_manager.log_tails(20));
        }
        if let Some(capi) = &self.capi {
            section("Cluster API manager log", capi.log_tail(40));
        }
        if let Some(ipam) = &self.ipam {
            section("IPAM provider log", ipam.log_tail(20));
        }
        if let Some(cabpt) = &self.cabpt {
            section("CABPT log", cabpt.log_tail(30));
        }
        if let Some(kubevirt) = &self.kubevirt {
            section(
                "virt-controller log",
                kubevirt.virt_controller_log(30).unwrap_or_default(),
            );
        }
        if let Some(nodes) = &self.nodes {
            let refusals = nodes.join_refusals();
            if !refusals.is_empty() {
                section("kubelet join refusals", format!("{refusals:?}"));
            }
        }
        text
    }

    /// Fails the test with `error` and [`Self::diagnostics`].
    pub fn fail(&self, error: anyhow::Error) -> ! {
        panic!("{error:#}{}", self.diagnostics())
    }
}
