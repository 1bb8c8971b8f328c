//! The tenant companion for `Kubernetes` objects (`apps.tenantry.dev`): a
//! tenant cluster's control plane on Kamaji, backed by the namespace's
//! etcd.
//!
//! - `admission`: the rules the CRD's schema and CEL cannot express, pure
//!   functions the validating and mutating webhooks call;
//! - `render`: the objects a `Kubernetes` becomes, as pure functions;
//! - `pki`: the etcd and Talos certificates and tokens tenantry issues;
//! - `talos`: the Talos machine config the workers of a pool join with;
//! - `reconcile` and `controller`: applying them, reporting status, and
//!   deleting in the safe order (worker pools first);
//! - `pool`, `pool_reconcile` and `pool_controller`: the same for
//!   `KubernetesNodes` worker pools, with `access` reaching the tenant
//!   cluster;
//! - `storage`: the StorageClasses a tenant cluster offers;
//! - `proxmox_controllers`: the Proxmox CSI controller and CCM of a tenant,
//!   run in the management namespace so their tokens never reach it.

pub mod access;
pub mod admission;
pub mod controller;
pub mod nodes_admission;
pub mod pki;
pub mod pool;
pub mod pool_controller;
pub mod pool_reconcile;
pub mod proxmox_controllers;
pub mod reconcile;
pub mod render;
pub mod storage;
pub mod talos;

pub use controller::run;
