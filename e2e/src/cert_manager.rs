//! The real cert-manager (controller and CA injector) against a harness
//! control plane, as local processes.
//!
//! Both programs are built by `hack/upstream/build.sh` from the
//! `github.com/cert-manager/cert-manager` module at the version clusterctl
//! pins, through the wrapper module `hack/upstream/cert-manager-bin/`: the
//! upstream main packages live in nested modules the Go module proxy does not
//! serve, so two small mains there wire cert-manager's own public packages
//! the way its `cmd/controller/app` and `cmd/cainjector/app` do.
//!
//! **What runs for real.** cert-manager's controller loops for Certificates
//! (trigger, key manager, request manager, issuing, readiness, revision
//! manager, metrics), the CertificateRequest approver, the CertificateRequest
//! signers of the `selfSigned` and `ca` issuers, and the Issuer and
//! ClusterIssuer status loops: a Certificate gets its Secret (`tls.crt`,
//! `tls.key`, `ca.crt`), its `Ready` condition and its revision exactly as in
//! a real management cluster. The CA injector fills `caBundle` in
//! ValidatingWebhookConfigurations, MutatingWebhookConfigurations,
//! CustomResourceDefinitions (conversion webhook) and APIServices annotated
//! `cert-manager.io/inject-ca-from`, `…/inject-ca-from-secret` or
//! `…/inject-apiserver-ca`.
//!
//! **What is left out.** cert-manager's webhook (it validates and defaults
//! cert-manager objects at admission and records the requesting user on a
//! CertificateRequest: here nothing refuses an invalid Issuer at create
//! time, the controller reports it instead), the ACME, Vault and Venafi
//! issuers, the ingress and Gateway API shims, the experimental
//! CertificateSigningRequest signers, leader election (one replica of each)
//! and TLS on the metrics endpoints.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};

use crate::cluster_api::http_status;
use crate::clusterctl::install_cert_manager_crds;
use crate::control_plane::{ControlPlane, free_port};
use crate::manifests::FIELD_MANAGER;
use crate::process::ManagedProcess;
use crate::upstream::Upstream;
use crate::wait;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The namespace cert-manager is installed into; ClusterIssuers read their
/// Secrets from it (`--cluster-resource-namespace`, as its Helm chart sets).
pub const CERT_MANAGER_NAMESPACE: &str = "cert-manager";

/// cert-manager's controller and CA injector, running against one control
/// plane. Both stop (SIGTERM, then SIGKILL) when this is dropped.
pub struct CertManager {
    controller: ManagedProcess,
    cainjector: ManagedProcess,
}

impl CertManager {
    /// Installs cert-manager's CRDs and its namespace into `control_plane`,
    /// starts the controller and the CA injector, and waits until the
    /// controller's `/livez` and the injector's `/readyz` (its informers
    /// synced) answer.
    pub async fn start(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let client = control_plane.client();
        install_cert_manager_crds(&client).await?;
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": CERT_MANAGER_NAMESPACE },
        }))?;
        Api::<Namespace>::all(client)
            .patch(
                CERT_MANAGER_NAMESPACE,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&namespace),
            )
            .await
            .context("create the cert-manager namespace")?;

        let bin = Upstream::locate()?.root().join("bin");
        let kubeconfig = format!("--kubeconfig={}", control_plane.kubeconfig_path().display());

        let healthz_port = free_port()?;
        let mut controller = Command::new(binary(&bin, "cert-manager-controller")?);
        controller.args([
            kubeconfig.clone(),
            format!("--cluster-resource-namespace={CERT_MANAGER_NAMESPACE}"),
            format!("--metrics-listen-address=127.0.0.1:{}", free_port()?),
            format!("--internal-healthz-listen-address=127.0.0.1:{healthz_port}"),
            // The Helm chart's default log level.
            "--v=2".to_string(),
        ]);
        let controller = ManagedProcess::spawn(
            &format!("{}/cert-manager-controller", control_plane.name()),
            controller,
            &control_plane.dir().join("cert-manager-controller.log"),
        )?;

        let probe_port = free_port()?;
        let mut cainjector = Command::new(binary(&bin, "cert-manager-cainjector")?);
        cainjector.args([
            kubeconfig,
            format!("--metrics-listen-address=127.0.0.1:{}", free_port()?),
            format!("--health-probe-bind-address=127.0.0.1:{probe_port}"),
            "--v=2".to_string(),
        ]);
        let cainjector = ManagedProcess::spawn(
            &format!("{}/cert-manager-cainjector", control_plane.name()),
            cainjector,
            &control_plane.dir().join("cert-manager-cainjector.log"),
        )?;

        let mut cert_manager = Self {
            controller,
            cainjector,
        };
        wait_until_answers(&mut cert_manager.controller, healthz_port, "/livez").await?;
        wait_until_answers(&mut cert_manager.cainjector, probe_port, "/readyz").await?;
        Ok(cert_manager)
    }

    /// The controller's log file.
    pub fn controller_log_path(&self) -> &Path {
        self.controller.log_path()
    }

    /// The CA injector's log file.
    pub fn cainjector_log_path(&self) -> &Path {
        self.cainjector.log_path()
    }

    /// The last lines of the controller's log.
    pub fn controller_log_tail(&self, lines: usize) -> String {
        self.controller.log_tail(lines)
    }

    /// The last lines of the CA injector's log.
    pub fn cainjector_log_tail(&self, lines: usize) -> String {
        self.cainjector.log_tail(lines)
    }

    /// Both log tails, labelled, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        format!(
            "cert-manager controller log tail:\n{}\ncert-manager cainjector log tail:\n{}",
            self.controller_log_tail(lines),
            self.cainjector_log_tail(lines)
        )
    }

    /// Stops both (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(mut self) {
        self.stop_processes();
    }

    fn stop_processes(&mut self) {
        self.controller.stop(STOP_GRACE);
        self.cainjector.stop(STOP_GRACE);
    }
}

impl Drop for CertManager {
    fn drop(&mut self) {
        // Skipped on a panic: ManagedProcess's own drop prints the log tails
        // and kills at once.
        if !std::thread::panicking() {
            self.stop_processes();
        }
    }
}

fn binary(bin: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = bin.join(name);
    if !path.exists() {
        bail!(
            "{name} not found at {}: run hack/upstream/build.sh {name}",
            path.display()
        );
    }
    Ok(path)
}

/// Waits until a plain-HTTP GET of `path` on `port` answers 200, failing at
/// once if the process exits.
async fn wait_until_answers(
    process: &mut ManagedProcess,
    port: u16,
    path: &str,
) -> anyhow::Result<()> {
    let address = format!("127.0.0.1:{port}");
    let name = process.name().to_owned();
    let ready = wait::until(format!("{name} {path}"), READY_TIMEOUT, || {
        let exited = process.exit_status();
        let address = address.clone();
        async move {
            if let Some(status) = exited {
                return Ok(Some(Err(status)));
            }
            Ok((http_status(&address, path).await? == 200).then_some(Ok(())))
        }
    })
    .await;
    match ready {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => bail!(
            "{name} exited with {status} during start:\n{}",
            process.log_tail(30)
        ),
        Err(error) => Err(error.context(format!("{name} log tail:\n{}", process.log_tail(30)))),
    }
}
