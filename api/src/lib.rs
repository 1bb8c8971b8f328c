//! Tenantry's API types.
//!
//! This crate holds types and nothing that does I/O: tenantry's own custom
//! resources (`infrastructure.cluster.x-k8s.io` substrate kinds and the
//! `apps.tenantry.dev` tenant kinds) and the third-party kinds tenantry
//! reads and writes (Cluster API, KubeVirt, CDI, IPAM, Kamaji, etcd-operator), generated with kopium
//! from the upstream CRDs and committed (`hack/gen-types.sh`).

pub mod contract;
pub mod crds;
pub mod generated;
pub mod image_reference;
pub mod kubevirt;
pub mod proxmox;
pub mod remediation;
pub mod tenant;
pub mod tenant_nodes;
