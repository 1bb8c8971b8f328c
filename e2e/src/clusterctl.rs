//! The real `clusterctl` (built by `hack/upstream/build.sh`) against harness
//! control planes, installing from a local provider repository.
//!
//! [`Clusterctl::with_local_repository`] writes, into a temporary folder, the
//! repository layout clusterctl reads for `file://` providers
//! (`{basepath}/{provider-label}/{version}/{file}`) and a `clusterctl.yaml`
//! naming both providers:
//!
//! ```text
//! repository/infrastructure-tenantry/v0.1.0/  infrastructure-components.yaml, metadata.yaml
//!                                             (tenantry_provider::components, what hack/release.sh
//!                                             writes), cluster-template-*.yaml (config/templates)
//! repository/cluster-api/v1.14.2/             core-components.yaml, metadata.yaml (Cluster API's
//!                                             own release artifacts, rendered by build.sh with
//!                                             kustomize from the pinned module)
//! clusterctl.yaml                             providers: (file:// URLs), cert-manager:
//! ```
//!
//! **cert-manager.** The clusterctl.yaml written here declares cert-manager
//! `externallyProvisioned: "true"`, so clusterctl never downloads and
//! installs it, only checks that its API answers (it creates and deletes a
//! test Issuer and Certificate in `cert-manager-test`). Tests that only
//! install components provide that API with cert-manager's CRDs
//! ([`install_cert_manager_crds`], at the version clusterctl pins); there
//! nothing issues the Certificates, and those tests say so. The
//! deployed-manager tests run the real cert-manager instead
//! ([`crate::cert_manager`], in [`crate::management::ManagementCluster`]),
//! which issues the webhook certificates and injects their CA.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tenantry_provider::components;

use crate::manifests::{apply_crds, crds_of, read_documents};
use crate::upstream::{Binary, Upstream};

/// How long one clusterctl command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// The version tenantry's local repository publishes.
pub const TENANTRY_VERSION: &str = components::RELEASE_VERSION;

/// The cluster templates shipped with the release (`config/templates`).
pub fn templates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/templates")
}

/// The Cluster API version `hack/upstream/cluster-api/go.mod` pins.
pub fn pinned_cluster_api_version() -> anyhow::Result<String> {
    crate::upstream::pinned_version("cluster-api", "sigs.k8s.io/cluster-api")
}

/// Installs cert-manager's CRDs (no controller, no webhook: see the module
/// documentation) and waits until they are Established.
pub async fn install_cert_manager_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let dir = Upstream::locate()?.cert_manager_config()?.join("crd");
    apply_crds(client, crds_of(read_documents(&dir)?)?).await
}

/// What a clusterctl command printed.
#[derive(Debug)]
pub struct ClusterctlOutput {
    pub stdout: String,
    pub stderr: String,
}

impl ClusterctlOutput {
    /// Both streams, stdout first (clusterctl logs progress to stderr).
    pub fn combined(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// clusterctl with a local provider repository and its own configuration
/// folder, both removed on drop.
pub struct Clusterctl {
    dir: tempfile::TempDir,
    binary: PathBuf,
    cluster_api_version: String,
}

impl Clusterctl {
    /// Writes the local repository (tenantry and Cluster API core) and
    /// `clusterctl.yaml` into a temporary folder.
    pub fn with_local_repository() -> anyhow::Result<Self> {
        Self::with_releases(&[(TENANTRY_VERSION, components::DEFAULT_IMAGE)])
    }

    /// A local repository holding tenantry `releases` (version, manager
    /// image), as `hack/release.sh` writes them (the image pinned by
    /// digest), oldest first; `init` without a version takes the newest.
    pub fn with_releases(releases: &[(&str, &str)]) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let binary = upstream.binary(Binary::Clusterctl)?;
        let capi_release = upstream.cluster_api_release()?;
        let cluster_api_version = pinned_cluster_api_version()?;
        let dir = tempfile::Builder::new()
            .prefix("tenantry-clusterctl-")
            .tempdir()
            .context("create clusterctl folder")?;
        let repository = dir.path().join("repository");

        let mut tenantry = PathBuf::new();
        for (version, image) in releases {
            tenantry = repository.join(components::PROVIDER_LABEL).join(version);
            std::fs::create_dir_all(&tenantry)?;
            std::fs::write(
                tenantry.join("infrastructure-components.yaml"),
                components::infrastructure_components_yaml_for(image),
            )?;
            std::fs::write(tenantry.join("metadata.yaml"), components::metadata_yaml())?;
            for entry in std::fs::read_dir(templates_dir()).context("read config/templates")? {
                let path = entry?.path();
                if let Some(name) = path.file_name().and_then(|n| n.to_str())
                    && name.starts_with("cluster-template")
                {
                    std::fs::copy(&path, tenantry.join(name))
                        .with_context(|| format!("copy {}", path.display()))?;
                }
            }
        }

        let core = repository.join("cluster-api").join(&cluster_api_version);
        std::fs::create_dir_all(&core)?;
        for name in ["core-components.yaml", "metadata.yaml"] {
            std::fs::copy(capi_release.join(name), core.join(name))
                .with_context(|| format!("copy Cluster API {name}"))?;
        }

        let config = serde_json::json!({
            "providers": [
                {
                    "name": components::PROVIDER_NAME,
                    "type": "InfrastructureProvider",
                    "url": format!("file://{}", tenantry.join("infrastructure-components.yaml").display()),
                },
                {
                    "name": "cluster-api",
                    "type": "CoreProvider",
                    "url": format!("file://{}", core.join("core-components.yaml").display()),
                },
            ],
            // See the module documentation: clusterctl only checks that the
            // cert-manager API answers, and never installs it.
            "cert-manager": { "externallyProvisioned": "true", "timeout": "2m" },
        });
        std::fs::write(
            dir.path().join("clusterctl.yaml"),
            serde_norway::to_string(&config)?,
        )?;
        Ok(Self {
            dir,
            binary,
            cluster_api_version,
        })
    }

    /// The `clusterctl.yaml` passed as `--config`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("clusterctl.yaml")
    }

    /// The repository's base path.
    pub fn repository_path(&self) -> PathBuf {
        self.dir.path().join("repository")
    }

    /// `cluster-api:<pinned version>`, for `init --core`.
    pub fn core_provider(&self) -> String {
        format!("cluster-api:{}", self.cluster_api_version)
    }

    /// `tenantry:<version>`, for `--infrastructure`.
    pub fn infrastructure_provider(&self) -> String {
        format!("{}:{TENANTRY_VERSION}", components::PROVIDER_NAME)
    }

    /// Runs `clusterctl <args> --config <clusterctl.yaml> --kubeconfig
    /// <kubeconfig>` with `variables` in its environment (clusterctl reads
    /// template and components variables from there). A non-zero exit is an
    /// error carrying everything clusterctl printed.
    pub async fn run(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        variables: &BTreeMap<String, String>,
    ) -> anyhow::Result<ClusterctlOutput> {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(args)
            .arg(format!("--config={}", self.config_path().display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            // Keep clusterctl away from the user's ~/.config/cluster-api
            // (overrides, version-check state) and from GitHub.
            .env("XDG_CONFIG_HOME", self.dir.path().join("xdg"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .envs(variables)
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        let output = tokio::time::timeout(COMMAND_TIMEOUT, command.output())
            .await
            .with_context(|| {
                format!(
                    "clusterctl {} took over {COMMAND_TIMEOUT:?}",
                    args.join(" ")
                )
            })?
            .context("run clusterctl")?;
        let result = ClusterctlOutput {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        if !output.status.success() {
            bail!(
                "clusterctl {} failed ({}):\n{}",
                args.join(" "),
                output.status,
                result.combined()
            );
        }
        Ok(result)
    }
}
