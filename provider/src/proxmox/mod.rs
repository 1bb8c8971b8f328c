//! The Proxmox VE substrate: the PVE API client, the NoCloud seed and the
//! node scheduler; the reconcilers follow.

pub mod client;
pub mod nocloud;
pub mod scheduler;
