//! The tenant companion, one folder per kind it reconciles, with what both
//! share beside them:
//!
//! - `kubernetes`: `Kubernetes` objects (`apps.tenantry.dev`), a tenant
//!   cluster's control plane on Kamaji backed by the namespace's etcd:
//!   `admission` (the rules the CRD's schema and CEL cannot express, pure
//!   functions the webhooks call), `render` (the objects a `Kubernetes`
//!   becomes, pure), `reconcile` and `controller` (applying them, status,
//!   deleting in the safe order, worker pools first), `storage` (the
//!   StorageClasses a tenant cluster offers) and `proxmox_controllers` (the
//!   Proxmox CSI controller and CCM of a tenant, run in the management
//!   namespace so their tokens never reach it);
//! - `kubernetes_nodes`: `KubernetesNodes` worker pools, in the same shape
//!   (`admission`, `render`, `reconcile`, `controller`);
//! - shared: `pki` (the etcd and Talos certificates and tokens tenantry
//!   issues), `talos` (the machine config a pool's workers join with) and
//!   `access` (reaching a tenant cluster), `served` (the Cluster API and
//!   Kamaji API versions objects are written in).

pub mod access;
pub mod kubernetes;
pub mod kubernetes_nodes;
pub mod pki;
pub mod reasons;
pub mod served;
pub mod talos;

pub use kubernetes::controller::run;
