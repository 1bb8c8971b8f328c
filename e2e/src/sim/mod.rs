//! Simulators for what cannot run on a test machine. Each one documents which
//! upstream behaviour it copies, what it leaves out, and how to inject faults.

pub mod ingress;
pub mod kubevirt;
pub mod proxmox;
pub mod tenant;
