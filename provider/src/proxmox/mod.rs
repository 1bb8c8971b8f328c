//! The Proxmox VE substrate: the PVE API client, the ProxmoxCluster and
//! ProxmoxMachine reconcilers, the NoCloud seed, the node scheduler and
//! the ProxmoxMachineTemplate status.

pub mod client;
pub mod cluster;
pub mod credentials;
pub mod machine;
pub mod nocloud;
pub mod scheduler;
pub mod template;
