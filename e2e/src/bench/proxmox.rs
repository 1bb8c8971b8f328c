//! One Proxmox VE run: tenantry or capmox provisions and deletes a wave of
//! ProxmoxMachines against the PVE simulator.

use super::{BenchConfig, Provider, RunResult};

/// Provisions and deletes `machines` ProxmoxMachines with `provider`.
pub async fn run(
    _config: &BenchConfig,
    provider: Provider,
    _with_capi: bool,
    _machines: usize,
) -> anyhow::Result<RunResult> {
    anyhow::bail!(
        "the Proxmox benchmark is not written yet ({})",
        provider.name()
    )
}
