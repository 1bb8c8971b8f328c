//! Tenantry's API types.
//!
//! This crate holds types and nothing that does I/O: tenantry's own custom
//! resources (`infrastructure.cluster.x-k8s.io` substrate kinds and the
//! `apps.tenantry.dev` tenant kinds) and the third-party kinds tenantry reads
//! and writes (Cluster API, KubeVirt, CDI, Kamaji, etcd-operator, IPAM),
//! generated with kopium from the upstream CRDs and committed.
//!
//! The kinds arrive with the substrate and tenant issues; the foundation only
//! fixes where they live.

/// The Cluster API contract labels every infrastructure CRD carries, so that
/// CAPI core knows which of our API versions answers which contract version.
pub mod contract {
    /// Label key for the v1beta2 contract.
    pub const CONTRACT_V1BETA2_LABEL: &str = "cluster.x-k8s.io/v1beta2";
    /// Label key for the v1beta1 contract.
    pub const CONTRACT_V1BETA1_LABEL: &str = "cluster.x-k8s.io/v1beta1";
}
