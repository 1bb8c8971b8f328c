//! The KubevirtMachine reconciler: observe (owner Machine, Cluster,
//! bootstrap data, VM, VMI, DataVolumes) → decide (pure, `decide.rs`) → act
//! (`act.rs`) → report (status and events).

pub mod act;
pub mod cache;
pub mod cloud_config;
pub mod controller;
pub mod decide;
mod reconcile;

pub use controller::run;
