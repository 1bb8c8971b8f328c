//! The ProxmoxCluster reconciler: the machines' InClusterIPPools (capmox's
//! names, owned by the ProxmoxCluster), the credentials (read from the
//! cluster's own namespace and held by a finalizer while the cluster
//! exists), a preflight of the token's privileges against what the
//! cluster's machines will need, where the machines run, and the v1beta2
//! contract status. Deletion waits for the cluster's ProxmoxMachines.
//! Reads in `observe.rs`, pure rules in `decide/`, writes in `act.rs`,
//! the status in `status.rs`, the pass in `reconcile.rs`.

mod act;
pub mod controller;
pub mod decide;
mod observe;
mod reconcile;
mod status;

pub use controller::run;
