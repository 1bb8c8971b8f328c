//! The `tenantry` command line: flags, and what each subcommand runs. A
//! library module so that the test harness can run the very same binary
//! behaviour as a separate process (`e2e`'s `tenantry-under-test`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::leader::LeaderElectionConfig;
use crate::metrics::MetricsConfig;
use crate::reconciler::ManagerConfig;
use crate::telemetry::{self, LogFormat};
use crate::webhook::WebhookConfig;
use anyhow::Context;
use clap::{Parser, Subcommand};

/// Cluster API infrastructure provider for KubeVirt and Proxmox VE, and the
/// tenant companion controller for Kamaji control planes.
#[derive(Parser, Debug)]
#[command(name = "tenantry", version = env!("TENANTRY_VERSION_TEXT"), about)]
struct Args {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "TENANTRY_LOG_FORMAT", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the `Run` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controllers (and the admission webhooks) against the cluster
    /// of the ambient kubeconfig or in-cluster service account.
    Run(RunArgs),
    /// Print tenantry's CustomResourceDefinitions as YAML, or write one file
    /// per CRD into a folder.
    Crds {
        /// Folder to write `<group>_<plural>.yaml` files into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print clusterctl's `infrastructure-components.yaml`, or write it and
    /// `metadata.yaml` into a folder (see hack/release.sh).
    Components {
        /// Folder to write `infrastructure-components.yaml` and `metadata.yaml` into.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The manager image `TENANTRY_IMAGE` defaults to; a release pins
        /// it by digest (`<repository>:<tag>@sha256:<digest>`).
        #[arg(long, default_value = crate::components::DEFAULT_IMAGE)]
        image: String,
    },
}

/// Flags of `tenantry run`, named as Cluster API providers name them.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Watch only this namespace; all namespaces when unset or empty.
    #[arg(long, env = "TENANTRY_NAMESPACE")]
    namespace: Option<String>,
    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value>;
    /// all objects when unset or empty.
    #[arg(long)]
    watch_filter: Option<String>,
    /// Address of the admission webhook server.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_bind: SocketAddr,
    /// Folder with the webhook serving certificate (tls.crt, tls.key).
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs")]
    webhook_cert_dir: PathBuf,
    /// Do not serve admission webhooks.
    #[arg(long)]
    no_webhooks: bool,
    /// Address of the health endpoints (/healthz, /readyz).
    #[arg(long, default_value = "0.0.0.0:9440")]
    health_addr: SocketAddr,
    /// Key of Kamaji's <cluster>-admin-kubeconfig Secret used to reach
    /// tenant clusters: super-admin.svc inside the management cluster,
    /// super-admin.conf for a manager running outside it.
    #[arg(long, default_value = "super-admin.svc")]
    tenant_kubeconfig_key: String,
    /// IngressClass of the Ingress that publishes a tenant apiserver when
    /// its namespace names none (annotation namespace.cozystack.io/ingress);
    /// empty: the cluster's default class.
    #[arg(long, default_value = "", env = "TENANTRY_TENANT_INGRESS_CLASS")]
    tenant_ingress_class: String,
    /// How many objects each controller reconciles at once (0: no limit).
    #[arg(long, default_value_t = crate::reconciler::DEFAULT_MAX_CONCURRENT_RECONCILES, env = "TENANTRY_MAX_CONCURRENT_RECONCILES")]
    max_concurrent_reconciles: u16,
    /// The Talos image factory of `Kubernetes` objects that name none
    /// (their talos.imageFactoryURL is set to it at creation): a
    /// self-hosted factory or a mirror, for air-gapped platforms. A
    /// trailing slash is dropped.
    #[arg(long, default_value = tenantry_api::kubevirt::DEFAULT_IMAGE_FACTORY_URL, env = "TENANTRY_TALOS_IMAGE_FACTORY_URL", value_parser = image_factory_url)]
    talos_image_factory_url: String,
    /// Address of the metrics endpoint (/metrics): `:8443` (every
    /// interface), `host:port`, or 0 to serve no metrics.
    #[arg(long, visible_alias = "diagnostics-address", default_value = "0", value_parser = metrics_address)]
    metrics_bind_address: MetricsAddress,
    /// Serve metrics over HTTPS to authenticated and authorised scrapers
    /// only (TokenReview and SubjectAccessReview of `get` on /metrics);
    /// false: plain HTTP, open to anyone who reaches the address.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    metrics_secure: bool,
    /// Cluster API's name for `--metrics-secure=false`.
    #[arg(long)]
    insecure_diagnostics: bool,
    /// Folder with the metrics serving certificate (tls.crt, tls.key);
    /// a self-signed one when unset.
    #[arg(long)]
    metrics_cert_dir: Option<PathBuf>,
    /// Run the controllers only while holding a Lease, so that several
    /// replicas can run (webhooks are served by all).
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the leader Lease; the pod's namespace (POD_NAMESPACE)
    /// when unset.
    #[arg(long)]
    leader_election_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, default_value = "tenantry-manager-leader")]
    leader_election_id: String,
    /// How long a leader's Lease holds without renewal (Go duration).
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    leader_elect_lease_duration: Duration,
    /// How long a leader keeps leading without seeing its Lease renewed.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    leader_elect_renew_deadline: Duration,
    /// How often the Lease is looked at.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    leader_elect_retry_period: Duration,
}

/// Where metrics are served; `None`: nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MetricsAddress(Option<SocketAddr>);

/// `0` (no metrics), `:port` (every interface) or `host:port`, as
/// controller-runtime reads `--metrics-bind-address`.
fn metrics_address(text: &str) -> Result<MetricsAddress, String> {
    let text = text.trim();
    if text.is_empty() || text == "0" {
        return Ok(MetricsAddress(None));
    }
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_string(),
    };
    full.parse()
        .map(|address| MetricsAddress(Some(address)))
        .map_err(|_| format!("{text:?} is not 0, :port or host:port"))
}

fn go_duration(text: &str) -> Result<Duration, String> {
    tenantry_api::remediation::parse_duration(text)
}

/// An http(s) base URL without its trailing slashes, as the CRD's rules on
/// `talos.imageFactoryURL` want it: a value they refuse would make every
/// new `Kubernetes` object fail admission. Empty is the public factory, as
/// the release manifests' other empty values mean the default.
fn image_factory_url(text: &str) -> Result<String, String> {
    let url = text.trim().trim_end_matches('/');
    if url.is_empty() {
        return Ok(tenantry_api::kubevirt::DEFAULT_IMAGE_FACTORY_URL.to_string());
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("{text:?} is not an http:// or https:// URL"))?;
    if rest.is_empty() || url.len() > 512 || url.contains(char::is_whitespace) {
        return Err(format!(
            "{text:?} is not a base URL such as https://factory.talos.dev"
        ));
    }
    Ok(url.to_string())
}

/// Parses the command line and runs the subcommand.
pub fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);
    match args.command {
        Command::Run(run) => tokio::runtime::Runtime::new()?.block_on(run_manager(run)),
        Command::Crds { out } => write_crds(out),
        Command::Components { out, image } => write_components(out, &image),
    }
}

async fn run_manager(args: RunArgs) -> anyhow::Result<()> {
    let mut kube_config = kube::Config::infer()
        .await
        .context("find the cluster's address and credentials")?;
    kube_config.read_timeout = Some(crate::reconciler::CLIENT_READ_TIMEOUT);
    // Count the read timeout from the request, not from when its pooled
    // connection went idle.
    kube_config.reset_reader_on_write = true;
    let client = kube::client::ClientBuilder::try_from(kube_config)
        .context("connect to the cluster")?
        .with_layer(&tower::timeout::TimeoutLayer::new(
            crate::reconciler::RESPONSE_TIMEOUT,
        ))
        .build();
    let version = client
        .apiserver_version()
        .await
        .context("read the apiserver version")?;
    tracing::info!(apiserver = %version.git_version, "connected");
    let config = ManagerConfig {
        // The release manifests pass `--namespace=` and `--watch-filter=` when
        // their clusterctl variables are left empty.
        namespace: args.namespace.filter(|n| !n.is_empty()),
        watch_filter: args.watch_filter.filter(|f| !f.is_empty()),
        instance: std::env::var("POD_NAME").ok(),
        webhook: (!args.no_webhooks).then_some(WebhookConfig {
            bind: args.webhook_bind,
            cert_dir: args.webhook_cert_dir,
        }),
        tenant_kubeconfig_key: Some(args.tenant_kubeconfig_key),
        tenant_ingress_class: Some(args.tenant_ingress_class).filter(|c| !c.is_empty()),
        max_concurrent_reconciles: Some(args.max_concurrent_reconciles),
        readiness: Default::default(),
        talos_image_factory_url: Some(args.talos_image_factory_url),
        metrics: args.metrics_bind_address.0.map(|bind| MetricsConfig {
            bind,
            secure: args.metrics_secure && !args.insecure_diagnostics,
            cert_dir: args.metrics_cert_dir.clone(),
        }),
    };
    let health = crate::health::serve(args.health_addr, config.readiness.clone());
    let election = args
        .leader_elect
        .then(|| -> anyhow::Result<LeaderElectionConfig> {
            let namespace = args
                .leader_election_namespace
                .filter(|n| !n.is_empty())
                .or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|n| !n.is_empty())
                })
                .context("--leader-elect needs --leader-election-namespace or POD_NAMESPACE")?;
            let election = LeaderElectionConfig {
                namespace,
                name: args.leader_election_id.clone(),
                identity: LeaderElectionConfig::default_identity(config.instance.as_deref()),
                lease_duration: args.leader_elect_lease_duration,
                renew_deadline: args.leader_elect_renew_deadline,
                retry_period: args.leader_elect_retry_period,
            };
            election.validate().map_err(anyhow::Error::msg)?;
            Ok(election)
        })
        .transpose()?;
    tokio::select! {
        result = crate::manager::run_elected(client, config, election) => result?,
        result = health => result?,
    }
    tracing::info!("stopped");
    Ok(())
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    for crd in tenantry_api::crds::all() {
        let yaml = serde_norway::to_string(&crd)?;
        match &out {
            None => print!("---\n{yaml}"),
            Some(dir) => {
                let name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
                let path = dir.join(name);
                std::fs::create_dir_all(dir)?;
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn write_components(out: Option<PathBuf>, image: &str) -> anyhow::Result<()> {
    use crate::components;
    tenantry_api::image_reference::check_image_reference(image)?;
    match out {
        None => print!("{}", components::infrastructure_components_yaml_for(image)),
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            for (name, text) in [
                (
                    "infrastructure-components.yaml",
                    components::infrastructure_components_yaml_for(image),
                ),
                ("metadata.yaml", components::metadata_yaml()),
            ] {
                let path = dir.join(name);
                std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags as the release Deployment passes them, read the way
    /// `run_manager` reads them (clap checks types only on access).
    #[test]
    fn the_run_flags_parse_and_read_back() {
        let parse = |flags: &[&str]| {
            let args = Args::try_parse_from(["tenantry", "run"].iter().chain(flags))
                .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            let Command::Run(run) = args.command else {
                panic!("not run");
            };
            run
        };
        let defaults = parse(&[]);
        assert_eq!(defaults.metrics_bind_address, MetricsAddress(None));
        assert!(defaults.metrics_secure && !defaults.insecure_diagnostics);
        let deployed = parse(&[
            "--metrics-bind-address=:8443",
            "--metrics-cert-dir=/tmp/k8s-webhook-server/serving-certs",
            "--leader-elect",
        ]);
        assert_eq!(
            deployed.metrics_bind_address,
            MetricsAddress(Some("0.0.0.0:8443".parse().unwrap()))
        );
        let insecure = parse(&[
            "--diagnostics-address=127.0.0.1:8080",
            "--insecure-diagnostics",
        ]);
        assert_eq!(
            insecure.metrics_bind_address,
            MetricsAddress(Some("127.0.0.1:8080".parse().unwrap()))
        );
        assert!(insecure.insecure_diagnostics);
        assert!(!parse(&["--metrics-secure=false"]).metrics_secure);
        assert!(Args::try_parse_from(["tenantry", "run", "--metrics-bind-address=8443"]).is_err());
    }

    /// What the release Deployment runs, its `$(VAR)`s expanded as the
    /// kubelet does with the variables' defaults.
    #[test]
    fn the_release_deployments_arguments_parse() {
        let args: Vec<String> = crate::components::manager_args()
            .into_iter()
            .map(|arg| {
                arg.replace("$(TENANTRY_WATCH_NAMESPACE)", "")
                    .replace("$(TENANTRY_WATCH_FILTER)", "")
                    .replace(
                        "$(TENANTRY_TALOS_IMAGE_FACTORY_URL)",
                        "https://factory.talos.dev",
                    )
            })
            .collect();
        let parsed = Args::try_parse_from(std::iter::once("tenantry".to_string()).chain(args))
            .unwrap_or_else(|e| panic!("{e}"));
        let Command::Run(run) = parsed.command else {
            panic!("not run");
        };
        assert_eq!(
            run.metrics_bind_address,
            MetricsAddress(Some(
                format!("0.0.0.0:{}", crate::components::METRICS_PORT)
                    .parse()
                    .unwrap()
            ))
        );
        assert!(run.metrics_secure && run.leader_elect);
    }

    #[test]
    fn the_image_factory_url_flag_takes_base_urls_only() {
        assert_eq!(
            image_factory_url("http://factory.internal:8080/").as_deref(),
            Ok("http://factory.internal:8080")
        );
        assert_eq!(
            image_factory_url("").as_deref(),
            Ok("https://factory.talos.dev")
        );
        for refused in [
            "factory.talos.dev",
            "ftp://mirror",
            "https://",
            "https://a b",
        ] {
            assert!(image_factory_url(refused).is_err(), "{refused}");
        }
    }
}
