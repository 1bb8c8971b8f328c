//! The Talos Linux machine config (v1alpha1, `machine.type: worker`) the
//! workers of a `KubernetesNodes` pool boot with, rendered as a pure function
//! of the cluster, the pool and the cluster's trust material.
//!
//! It carries what the platform chart's worker config carries: the machine
//! token and Talos CA certificate trustd (the CSR signer next to Kamaji)
//! checks, the kubeadm-format bootstrap token and the tenant's Kubernetes CA
//! the kubelet TLS-bootstraps with, the kubelet's reservations and eviction
//! thresholds, the installer image and the registry mirrors. It never carries
//! a private key: both `ca.key` fields are empty.
//!
//! The output is hashed by the caller (a changed config rolls the pool), so it
//! is rendered from a `serde_json::Value`, whose object keys are kept in a
//! stable order, and serialized as YAML by serde_norway, which quotes what
//! needs quoting.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt as _;
use serde_json::{Map, Value, json};
use tenantry_api::tenant::{Kubernetes, ResourceAmounts, cluster_name};
use tenantry_api::tenant_nodes::{
    KubeletReservations, KubernetesNodes, default_reserved_memory_bytes, default_reserved_millicpu,
    quantity_milli_value,
};

use super::kubernetes::render::{POD_CIDR, SERVICE_CIDR, service_dns_names};

/// Port of the tenant kube-apiserver's Service in the management cluster.
const API_SERVER_PORT: u16 = 6443;
/// The workers' system disk: the first virtio disk on both substrates.
const INSTALL_DISK: &str = "/dev/vda";
/// Repository of the kubelet image Talos runs.
const KUBELET_IMAGE_REPOSITORY: &str = "ghcr.io/siderolabs/kubelet";
/// The label GPU workers carry (the platform chart's `gpu=on`).
const GPU_NODE_LABEL: (&str, &str) = ("gpu", "on");
const MEBIBYTE: u128 = 1 << 20;

/// The trust material a worker config carries (all from the management
/// namespace).
pub struct WorkerTrust<'a> {
    /// Talos machine token (trustd).
    pub machine_token: &'a str,
    /// Talos CA certificate (PEM); its key never goes into a worker config.
    pub talos_ca_pem: &'a str,
    /// Talos cluster ID.
    pub cluster_id: &'a str,
    /// Talos cluster secret.
    pub cluster_secret: &'a str,
    /// kubeadm-format bootstrap token, `<6 chars>.<16 chars>`.
    pub bootstrap_token: &'a str,
    /// The tenant's Kubernetes CA certificate (PEM, Kamaji's `<cluster>-ca`
    /// `tls.crt`).
    pub kubernetes_ca_pem: &'a str,
}

/// The control-plane endpoint workers join:
/// `https://kubernetes-<name>.<ns>.svc:6443`.
pub fn control_plane_endpoint(kubernetes: &Kubernetes) -> String {
    format!("https://{}:{API_SERVER_PORT}", service_host(kubernetes))
}

/// The complete worker machine config, YAML (one v1alpha1 document).
///
/// `service_ip` is the ClusterIP of the tenant control plane's Service in
/// the management cluster, when known: it becomes
/// `machine.network.extraHostEntries` for `kubernetes-<name>.<ns>.svc` and
/// `.svc.cluster.local`, so workers reach the apiserver by the name its
/// certificate carries without resolving management-cluster DNS.
pub fn worker_config(
    kubernetes: &Kubernetes,
    pool: &KubernetesNodes,
    trust: &WorkerTrust,
    service_ip: Option<&str>,
) -> String {
    let document = worker_document(kubernetes, pool, trust, service_ip);
    serde_norway::to_string(&document).expect("a JSON value always serializes as YAML")
}

/// The Talos minor (`v1.13`) of a Talos release (`v1.13.6`), for the
/// TalosConfigTemplate's `talosVersion`.
pub fn talos_minor(version: &str) -> String {
    // A pre-release (v1.13.0-alpha.1) has the same minor as its release.
    let mut parts = version.split(['.', '-']);
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => format!("{major}.{minor}"),
        _ => version.to_string(),
    }
}

/// `kubernetes-<name>.<ns>.svc`: the first of the apiserver's in-cluster
/// names, which its serving certificate carries.
fn service_host(kubernetes: &Kubernetes) -> String {
    let namespace = kubernetes.namespace().unwrap_or_default();
    service_dns_names(&kubernetes.name_any(), &namespace)
        .into_iter()
        .next()
        .expect("service_dns_names returns the .svc name first")
}

fn worker_document(
    kubernetes: &Kubernetes,
    pool: &KubernetesNodes,
    trust: &WorkerTrust,
    service_ip: Option<&str>,
) -> Value {
    let talos = &kubernetes.spec.talos;
    let kubernetes_patch = pool.spec.effective_version(&kubernetes.spec).pinned_patch();

    let mut machine = json!({
        "type": "worker",
        "token": trust.machine_token,
        "ca": { "crt": STANDARD.encode(trust.talos_ca_pem), "key": "" },
        "kubelet": {
            "image": format!("{KUBELET_IMAGE_REPOSITORY}:{kubernetes_patch}"),
            "extraConfig": kubelet_extra_config(&pool.spec.kubelet, pool.spec.worker_size()),
        },
        "install": {
            "disk": INSTALL_DISK,
            "image": format!(
                "{}/{}:{}",
                talos.installer_repository, talos.schematic_id, talos.version
            ),
            "wipe": false,
        },
        // KubePrism is a node-local load balancer over control-plane nodes;
        // a Kamaji control plane has none, workers go through its Service.
        "features": { "rbac": true, "kubePrism": { "enabled": false } },
    });
    if !pool.spec.gpus.is_empty() {
        machine["nodeLabels"] = json!({ GPU_NODE_LABEL.0: GPU_NODE_LABEL.1 });
    }
    if let Some(ip) = service_ip {
        let namespace = kubernetes.namespace().unwrap_or_default();
        machine["network"] = json!({
            "extraHostEntries": [{
                "ip": ip,
                "aliases": service_dns_names(&kubernetes.name_any(), &namespace),
            }],
        });
    }
    if !talos.registry_mirrors.is_empty() {
        let mirrors: Map<String, Value> = talos
            .registry_mirrors
            .iter()
            .map(|(host, mirror)| {
                let mut entry = json!({ "endpoints": mirror.endpoints });
                if let Some(override_path) = mirror.override_path {
                    entry["overridePath"] = json!(override_path);
                }
                if let Some(skip_fallback) = mirror.skip_fallback {
                    entry["skipFallback"] = json!(skip_fallback);
                }
                (host.clone(), entry)
            })
            .collect();
        machine["registries"] = json!({ "mirrors": mirrors });
    }

    json!({
        "version": "v1alpha1",
        "debug": false,
        "persist": true,
        "machine": machine,
        "cluster": {
            "id": trust.cluster_id,
            "secret": trust.cluster_secret,
            "controlPlane": { "endpoint": control_plane_endpoint(kubernetes) },
            "clusterName": cluster_name(&kubernetes.name_any()),
            "network": {
                "dnsDomain": "cluster.local",
                "podSubnets": [POD_CIDR],
                "serviceSubnets": [SERVICE_CIDR],
            },
            "token": trust.bootstrap_token,
            "ca": { "crt": STANDARD.encode(trust.kubernetes_ca_pem), "key": "" },
            // Workers find the apiserver through its Service, not through
            // peers: neither discovery registry is needed or reachable.
            "discovery": {
                "enabled": true,
                "registries": {
                    "kubernetes": { "disabled": true },
                    "service": { "disabled": true },
                },
            },
        },
    })
}

/// The kubelet configuration Talos merges into its own: reservations and
/// eviction thresholds, as the platform chart sets them.
fn kubelet_extra_config(kubelet: &KubeletReservations, size: Option<ResourceAmounts>) -> Value {
    let (default_cpu, default_memory) = default_reservations(size.as_ref());
    json!({
        "systemReserved": {
            "cpu": reserved(kubelet.system_reserved_cpu.as_ref(), &default_cpu),
            "memory": reserved(kubelet.system_reserved_memory.as_ref(), &default_memory),
        },
        "kubeReserved": {
            "cpu": reserved(kubelet.kube_reserved_cpu.as_ref(), &default_cpu),
            "memory": reserved(kubelet.kube_reserved_memory.as_ref(), &default_memory),
        },
        "evictionHard": {
            "memory.available": kubelet.eviction_hard_memory,
            "nodefs.available": "10%",
            "imagefs.available": "15%",
            "nodefs.inodesFree": "5%",
        },
        "evictionSoft": {
            "memory.available": kubelet.eviction_soft_memory,
            "nodefs.available": "15%",
            "imagefs.available": "20%",
        },
        "evictionSoftGracePeriod": {
            "memory.available": "1m30s",
            "nodefs.available": "1m30s",
            "imagefs.available": "1m30s",
        },
        "evictionMinimumReclaim": { "memory.available": "256Mi" },
    })
}

/// A reservation as written in the pool, else the computed default.
fn reserved(set: Option<&Quantity>, default: &str) -> String {
    set.map_or_else(|| default.to_string(), |quantity| quantity.0.clone())
}

/// The reservation an unset field gets, `(cpu, memory)`, computed by the api
/// crate from the workers' size. Each of systemReserved and kubeReserved gets
/// the whole amount (the api crate's "for the system and again for the
/// kubelet"), as the admission webhook assumes when it checks that pods keep
/// room. Memory is rounded down to whole MiB, so it never exceeds what the
/// webhook checked. A size that is unknown or does not parse (the webhook
/// refuses both) gets the smallest defaults.
fn default_reservations(size: Option<&ResourceAmounts>) -> (String, String) {
    let milli = |text: &str| {
        quantity_milli_value(text)
            .and_then(|value| u128::try_from(value).ok())
            .unwrap_or(0)
    };
    let (worker_millicpu, worker_memory_bytes) = size.map_or((0, 0), |size| {
        (milli(&size.cpu.0), milli(&size.memory.0) / 1_000)
    });
    let cpu = default_reserved_millicpu(worker_millicpu);
    let memory = default_reserved_memory_bytes(worker_memory_bytes) / MEBIBYTE;
    (format!("{cpu}m"), format!("{memory}Mi"))
}

#[cfg(test)]
mod schema_check;
#[cfg(test)]
mod tests;
