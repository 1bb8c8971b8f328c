//! The ProxmoxCluster reconciler: the machines' InClusterIPPools (capmox's
//! names, owned by the ProxmoxCluster), the credentials (read from the
//! cluster's own namespace and held by a finalizer while the cluster
//! exists), a preflight of the token's privileges against what the
//! cluster's machines will need, where the machines run, and the v1beta2
//! contract status. Deletion waits for the cluster's ProxmoxMachines.

pub mod controller;
pub mod decide;
mod reconcile;

pub use controller::run;
