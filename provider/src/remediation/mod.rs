//! Reboot-first external remediation (CAPI's MachineHealthCheck
//! `spec.remediation.templateRef`): KubevirtRemediation and
//! ProxmoxRemediation restart an unhealthy Machine's VM in place, keeping
//! its disks, and delete the Machine for replacement when restarts do not
//! help. Observe (`observe.rs`) → decide (pure, `decide.rs`) → act
//! (`act.rs`) → report (`reconcile.rs`, reasons in `status.rs`), one step
//! per reconcile. See `docs/remediation.md`.

pub mod act;
pub mod controller;
pub mod decide;
mod observe;
mod reconcile;
pub mod status;

pub use controller::{run_kubevirt, run_proxmox};
