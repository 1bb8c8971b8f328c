//! `config/release/` holds exactly what `tenantry components` renders;
//! regenerate with `cargo run -p tenantry-provider -- components --out config/release`.

use std::path::Path;

use tenantry_provider::components;

const REGENERATE: &str = "cargo run -p tenantry-provider -- components --out config/release";

#[test]
fn committed_release_artifacts_match_the_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/release");
    for (name, generated) in [
        (
            "infrastructure-components.yaml",
            components::infrastructure_components_yaml(),
        ),
        ("metadata.yaml", components::metadata_yaml()),
    ] {
        let committed = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("config/release/{name} missing ({e}); run: {REGENERATE}"));
        assert!(
            committed == generated,
            "config/release/{name} is stale; run: {REGENERATE}"
        );
    }
}
