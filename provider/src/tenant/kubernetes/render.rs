//! What a `Kubernetes` object becomes: the objects the companion
//! server-side applies, rendered as pure functions of the spec (no I/O), so
//! they are unit-tested here and compared field by field in review.
//!
//! Names follow the platform chart the users know: for `Kubernetes` `<name>`
//! the CAPI Cluster, the KamajiControlPlane and the infrastructure cluster
//! are all `kubernetes-<name>`; the namespace's etcd is `etcd` with the
//! Kamaji DataStore named after the namespace.

use super::exposure::Exposure;
use serde_json::{Value, json};
use tenantry_api::tenant::{
    ComponentResources, ControlPlaneComponent, Kubernetes, OidcMode, ResourceAmounts, Substrate,
    cluster_name,
};

/// The namespace's etcd (one per tenant namespace, shared by its clusters).
pub const ETCD_NAME: &str = "etcd";
/// etcd release the EtcdCluster runs (etcd-operator needs X.Y.Z).
pub const ETCD_VERSION: &str = "3.6.11";
/// etcd data volume size.
pub const ETCD_STORAGE_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Secrets with the etcd PKI (cert-manager's kubernetes.io/tls layout).
pub const ETCD_CA_SECRET: &str = "etcd-ca-tls";
pub const ETCD_SERVER_SECRET: &str = "etcd-server-tls";
pub const ETCD_PEER_SECRET: &str = "etcd-peer-tls";
pub const ETCD_CLIENT_SECRET: &str = "etcd-client-tls";
/// Every Secret of the etcd PKI.
pub const ETCD_SECRETS: [&str; 4] = [
    ETCD_CA_SECRET,
    ETCD_SERVER_SECRET,
    ETCD_PEER_SECRET,
    ETCD_CLIENT_SECRET,
];

/// Pod and Service networks of every tenant cluster (the Talos machine
/// configs of the workers carry the same).
pub const POD_CIDR: &str = "10.243.0.0/16";
pub const SERVICE_CIDR: &str = "10.95.0.0/16";

/// The Proxmox credentials Secret when `proxmox.credentialsSecretName` is
/// not set.
pub const DEFAULT_PROXMOX_CREDENTIALS: &str = "proxmox-credentials";

/// Label on everything the companion creates, naming the `Kubernetes`
/// object it belongs to.
pub const KUBERNETES_LABEL: &str = "apps.tenantry.dev/kubernetes";
/// Label on the namespace's etcd objects, which belong to the namespace.
pub const ETCD_LABEL: &str = "apps.tenantry.dev/etcd";

/// Default image of the talos-csr-signer sidecar (Talos trustd for the
/// workers' apid certificates): the build Cozystack v1.6.0 pins, by digest.
pub const DEFAULT_TALOS_CSR_SIGNER_IMAGE: &str = "ghcr.io/cozystack/cozystack/talos-csr-signer:v1.6.0@sha256:85b41e16e5e40398b1272fe0a69de72e205532c8034d0e6a9fc4a1d510f17818";
/// Port of the Talos trustd the workers dial.
pub const TALOS_TRUSTD_PORT: i32 = 50001;
/// The konnectivity server's port.
pub const KONNECTIVITY_PORT: i32 = 8132;
/// Where the OIDC AuthenticationConfiguration is mounted.
const AUTHENTICATION_CONFIG_DIR: &str = "/etc/kubernetes/authentication-config";

/// The Secret holding the Talos machine token and cluster secrets.
pub fn talos_secrets_name(name: &str) -> String {
    format!("{}-talos-secrets", cluster_name(name))
}
/// The Secret holding the Talos CA (tls.crt, tls.key).
pub fn talos_ca_name(name: &str) -> String {
    format!("{}-talos-ca", cluster_name(name))
}
/// The Secret holding trustd's serving certificate.
pub fn talos_tls_cert_name(name: &str) -> String {
    format!("{}-talos-tls-cert", cluster_name(name))
}
/// The Secret holding the OIDC AuthenticationConfiguration rendered from
/// `oidc.customConfig.config`.
pub fn oidc_config_name(name: &str) -> String {
    format!("{}-oidc-authn-config", cluster_name(name))
}

/// The kube-apiserver's in-cluster DNS names (certificate SANs).
pub fn service_dns_names(name: &str, namespace: &str) -> Vec<String> {
    let cluster = cluster_name(name);
    vec![
        format!("{cluster}.{namespace}.svc"),
        format!("{cluster}.{namespace}.svc.cluster.local"),
    ]
}

fn labels(name: &str) -> Value {
    json!({ KUBERNETES_LABEL: name, "cluster.x-k8s.io/cluster-name": cluster_name(name) })
}

/// The EtcdCluster `etcd` (etcd-operator.cozystack.io/v1alpha2): three
/// members, TLS on both surfaces with the Secrets tenantry issues, quota 95%
/// of the volume, periodic compaction.
pub fn etcd_cluster(namespace: &str) -> Value {
    json!({
        "apiVersion": "etcd-operator.cozystack.io/v1alpha2",
        "kind": "EtcdCluster",
        "metadata": { "name": ETCD_NAME, "namespace": namespace, "labels": { ETCD_LABEL: "true" } },
        "spec": {
            "replicas": 3,
            "version": ETCD_VERSION,
            "storage": { "size": "4Gi" },
            "options": {
                "quotaBackendBytes": ETCD_STORAGE_BYTES * 95 / 100,
                "autoCompactionMode": "periodic",
                "autoCompactionRetention": "5m",
                "snapshotCount": 10000,
            },
            "tls": {
                "client": {
                    "serverSecretRef": { "name": ETCD_SERVER_SECRET },
                    "operatorClientSecretRef": { "name": ETCD_CLIENT_SECRET },
                },
                "peer": { "secretRef": { "name": ETCD_PEER_SECRET } },
            },
        },
    })
}

/// The Kamaji DataStore of the namespace's etcd (cluster-scoped, named
/// after the namespace): Kamaji signs each tenant's etcd client
/// certificate with the CA key, and dials etcd as `root`.
pub fn data_store(namespace: &str) -> Value {
    let secret = |name: &str, key: &str| json!({ "secretReference": { "name": name, "namespace": namespace, "keyPath": key } });
    json!({
        "apiVersion": "kamaji.clastix.io/v1alpha1",
        "kind": "DataStore",
        "metadata": { "name": namespace, "labels": { ETCD_LABEL: namespace } },
        "spec": {
            "driver": "etcd",
            "endpoints": [format!("{ETCD_NAME}.{namespace}.svc:2379")],
            "tlsConfig": {
                "certificateAuthority": {
                    "certificate": secret(ETCD_CA_SECRET, "tls.crt"),
                    "privateKey": secret(ETCD_CA_SECRET, "tls.key"),
                },
                "clientCertificate": {
                    "certificate": secret(ETCD_CLIENT_SECRET, "tls.crt"),
                    "privateKey": secret(ETCD_CLIENT_SECRET, "tls.key"),
                },
            },
        },
    })
}

/// The infrastructure cluster's kind for a substrate.
pub fn infrastructure_kind(substrate: Substrate) -> &'static str {
    match substrate {
        Substrate::Kubevirt => "KubevirtCluster",
        Substrate::Proxmox => "ProxmoxCluster",
    }
}

/// The CAPI Cluster `kubernetes-<name>`.
pub fn cluster(kubernetes: &Kubernetes) -> Value {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let cluster = cluster_name(name);
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": cluster, "labels": labels(name) },
        "spec": {
            "clusterNetwork": {
                "pods": { "cidrBlocks": [POD_CIDR] },
                "services": { "cidrBlocks": [SERVICE_CIDR] },
            },
            "controlPlaneRef": {
                "apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "KamajiControlPlane",
                "name": cluster,
            },
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": infrastructure_kind(kubernetes.spec.substrate),
                "name": cluster,
            },
        },
    })
}

/// The infrastructure cluster, its endpoint managed by the control plane
/// provider (Kamaji writes it).
pub fn infrastructure_cluster(kubernetes: &Kubernetes) -> Value {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let cluster = cluster_name(name);
    // The KubevirtCluster is Kamaji's (it writes the endpoint and marks it
    // ready), so CAPI's externally-managed annotation keeps infrastructure
    // providers off it. The ProxmoxCluster is tenantry's: it owns the
    // workers' address pool; `externalManagedControlPlane` leaves the
    // endpoint to Kamaji.
    let metadata = match kubernetes.spec.substrate {
        Substrate::Kubevirt => json!({
            "name": cluster,
            "labels": labels(name),
            "annotations": { "cluster.x-k8s.io/managed-by": "kamaji" },
        }),
        Substrate::Proxmox => json!({ "name": cluster, "labels": labels(name) }),
    };
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    match kubernetes.spec.substrate {
        Substrate::Kubevirt => json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtCluster",
            "metadata": metadata,
            "spec": {},
        }),
        Substrate::Proxmox => {
            let proxmox = kubernetes.spec.proxmox.clone().unwrap_or_default();
            let ipv4 = proxmox.ipv4_config.unwrap_or_default();
            let credentials = proxmox
                .credentials_secret_name
                .clone()
                .unwrap_or_else(|| DEFAULT_PROXMOX_CREDENTIALS.to_string());
            let mut spec = json!({
                // Kamaji writes the endpoint.
                "externalManagedControlPlane": true,
                "credentialsRef": { "name": credentials, "namespace": namespace },
                "ipv4Config": {
                    "addresses": ipv4.addresses,
                    "gateway": ipv4.gateway,
                    "prefix": ipv4.prefix,
                },
                "dnsServers": proxmox.dns_servers,
            });
            if !proxmox.allowed_nodes.is_empty() {
                spec["allowedNodes"] = json!(proxmox.allowed_nodes);
            }
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha2",
                "kind": "ProxmoxCluster",
                "metadata": metadata,
                "spec": spec,
            })
        }
    }
}

/// Millicores of a CPU quantity (`2`, `1.5`, `500m`); `None` for forms
/// Kubernetes allows but a preset never produces.
fn millicores(cpu: &str) -> Option<u64> {
    if let Some(milli) = cpu.strip_suffix('m') {
        return milli.parse().ok();
    }
    let value: f64 = cpu.parse().ok()?;
    (value >= 0.0).then(|| (value * 1000.0).round() as u64)
}

/// Limits as given; requests with the platform's allocation ratios (CPU
/// 10:1, memory 1:1), as the chart renders them.
fn container_resources(amounts: &ResourceAmounts) -> Value {
    let cpu_request = millicores(&amounts.cpu.0)
        .map(|m| format!("{}m", (m / 10).max(1)))
        .unwrap_or_else(|| amounts.cpu.0.clone());
    json!({
        "limits": { "cpu": amounts.cpu.0, "memory": amounts.memory.0 },
        "requests": { "cpu": cpu_request, "memory": amounts.memory.0 },
    })
}

fn component_resources(component: &ControlPlaneComponent) -> Value {
    container_resources(&ComponentResources::or_preset(
        component.resources.as_ref(),
        component.resources_preset,
    ))
}

/// Whether the cluster trusts an OIDC issuer.
fn oidc_on(kubernetes: &Kubernetes) -> bool {
    kubernetes.spec.oidc.mode != OidcMode::None
}

/// The Secret holding the AuthenticationConfiguration, if OIDC is on: the
/// user's own (`secretRef`), or the one tenantry writes.
pub fn oidc_secret(kubernetes: &Kubernetes) -> Option<String> {
    if !oidc_on(kubernetes) {
        return None;
    }
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    Some(
        kubernetes
            .spec
            .oidc
            .custom_config
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .and_then(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| oidc_config_name(name)),
    )
}

/// The KamajiControlPlane `kubernetes-<name>` (v1alpha2).
pub fn kamaji_control_plane(
    kubernetes: &Kubernetes,
    data_store: &str,
    exposure: &Exposure,
) -> Value {
    let name = kubernetes.metadata.name.as_deref().unwrap_or_default();
    let namespace = kubernetes.metadata.namespace.as_deref().unwrap_or_default();
    let cluster = cluster_name(name);
    let spec = &kubernetes.spec;
    let control_plane = &spec.control_plane;
    let api_server = &control_plane.api_server;

    let mut extra_args = api_server.extra_args.clone();
    let mut api_server_mounts: Vec<Value> = api_server
        .extra_volume_mounts
        .iter()
        .map(|m| serde_json::to_value(m).expect("VolumeMount serializes"))
        .collect();
    let mut volumes = vec![
        json!({ "name": "talos-ca", "secret": { "secretName": talos_ca_name(name) } }),
        json!({ "name": "talos-tls-cert", "secret": { "secretName": talos_tls_cert_name(name) } }),
    ];
    volumes.extend(
        api_server
            .extra_volumes
            .iter()
            .map(|v| serde_json::to_value(v).expect("Volume serializes")),
    );
    if let Some(secret) = oidc_secret(kubernetes) {
        extra_args.push(format!(
            "--authentication-config={AUTHENTICATION_CONFIG_DIR}/config.yaml"
        ));
        api_server_mounts.push(json!({
            "name": "authentication-config",
            "mountPath": AUTHENTICATION_CONFIG_DIR,
            "readOnly": true,
        }));
        volumes.push(json!({
            "name": "authentication-config",
            "secret": { "secretName": secret, "items": [{ "key": "config.yaml", "path": "config.yaml" }] },
        }));
    }
    let preferred_address_types = if control_plane.kubelet.preferred_address_types.is_empty() {
        vec!["InternalIP".to_string(), "ExternalIP".to_string()]
    } else {
        control_plane.kubelet.preferred_address_types.clone()
    };
    let csr_signer_image = spec
        .images
        .as_ref()
        .and_then(|i| i.talos_csr_signer.clone())
        .unwrap_or_else(|| DEFAULT_TALOS_CSR_SIGNER_IMAGE.to_string());
    let csr_signer = json!({
        "name": "talos-csr-signer",
        "image": csr_signer_image,
        "ports": [{ "name": "trustd", "containerPort": TALOS_TRUSTD_PORT, "protocol": "TCP" }],
        "env": [{
            "name": "TALOS_TOKEN",
            "valueFrom": { "secretKeyRef": { "name": talos_secrets_name(name), "key": "token" } },
        }],
        "volumeMounts": [
            { "name": "talos-ca", "mountPath": "/etc/talos/ca", "readOnly": true },
            { "name": "talos-tls-cert", "mountPath": "/etc/talos/tls", "readOnly": true },
        ],
        "resources": {
            "requests": { "cpu": "10m", "memory": "32Mi" },
            "limits": { "cpu": "200m", "memory": "128Mi" },
        },
        "securityContext": {
            "runAsNonRoot": true,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
        },
    });
    // The Service's names, then the external host and the ClusterIP once
    // known (Kamaji adds the ingress host too; listing it keeps the
    // certificate right under providers that do not).
    let mut cert_sans = service_dns_names(name, namespace);
    cert_sans.extend(exposure.extra_sans().map(str::to_string));
    let mut network = json!({
        "serviceType": "ClusterIP",
        "certSANs": cert_sans,
        "additionalServicePorts": [{
            "name": "talos-trustd", "port": TALOS_TRUSTD_PORT, "protocol": "TCP", "targetPort": TALOS_TRUSTD_PORT,
        }],
    });
    if let Some(ingress) = exposure.network_ingress() {
        network["ingress"] = ingress;
    }
    let mut kcp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2",
        "kind": "KamajiControlPlane",
        "metadata": {
            "name": cluster,
            "labels": labels(name).as_object().cloned().map(|mut l| {
                l.insert("cluster.x-k8s.io/role".into(), json!("control-plane"));
                Value::Object(l)
            }).unwrap_or_default(),
            // Management-side consumers read the in-cluster variant.
            "annotations": { "kamaji.clastix.io/kubeconfig-secret-key": "super-admin.svc" },
        },
        "spec": {
            "dataStoreName": data_store,
            "version": spec.version.pinned_patch(),
            "replicas": control_plane.replicas,
            "addons": {
                "konnectivity": {
                    "server": {
                        "port": KONNECTIVITY_PORT,
                        "resources": component_resources(&control_plane.konnectivity.server),
                    },
                },
            },
            // Always written, empty or not, so that a field the user
            // removed is removed from the control plane too.
            "apiServer": {
                "extraArgs": extra_args,
                "extraVolumeMounts": api_server_mounts,
                "resources": container_resources(&ComponentResources::or_preset(
                    api_server.resources.as_ref(),
                    api_server.resources_preset,
                )),
            },
            "controllerManager": { "resources": component_resources(&control_plane.controller_manager) },
            "scheduler": { "resources": component_resources(&control_plane.scheduler) },
            "kubelet": {
                "preferredAddressTypes": preferred_address_types,
                "cgroupfs": "systemd",
            },
            "network": network,
            "deployment": {
                "extraContainers": [csr_signer],
                "extraVolumes": volumes,
                "podAdditionalMetadata": { "labels": { "policy.cozystack.io/allow-to-etcd": "true" } },
            },
        },
    });
    if !api_server.admission_controllers.is_empty() {
        kcp["spec"]["admissionControllers"] = json!(api_server.admission_controllers);
    }
    kcp
}

#[cfg(test)]
mod tests;
