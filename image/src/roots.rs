//! The CA roots the image carries at `/etc/ssl/certs/ca-certificates.crt`,
//! where the manager's TLS clients (and every Go or C program) look for the
//! system store: Mozilla's root program as the `webpki-root-certs` crate
//! pinned in `Cargo.lock` ships it. Taking them from a crate rather than
//! from the build machine's `ca-certificates` package makes the file, and so
//! the image digest, depend on the commit alone.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// Where the image puts the bundle (the Debian path, which rustls-native-certs,
/// Go's crypto/x509 and OpenSSL all probe).
pub const BUNDLE_PATH: &str = "etc/ssl/certs/ca-certificates.crt";

/// Every root as PEM, in the crate's order.
pub fn pem_bundle() -> String {
    let mut bundle = String::new();
    for certificate in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        bundle.push_str("-----BEGIN CERTIFICATE-----\n");
        let encoded = BASE64.encode(certificate.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            bundle.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            bundle.push('\n');
        }
        bundle.push_str("-----END CERTIFICATE-----\n");
    }
    bundle
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_holds_every_root_as_a_pem_block() {
        let bundle = pem_bundle();
        let count = bundle.matches("-----BEGIN CERTIFICATE-----").count();
        assert_eq!(count, webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
        assert!(count > 100, "Mozilla's program has well over 100 roots");
        assert!(bundle.lines().all(|line| line.len() <= 64));
    }
}
