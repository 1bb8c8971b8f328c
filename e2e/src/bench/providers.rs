//! The providers a benchmark compares, each run as its own process outside
//! the cluster, as its release runs inside one: tenantry's `tenantry run`,
//! and the peers built by `hack/upstream/build.sh capk capmox`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition,
};

use crate::control_plane::{ControlPlane, free_port};
use crate::manifests;
use crate::process::ManagedProcess;

/// Which provider runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    Tenantry,
    /// cluster-api-provider-kubevirt.
    Capk,
    /// cluster-api-provider-proxmox.
    Capmox,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Tenantry => "tenantry",
            Provider::Capk => "capk",
            Provider::Capmox => "capmox",
        }
    }

    /// The Cluster API core version this provider reads Clusters and
    /// Machines in (CAPK v0.1 is built on Cluster API v1.10's v1beta1 types).
    pub fn capi_version(self) -> &'static str {
        match self {
            Provider::Capk => "v1beta1",
            Provider::Tenantry | Provider::Capmox => "v1beta2",
        }
    }
}

/// Where the binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `tenantry` (a release build: `cargo build --release -p tenantry-provider`).
    pub tenantry: PathBuf,
    /// The upstream cache (`~/.cache/tenantry/upstream`).
    pub upstream: PathBuf,
}

impl Binaries {
    /// A peer's manager binary.
    pub fn peer(&self, provider: Provider) -> PathBuf {
        self.upstream.join("bin").join(provider.name())
    }

    /// A peer's CRD folder.
    pub fn peer_crds(&self, provider: Provider) -> PathBuf {
        self.upstream.join(provider.name()).join("crd")
    }
}

/// The CRDs of `provider`'s own kinds, as its release installs them: a
/// peer's `config/crd/bases` with the Cluster API contract labels its
/// kustomization adds, and no conversion webhook (only the storage version is
/// written here, and the peers' webhooks do not run).
pub fn provider_crds(
    binaries: &Binaries,
    provider: Provider,
) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    match provider {
        Provider::Tenantry => Ok(tenantry_api::crds::all()),
        Provider::Capk | Provider::Capmox => {
            let dir = binaries.peer_crds(provider);
            let mut documents = Vec::new();
            let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
                .with_context(|| {
                    format!(
                        "read {} (build it: hack/upstream/build.sh {})",
                        dir.display(),
                        provider.name()
                    )
                })?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
                .collect();
            paths.sort();
            for path in paths {
                documents.extend(manifests::read_documents(&path)?);
            }
            let labels: &[(&str, &str)] = match provider {
                // config/crd/kustomization.yaml of each release.
                Provider::Capk => &[("cluster.x-k8s.io/v1beta1", "v1alpha1")],
                _ => &[
                    ("cluster.x-k8s.io/v1beta1", "v1alpha2"),
                    ("cluster.x-k8s.io/v1beta2", "v1alpha2"),
                ],
            };
            let mut crds = manifests::crds_of(documents)?;
            for crd in &mut crds {
                let crd_labels = crd.metadata.labels.get_or_insert_default();
                for (key, value) in labels {
                    crd_labels.insert(key.to_string(), value.to_string());
                }
                crd.spec.conversion = Some(CustomResourceConversion {
                    strategy: "None".into(),
                    webhook: None,
                });
            }
            Ok(crds)
        }
    }
}

/// How a provider is started against a control plane.
pub struct ProviderLaunch<'a> {
    pub binaries: &'a Binaries,
    pub control_plane: &'a ControlPlane,
    /// Environment of the process (the peers take Proxmox credentials so).
    pub env: Vec<(String, String)>,
    /// More command-line arguments, after the provider's own (leader
    /// election flags, for instance).
    pub args: Vec<String>,
    /// Tells replicas of one provider apart: in the process name and the
    /// log file (`<provider>-<instance>.log`). `None` for a provider that
    /// runs alone.
    pub instance: Option<String>,
}

/// Starts `provider` with its release defaults (concurrency, client rate
/// limits), webhooks off where it allows that, logging to its own file.
pub fn start(provider: Provider, launch: ProviderLaunch<'_>) -> anyhow::Result<RunningProvider> {
    let dir = launch.control_plane.dir();
    let kubeconfig = launch.control_plane.kubeconfig_path();
    let health = format!("127.0.0.1:{}", free_port()?);
    let mut command = match provider {
        Provider::Tenantry => {
            let mut command = Command::new(&launch.binaries.tenantry);
            command.args([
                "run",
                "--no-webhooks",
                "--health-addr",
                &health,
                "--tenant-kubeconfig-key",
                "super-admin.conf",
            ]);
            command
        }
        Provider::Capk => {
            // CAPK always serves its webhooks: give it a certificate.
            let cert_dir = dir.join("capk-webhook-certs");
            std::fs::create_dir_all(&cert_dir).context("create CAPK's certificate folder")?;
            launch
                .control_plane
                .ca()
                .issue_server("capk-webhook", &["127.0.0.1", "localhost"])?
                .write(&cert_dir, "tls")?;
            let mut command = Command::new(launch.binaries.peer(provider));
            command.args([
                format!("--kubeconfig={}", kubeconfig.display()),
                "--metrics-bind-addr=0".into(),
                format!("--health-addr={health}"),
                format!("--webhook-port={}", free_port()?),
                format!("--webhook-cert-dir={}", cert_dir.display()),
                "--leader-elect=false".into(),
            ]);
            command
        }
        Provider::Capmox => {
            let mut command = Command::new(launch.binaries.peer(provider));
            command.args([
                format!("--kubeconfig={}", kubeconfig.display()),
                // capmox v0.9 takes Cluster API's diagnostics flags (there
                // is no --metrics-bind-address); "0" turns the server off.
                "--diagnostics-address=0".into(),
                format!("--health-probe-bind-address={health}"),
                "--enable-webhooks=false".into(),
                "--leader-elect=false".into(),
            ]);
            command
        }
    };
    command.args(&launch.args);
    command.env("KUBECONFIG", kubeconfig);
    command.env("RUST_LOG", "info");
    for (key, value) in &launch.env {
        command.env(key, value);
    }
    let name = match &launch.instance {
        Some(instance) => format!("{}-{instance}", provider.name()),
        None => provider.name().to_string(),
    };
    let log = dir.join(format!("{name}.log"));
    Ok(RunningProvider {
        process: ManagedProcess::spawn(&name, command, &log)?,
        health,
    })
}

/// A started provider process and its health endpoint.
pub struct RunningProvider {
    pub process: ManagedProcess,
    health: String,
}

impl RunningProvider {
    /// `host:port` of its health endpoints.
    pub fn health_addr(&self) -> &str {
        &self.health
    }

    /// Waits until the process answers `/healthz` (each of them serves it
    /// once its manager runs), or fails with its log if it exits first.
    /// Whether its controllers work shows next, when the infrastructure
    /// cluster gets ready.
    pub async fn wait_healthy(&mut self, deadline: Duration) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        let http = reqwest::Client::new();
        let url = format!("http://{}/healthz", self.health);
        loop {
            if let Some(status) = self.process.exit_status() {
                anyhow::bail!(
                    "{} exited ({status}):\n{}",
                    self.process.name(),
                    self.process.log_tail(40)
                );
            }
            if let Ok(response) = http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if started.elapsed() > deadline {
                anyhow::bail!(
                    "{} did not answer {url} within {deadline:?}:\n{}",
                    self.process.name(),
                    self.process.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Where `tenantry` is by default: the workspace's release build.
pub fn default_tenantry_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("release/tenantry")
}
