//! KubeVirt's own virt-api and virt-controller (`hack/upstream/kubevirt`,
//! the release Cozystack runs) on a harness control plane, with the harness
//! in virt-operator's place.
//!
//! What virt-operator would install comes from KubeVirt's generators
//! (`kubevirt-manifests`), and CDI's CRDs from CDI's module (`cdi-crds`):
//! every KubeVirt CRD, the ServiceAccounts and roles
//! of virt-api, virt-controller and virt-handler, virt-api's mutating
//! and validating webhook configurations, and (`kubevirt-instancetypes`)
//! the common instance types and preferences virt-operator deploys. The harness applies them as they
//! are, with two changes a cluster does not need: each webhook names the
//! port virt-api listens on here, and the `virt-api` Service is an
//! ExternalName for `localhost` (no kube-proxy routes a ClusterIP here; the
//! apiserver dials an ExternalName directly and still checks the serving
//! certificate for `virt-api.kubevirt.svc`). It writes the `KubeVirt`
//! object and the status virt-operator gives it once deployed, issues
//! virt-api's serving certificate from the control plane's CA (operator:
//! its own `kubevirt-ca`), and runs virt-api as its ServiceAccount — virt-api's
//! admission treats KubeVirt's own ServiceAccounts apart from everyone else.
//!
//! Left out: the `subresources.kubevirt.io` APIServices (start/stop/console
//! go through them; tenantry changes `runStrategy` instead), virt-operator's
//! own webhook for `KubeVirt` objects, and the certificate rotation.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::control_plane::{ControlPlane, free_port};
use crate::manifests::{self, FIELD_MANAGER};
use crate::process::{ManagedProcess, Supervised};
use crate::upstream::{Binary, Upstream};
use crate::wait;

/// Where virt-operator installs KubeVirt; virt-api and virt-controller
/// take it from their ServiceAccount's mount, `kubevirt` without one.
pub const NAMESPACE: &str = "kubevirt";
/// The user virt-api runs as.
pub const VIRT_API_USER: &str = "system:serviceaccount:kubevirt:kubevirt-apiserver";
/// The user virt-controller runs as; virt-api's admission lets it (and
/// virt-handler) write what others may not: a VMI's status, its
/// `kubevirt.io/nodeName` and `kubevirt.io/created-by` labels.
pub const VIRT_CONTROLLER_USER: &str = "system:serviceaccount:kubevirt:kubevirt-controller";
/// The user virt-handler runs as.
pub const VIRT_HANDLER_USER: &str = "system:serviceaccount:kubevirt:kubevirt-handler";
/// The groups of a ServiceAccount of [`NAMESPACE`].
pub const SERVICE_ACCOUNT_GROUPS: [&str; 2] =
    ["system:serviceaccounts", "system:serviceaccounts:kubevirt"];

const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running virt-api, its webhooks registered. Dropping it stops it; the
/// webhook configurations stay (the control plane goes with the test).
pub struct VirtApi {
    process: Supervised,
    port: u16,
}

impl std::fmt::Debug for VirtApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtApi")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl VirtApi {
    /// Installs KubeVirt's CRDs, roles and `KubeVirt` object, starts virt-api
    /// and registers its webhooks; returns once they answer.
    pub async fn start(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let client = control_plane.client();
        let documents = manifests::read_documents(&upstream.kubevirt_manifests()?)?;
        let (crds, others): (Vec<_>, Vec<_>) = documents
            .into_iter()
            .partition(|d| d["kind"] == "CustomResourceDefinition");
        let (webhooks, roles): (Vec<_>, Vec<_>) = others.into_iter().partition(|d| {
            matches!(
                d["kind"].as_str(),
                Some("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration")
            )
        });

        manifests::apply_object(
            &client,
            &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } }),
            NAMESPACE,
        )
        .await?;
        manifests::apply_crds(&client, manifests::crds_of(crds)?)
            .await
            .context("install KubeVirt's CRDs")?;
        // CDI's too, as on a platform running CDI: virt-api and
        // virt-controller pick their DataVolume handling at start (and exit
        // when the CRDs come later).
        let cdi = manifests::read_documents(&upstream.cdi_crds()?)?;
        manifests::apply_crds(&client, manifests::crds_of(cdi)?)
            .await
            .context("install CDI's CRDs")?;
        for role in &roles {
            manifests::apply_object(&client, role, NAMESPACE)
                .await
                .context("install KubeVirt's ServiceAccounts and roles")?;
        }
        // virt-operator deploys KubeVirt's common instance types and
        // preferences, which VMs name (u1.medium, ...).
        let instancetypes = manifests::read_documents(&upstream.kubevirt_instancetypes()?)?;
        futures::stream::iter(instancetypes.iter().map(|document| {
            let client = client.clone();
            async move { manifests::apply_object(&client, document, NAMESPACE).await }
        }))
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await
        .context("deploy KubeVirt's common instance types")?;
        deploy_kubevirt_object(&client).await?;
        // virt-api reads the front proxy's CA from here once, at start, and
        // exits without it; the apiserver writes it shortly after it is up.
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
        wait::until(
            "kube-system/extension-apiserver-authentication",
            START_TIMEOUT,
            || async {
                Ok(configmaps
                    .get_opt("extension-apiserver-authentication")
                    .await?
                    .filter(|c| {
                        c.data
                            .as_ref()
                            .is_some_and(|d| d.contains_key("requestheader-client-ca-file"))
                    })
                    .map(|_| ()))
            },
        )
        .await?;

        let dir = control_plane.dir().join("virt-api");
        std::fs::create_dir_all(&dir).context("create virt-api folder")?;
        let serving = control_plane.ca().issue_server(
            "virt-api.kubevirt.pod.cluster.local",
            &[
                "virt-api",
                "virt-api.kubevirt",
                "virt-api.kubevirt.svc",
                "virt-api.kubevirt.svc.cluster.local",
                "localhost",
                "127.0.0.1",
            ],
        )?;
        // Certificates in a folder of their own: virt-api watches the
        // folder, and would reload (and log it) on each write of its log.
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).context("create virt-api certificate folder")?;
        let (cert, key) = serving.write(&certs, "tls")?;
        // virt-api's client certificate towards virt-handler (consoles):
        // unused here, but virt-api keeps looking for the files.
        let (handler_cert, handler_key) = control_plane
            .ca()
            .issue_client("kubevirt.io:system:client:virt-handler", &[])?
            .write(&certs, "handler-client")?;
        let kubeconfig = control_plane.user_kubeconfig(VIRT_API_USER, &SERVICE_ACCOUNT_GROUPS)?;
        let port = free_port()?;
        let binary = upstream.binary(Binary::VirtApi)?;
        let log = dir.join("virt-api.log");
        let command = move || {
            let mut command = Command::new(&binary);
            command.args(arg_list(&[
                ("--kubeconfig", &kubeconfig),
                ("--tls-cert-file", &cert),
                ("--tls-key-file", &key),
                ("--handler-cert-file", &handler_cert),
                ("--handler-key-file", &handler_key),
            ]));
            command.args(["--listen=127.0.0.1".to_string(), format!("--port={port}")]);
            // A writable working folder: virt-api makes a temporary one there.
            command.current_dir(&dir).env("TMPDIR", &dir);
            command
        };
        let mut process = ManagedProcess::spawn(
            &format!("{}/virt-api", control_plane.name()),
            command(),
            &log,
        )?;
        wait_answering(
            &mut process,
            &control_plane.ca().cert_pem(),
            port,
            "/apis/subresources.kubevirt.io/v1/healthz",
            "virt-api to be healthy",
            |_| true,
        )
        .await?;
        // It exits when CDI's DataSource CRD comes or goes; its Deployment
        // would start it again.
        let process = Supervised::watch(process, command);

        register_webhooks(control_plane, webhooks, port).await?;
        let virt_api = Self { process, port };
        virt_api.wait_admission(&client).await?;
        Ok(virt_api)
    }

    /// The port virt-api serves on, on loopback.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The KubeVirt release virt-api reports (`gitVersion` of its
    /// `/apis/subresources.kubevirt.io/v1/version`, which it serves to
    /// everyone), as built by `hack/upstream/build.sh`.
    pub async fn version(&self, ca_pem: &str) -> anyhow::Result<String> {
        let http = loopback_client(ca_pem)?;
        let info: serde_json::Value = http
            .get(format!(
                "https://localhost:{}/apis/subresources.kubevirt.io/v1/version",
                self.port
            ))
            .timeout(Duration::from_secs(10))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        info["gitVersion"]
            .as_str()
            .map(str::to_string)
            .context("virt-api's version has no gitVersion")
    }

    /// The last lines of virt-api's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Waits until the apiserver calls virt-api's webhooks: a dry-run
    /// VirtualMachine KubeVirt refuses (no domain devices for a disk it
    /// names) is refused by `virtualmachine-validator.kubevirt.io`.
    async fn wait_admission(&self, client: &kube::Client) -> anyhow::Result<()> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
            "virtualmachines",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
        let probe: DynamicObject = serde_json::from_value(refused_virtual_machine("probe"))?;
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        wait::until("virt-api's webhooks to answer", START_TIMEOUT, || {
            let api = api.clone();
            let probe = probe.clone();
            let params = params.clone();
            async move {
                Ok(match api.create(&params, &probe).await {
                    Err(kube::Error::Api(status))
                        if status
                            .message
                            .contains("virtualmachine-validator.kubevirt.io") =>
                    {
                        Some(())
                    }
                    _ => None,
                })
            }
        })
        .await
        .with_context(|| format!("virt-api log tail:\n{}", self.log_tail(30)))
    }
}

/// The image virt-controller names in launcher pods (nothing pulls it here).
pub const LAUNCHER_IMAGE: &str = "quay.io/kubevirt/virt-launcher:v1.8.4";

/// A running virt-controller, leading. Dropping it stops it.
///
/// It runs as its ServiceAccount: virt-api's admission lets only KubeVirt's
/// own users write a VMI's status and its `kubevirt.io/nodeName` label. It
/// always takes part in leader election (Lease `kubevirt/virt-controller`;
/// there is no flag to turn that off) and starts its controllers once it
/// leads. It leaves and expects a restart when CDI's DataVolume CRD comes or
/// goes: install the CRDs before starting it.
pub struct VirtController {
    process: Supervised,
}

impl std::fmt::Debug for VirtController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtController")
            .field("pid", &self.process.pid())
            .finish_non_exhaustive()
    }
}

impl VirtController {
    /// Starts virt-controller on a control plane where [`VirtApi`] runs;
    /// returns once it leads and its caches are synced.
    pub async fn start(control_plane: &ControlPlane, _virt_api: &VirtApi) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let dir = control_plane.dir().join("virt-controller");
        std::fs::create_dir_all(&dir).context("create virt-controller folder")?;
        // Its health and leader endpoints are HTTPS only.
        // In a folder of their own, as for virt-api.
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).context("create virt-controller certificate folder")?;
        let (cert, key) = control_plane
            .ca()
            .issue_server("virt-controller", &["localhost", "127.0.0.1"])?
            .write(&certs, "tls")?;
        let kubeconfig =
            control_plane.user_kubeconfig(VIRT_CONTROLLER_USER, &SERVICE_ACCOUNT_GROUPS)?;
        let port = free_port()?;
        let binary = upstream.binary(Binary::VirtController)?;
        let log = dir.join("virt-controller.log");
        let command = move || {
            let mut command = Command::new(&binary);
            command.args(arg_list(&[
                ("--kubeconfig", &kubeconfig),
                ("--prom-cert-file", &cert),
                ("--prom-key-file", &key),
            ]));
            command.args([
                "--listen=127.0.0.1".to_string(),
                format!("--port={port}"),
                format!("--launcher-image={LAUNCHER_IMAGE}"),
                // It is the only replica, and it exits when a renewal misses
                // the deadline (10 s by default): a loaded test machine must
                // not end it. A restart takes the Lease back at once (same
                // identity).
                "--leader-elect-lease-duration=120s".to_string(),
                "--leader-elect-renew-deadline=90s".to_string(),
            ]);
            command.current_dir(&dir).env("TMPDIR", &dir);
            command
        };
        let mut process = ManagedProcess::spawn(
            &format!("{}/virt-controller", control_plane.name()),
            command(),
            &log,
        )?;
        // `/leader` answers 200 from the start; its body says
        // `"leader":"true"` once this process leads and its caches synced.
        wait_answering(
            &mut process,
            &control_plane.ca().cert_pem(),
            port,
            "/leader",
            "virt-controller to lead",
            |body| {
                body.replace(char::is_whitespace, "")
                    .contains(r#""leader":"true""#)
            },
        )
        .await?;
        Ok(Self {
            process: Supervised::watch(process, command),
        })
    }

    /// The last lines of virt-controller's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// How often it exited and was started again (it exits when it loses
    /// the Lease or when CDI's CRDs change, and its Deployment restarts it).
    pub fn restarts(&self) -> u32 {
        self.process.restarts()
    }
}

/// A VirtualMachine KubeVirt's admission refuses: its disk names a volume
/// that does not exist.
pub fn refused_virtual_machine(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": { "name": name },
        "spec": {
            "runStrategy": "Halted",
            "template": { "spec": {
                "domain": {
                    "devices": { "disks": [{ "name": "root", "disk": { "bus": "virtio" } }] },
                    "resources": { "requests": { "memory": "1Gi" } },
                },
                "volumes": [],
            }},
        },
    })
}

fn arg_list(pairs: &[(&str, &PathBuf)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(flag, path)| format!("{flag}={}", path.display()))
        .collect()
}

/// The `KubeVirt` object, with the status virt-operator writes once it
/// deployed a release: virt-api and virt-controller read their settings only
/// from an object with a phase, and default a VM's architecture to
/// `status.defaultArchitecture`.
async fn deploy_kubevirt_object(client: &kube::Client) -> anyhow::Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "KubeVirt"),
        "kubevirts",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(
        "kubevirt",
        &params,
        &Patch::Apply(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": { "name": "kubevirt", "namespace": NAMESPACE },
            "spec": {
                "imagePullPolicy": "IfNotPresent",
                // No /dev/kvm here; it changes only what launcher pods ask for.
                "configuration": { "developerConfiguration": { "useEmulation": true } },
            },
        })),
    )
    .await
    .context("create the KubeVirt object")?;
    api.patch_status(
        "kubevirt",
        &params,
        &Patch::Apply(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "status": {
                "phase": "Deployed",
                "defaultArchitecture": kubernetes_arch(),
            },
        })),
    )
    .await
    .context("write the KubeVirt object's status")?;
    Ok(())
}

/// An HTTPS client for virt-api's and virt-controller's own endpoints on
/// loopback, trusting the control plane's CA (`ca_pem`).
fn loopback_client(ca_pem: &str) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes())?)
        .build()?)
}

/// Waits until `process` answers `https://localhost:<port><path>` (trusting
/// `ca_pem`) with a body `ready` accepts; fails at once, with its log tail,
/// if it exits first.
async fn wait_answering(
    process: &mut ManagedProcess,
    ca_pem: &str,
    port: u16,
    path: &str,
    what: &str,
    ready: fn(&str) -> bool,
) -> anyhow::Result<()> {
    let http = loopback_client(ca_pem)?;
    let url = format!("https://localhost:{port}{path}");
    let answered = wait::until(what, START_TIMEOUT, || {
        let exited = process.exit_status();
        let http = http.clone();
        let url = url.clone();
        async move {
            if let Some(status) = exited {
                return Ok(Some(Err(status)));
            }
            let Ok(response) = http.get(&url).timeout(Duration::from_secs(2)).send().await else {
                return Ok(None);
            };
            if !response.status().is_success() {
                return Ok(None);
            }
            let body = response.text().await.unwrap_or_default();
            Ok(ready(&body).then_some(Ok(())))
        }
    })
    .await;
    match answered {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => anyhow::bail!(
            "{} exited with {status} during start:\n{}",
            process.name(),
            process.log_tail(30)
        ),
        Err(error) => Err(error.context(format!(
            "{} log tail:\n{}",
            process.name(),
            process.log_tail(30)
        ))),
    }
}

/// The architecture as Kubernetes and KubeVirt name it (`amd64`, `arm64`).
pub fn kubernetes_arch() -> String {
    match std::env::consts::ARCH {
        "x86_64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        other => other.into(),
    }
}

/// The `virt-api` Service and KubeVirt's webhook configurations, pointed at
/// the local virt-api and trusting the control plane's CA.
async fn register_webhooks(
    control_plane: &ControlPlane,
    webhooks: Vec<serde_json::Value>,
    port: u16,
) -> anyhow::Result<()> {
    let client = control_plane.client();
    manifests::apply_object(
        &client,
        &json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": "virt-api", "namespace": NAMESPACE },
            "spec": { "type": "ExternalName", "externalName": "localhost" },
        }),
        NAMESPACE,
    )
    .await
    .context("create the virt-api Service")?;
    let ca_bundle = BASE64.encode(control_plane.ca().cert_pem());
    for mut configuration in webhooks {
        for webhook in configuration["webhooks"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let client_config = &mut webhook["clientConfig"];
            client_config["caBundle"] = json!(ca_bundle);
            client_config["service"]["port"] = json!(port);
        }
        manifests::apply_object(&client, &configuration, NAMESPACE)
            .await
            .context("register virt-api's webhooks")?;
    }
    Ok(())
}
