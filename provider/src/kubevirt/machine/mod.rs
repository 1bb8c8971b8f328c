//! The KubevirtMachine reconciler, in the shape every reconciler here has:
//! `observe.rs` reads (owner Machine, Cluster, bootstrap data, the
//! infrastructure cluster, VM, VMI, DataVolumes, the guest's sentinel),
//! `decide/` chooses from plain data (pure, table-tested), `act.rs` writes,
//! `status.rs` names every reason the machine reports, and `reconcile.rs`
//! runs the pass and reports.

pub mod act;
pub mod cache;
pub mod cloud_config;
pub mod controller;
pub mod decide;
mod observe;
mod reconcile;
pub mod status;

pub use controller::run;
