//! The demo tenant cluster the sandbox creates, as a platform user would:
//! a `Kubernetes` object (its Kamaji control plane and etcd) and a
//! `KubernetesNodes` pool of Talos workers on KubeVirt, booting from the
//! image factory.

use serde_json::{Value, json};

/// What the demo cluster looks like.
#[derive(Clone, Debug)]
pub struct DemoCluster {
    pub namespace: String,
    pub name: String,
    /// The Kubernetes minor, e.g. `v1.35`.
    pub kubernetes_version: String,
    pub talos_version: String,
    pub schematic: String,
    /// Base URL of the Talos image factory (or a mirror).
    pub image_factory_url: String,
    pub workers: u32,
}

impl DemoCluster {
    /// The worker pool object, `<name>-md0`.
    pub fn pool(&self) -> String {
        format!("{}-md0", self.name)
    }

    /// The CAPI Cluster (and KamajiControlPlane) the companion creates.
    pub fn capi_cluster(&self) -> String {
        format!("kubernetes-{}", self.name)
    }

    /// The pool's MachineDeployment.
    pub fn deployment(&self) -> String {
        format!("kubernetes-{}-md0", self.name)
    }

    /// The Secret with the tenant's admin kubeconfigs (Kamaji's).
    pub fn admin_kubeconfig_secret(&self) -> String {
        format!("kubernetes-{}-admin-kubeconfig", self.name)
    }

    /// The `Kubernetes` object.
    pub fn kubernetes(&self) -> Value {
        json!({
            "apiVersion": "apps.tenantry.dev/v1alpha1",
            "kind": "Kubernetes",
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": {
                "version": self.kubernetes_version,
                "talos": {
                    "version": self.talos_version,
                    "schematicID": self.schematic,
                    "imageFactoryURL": self.image_factory_url.trim_end_matches('/'),
                },
            },
        })
    }

    /// The `KubernetesNodes` pool: `workers` u1.medium workers at least,
    /// up to 10 (or `workers`, if more).
    pub fn nodes(&self) -> Value {
        json!({
            "apiVersion": "apps.tenantry.dev/v1alpha1",
            "kind": "KubernetesNodes",
            "metadata": { "name": self.pool(), "namespace": self.namespace },
            "spec": {
                "cluster": self.name,
                "minReplicas": self.workers,
                "maxReplicas": self.workers.max(10),
            },
        })
    }
}
