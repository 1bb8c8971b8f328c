//! X.509 and key plumbing under the PKI functions: parameters, signing,
//! PEM in and out, and the DER reading rcgen does not do.

use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData as _, SerialNumber,
    SignatureAlgorithm,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use super::*;

/// When the (first) certificate in `cert_pem` stops being valid.
pub fn certificate_expiry(cert_pem: &str) -> Result<Timestamp, PkiError> {
    const WHAT: &str = "the certificate";
    let der = certificate_der(cert_pem, WHAT)?;
    let cert = parse_certificate(&der, WHAT)?;
    Timestamp::from_second(cert.validity().not_after.timestamp()).map_err(|e| {
        PkiError::InvalidCertificate {
            what: WHAT,
            reason: format!("notAfter: {e}"),
        }
    })
}

/// Whether a leaf should be re-issued at `now`: it expires within `within`
/// (normally [`RENEW_BEFORE`]), or it cannot be read at all. Meant for
/// leaves, which are cheap to replace; a CA is never replaced on this
/// module's account.
pub fn needs_renewal(cert_pem: &str, now: Timestamp, within: Duration) -> bool {
    let Ok(not_after) = certificate_expiry(cert_pem) else {
        return true;
    };
    match now.checked_add(within) {
        Ok(deadline) => not_after <= deadline,
        // Past the end of time: everything expires before then.
        Err(_) => true,
    }
}

/// Whether `cert_pem` was signed by the CA in `ca_cert_pem` (issuer name and
/// signature). A leaf that fails this after its CA Secret was recreated
/// has to be re-issued.
pub fn is_issued_by(cert_pem: &str, ca_cert_pem: &str) -> bool {
    let (Ok(cert_der), Ok(ca_der)) = (
        certificate_der(cert_pem, "the certificate"),
        certificate_der(ca_cert_pem, "the CA certificate"),
    ) else {
        return false;
    };
    let (Ok(cert), Ok(ca)) = (
        parse_certificate(&cert_der, "the certificate"),
        parse_certificate(&ca_der, "the CA certificate"),
    ) else {
        return false;
    };
    cert.issuer().as_raw() == ca.subject().as_raw()
        && cert.verify_signature(Some(ca.public_key())).is_ok()
}

pub(super) fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial());
    set_validity(&mut params, CA_VALIDITY);
    params
}

/// A leaf with an empty subject (callers add theirs), the given SANs and
/// extended key usages. Key usage is digital signature only: the keys are
/// ECDSA or Ed25519, which never encipher keys (cert-manager's
/// `key encipherment` is an RSA key-transport usage).
pub(super) fn leaf_params(
    names: Vec<String>,
    extended_key_usages: Vec<ExtendedKeyUsagePurpose>,
    what: &'static str,
) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::new(names).map_err(|e| issue_error(what, e))?;
    params.distinguished_name = DistinguishedName::new();
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = extended_key_usages;
    // Some verifiers (OpenSSL) pick the issuer by key identifier.
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    set_validity(&mut params, LEAF_VALIDITY);
    Ok(params)
}

pub(super) fn sign_leaf(
    params: &CertificateParams,
    algorithm: &'static SignatureAlgorithm,
    issuer: &Issuer<'_, KeyPair>,
    what: &'static str,
) -> Result<CertificateAndKey, PkiError> {
    let key = generate_key(algorithm, what)?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| issue_error(what, e))?;
    Ok(CertificateAndKey {
        cert_pem: cert.pem(),
        key_pem: private_key_pem(&key, what)?,
    })
}

pub(super) fn set_validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + lifetime;
}

/// 16 random bytes, positive (RFC 5280 serials are positive integers).
pub(super) fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

pub(super) fn generate_key(
    algorithm: &'static SignatureAlgorithm,
    what: &'static str,
) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(algorithm).map_err(|e| issue_error(what, e))
}

pub(super) fn issue_error(what: &'static str, error: rcgen::Error) -> PkiError {
    PkiError::Issue {
        what,
        reason: error.to_string(),
    }
}

/// ECDSA keys as SEC1 `EC PRIVATE KEY`, everything else (Ed25519) as PKCS#8
/// v1 `PRIVATE KEY`: cert-manager's encodings, and the ones every Kamaji
/// release and OpenSSL read.
pub(super) fn private_key_pem(key: &KeyPair, what: &'static str) -> Result<String, PkiError> {
    let (label, der) = if key.algorithm() == &PKCS_ECDSA_P256_SHA256 {
        ("EC PRIVATE KEY", der::pkcs8_to_sec1(key.serialized_der()))
    } else {
        ("PRIVATE KEY", der::pkcs8_v1(key.serialized_der()))
    };
    let der = der.ok_or_else(|| PkiError::Issue {
        what,
        reason: format!("re-encoding the private key as {label} failed"),
    })?;
    Ok(pem_encode(label, &der))
}

pub(super) fn pem_encode(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    // Base64 is ASCII, so any byte offset is a character boundary.
    for start in (0..body.len()).step_by(64) {
        pem.push_str(&body[start..body.len().min(start + 64)]);
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

/// The issuer for a CA kept in a Secret. The key may be PKCS#8 or SEC1 (what
/// this module and cert-manager write); the key has to match the
/// certificate, and the certificate has to be a CA, so a hand-edited Secret
/// fails here rather than yield leaves nothing verifies.
pub(super) fn load_ca(
    ca_cert_pem: &str,
    ca_key_pem: &str,
) -> Result<Issuer<'static, KeyPair>, PkiError> {
    const WHAT: &str = "the CA certificate";
    let der = certificate_der(ca_cert_pem, WHAT)?;
    let cert = parse_certificate(&der, WHAT)?;
    if !cert.is_ca() {
        return Err(PkiError::NotACa);
    }
    let key = load_private_key(ca_key_pem)?;
    if key.subject_public_key_info() != cert.public_key().raw {
        return Err(PkiError::CaKeyMismatch);
    }
    Issuer::from_ca_cert_der(&der, key).map_err(|e| PkiError::InvalidCertificate {
        what: WHAT,
        reason: e.to_string(),
    })
}

pub(super) fn load_private_key(pem: &str) -> Result<KeyPair, PkiError> {
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| PkiError::NotPem {
        what: "the CA private key",
        label: "PRIVATE KEY or EC PRIVATE KEY",
    })?;
    // ring (rcgen's backend) reads PKCS#8 only.
    let pkcs8 = match &key {
        PrivateKeyDer::Pkcs8(pkcs8) => pkcs8.secret_pkcs8_der().to_vec(),
        PrivateKeyDer::Sec1(sec1) => {
            der::sec1_to_pkcs8(sec1.secret_sec1_der()).ok_or_else(|| PkiError::UnsupportedKey {
                reason: "an EC PRIVATE KEY without its named curve".to_string(),
            })?
        }
        PrivateKeyDer::Pkcs1(_) => {
            return Err(PkiError::UnsupportedKey {
                reason: "RSA PRIVATE KEY (PKCS#1); only PKCS#8 and SEC1 keys are read".to_string(),
            });
        }
        _ => {
            return Err(PkiError::UnsupportedKey {
                reason: "an unknown key encoding".to_string(),
            });
        }
    };
    KeyPair::try_from(&PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8))).map_err(|e| {
        PkiError::UnsupportedKey {
            reason: e.to_string(),
        }
    })
}

pub(super) fn certificate_der(
    pem: &str,
    what: &'static str,
) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|_| PkiError::NotPem {
        what,
        label: "CERTIFICATE",
    })
}

pub(super) fn parse_certificate<'a>(
    der: &'a [u8],
    what: &'static str,
) -> Result<X509Certificate<'a>, PkiError> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, cert)| cert)
        .map_err(|e| PkiError::InvalidCertificate {
            what,
            reason: e.to_string(),
        })
}

/// Just enough DER to move an EC private key between PKCS#8 (what ring
/// reads and writes) and SEC1 (what cert-manager writes and older Kamaji
/// reads). ring validates whatever comes out of here before using it.
pub(super) mod der {
    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const OCTET_STRING: u8 = 0x04;
    const OID: u8 = 0x06;
    const CONTEXT_0: u8 = 0xa0;
    const CONTEXT_1: u8 = 0xa1;
    /// id-ecPublicKey (1.2.840.10045.2.1), with its tag and length.
    const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

    /// One element: its tag, its value, the whole element, and what follows.
    struct Element<'a> {
        tag: u8,
        value: &'a [u8],
        whole: &'a [u8],
        rest: &'a [u8],
    }

    fn read(input: &[u8]) -> Option<Element<'_>> {
        let (&tag, after_tag) = input.split_first()?;
        let (&first, after_first) = after_tag.split_first()?;
        let (len, after_len) = if first < 0x80 {
            (usize::from(first), after_first)
        } else {
            // Long form; 0x80 (indefinite) and lengths over 4 bytes are not DER
            // for anything this small.
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || after_first.len() < count {
                return None;
            }
            let len = after_first[..count]
                .iter()
                .fold(0usize, |len, &byte| (len << 8) | usize::from(byte));
            (len, &after_first[count..])
        };
        if after_len.len() < len {
            return None;
        }
        let header = input.len() - after_len.len();
        Some(Element {
            tag,
            value: &after_len[..len],
            whole: &input[..header + len],
            rest: &after_len[len..],
        })
    }

    fn expect(input: &[u8], tag: u8) -> Option<Element<'_>> {
        read(input).filter(|element| element.tag == tag)
    }

    fn write(tag: u8, value: &[u8]) -> Vec<u8> {
        let len = value.len();
        let mut out = vec![tag];
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes = len.to_be_bytes();
            let skip = bytes.iter().take_while(|&&b| b == 0).count();
            out.push(0x80 | (bytes.len() - skip) as u8);
            out.extend_from_slice(&bytes[skip..]);
        }
        out.extend_from_slice(value);
        out
    }

    /// PKCS#8 `PrivateKeyInfo` of an EC key → SEC1 `ECPrivateKey` with the
    /// named curve in `[0]`, which Go's `x509.ParseECPrivateKey` needs and
    /// ring leaves out (it keeps the curve in the algorithm identifier).
    pub(in crate::tenant::pki) fn pkcs8_to_sec1(pkcs8: &[u8]) -> Option<Vec<u8>> {
        let info = expect(pkcs8, SEQUENCE)?.value;
        let version = expect(info, INTEGER)?;
        let algorithm = expect(version.rest, SEQUENCE)?;
        let algorithm_oid = expect(algorithm.value, OID)?;
        if algorithm_oid.whole != EC_PUBLIC_KEY {
            return None;
        }
        let curve = expect(algorithm_oid.rest, OID)?;
        let private_key = expect(algorithm.rest, OCTET_STRING)?.value;

        let ec = expect(private_key, SEQUENCE)?.value;
        let ec_version = expect(ec, INTEGER)?;
        let secret = expect(ec_version.rest, OCTET_STRING)?;
        let mut rest = secret.rest;
        if let Some(parameters) = expect(rest, CONTEXT_0) {
            rest = parameters.rest;
        }
        let public_key = expect(rest, CONTEXT_1)?;

        let body = [
            ec_version.whole,
            secret.whole,
            &write(CONTEXT_0, curve.whole),
            public_key.whole,
        ]
        .concat();
        Some(write(SEQUENCE, &body))
    }

    /// PKCS#8 v2 (`OneAsymmetricKey`, version 1, public key appended) → v1
    /// (`PrivateKeyInfo`, version 0): the version, algorithm and private key,
    /// nothing after. ring writes Ed25519 keys as v2 with the public key in
    /// `[1]` constructed where RFC 5958 has it implicit, which OpenSSL 3.0
    /// refuses to read.
    pub(super) fn pkcs8_v1(pkcs8: &[u8]) -> Option<Vec<u8>> {
        let info = expect(pkcs8, SEQUENCE)?.value;
        let version = expect(info, INTEGER)?;
        let algorithm = expect(version.rest, SEQUENCE)?;
        let private_key = expect(algorithm.rest, OCTET_STRING)?;
        let body = [
            &write(INTEGER, &[0])[..],
            algorithm.whole,
            private_key.whole,
        ]
        .concat();
        Some(write(SEQUENCE, &body))
    }

    /// SEC1 `ECPrivateKey` → PKCS#8 `PrivateKeyInfo`. The curve comes from
    /// the key's `[0]` parameters, which must be there; the SEC1 structure is
    /// wrapped as is (ring accepts `[0]` when it names the same curve).
    pub(in crate::tenant::pki) fn sec1_to_pkcs8(sec1: &[u8]) -> Option<Vec<u8>> {
        let ec = expect(sec1, SEQUENCE)?.value;
        let version = expect(ec, INTEGER)?;
        let secret = expect(version.rest, OCTET_STRING)?;
        let parameters = expect(secret.rest, CONTEXT_0)?;
        let curve = expect(parameters.value, OID)?;

        let algorithm = write(SEQUENCE, &[EC_PUBLIC_KEY, curve.whole].concat());
        let body = [
            &write(INTEGER, &[0])[..],
            &algorithm,
            &write(OCTET_STRING, sec1),
        ]
        .concat();
        Some(write(SEQUENCE, &body))
    }
}
