//! Talos's own verdict on a machine config: the harness pipes a config
//! through `talos-config validate` (`hack/upstream/talos-config`, a small
//! main over `github.com/siderolabs/talos/pkg/machinery` at the pinned Talos
//! version), which loads and validates it as a booting Talos node does.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};

use anyhow::Context as _;
use tokio::io::AsyncWriteExt;

use crate::upstream::{Binary, Upstream};

/// The runtime mode a Talos node validates its config in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TalosMode {
    /// Booted from a prepared disk image (the `openstack` and `nocloud`
    /// images tenantry's workers run): nothing to install.
    Cloud,
    /// Installed to disk first (`machine.install` must name one).
    Metal,
}

impl TalosMode {
    fn flag(self) -> &'static str {
        match self {
            TalosMode::Cloud => "cloud",
            TalosMode::Metal => "metal",
        }
    }
}

/// Loads and validates `config` with Talos's machinery: `Ok(())` if a Talos
/// node would accept it, `Err` with Talos's message if it would refuse it.
/// Verdicts are remembered per config, so polling callers run the
/// validator once per distinct config.
pub async fn validate(config: &str, mode: TalosMode) -> anyhow::Result<Result<(), String>> {
    let key = {
        let mut hasher = DefaultHasher::new();
        (config, mode).hash(&mut hasher);
        hasher.finish()
    };
    if let Some(verdict) = verdicts().lock().expect("verdicts").get(&key) {
        return Ok(verdict.clone());
    }
    let binary = Upstream::locate()?.binary(Binary::TalosConfig)?;
    let mut child = tokio::process::Command::new(&binary)
        .args(["validate", "--mode", mode.flag()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("run {}", binary.display()))?;
    let mut stdin = child.stdin.take().context("talos-config stdin")?;
    stdin
        .write_all(config.as_bytes())
        .await
        .context("write the config to talos-config")?;
    drop(stdin);
    let output = child
        .wait_with_output()
        .await
        .context("wait for talos-config")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let verdict = match output.status.code() {
        Some(0) => Ok(()),
        Some(1) => Err(stderr
            .lines()
            .filter(|l| !l.starts_with("warning: "))
            .collect::<Vec<_>>()
            .join("\n")),
        _ => anyhow::bail!("talos-config failed ({}): {stderr}", output.status),
    };
    verdicts()
        .lock()
        .expect("verdicts")
        .insert(key, verdict.clone());
    Ok(verdict)
}

/// The pinned Talos machinery version, as the validator reports it.
pub async fn version() -> anyhow::Result<String> {
    let binary = Upstream::locate()?.binary(Binary::TalosConfig)?;
    let output = tokio::process::Command::new(&binary)
        .arg("--version")
        .output()
        .await
        .with_context(|| format!("run {}", binary.display()))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn verdicts() -> &'static Mutex<HashMap<u64, Result<(), String>>> {
    static VERDICTS: OnceLock<Mutex<HashMap<u64, Result<(), String>>>> = OnceLock::new();
    VERDICTS.get_or_init(Mutex::default)
}
