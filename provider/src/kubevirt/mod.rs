//! The KubeVirt substrate: KubevirtCluster and KubevirtMachine reconcilers
//! and the pure rendering of their VirtualMachines.

pub mod cluster;
pub mod infra;
pub mod machine;
pub mod reasons;
pub mod render;
pub mod ssh;
pub mod template;
