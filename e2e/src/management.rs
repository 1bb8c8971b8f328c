//! A management cluster that runs pods: a node network, a control plane
//! serving it (kube-apiserver, kube-controller-manager with the workload
//! controllers, kube-scheduler), cert-manager (controller and CA
//! injector, a prerequisite of every Cluster API provider), cluster DNS and
//! the service proxy, and the pod runner as its one node (see
//! `pod_runner/README.md`). The
//! deployed-manager tests install tenantry into it as a platform does,
//! and its pods run from tenantry's built image.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;

use crate::cert_manager::CertManager;
use crate::control_plane::{ControlPlane, ControlPlaneOptions, PodSupport};
use crate::pod_runner::images::ImageStore;
use crate::pod_runner::network::NodeNetwork;
use crate::pod_runner::services::ClusterServices;
use crate::pod_runner::{PodRunner, PodRunnerConfig, image_cache};
use crate::upstream::{Binary, Upstream};

/// Where tenantry's image comes from: `TENANTRY_IMAGE_LAYOUT`, else the
/// layout `hack/image.sh` writes (`out/image/layout`).
pub fn tenantry_image_layout() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("TENANTRY_IMAGE_LAYOUT") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../out/image/layout"),
    };
    if !path.join("index.json").is_file() {
        anyhow::bail!(
            "tenantry's image is not built at {}: run hack/image.sh first",
            path.display()
        );
    }
    Ok(path)
}

/// The index digest of tenantry's built image.
pub fn tenantry_image_digest() -> anyhow::Result<String> {
    let layout = tenantry_image::read::Layout::open(&tenantry_image_layout()?)?;
    let tags = layout.tags()?;
    tags.into_iter()
        .find(|(tag, _)| tag.as_deref() == Some(crate::clusterctl::TENANTRY_VERSION))
        .map(|(_, digest)| digest)
        .with_context(|| {
            format!(
                "tenantry's image layout has no image tagged {}",
                crate::clusterctl::TENANTRY_VERSION
            )
        })
}

/// `ghcr.io/tenantry/tenantry:<version>@<digest>`: the reference a release
/// of this build pins.
pub fn tenantry_image_reference() -> anyhow::Result<String> {
    Ok(format!(
        "{}@{}",
        tenantry_provider::components::DEFAULT_IMAGE,
        tenantry_image_digest()?
    ))
}

/// The version the upgrade tests move to: a second build of this commit's
/// manager, labelled and tagged as the next patch release (its image
/// digest differs, so a rollout really replaces the pods).
pub const NEXT_VERSION: &str = "v0.1.1";

/// The next build's image ([`NEXT_VERSION`]): this build's linux binary
/// packed again under the next version's tag and labels. Written once per
/// build of the current image into the pod runner's image cache; returns
/// the layout folder and the reference a release of it would pin.
pub fn next_build() -> anyhow::Result<(PathBuf, String)> {
    use tenantry_image::Platform;
    use tenantry_image::layout::{ImageSpec, LayerFile, LayoutWriter};
    let current = tenantry_image::read::Layout::open(&tenantry_image_layout()?)?;
    let image = current.resolve(Some(crate::clusterctl::TENANTRY_VERSION), &Platform::host())?;
    let dir = image_cache()?.join(format!(
        "next-{}-{}",
        NEXT_VERSION,
        image.digest.trim_start_matches("sha256:")
    ));
    let layout = dir.join("layout");
    if !layout.join("index.json").is_file() {
        let unpacked = tempfile::tempdir()?;
        current.unpack(&image, unpacked.path())?;
        let mut labels = image.config.labels.clone();
        labels.insert(
            "org.opencontainers.image.version".into(),
            NEXT_VERSION.into(),
        );
        let spec = ImageSpec {
            platform: image.platform.clone(),
            files: vec![
                LayerFile {
                    path: "tenantry".into(),
                    mode: 0o755,
                    contents: std::fs::read(unpacked.path().join("tenantry"))?,
                },
                LayerFile {
                    path: tenantry_image::roots::BUNDLE_PATH.into(),
                    mode: 0o644,
                    contents: std::fs::read(
                        unpacked.path().join(tenantry_image::roots::BUNDLE_PATH),
                    )?,
                },
            ],
            entrypoint: image.config.entrypoint.clone(),
            user: image.config.user.clone(),
            labels: labels.clone(),
            created: 0,
            created_by: format!("e2e: {NEXT_VERSION}, a second build of this manager"),
        };
        let partial = tempfile::Builder::new()
            .prefix("next-")
            .tempdir_in(image_cache()?)?;
        let writer = LayoutWriter::create(&partial.path().join("layout"))?;
        let manifest = writer.image(&spec)?;
        writer.finish(&[(spec.platform.clone(), manifest)], &labels, NEXT_VERSION)?;
        std::fs::create_dir_all(&dir)?;
        // Another test may have written it meanwhile; either copy will do.
        let _ = std::fs::rename(partial.path().join("layout"), &layout);
    }
    let digest = tenantry_image::read::Layout::open(&layout)?
        .tags()?
        .into_iter()
        .find_map(|(tag, digest)| (tag.as_deref() == Some(NEXT_VERSION)).then_some(digest))
        .context("the next build has no tag")?;
    let repository = tenantry_provider::components::DEFAULT_IMAGE
        .rsplit_once(':')
        .expect("tagged")
        .0;
    Ok((layout, format!("{repository}:{NEXT_VERSION}@{digest}")))
}

/// The image of the Cluster API core manager, as its release components
/// name it.
pub fn cluster_api_image(version: &str) -> String {
    format!("registry.k8s.io/cluster-api/cluster-api-controller:{version}")
}

/// A management cluster whose Deployments run.
pub struct ManagementCluster {
    // Field order is drop order: pods stop before what they talk to.
    pub runner: PodRunner,
    _services: ClusterServices,
    pub cert_manager: CertManager,
    pub control_plane: ControlPlane,
    network: Arc<NodeNetwork>,
}

impl ManagementCluster {
    /// Starts the node network, the control plane, DNS and the service
    /// proxy, and the pod runner with tenantry's image and the Cluster API
    /// manager's.
    pub async fn start(name: &str) -> anyhow::Result<Self> {
        let network = Arc::new(NodeNetwork::acquire()?);
        let control_plane = ControlPlane::start_with(ControlPlaneOptions {
            name: name.into(),
            pods: Some(PodSupport {
                node_ip: network.node_ip(),
                service_cidr: network.service_cidr(),
            }),
            ..Default::default()
        })
        .await?;
        let client = control_plane.client();
        let cert_manager = CertManager::start(&control_plane).await?;
        let services = ClusterServices::start(client.clone(), network.clone()).await?;
        let upstream = Upstream::locate()?;
        let mut images = ImageStore::new(&image_cache()?);
        let (repository, tag) = tenantry_provider::components::DEFAULT_IMAGE
            .rsplit_once(':')
            .expect("the default image has a tag");
        images.add_layout(repository, tag, &tenantry_image_layout()?, Some(tag));
        let (next_layout, _) = next_build()?;
        images.add_layout(repository, NEXT_VERSION, &next_layout, Some(NEXT_VERSION));
        let capi_version = crate::clusterctl::pinned_cluster_api_version()?;
        let capi_image = cluster_api_image(&capi_version);
        let (capi_repository, capi_tag) = capi_image.rsplit_once(':').expect("tagged");
        images.add_binary(
            capi_repository,
            capi_tag,
            &upstream.binary(Binary::ClusterApiManager)?,
            "/manager",
            "65532:65532",
        );
        let runner = PodRunner::start(
            client,
            PodRunnerConfig {
                node_name: format!("{name}-node"),
                dir: control_plane.dir().join("node"),
                images,
                network: network.clone(),
                apiserver_port: control_plane.port(),
            },
        )
        .await?;
        Ok(Self {
            runner,
            _services: services,
            cert_manager,
            control_plane,
            network,
        })
    }

    /// A client authenticated as the admin.
    pub fn client(&self) -> kube::Client {
        self.control_plane.client()
    }

    /// Waits until Deployment `namespace/name` is available with every
    /// replica updated and ready (what `kubectl rollout status` waits for).
    pub async fn wait_available(
        &self,
        namespace: &str,
        name: &str,
        timeout: std::time::Duration,
    ) -> anyhow::Result<()> {
        use k8s_openapi::api::apps::v1::Deployment;
        let deployments: kube::Api<Deployment> = kube::Api::namespaced(self.client(), namespace);
        crate::wait::until(
            format!("Deployment {namespace}/{name} to be available"),
            timeout,
            || {
                let deployments = deployments.clone();
                async move {
                    let Some(deployment) = deployments.get_opt(name).await? else {
                        return Ok(None);
                    };
                    let status = deployment.status.unwrap_or_default();
                    let available = status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Available" && c.status == "True")
                        && status.updated_replicas == status.replicas
                        && status.ready_replicas == status.replicas;
                    Ok(available.then_some(()))
                }
            },
        )
        .await
    }

    /// `clusterctl init` of Cluster API core and tenantry from a local
    /// repository holding this build's release (its image pinned by digest)
    /// and the next build's, with `variables` in clusterctl's environment;
    /// returns once both managers' Deployments are available.
    pub async fn install_with_clusterctl(
        &self,
        variables: &std::collections::BTreeMap<String, String>,
        timeout: std::time::Duration,
    ) -> anyhow::Result<crate::clusterctl::Clusterctl> {
        use crate::clusterctl::{Clusterctl, TENANTRY_VERSION};
        let image = tenantry_image_reference()?;
        let (_, next) = next_build()?;
        let clusterctl =
            Clusterctl::with_releases(&[(TENANTRY_VERSION, &image), (NEXT_VERSION, &next)])?;
        clusterctl
            .run(
                self.control_plane.kubeconfig_path(),
                &[
                    "init",
                    "--core",
                    &clusterctl.core_provider(),
                    "--bootstrap=-",
                    "--control-plane=-",
                    "--infrastructure",
                    &format!(
                        "{}:{TENANTRY_VERSION}",
                        tenantry_provider::components::PROVIDER_NAME
                    ),
                ],
                variables,
            )
            .await?;
        self.wait_available("capi-system", "capi-controller-manager", timeout)
            .await?;
        self.wait_available(
            tenantry_provider::components::NAMESPACE,
            tenantry_provider::components::DEPLOYMENT_NAME,
            timeout,
        )
        .await?;
        Ok(clusterctl)
    }

    /// What `kubectl get` shows of the workloads and the last events, for
    /// failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for args in [
            &[
                "get",
                "deployments,replicasets,pods,services,endpointslices",
                "-A",
                "-o",
                "wide",
            ][..],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
        ] {
            match self
                .control_plane
                .kubectl()
                .map(|mut c| c.args(args).output())
            {
                Ok(Ok(output)) => {
                    out.push_str(&String::from_utf8_lossy(&output.stdout));
                    out.push_str(&String::from_utf8_lossy(&output.stderr));
                }
                other => out.push_str(&format!("kubectl failed: {other:?}\n")),
            }
        }
        out
    }

    /// The node's address: where pods reach servers running on the host
    /// (simulators must listen there, not on loopback).
    pub fn node_ip(&self) -> std::net::Ipv4Addr {
        self.network.node_ip()
    }
}
