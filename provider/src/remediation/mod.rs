//! Reboot-first external remediation (CAPI's MachineHealthCheck
//! `spec.remediation.templateRef`): KubevirtRemediation and
//! ProxmoxRemediation restart an unhealthy Machine's VM in place, keeping
//! its disks, and delete the Machine for replacement when restarts do not
//! help. observe → decide (pure, `decide.rs`) → act (`act.rs`) → report,
//! one step per reconcile (`reconcile.rs`). See `docs/remediation.md`.

pub mod act;
pub mod controller;
pub mod decide;
mod reconcile;

pub use controller::{run_kubevirt, run_proxmox};
