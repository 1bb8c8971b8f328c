//! Stamps the commit a release binary was built from into `--version`
//! (`hack/image.sh` sets TENANTRY_REVISION); other builds say only the
//! crate version.
fn main() {
    println!("cargo:rerun-if-env-changed=TENANTRY_REVISION");
    let version = env!("CARGO_PKG_VERSION");
    let text = match std::env::var("TENANTRY_REVISION") {
        Ok(revision) if !revision.is_empty() => format!("{version} ({revision})"),
        _ => version.to_string(),
    };
    println!("cargo:rustc-env=TENANTRY_VERSION_TEXT={text}");
}
