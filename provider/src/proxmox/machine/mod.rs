//! The ProxmoxMachine reconciler: observe (owner Machine, Cluster,
//! ProxmoxCluster, bootstrap data, IP claims, the PVE task in flight, the
//! VM) → decide (pure, `decide.rs`) → act (`act.rs`) → report (status,
//! conditions, events). `reconcile.rs` runs one step per reconcile.

pub mod act;
pub mod cache;
pub mod controller;
pub mod decide;
mod reconcile;

pub use controller::run;
