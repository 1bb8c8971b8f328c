//! The Proxmox VE controllers of a tenant cluster on `substrate: proxmox`:
//! the Proxmox CSI controller (creates, attaches and resizes the tenant's
//! volumes as Proxmox disks) and the Proxmox cloud-controller-manager
//! (initialises the tenant's Nodes from their VMs and deletes Nodes whose VM
//! is gone). Both hold a Proxmox API token, so both run in the tenant's
//! **management** namespace and talk to the tenant apiserver through its
//! `super-admin.svc` kubeconfig; their config Secret is composed there from
//! `proxmox.csi.credentialsSecretName` / `proxmox.ccm.credentialsSecretName`.
//! Nothing holding a credential is written into the tenant cluster. (The
//! CSI node plugin, which mounts volumes on the workers and holds no
//! credential, is a tenant addon.)

use serde_json::{Value, json};
use tenantry_api::tenant::{Kubernetes, ProxmoxCsi, admin_kubeconfig_secret_name, cluster_name};

use super::render::KUBERNETES_LABEL;

/// Images of the controllers, pinned.
pub const CSI_CONTROLLER_IMAGE: &str = "ghcr.io/sergelogvinov/proxmox-csi-controller:v0.13.0";
pub const CSI_PROVISIONER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-provisioner:v5.2.0";
pub const CSI_ATTACHER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-attacher:v4.8.1";
pub const CSI_RESIZER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-resizer:v1.13.2";
pub const CCM_IMAGE: &str = "ghcr.io/sergelogvinov/proxmox-cloud-controller-manager:v0.8.0";

/// Where the tenant's admin kubeconfig Secret is mounted.
const KUBECONFIG_DIR: &str = "/etc/kubernetes/tenant";
const KUBECONFIG_KEY: &str = "super-admin.svc";
const CLOUD_CONFIG_DIR: &str = "/etc/proxmox";

/// The CSI driver's settings, defaulted when `proxmox.csi` is unset (the
/// driver is installed unless disabled).
pub fn csi_settings(kubernetes: &Kubernetes) -> Option<ProxmoxCsi> {
    let csi = kubernetes
        .spec
        .proxmox
        .as_ref()
        .map(|p| p.csi.clone().unwrap_or_default())?;
    csi.enabled.then_some(csi)
}

/// Which controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxmoxController {
    Csi,
    Ccm,
}

impl ProxmoxController {
    fn suffix(self) -> &'static str {
        match self {
            ProxmoxController::Csi => "proxmox-csi",
            ProxmoxController::Ccm => "proxmox-ccm",
        }
    }

    /// `kubernetes-<name>-proxmox-csi` / `-proxmox-ccm`: the Deployment and
    /// its config Secret.
    pub fn object_name(self, kubernetes: &str) -> String {
        format!("{}-{}", cluster_name(kubernetes), self.suffix())
    }

    /// The credentials Secret the user names for this controller, falling
    /// back to the cluster's Proxmox credentials.
    pub fn credentials_secret(self, kubernetes: &Kubernetes) -> String {
        let proxmox = kubernetes.spec.proxmox.clone().unwrap_or_default();
        let own = match self {
            ProxmoxController::Csi => proxmox.csi.and_then(|c| c.credentials_secret_name),
            ProxmoxController::Ccm => proxmox.ccm.and_then(|c| c.credentials_secret_name),
        };
        own.or(proxmox.credentials_secret_name)
            .unwrap_or_else(|| super::render::DEFAULT_PROXMOX_CREDENTIALS.to_string())
    }

    /// The field naming the credentials, for messages.
    pub fn credentials_field(self) -> &'static str {
        match self {
            ProxmoxController::Csi => "spec.proxmox.csi.credentialsSecretName",
            ProxmoxController::Ccm => "spec.proxmox.ccm.credentialsSecretName",
        }
    }
}

/// The controllers' `config.yaml` (both read the same shape): the Proxmox
/// API URL, token and region, from the credentials Secret's `url`,
/// `token_id`, `token_secret` and optional `region` (default: the CAPI
/// cluster's name).
pub fn cloud_config(
    kubernetes: &Kubernetes,
    url: &str,
    token_id: &str,
    token_secret: &str,
    region: Option<&str>,
) -> String {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let api = if url.trim_end_matches('/').ends_with("/api2/json") {
        url.trim_end_matches('/').to_string()
    } else {
        format!("{}/api2/json", url.trim_end_matches('/'))
    };
    let insecure = kubernetes.spec.proxmox.as_ref().is_some_and(|p| p.insecure);
    let config = json!({ "clusters": [{
        "url": api,
        "insecure": insecure,
        "token_id": token_id,
        "token_secret": token_secret,
        "region": region.map(str::to_string).unwrap_or_else(|| cluster_name(name)),
    }]});
    serde_norway::to_string(&config).unwrap_or_default()
}

/// The config Secret in the management namespace.
pub fn config_secret(
    kubernetes: &Kubernetes,
    controller: ProxmoxController,
    config: &str,
) -> Value {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": controller.object_name(name),
            "labels": { KUBERNETES_LABEL: name },
        },
        "type": "Opaque",
        "stringData": { "config.yaml": config },
    })
}

fn volumes(kubernetes: &str, controller: ProxmoxController) -> Value {
    json!([
        { "name": "tenant-kubeconfig", "secret": {
            "secretName": admin_kubeconfig_secret_name(kubernetes),
            "items": [{ "key": KUBECONFIG_KEY, "path": KUBECONFIG_KEY }],
        }},
        { "name": "cloud-config", "secret": { "secretName": controller.object_name(kubernetes) } },
        { "name": "socket-dir", "emptyDir": {} },
    ])
}

fn container(name: &str, image: &str, args: Vec<String>, mounts: Value) -> Value {
    json!({
        "name": name,
        "image": image,
        "args": args,
        "volumeMounts": mounts,
        "resources": { "requests": { "cpu": "10m", "memory": "32Mi" }, "limits": { "memory": "128Mi" } },
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": { "drop": ["ALL"] },
        },
    })
}

/// The Deployment of a controller, in the management namespace.
pub fn deployment(kubernetes: &Kubernetes, controller: ProxmoxController) -> Value {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let object_name = controller.object_name(name);
    let kubeconfig = format!("--kubeconfig={KUBECONFIG_DIR}/{KUBECONFIG_KEY}");
    let cloud_config = format!("--cloud-config={CLOUD_CONFIG_DIR}/config.yaml");
    let tenant_mount =
        json!({ "name": "tenant-kubeconfig", "mountPath": KUBECONFIG_DIR, "readOnly": true });
    let config_mount =
        json!({ "name": "cloud-config", "mountPath": CLOUD_CONFIG_DIR, "readOnly": true });
    let socket_mount = json!({ "name": "socket-dir", "mountPath": "/csi" });
    let containers = match controller {
        ProxmoxController::Csi => {
            let sidecar = |n: &str, image: &str| {
                container(
                    n,
                    image,
                    vec![
                        "--v=2".into(),
                        "--csi-address=unix:///csi/csi.sock".into(),
                        kubeconfig.clone(),
                        "--timeout=3m".into(),
                        "--leader-election".into(),
                        "--default-fstype=ext4".into(),
                    ]
                    .into_iter()
                    .filter(|a| n == "csi-provisioner" || a != "--default-fstype=ext4")
                    .collect(),
                    json!([tenant_mount, socket_mount]),
                )
            };
            vec![
                container(
                    "proxmox-csi-plugin-controller",
                    CSI_CONTROLLER_IMAGE,
                    vec![
                        "-v=3".into(),
                        "--csi-address=unix:///csi/csi.sock".into(),
                        cloud_config.clone(),
                        kubeconfig.clone(),
                    ],
                    json!([tenant_mount, config_mount, socket_mount]),
                ),
                sidecar("csi-provisioner", CSI_PROVISIONER_IMAGE),
                sidecar("csi-attacher", CSI_ATTACHER_IMAGE),
                sidecar("csi-resizer", CSI_RESIZER_IMAGE),
            ]
        }
        ProxmoxController::Ccm => vec![container(
            "proxmox-cloud-controller-manager",
            CCM_IMAGE,
            vec![
                "--v=2".into(),
                "--cloud-provider=proxmox".into(),
                cloud_config,
                kubeconfig.clone(),
                format!("--authentication-kubeconfig={KUBECONFIG_DIR}/{KUBECONFIG_KEY}"),
                format!("--authorization-kubeconfig={KUBECONFIG_DIR}/{KUBECONFIG_KEY}"),
                "--controllers=cloud-node,cloud-node-lifecycle".into(),
                "--leader-elect=true".into(),
                "--use-service-account-credentials=false".into(),
                "--secure-port=10258".into(),
            ],
            json!([tenant_mount, config_mount]),
        )],
    };
    let labels = json!({ KUBERNETES_LABEL: name, "app.kubernetes.io/name": object_name });
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": object_name, "labels": labels },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    // The tenant's API is all these talk to, with the
                    // mounted kubeconfig: no token of the management cluster.
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "containers": containers,
                    "volumes": volumes(name, controller),
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenantry_api::tenant::{KubernetesSpec, ProxmoxSettings, Substrate};

    fn proxmox_cluster() -> Kubernetes {
        let mut k = Kubernetes::new("demo", KubernetesSpec::default());
        k.metadata.namespace = Some("tenant-a".into());
        k.spec.substrate = Substrate::Proxmox;
        k.spec.proxmox = Some(ProxmoxSettings {
            credentials_secret_name: Some("pve".into()),
            ..Default::default()
        });
        k
    }

    #[test]
    fn the_config_names_the_api_and_stays_out_of_the_deployment() {
        let k = proxmox_cluster();
        let config = cloud_config(
            &k,
            "https://pve.example:8006",
            "capi@pve!t",
            "s3cr3t-token",
            None,
        );
        assert!(config.contains("url: https://pve.example:8006/api2/json"));
        assert!(config.contains("region: kubernetes-demo"));
        for controller in [ProxmoxController::Csi, ProxmoxController::Ccm] {
            let d = deployment(&k, controller);
            assert!(!d.to_string().contains("s3cr3t-token"));
            assert_eq!(
                d["spec"]["template"]["spec"]["automountServiceAccountToken"],
                false
            );
            assert_eq!(controller.credentials_secret(&k), "pve");
        }
    }

    #[test]
    fn the_csi_driver_is_on_unless_disabled() {
        let mut k = proxmox_cluster();
        assert!(csi_settings(&k).is_some());
        k.spec.proxmox.as_mut().unwrap().csi = Some(ProxmoxCsi {
            enabled: false,
            ..Default::default()
        });
        assert!(csi_settings(&k).is_none());
    }
}
