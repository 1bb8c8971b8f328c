//! `tenantry`: the manager binary.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tenantry_provider::telemetry::{self, LogFormat};

/// Cluster API infrastructure provider for KubeVirt and Proxmox VE, and the
/// tenant companion controller for Kamaji control planes.
#[derive(Parser, Debug)]
#[command(name = "tenantry", version, about)]
struct Args {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "TENANTRY_LOG_FORMAT", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print tenantry's CustomResourceDefinitions as YAML, or write one file
    /// per CRD into a folder.
    Crds {
        /// Folder to write `<group>_<plural>.yaml` files into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);
    match args.command {
        Command::Crds { out } => write_crds(out),
    }
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    for crd in tenantry_api::crds::all() {
        let yaml = serde_norway::to_string(&crd)?;
        match &out {
            None => print!("---\n{yaml}"),
            Some(dir) => {
                let name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
                let path = dir.join(name);
                std::fs::create_dir_all(dir)?;
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}
