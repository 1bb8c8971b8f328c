//! The demo workload cluster the sandbox creates: a Kamaji control plane,
//! a KubevirtCluster, and a MachineDeployment of Talos workers booting from
//! the image factory, as the platform renders a tenant cluster.

use serde_json::{Value, json};

/// What the demo cluster looks like.
#[derive(Clone, Debug)]
pub struct DemoCluster {
    pub namespace: String,
    pub name: String,
    pub kubernetes_version: String,
    pub talos_version: String,
    pub schematic: String,
    /// Base URL of the Talos image factory (or a mirror).
    pub image_factory_url: String,
    pub workers: u32,
}

impl DemoCluster {
    /// The MachineDeployment of the workers.
    pub fn deployment(&self) -> String {
        format!("{}-md-0", self.name)
    }

    /// The Secret holding the workers' Talos config.
    pub fn bootstrap_secret(&self) -> String {
        format!("{}-talos-worker", self.name)
    }

    /// Cluster, KamajiControlPlane and KubevirtCluster.
    pub fn cluster_documents(&self) -> Vec<Value> {
        let name = &self.name;
        vec![
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "KubevirtCluster",
                "metadata": { "name": name, "namespace": self.namespace },
                "spec": {},
            }),
            json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2",
                "kind": "KamajiControlPlane",
                "metadata": { "name": name, "namespace": self.namespace },
                "spec": { "version": self.kubernetes_version, "replicas": 2, "dataStoreName": "default" },
            }),
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Cluster",
                "metadata": { "name": name, "namespace": self.namespace },
                "spec": {
                    "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] }, "services": { "cidrBlocks": ["10.95.0.0/16"] } },
                    "controlPlaneRef": { "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KamajiControlPlane", "name": name },
                    "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": name }
                }
            }),
        ]
    }

    /// The workers' Talos config Secret, their KubevirtMachineTemplate and
    /// the MachineDeployment, for a control plane answering at `endpoint`.
    pub fn worker_documents(&self, endpoint: &str) -> Vec<Value> {
        let template = format!(
            "{}-workers-{}",
            self.name,
            self.talos_version.replace('.', "-")
        );
        let labels = json!({
            "cluster.x-k8s.io/cluster-name": self.name,
            "cluster.x-k8s.io/deployment-name": self.deployment(),
        });
        vec![
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": self.bootstrap_secret(), "namespace": self.namespace },
                "stringData": {
                    "value": talos_worker_config(endpoint, &self.name, &self.kubernetes_version),
                    "format": "cloud-config",
                },
            }),
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "KubevirtMachineTemplate",
                "metadata": { "name": template, "namespace": self.namespace },
                "spec": { "template": { "spec": {
                    "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
                    "bootDisk": {
                        "imageFactoryURL": self.image_factory_url.trim_end_matches('/'),
                        "schematicID": self.schematic,
                        "talosVersion": self.talos_version,
                        "diskSize": "20Gi",
                        "storageClass": "replicated",
                    },
                    "virtualMachineTemplate": { "spec": {
                        "runStrategy": "Always",
                        "template": { "spec": {
                            "domain": {
                                "cpu": { "cores": 2 },
                                "memory": { "guest": "4Gi" },
                                "devices": { "interfaces": [{ "name": "default", "bridge": {} }] },
                            },
                            "networks": [{ "name": "default", "pod": {} }],
                        }},
                    }},
                }}},
            }),
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "MachineDeployment",
                "metadata": { "name": self.deployment(), "namespace": self.namespace },
                "spec": {
                    "clusterName": self.name,
                    "replicas": self.workers,
                    "selector": { "matchLabels": labels },
                    "template": {
                        "metadata": { "labels": labels },
                        "spec": {
                            "clusterName": self.name,
                            "version": self.kubernetes_version,
                            "bootstrap": { "dataSecretName": self.bootstrap_secret() },
                            "infrastructureRef": {
                                "apiGroup": "infrastructure.cluster.x-k8s.io",
                                "kind": "KubevirtMachineTemplate",
                                "name": template,
                            },
                        },
                    },
                },
            }),
        ]
    }
}

/// A Talos worker machine config naming the control plane `endpoint`, as
/// CABPT renders one, trimmed to what a kubelet reads.
pub fn talos_worker_config(endpoint: &str, cluster: &str, kubernetes_version: &str) -> String {
    format!(
        "version: v1alpha1\ndebug: false\npersist: true\nmachine:\n  type: worker\n  token: demo-token\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:{kubernetes_version}\ncluster:\n  controlPlane:\n    endpoint: {endpoint}\n  clusterName: {cluster}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tenant::TalosJoin;

    #[test]
    fn workers_join_the_given_endpoint() {
        let config = talos_worker_config("https://127.0.0.1:6443", "demo", "v1.35.0");
        let join = TalosJoin::parse(&config).expect("a Talos config");
        assert_eq!(join.endpoint, "https://127.0.0.1:6443");
        assert_eq!(join.kubelet_version.as_deref(), Some("v1.35.0"));
    }
}
