//! The ProxmoxMachine reconciler, in the shape every reconciler here has:
//! `observe/` reads (owner Machine, Cluster, ProxmoxCluster, bootstrap
//! data, IP claims, the PVE task in flight, the VM, its seed and guest),
//! `decide/` chooses from plain data (pure, table-tested), `act/` writes,
//! `status.rs` names every reason the machine reports, and `reconcile.rs`
//! runs the loop and reports.

pub mod act;
pub mod cache;
pub mod controller;
pub mod decide;
pub mod observe;
mod reconcile;
pub mod status;

pub use controller::run;
