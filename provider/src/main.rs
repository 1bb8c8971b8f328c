//! `tenantry`: the manager binary (the command line is `tenantry_provider::cli`).

fn main() -> anyhow::Result<()> {
    tenantry_provider::cli::main()
}
