//! `config/crd/bases` holds exactly what the Rust types generate; regenerate
//! with `cargo run -p tenantry-provider -- crds --out config/crd/bases`.

use std::path::Path;

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases");
    let mut expected_files = Vec::new();
    for crd in tenantry_api::crds::all() {
        let name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
        let committed = std::fs::read_to_string(dir.join(&name)).unwrap_or_else(|e| {
            panic!("config/crd/bases/{name} missing ({e}); regenerate the CRDs")
        });
        let generated = serde_norway::to_string(&crd).expect("serialize CRD");
        assert!(
            committed == generated,
            "config/crd/bases/{name} is stale; run: cargo run -p tenantry-provider -- crds --out config/crd/bases"
        );
        expected_files.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("read config/crd/bases")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(
        present, expected_files,
        "config/crd/bases holds CRDs no type generates"
    );
}
