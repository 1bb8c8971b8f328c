//! The Proxmox VE substrate: the PVE API client, and (later) the
//! ProxmoxCluster and ProxmoxMachine reconcilers.

pub mod client;
