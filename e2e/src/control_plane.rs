//! A real Kubernetes control plane on loopback: etcd, kube-apiserver and
//! (optionally) kube-controller-manager running its garbage collector and
//! namespace controllers, all built from the upstream Go modules.

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Deserialize;

use crate::pki::{CertificateAuthority, ServiceAccountKeys, write_private};
use crate::process::ManagedProcess;
use crate::upstream::{Binary, Upstream};
use crate::wait;

/// How long a start may take before it is reported as broken. A warm start
/// takes a few seconds; the bound covers a loaded CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Port races between parallel starts are retried with fresh ports.
const START_ATTEMPTS: usize = 3;

/// The user the admin kubeconfig authenticates as (group `system:masters`).
pub const ADMIN_USER: &str = "tenantry-admin";
/// The user the apiserver's front proxy presents to aggregated API servers.
const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// What to run besides etcd and kube-apiserver.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// A short name for logs and the kubeconfig context.
    pub name: String,
    /// Run kube-controller-manager with the garbage collector (owner
    /// references cascade), namespace (namespace deletion) and service
    /// account controllers. Nothing else: no pods run here.
    pub controller_manager: bool,
    /// Also run kube-controller-manager's node lifecycle controller, which
    /// marks a Node's `Ready` condition `Unknown` (and taints it) once its
    /// kubelet has not posted status or renewed its Lease for this long, as
    /// in a tenant cluster whose worker stopped answering. Needs
    /// `controller_manager`.
    pub node_monitor_grace_period: Option<Duration>,
    /// Extra kube-apiserver flags, appended last.
    pub extra_apiserver_args: Vec<String>,
    /// Which kube-apiserver build runs: the pinned release by default, or
    /// another minor `hack/upstream/build.sh` builds (see
    /// [`crate::upstream::KUBE_APISERVER_MINORS`]).
    pub apiserver_binary: Binary,
    /// More DNS names for the apiserver's serving certificate, besides
    /// `127.0.0.1`, `localhost` and the `kubernetes.default…` names: the
    /// in-cluster Service names a hosted control plane answers to.
    pub extra_serving_names: Vec<String>,
    /// Run pods (`crate::pod_runner`): the apiserver also listens on the
    /// node's address, admits pods with their ServiceAccount's token
    /// volume, routes webhook and aggregated calls to Service endpoints;
    /// kube-controller-manager also runs the Deployment, ReplicaSet,
    /// EndpointSlice and root CA publisher controllers; kube-scheduler runs.
    pub pods: Option<PodSupport>,
    /// Listen on all addresses and name this one in the kubeconfig and the
    /// serving certificate instead of loopback: a control plane that pods
    /// of a [`crate::management::ManagementCluster`] reach (a tenant's,
    /// behind Kamaji's Service).
    pub address: Option<std::net::Ipv4Addr>,
    /// Record the apiserver's audit log (`audit.log` in the control plane's
    /// folder): every request at level `Metadata`, one JSON event per line,
    /// read back with [`ControlPlane::audit_events`].
    pub audit_log: bool,
}

/// What a control plane that runs pods needs to know of the node network.
#[derive(Clone, Debug)]
pub struct PodSupport {
    /// The node's address, where pods reach the apiserver.
    pub node_ip: std::net::Ipv4Addr,
    /// The Services' ClusterIP range (distinct per node network, so that
    /// parallel clusters' Service addresses never collide on this machine).
    pub service_cidr: String,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            name: "harness".into(),
            controller_manager: true,
            node_monitor_grace_period: None,
            extra_apiserver_args: Vec::new(),
            apiserver_binary: Binary::KubeApiserver,
            extra_serving_names: Vec::new(),
            pods: None,
            address: None,
            audit_log: false,
        }
    }
}

/// Every request at level `Metadata` (who, what, the answer's code; no
/// bodies), once when the answer is complete: the `RequestReceived` stage
/// would log each request twice.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
  - RequestReceived
rules:
  - level: Metadata
";

/// One event of the apiserver's audit log (`audit.k8s.io/v1` `Event`),
/// reduced to who asked what and how it was answered.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, …
    pub verb: String,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub user: AuditUser,
    /// Absent when the client sent none.
    pub user_agent: Option<String>,
    /// The object or collection asked for; absent for non-resource URLs
    /// (`/readyz`, discovery).
    pub object_ref: Option<AuditObjectRef>,
    /// Absent when the request panicked.
    pub response_status: Option<AuditResponseStatus>,
}

/// Who sent an audited request.
#[derive(Clone, Debug, Deserialize)]
pub struct AuditUser {
    #[serde(default)]
    pub username: String,
}

/// What an audited request was about; `None` for what it did not name
/// (`apiGroup` of the core group, `namespace` of a cluster-wide request,
/// `name` of a list or watch).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectRef {
    pub api_group: Option<String>,
    pub api_version: Option<String>,
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// How an audited request was answered.
#[derive(Clone, Debug, Deserialize)]
pub struct AuditResponseStatus {
    #[serde(default)]
    pub code: u16,
}

/// A running control plane. Dropping it kills every process it started; on a
/// panic their log tails are printed and the working folder is kept.
pub struct ControlPlane {
    name: String,
    // Declared before `dir` so processes stop before their files go.
    scheduler: Option<ManagedProcess>,
    controller_manager: Option<ManagedProcess>,
    apiserver: ManagedProcess,
    etcd: ManagedProcess,
    /// The kube-apiserver build running now and the flags it runs with, so
    /// it can be restarted (another minor) on the same data and port.
    apiserver_binary: Binary,
    apiserver_args: Vec<String>,
    apiserver_log: PathBuf,
    audit_log: Option<PathBuf>,
    /// The names the serving certificate always carries (not the
    /// `extra_serving_names`), and where it is.
    serving_names: Vec<String>,
    pki: PathBuf,
    ca: CertificateAuthority,
    server_url: String,
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    client: kube::Client,
    dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("name", &self.name)
            .field("server_url", &self.server_url)
            .field("kubeconfig_path", &self.kubeconfig_path)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager with defaults.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(ControlPlaneOptions::default()).await
    }

    /// Starts a control plane with the given options, waits until
    /// kube-apiserver's `/readyz` answers `ok`.
    pub async fn start_with(options: ControlPlaneOptions) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            match Self::try_start(&upstream, &options).await {
                Ok(control_plane) => return Ok(control_plane),
                Err(StartError::PortTaken(error)) if attempt < START_ATTEMPTS => {
                    tracing::warn!(%error, attempt, "control plane port taken; retrying with new ports");
                    last_error = Some(error);
                }
                Err(StartError::PortTaken(error) | StartError::Other(error)) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("control plane did not start")))
    }

    async fn try_start(
        upstream: &Upstream,
        options: &ControlPlaneOptions,
    ) -> Result<Self, StartError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tenantry-{}-", options.name))
            .tempdir()
            .context("create control plane folder")?;
        let root = dir.path().to_owned();
        let etcd_client_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let apiserver_port = free_port()?;
        let server_url = match options.address {
            Some(address) => format!("https://{address}:{apiserver_port}"),
            None => format!("https://127.0.0.1:{apiserver_port}"),
        };

        let pki = root.join("pki");
        std::fs::create_dir_all(&pki).context("create pki folder")?;
        let ca = CertificateAuthority::new(&format!("tenantry-{}-ca", options.name))?;
        let ca_path = pki.join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).context("write ca.crt")?;
        let mut serving_names = vec![
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        let node_ip = options.pods.as_ref().map(|p| p.node_ip.to_string());
        serving_names.extend(node_ip.as_deref());
        let address = options.address.map(|a| a.to_string());
        serving_names.extend(address.as_deref());
        let serving_names: Vec<String> = serving_names.into_iter().map(String::from).collect();
        let (serving_cert, serving_key) = issue_serving(
            &ca,
            &pki,
            serving_names.iter().chain(&options.extra_serving_names),
        )?;
        // The front proxy (aggregation layer) has a CA of its own, as kubeadm
        // sets it up; the apiserver publishes it in
        // kube-system/extension-apiserver-authentication, which aggregated
        // API servers and KubeVirt's virt-api read at start.
        let front_proxy_ca =
            CertificateAuthority::new(&format!("tenantry-{}-front-proxy-ca", options.name))?;
        let front_proxy_ca_path = pki.join("front-proxy-ca.crt");
        std::fs::write(&front_proxy_ca_path, front_proxy_ca.cert_pem())
            .context("write front-proxy-ca.crt")?;
        let (front_proxy_cert, front_proxy_key) = front_proxy_ca
            .issue_client(FRONT_PROXY_CLIENT, &[])?
            .write(&pki, "front-proxy-client")?;
        let admin = ca.issue_client(ADMIN_USER, &["system:masters"])?;
        let sa_keys = ServiceAccountKeys::generate()?;
        let sa_private = pki.join("sa.key");
        let sa_public = pki.join("sa.pub");
        write_private(&sa_private, &sa_keys.private_pem)?;
        std::fs::write(&sa_public, &sa_keys.public_pem).context("write sa.pub")?;

        let kubeconfig_text = client_kubeconfig(
            &options.name,
            &server_url,
            ADMIN_USER,
            &ca.cert_pem(),
            &admin.cert_pem,
            &admin.key_pem,
        );
        let kubeconfig_path = root.join("kubeconfig");
        write_private(&kubeconfig_path, &kubeconfig_text)?;
        let kubeconfig =
            Kubeconfig::from_yaml(&kubeconfig_text).context("parse generated kubeconfig")?;

        let mut etcd_cmd = Command::new(upstream.binary(Binary::Etcd)?);
        etcd_cmd.args([
            "--name=default".to_string(),
            format!("--data-dir={}", root.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_client_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_client_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer_port}"),
            // Test data need not survive a power cut; fsync dominates start time.
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ]);
        let mut etcd = ManagedProcess::spawn(
            &format!("{}/etcd", options.name),
            etcd_cmd,
            &root.join("etcd.log"),
        )?;

        let mut apiserver_cmd = Command::new(upstream.binary(options.apiserver_binary)?);
        let (bind_address, advertise_address) = match (&address, &node_ip) {
            (Some(address), _) => ("0.0.0.0", address.as_str()),
            // Pods reach it on the node's address, tests on loopback.
            (None, Some(node_ip)) => ("0.0.0.0", node_ip.as_str()),
            (None, None) => ("127.0.0.1", "127.0.0.1"),
        };
        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client_port}"),
            format!("--bind-address={bind_address}"),
            format!("--advertise-address={advertise_address}"),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", root.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_path.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", sa_public.display()),
            format!(
                "--service-account-signing-key-file={}",
                sa_private.display()
            ),
            format!(
                "--service-cluster-ip-range={}",
                options
                    .pods
                    .as_ref()
                    .map_or("10.96.0.0/16", |p| p.service_cidr.as_str())
            ),
            format!(
                "--requestheader-client-ca-file={}",
                front_proxy_ca_path.display()
            ),
            format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            format!("--proxy-client-cert-file={}", front_proxy_cert.display()),
            format!("--proxy-client-key-file={}", front_proxy_key.display()),
            "--authorization-mode=RBAC".to_string(),
            "--allow-privileged=true".to_string(),
            // The `kubernetes` Service endpoint would be 127.0.0.1, which
            // Endpoints validation refuses; pods are told the node address
            // directly (KUBERNETES_SERVICE_HOST).
            "--endpoint-reconciler-type=none".to_string(),
            "--profiling=false".to_string(),
        ];
        if options.pods.is_some() {
            // Webhooks and aggregated APIs behind a Service are called on
            // an endpoint's address: nothing here routes ClusterIPs for the
            // apiserver, as kube-proxy would on a node.
            apiserver_args.push("--enable-aggregator-routing=true".to_string());
        } else {
            // Without pods no ServiceAccount token volume is needed, and
            // the admission plugin would refuse pods of namespaces whose
            // default ServiceAccount was not made yet.
            apiserver_args.push("--disable-admission-plugins=ServiceAccount".to_string());
        }
        let audit_log = match options.audit_log {
            true => {
                let policy = root.join("audit-policy.yaml");
                std::fs::write(&policy, AUDIT_POLICY).context("write audit-policy.yaml")?;
                let log = root.join("audit.log");
                apiserver_args.extend([
                    format!("--audit-policy-file={}", policy.display()),
                    format!("--audit-log-path={}", log.display()),
                    "--audit-log-format=json".to_string(),
                    // Each event is written before the request's handler
                    // returns, not batched in the background.
                    "--audit-log-mode=blocking".to_string(),
                ]);
                Some(log)
            }
            false => None,
        };
        apiserver_args.extend(options.extra_apiserver_args.iter().cloned());
        apiserver_cmd.args(&apiserver_args);
        let apiserver_log = root.join("kube-apiserver.log");
        let mut apiserver = ManagedProcess::spawn(
            &format!("{}/kube-apiserver", options.name),
            apiserver_cmd,
            &apiserver_log,
        )?;

        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .context("load generated kubeconfig")?;
        let client = kube::Client::try_from(config).context("build client")?;

        let ready = wait::until("kube-apiserver /readyz", START_TIMEOUT, || {
            let client = client.clone();
            let exited = [
                etcd.exit_status().map(|s| ("etcd", s)),
                apiserver.exit_status().map(|s| ("kube-apiserver", s)),
            ];
            async move {
                if let Some((which, status)) = exited.into_iter().flatten().next() {
                    return Ok(Some(Err((which, status))));
                }
                let request = http::Request::get("/readyz").body(Vec::new())?;
                let body = client.request_text(request).await?;
                Ok((body.trim() == "ok").then_some(Ok(())))
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => {}
            Ok(Err((which, status))) => {
                let log = if which == "etcd" {
                    etcd.log_tail(20)
                } else {
                    apiserver.log_tail(20)
                };
                let error = anyhow::anyhow!("{which} exited with {status} during start:\n{log}");
                if log.contains("address already in use") {
                    return Err(StartError::PortTaken(error));
                }
                return Err(StartError::Other(error));
            }
            Err(error) => {
                return Err(StartError::Other(error.context(format!(
                    "kube-apiserver log tail:\n{}\netcd log tail:\n{}",
                    apiserver.log_tail(20),
                    etcd.log_tail(20)
                ))));
            }
        }

        let controller_manager = if options.controller_manager {
            let mut cmd = Command::new(upstream.binary(Binary::KubeControllerManager)?);
            let mut controllers = "garbagecollector,namespace,serviceaccount".to_string();
            if options.pods.is_some() {
                // What turns a Deployment into pods and a Service into the
                // endpoints the apiserver calls webhooks on, publishes
                // kube-root-ca.crt for the pods' token volumes, fills the
                // aggregated ClusterRoles providers bind to (Cluster API's
                // manager role gathers its providers' rules), and lifts
                // the not-ready taint the apiserver puts on a new Node.
                controllers.push_str(
                    ",deployment-controller,replicaset-controller,endpointslice-controller,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller",
                );
                if options.node_monitor_grace_period.is_none() {
                    controllers.push_str(",node-lifecycle-controller");
                }
                cmd.arg(format!("--root-ca-file={}", ca_path.display()));
            }
            if let Some(grace) = options.node_monitor_grace_period {
                controllers.push_str(",nodelifecycle");
                cmd.args([
                    format!("--node-monitor-grace-period={}s", grace.as_secs().max(1)),
                    // It checks every period; a short one keeps `Unknown`
                    // close to the grace period.
                    "--node-monitor-period=1s".to_string(),
                ]);
            }
            cmd.args([
                format!("--kubeconfig={}", kubeconfig_path.display()),
                format!("--controllers={controllers}"),
                "--leader-elect=false".to_string(),
                "--secure-port=0".to_string(),
                "--use-service-account-credentials=false".to_string(),
            ]);
            Some(ManagedProcess::spawn(
                &format!("{}/kube-controller-manager", options.name),
                cmd,
                &root.join("kube-controller-manager.log"),
            )?)
        } else {
            None
        };

        let scheduler = if options.pods.is_some() {
            let mut cmd = Command::new(upstream.binary(Binary::KubeScheduler)?);
            cmd.args([
                format!("--kubeconfig={}", kubeconfig_path.display()),
                "--leader-elect=false".to_string(),
                format!("--secure-port={}", free_port()?),
                "--bind-address=127.0.0.1".to_string(),
            ]);
            Some(ManagedProcess::spawn(
                &format!("{}/kube-scheduler", options.name),
                cmd,
                &root.join("kube-scheduler.log"),
            )?)
        } else {
            None
        };

        Ok(Self {
            name: options.name.clone(),
            scheduler,
            controller_manager,
            apiserver,
            etcd,
            apiserver_binary: options.apiserver_binary,
            apiserver_args,
            apiserver_log,
            audit_log,
            serving_names,
            pki,
            ca,
            server_url,
            kubeconfig_path,
            kubeconfig,
            client,
            dir: Some(dir),
        })
    }

    /// A client authenticated as the admin (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The admin kubeconfig file, usable by kubectl and upstream managers.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// Writes a kubeconfig for `user` in `groups` (a client certificate
    /// from this control plane's CA) into its folder, as
    /// `kubeconfig-<user>`, and returns its path: a client that has only
    /// what RBAC grants that user.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        let certificate = self.ca.issue_client(user, groups)?;
        let text = client_kubeconfig(
            &self.name,
            &self.server_url,
            user,
            &self.ca.cert_pem(),
            &certificate.cert_pem,
            &certificate.key_pem,
        );
        let path = self.dir().join(format!("kubeconfig-{user}"));
        write_private(&path, &text)?;
        Ok(path)
    }

    /// A client as `user` in `groups` (see [`Self::user_kubeconfig`]).
    pub async fn user_client(&self, user: &str, groups: &[&str]) -> anyhow::Result<kube::Client> {
        let path = self.user_kubeconfig(user, groups)?;
        let kubeconfig = Kubeconfig::read_from(&path)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The apiserver's port (on loopback, and on the node address when it
    /// runs pods).
    pub fn port(&self) -> u16 {
        self.server_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("server URL ends with its port")
    }

    /// The CA that signed the apiserver's serving certificate; it also
    /// issues webhook serving certificates for processes of this control plane.
    pub fn ca(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// The control plane's working folder (certificates, logs, etcd data).
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .expect("control plane folder")
    }

    /// The name given in the options.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pids of every process this control plane runs.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.etcd.pid(), self.apiserver.pid()];
        pids.extend(self.controller_manager.as_ref().map(ManagedProcess::pid));
        pids.extend(self.scheduler.as_ref().map(ManagedProcess::pid));
        pids
    }

    /// The kube-apiserver build running now.
    pub fn apiserver_binary(&self) -> Binary {
        self.apiserver_binary
    }

    /// What kube-apiserver answers at `/version` (`gitVersion`, e.g.
    /// `v1.35.4`).
    pub async fn server_version(&self) -> anyhow::Result<String> {
        let info = self
            .client
            .apiserver_version()
            .await
            .context("GET /version")?;
        Ok(info.git_version)
    }

    /// Replaces the running kube-apiserver with another build (a Kubernetes
    /// upgrade, as a hosted control plane rolls its apiserver pods): stops
    /// the kube-apiserver process only, starts `binary` with the same flags,
    /// so on the same etcd data, certificates and port (kubeconfigs and
    /// clients keep working), and waits until `/readyz` answers `ok`. etcd
    /// and kube-controller-manager keep running; the controller manager
    /// reconnects by itself.
    pub async fn restart_apiserver_with(&mut self, binary: Binary) -> anyhow::Result<()> {
        // Find the binary before stopping anything.
        let path = Upstream::locate()?.binary(binary)?;
        stop_process(&mut self.apiserver, Duration::from_secs(5)).await;
        {
            use std::io::Write as _;
            let mut log = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.apiserver_log)
                .context("open the kube-apiserver log")?;
            writeln!(log, "==== restarting as {} ====", binary.file_name())?;
        }
        let mut command = Command::new(path);
        command.args(&self.apiserver_args);
        self.apiserver = ManagedProcess::spawn(
            &format!("{}/kube-apiserver", self.name),
            command,
            &self.apiserver_log,
        )?;
        self.apiserver_binary = binary;
        let ready = wait::until("restarted kube-apiserver /readyz", START_TIMEOUT, || {
            let client = self.client.clone();
            let exited = [
                self.etcd.exit_status().map(|s| ("etcd", s)),
                self.apiserver.exit_status().map(|s| ("kube-apiserver", s)),
            ];
            async move {
                if let Some((which, status)) = exited.into_iter().flatten().next() {
                    return Ok(Some(Err((which, status))));
                }
                let request = http::Request::get("/readyz").body(Vec::new())?;
                let body = client.request_text(request).await?;
                Ok((body.trim() == "ok").then_some(Ok(())))
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => Ok(()),
            Ok(Err((which, status))) => Err(anyhow::anyhow!(
                "{which} exited with {status} after the kube-apiserver restart:\n{}",
                self.apiserver.log_tail(20)
            )),
            Err(error) => Err(error.context(format!(
                "kube-apiserver log tail:\n{}",
                self.apiserver.log_tail(20)
            ))),
        }
    }

    /// Re-issues the apiserver's serving certificate for its own names plus
    /// `extra_names` (DNS names or IP addresses; they replace the
    /// `extra_serving_names` it started with). kube-apiserver reloads its
    /// serving certificate when the files change, so it keeps serving
    /// throughout, as Kamaji's rolling update of the apiserver pods does
    /// when a tenant's certSANs change. The new files replace the old ones
    /// by rename, so the apiserver never reads half a file.
    pub fn reissue_serving_certificate(&self, extra_names: &[String]) -> anyhow::Result<()> {
        let staging = self.pki.join("reissue");
        std::fs::create_dir_all(&staging).context("create the certificate staging folder")?;
        let (cert, key) = issue_serving(
            &self.ca,
            &staging,
            self.serving_names.iter().chain(extra_names),
        )?;
        std::fs::rename(&key, self.pki.join("apiserver.key")).context("replace apiserver.key")?;
        std::fs::rename(&cert, self.pki.join("apiserver.crt")).context("replace apiserver.crt")?;
        Ok(())
    }

    /// Restarts kube-apiserver as it runs now (same build, flags, etcd data
    /// and port), as a crashed or rescheduled apiserver pod comes back; see
    /// [`Self::restart_apiserver_with`].
    pub async fn restart_apiserver(&mut self) -> anyhow::Result<()> {
        self.restart_apiserver_with(self.apiserver_binary).await
    }

    /// The events of the apiserver's audit log so far, oldest first (its
    /// flags survive [`Self::restart_apiserver_with`], which appends to the
    /// same file). Needs [`ControlPlaneOptions::audit_log`]. A request's
    /// event is written as its answer completes, so a test waits for the
    /// event it looks for rather than reading once.
    pub fn audit_events(&self) -> anyhow::Result<Vec<AuditEvent>> {
        let path = self
            .audit_log
            .as_ref()
            .context("this control plane records no audit log (ControlPlaneOptions::audit_log)")?;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            // The apiserver creates the file with the first event.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(error).with_context(|| format!("read {}", path.display()));
            }
        };
        // A line without its newline is still being written.
        let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        complete
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                serde_json::from_str(line)
                    .with_context(|| format!("parse audit event {line:?} in {}", path.display()))
            })
            .collect()
    }

    /// A `kubectl` command pointed at this control plane.
    pub fn kubectl(&self) -> anyhow::Result<Command> {
        let mut cmd = Command::new(Upstream::locate()?.binary(Binary::Kubectl)?);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig_path.display()));
        Ok(cmd)
    }

    /// Stops every process gracefully (SIGTERM, then SIGKILL after a grace
    /// period) in dependency order, then removes the working folder.
    pub fn stop(mut self) {
        let grace = Duration::from_secs(5);
        if let Some(scheduler) = self.scheduler.as_mut() {
            scheduler.stop(grace);
        }
        if let Some(kcm) = self.controller_manager.as_mut() {
            kcm.stop(grace);
        }
        self.apiserver.stop(grace);
        self.etcd.stop(grace);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            eprintln!(
                "---- control plane {} kept its files in {} ----",
                self.name,
                dir.keep().display()
            );
        }
        // Processes are killed by their own Drop, in field order.
    }
}

/// Stops a process like [`ManagedProcess::stop`] without blocking the async
/// runtime: SIGTERM, up to `grace` to exit, then SIGKILL.
async fn stop_process(process: &mut ManagedProcess, grace: Duration) {
    if process.exit_status().is_some() {
        return;
    }
    // SAFETY: plain kill(2) on our own child's pid, which has not been reaped
    // (exit_status above would have reaped it).
    unsafe {
        libc::kill(process.pid() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if process.exit_status().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    process.kill();
}

enum StartError {
    PortTaken(anyhow::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for StartError {
    fn from(error: anyhow::Error) -> Self {
        StartError::Other(error)
    }
}

/// A loopback TCP port that was free a moment ago and that this process has
/// not handed out before (so parallel starts in one test binary never pick
/// the same port).
pub fn free_port() -> anyhow::Result<u16> {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("bind a loopback port")?
            .port();
        if handed_out.lock().expect("port set lock").insert(port) {
            return Ok(port);
        }
    }
    bail!("no free loopback port found")
}

fn client_kubeconfig(
    name: &str,
    server: &str,
    user: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {user}
current-context: {name}
",
        ca = BASE64.encode(ca_pem),
        cert = BASE64.encode(cert_pem),
        key = BASE64.encode(key_pem),
    )
}

/// Issues the apiserver's serving certificate for `names` into `pki`
/// (`apiserver.crt`, `apiserver.key`).
fn issue_serving<'a>(
    ca: &CertificateAuthority,
    pki: &Path,
    names: impl IntoIterator<Item = &'a String>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let mut unique: Vec<&str> = Vec::new();
    for name in names {
        if !unique.contains(&name.as_str()) {
            unique.push(name);
        }
    }
    ca.issue_server("kube-apiserver", &unique)?
        .write(pki, "apiserver")
}
