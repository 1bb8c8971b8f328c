//! Types of third-party kinds, generated with kopium by `hack/gen-types.sh`
//! from the upstream CRDs. Do not edit: regenerate.

#![allow(clippy::all, missing_docs, rustdoc::all)]

/// KubeVirt (`kubevirt.io/v1`).
pub mod kubevirt {
    pub mod virtual_machine;
    pub mod virtual_machine_instance;
}

/// Containerized Data Importer (`cdi.kubevirt.io/v1beta1`).
pub mod cdi {
    pub mod data_volume;
}

/// Cluster API core and IPAM contract kinds (`cluster.x-k8s.io/v1beta2`,
/// `ipam.cluster.x-k8s.io/v1beta2`).
pub mod capi {
    pub mod cluster;
    pub mod ip_address;
    pub mod ip_address_claim;
    pub mod machine;
    pub mod machine_deployment;
    pub mod machine_health_check;
    pub mod machine_set;
}

/// The in-cluster IPAM provider (`ipam.cluster.x-k8s.io/v1alpha2`).
pub mod ipam {
    pub mod in_cluster_ip_pool;
}

/// Kamaji (`kamaji.clastix.io/v1alpha1`) and its Cluster API control-plane
/// provider (`controlplane.cluster.x-k8s.io/v1alpha2`).
pub mod kamaji {
    pub mod data_store;
    pub mod kamaji_control_plane;
}

/// Cozystack's etcd-operator (`etcd-operator.cozystack.io/v1alpha2`).
pub mod etcd_operator {
    pub mod etcd_cluster;
}
