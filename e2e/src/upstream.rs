//! Where the upstream Go programs built by `hack/upstream/build.sh` live.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The upstream binaries and manifests the harness runs, found in the cache
/// that `hack/upstream/build.sh` fills (`$TENANTRY_CACHE/upstream`, by default
/// `~/.cache/tenantry/upstream`).
#[derive(Clone, Debug)]
pub struct Upstream {
    root: PathBuf,
}

/// A program `hack/upstream/build.sh` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Etcd,
    /// kube-apiserver of the pinned Kubernetes release (v1.35).
    KubeApiserver,
    /// kube-apiserver of the oldest minor tenant clusters run (v1.31).
    KubeApiserverV1_31,
    /// kube-apiserver of the previous minor (v1.34), for tenant control
    /// planes that ask for it and for upgrades from it.
    KubeApiserverV1_34,
    /// kube-apiserver of the newest minor (v1.36), for the management
    /// clusters of the version matrix (`tests/management_versions.rs`).
    KubeApiserverV1_36,
    KubeControllerManager,
    KubeScheduler,
    Kubectl,
    /// The Cluster API core manager of the pinned release (v1.14).
    ClusterApiManager,
    /// The Cluster API core manager v1.10 (wrapper `cluster-api-1.10`), the
    /// last minor that serves `cluster.x-k8s.io/v1beta1` only.
    ClusterApiManagerV1_10,
    Clusterctl,
    IpamInCluster,
    /// CABPT, the Talos bootstrap provider (Cozystack's version).
    Cabpt,
    /// Talos's machine config loader and validator (`hack/upstream/talos-config`).
    TalosConfig,
    /// Prometheus's rule, PromQL and scrape parsers (`hack/upstream/prometheus`).
    Promcheck,
    /// KubeVirt's virt-api: its admission webhooks and subresource API.
    VirtApi,
    /// KubeVirt's virt-controller.
    VirtController,
    /// kube-state-metrics, serving `config/monitoring/kube-state-metrics.yaml`.
    KubeStateMetrics,
}

impl Binary {
    /// The file name in the cache's `bin/` folder.
    pub fn file_name(self) -> &'static str {
        match self {
            Binary::Etcd => "etcd",
            Binary::KubeApiserver => "kube-apiserver",
            Binary::KubeApiserverV1_31 => "kube-apiserver-v1.31",
            Binary::KubeApiserverV1_34 => "kube-apiserver-v1.34",
            Binary::KubeApiserverV1_36 => "kube-apiserver-v1.36",
            Binary::KubeControllerManager => "kube-controller-manager",
            Binary::KubeScheduler => "kube-scheduler",
            Binary::Kubectl => "kubectl",
            Binary::ClusterApiManager => "cluster-api-manager",
            Binary::ClusterApiManagerV1_10 => "cluster-api-manager-v1.10",
            Binary::Clusterctl => "clusterctl",
            Binary::IpamInCluster => "ipam-in-cluster",
            Binary::Cabpt => "cabpt",
            Binary::TalosConfig => "talos-config",
            Binary::Promcheck => "promcheck",
            Binary::VirtApi => "virt-api",
            Binary::VirtController => "virt-controller",
            Binary::KubeStateMetrics => "kube-state-metrics",
        }
    }
}

/// The kube-apiserver builds a tenant control plane may run, by Kubernetes
/// minor version (the `34` of v1.34), oldest first: the minors the
/// `Kubernetes` kind accepts that the harness has a build of.
/// `hack/upstream/build.sh` builds each from its own wrapper module
/// (`kubernetes/`, `kubernetes-1.31/`, `kubernetes-1.34/`).
pub const KUBE_APISERVER_MINORS: [(u32, Binary); 3] = [
    (31, Binary::KubeApiserverV1_31),
    (34, Binary::KubeApiserverV1_34),
    (35, Binary::KubeApiserver),
];

/// The kube-apiserver builds a management cluster is tested on: the pinned
/// release, on which the whole suite runs, and the newest minor (wrapper
/// `kubernetes-1.36/`), on which `tests/management_versions.rs` installs
/// tenantry's CRDs and webhooks and the KubeVirt and CDI CRDs.
pub const MANAGEMENT_APISERVER_MINORS: [(u32, Binary); 2] = [
    (35, Binary::KubeApiserver),
    (36, Binary::KubeApiserverV1_36),
];

impl Binary {
    /// The kube-apiserver build of Kubernetes `1.<minor>`, if there is one.
    pub fn kube_apiserver_for_minor(minor: u32) -> Option<Binary> {
        KUBE_APISERVER_MINORS
            .iter()
            .find(|(m, _)| *m == minor)
            .map(|(_, binary)| *binary)
    }

    /// The Kubernetes minor of a kube-apiserver build (`None` for the other
    /// programs).
    pub fn kube_apiserver_minor(self) -> Option<u32> {
        KUBE_APISERVER_MINORS
            .iter()
            .chain(MANAGEMENT_APISERVER_MINORS.iter())
            .find(|(_, b)| *b == self)
            .map(|(minor, _)| *minor)
    }
}

/// The version of `module` that the wrapper module `hack/upstream/<wrapper>`
/// pins in its go.mod, e.g. `pinned_version("kubevirt", "kubevirt.io/kubevirt")`
/// is `v1.8.4`.
pub fn pinned_version(wrapper: &str, module: &str) -> anyhow::Result<String> {
    let go_mod = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../hack/upstream")
        .join(wrapper)
        .join("go.mod");
    let prefix = format!("{module} v");
    std::fs::read_to_string(&go_mod)
        .with_context(|| format!("read {}", go_mod.display()))?
        .lines()
        .map(|line| line.trim().trim_start_matches("require").trim())
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|version| version.split_whitespace().next())
        .map(|version| format!("v{version}"))
        .with_context(|| format!("no {module} requirement in {}", go_mod.display()))
}

impl Upstream {
    /// The cache root: `$TENANTRY_CACHE/upstream`, else `~/.cache/tenantry/upstream`.
    pub fn locate() -> anyhow::Result<Self> {
        let base = match std::env::var_os("TENANTRY_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let home =
                    std::env::var_os("HOME").context("neither TENANTRY_CACHE nor HOME is set")?;
                PathBuf::from(home).join(".cache").join("tenantry")
            }
        };
        Ok(Self {
            root: base.join("upstream"),
        })
    }

    /// The path of an upstream binary, or an error telling how to build it.
    pub fn binary(&self, binary: Binary) -> anyhow::Result<PathBuf> {
        let path = self.root.join("bin").join(binary.file_name());
        if !path.exists() {
            bail!(
                "{} not found at {}: run hack/upstream/build.sh first",
                binary.file_name(),
                path.display()
            );
        }
        Ok(path)
    }

    /// The folder holding the Cluster API core CRDs (`crd/`) and webhook
    /// manifests (`webhook/`) of the pinned Cluster API release.
    pub fn cluster_api_config(&self) -> anyhow::Result<PathBuf> {
        self.config("cluster-api")
    }

    /// The folder holding the CRDs (`crd/`) and webhook manifests
    /// (`webhook/`) of Cluster API v1.10 (wrapper `cluster-api-1.10`).
    pub fn cluster_api_v1_10_config(&self) -> anyhow::Result<PathBuf> {
        self.config("cluster-api-v1.10")
    }

    /// The folder holding the in-cluster IPAM provider's CRDs (`crd/`) and
    /// webhook manifests (`webhook/`).
    pub fn ipam_in_cluster_config(&self) -> anyhow::Result<PathBuf> {
        self.config("ipam-in-cluster")
    }

    /// The folder holding CABPT's CRDs (`crd/`) and webhook manifests
    /// (`webhook/`).
    pub fn cabpt_config(&self) -> anyhow::Result<PathBuf> {
        self.config("cabpt")
    }

    /// What virt-operator installs for virt-api and virt-controller, from
    /// KubeVirt's own generators (`hack/upstream/kubevirt`): the CRDs, their
    /// ServiceAccounts and roles, virt-api's webhook configurations.
    pub fn kubevirt_manifests(&self) -> anyhow::Result<PathBuf> {
        self.generated("kubevirt/kubevirt.yaml", "KubeVirt manifests")
    }

    /// The common cluster instance types and preferences virt-operator
    /// deploys (`hack/upstream/kubevirt`, `kubevirt-instancetypes`).
    pub fn kubevirt_instancetypes(&self) -> anyhow::Result<PathBuf> {
        self.generated("kubevirt/instancetypes.yaml", "KubeVirt instance types")
    }

    /// CDI's CRDs as CDI's operator installs them (`hack/upstream/cdi`, the
    /// CDI API release KubeVirt builds against), one YAML stream.
    pub fn cdi_crds(&self) -> anyhow::Result<PathBuf> {
        self.generated("cdi/cdi-crds.yaml", "CDI CRDs")
    }

    /// A file `build.sh` wrote under the cache (`relative` to its root).
    fn generated(&self, relative: &str, what: &str) -> anyhow::Result<PathBuf> {
        let path = self.root.join(relative);
        if !path.is_file() {
            bail!(
                "{what} not found at {}: run hack/upstream/build.sh first",
                path.display()
            );
        }
        Ok(path)
    }

    /// The folder holding cert-manager's CRDs (`crd/`), of the cert-manager
    /// version the pinned clusterctl installs by default.
    pub fn cert_manager_config(&self) -> anyhow::Result<PathBuf> {
        self.config("cert-manager")
    }

    /// Cluster API's clusterctl release artifacts (`core-components.yaml`,
    /// `metadata.yaml`), rendered from the pinned module by `build.sh`.
    pub fn cluster_api_release(&self) -> anyhow::Result<PathBuf> {
        let path = self.root.join("cluster-api-release");
        if !path.join("core-components.yaml").is_file() {
            bail!(
                "Cluster API release artifacts not found at {}: run hack/upstream/build.sh first",
                path.display()
            );
        }
        Ok(path)
    }

    fn config(&self, name: &str) -> anyhow::Result<PathBuf> {
        let path = self.root.join(name);
        if !path.join("crd").is_dir() {
            bail!(
                "{name} manifests not found at {}: run hack/upstream/build.sh first",
                path.display()
            );
        }
        Ok(path)
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kube_apiserver_minor_has_its_own_binary() {
        assert_eq!(
            Binary::kube_apiserver_for_minor(35),
            Some(Binary::KubeApiserver)
        );
        assert_eq!(
            Binary::kube_apiserver_for_minor(34),
            Some(Binary::KubeApiserverV1_34)
        );
        assert_eq!(Binary::kube_apiserver_for_minor(33), None);
        // v1.36 serves management clusters only: the Kubernetes kind does
        // not offer it to tenants yet.
        assert_eq!(Binary::kube_apiserver_for_minor(36), None);
        assert_eq!(Binary::KubeApiserverV1_36.kube_apiserver_minor(), Some(36));
        assert_eq!(Binary::KubeApiserverV1_34.kube_apiserver_minor(), Some(34));
        assert_eq!(Binary::Etcd.kube_apiserver_minor(), None);
        assert_eq!(
            Binary::KubeApiserverV1_34.file_name(),
            "kube-apiserver-v1.34"
        );
    }
}
