//! The tenantry manager's library: the substrate reconcilers (KubeVirt,
//! Proxmox VE), remediation, the tenant companion controller and admission
//! webhooks. Each concept lives in its own module; see `docs/architecture.md`.

pub mod proxmox;
pub mod telemetry;
