//! The tenantry manager's library: the substrate reconcilers (KubeVirt,
//! Proxmox VE), the Cluster API contract helpers they share, reboot-first
//! remediation, admission webhooks and the tenant companion (today its
//! admission rules).
//! See `docs/architecture.md`.

pub mod capi;
pub mod cli;
pub mod components;
pub mod health;
pub mod https;
pub mod kubevirt;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod proxmox;
pub mod reconciler;
pub mod remediation;
pub mod telemetry;
pub mod tenant;
pub mod webhook;
