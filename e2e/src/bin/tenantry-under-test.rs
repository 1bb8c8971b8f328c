//! `tenantry-under-test`: the real `tenantry` command line, built as a
//! binary of this crate so that tests which kill and restart the manager
//! (`tests/chaos.rs`) find it through `CARGO_BIN_EXE_tenantry-under-test`,
//! built with the same profile as the test.

fn main() -> anyhow::Result<()> {
    tenantry_provider::cli::main()
}
