//! The tenantry manager's library: the substrate reconcilers (KubeVirt,
//! Proxmox VE), the Cluster API contract helpers they share, and (later)
//! remediation, the tenant companion controller and admission webhooks.
//! See `docs/architecture.md`.

pub mod capi;
pub mod kubevirt;
pub mod manager;
pub mod proxmox;
pub mod runtime;
pub mod telemetry;
pub mod webhook;
