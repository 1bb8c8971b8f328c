//! The certificates and tokens the tenant companion keeps in Secrets, as
//! pure functions: PEM and strings in, PEM and strings out. The shapes are
//! the ones Cozystack's charts ask cert-manager for (`packages/extra/etcd`,
//! and `talos-pki.yaml`/`talos-secrets.yaml` in `packages/apps/kubernetes`),
//! issued here because tenantry does not depend on cert-manager.
//!
//! - etcd: one CA per namespace signs the server, peer and client (`root`)
//!   certificates. Cozystack also keeps a second CA for the peer plane; one
//!   CA is enough here because whoever holds a client certificate already
//!   owns the data (the etcd runs cert-only, without auth, and Kamaji holds
//!   the CA key to sign its per-cluster client certificates), so a separate
//!   peer CA would protect nothing the client CA does not already expose.
//!   It also is the "one-CA topology" etcd-operator's `ServerSecretRef`
//!   docs describe: the server Secret's `ca.crt` verifies every client.
//! - Talos: an Ed25519 CA (`CN=talos`) and the trustd serving certificate
//!   it signs, plus the machine token, cluster id/secret and a kubeadm
//!   bootstrap token.
//!
//! Keys: ECDSA P-256 for etcd, not Cozystack's RSA-4096. ring (the crypto
//! provider everywhere in tenantry) cannot generate RSA keys, and an
//! RSA-4096 key takes seconds of CPU where P-256 takes microseconds. etcd and
//! etcd-operator accept ECDSA; Kamaji signs with an ECDSA CA key since
//! edge-25.03.1 (clastix/kamaji#667). The private keys are written the way
//! cert-manager writes them: ECDSA as SEC1 `EC PRIVATE KEY` (Kamaji reads
//! PKCS#8 `PRIVATE KEY` only since 26.7.5-edge, #1249), Ed25519 as PKCS#8
//! v1 `PRIVATE KEY` (ring writes v2, with the public key tagged in a way
//! OpenSSL 3.0 rejects; Go and cert-manager write v1).
//!
//! Validity: CAs 10 years and leaves 1 year (cert-manager's `87600h` and
//! `8760h` in the charts); leaves are renewed 30 days before they expire
//! ([`RENEW_BEFORE`], the charts' `renewBefore: 720h`). A CA that already
//! sits in a Secret is never replaced: [`etcd_pki_from`] and
//! [`issue_from`] issue new leaves from it, so a restart or a lost leaf
//! Secret never invalidates the certificates Kamaji already signed.
//!
//! Key material never reaches a log or an error: [`CertificateAndKey`]'s
//! `Debug` leaves the key out, and no [`PkiError`] carries PEM.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::jiff::Timestamp;
use rand::distr::{Alphanumeric, SampleString as _};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519, PublicKeyData as _,
    SerialNumber, SignatureAlgorithm,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

/// How long a CA is valid: cert-manager's `duration: 87600h` on the charts'
/// CA Certificates.
pub const CA_VALIDITY: Duration = Duration::from_secs(87_600 * 3600);
/// How long a leaf certificate is valid: the Talos chart's `duration: 8760h`,
/// used for the etcd leaves too.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(8_760 * 3600);
/// How long before expiry a leaf is re-issued: the charts' `renewBefore: 720h`.
pub const RENEW_BEFORE: Duration = Duration::from_secs(720 * 3600);
/// Certificates start being valid this long before they are issued, so a
/// node whose clock is behind the controller's accepts them at once
/// (client-go's certificate helpers backdate by an hour for the same reason).
const BACKDATE: Duration = Duration::from_secs(3600);

/// The name of the `EtcdCluster` these certificates serve; its Services are
/// `etcd` (headless, per-member names) and `etcd-client`.
const ETCD_CLUSTER: &str = "etcd";
/// The headless Service of a StatefulSet-era (v1alpha1) etcd adopted in place.
const ETCD_LEGACY_HEADLESS: &str = "etcd-headless";
/// The DNS suffix the rest of the provider assumes (see `render.rs`).
const CLUSTER_DOMAIN: &str = "cluster.local";

/// Keys of a `kubernetes.io/tls` Secret, as cert-manager fills them.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_PRIVATE_KEY_KEY: &str = "tls.key";
pub const TLS_CA_KEY: &str = "ca.crt";

/// Keys of the Talos secrets, spelled as Cozystack's `talos-secrets.yaml`.
pub const TALOS_TOKEN_KEY: &str = "token";
pub const TALOS_CLUSTER_ID_KEY: &str = "clusterId";
pub const TALOS_CLUSTER_SECRET_KEY: &str = "clusterSecret";
pub const TALOS_BOOTSTRAP_TOKEN_KEY: &str = "bootstrapToken";
pub const TALOS_BOOTSTRAP_TOKEN_ID_KEY: &str = "bootstrapTokenId";
pub const TALOS_BOOTSTRAP_TOKEN_SECRET_KEY: &str = "bootstrapTokenSecret";

/// A certificate and its private key, both PEM. `Debug` shows neither the
/// key nor the certificate body.
#[derive(Clone, PartialEq, Eq)]
pub struct CertificateAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for CertificateAndKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAndKey")
            .field("cert_pem", &format_args!("<{} bytes>", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The etcd PKI of one namespace, one Secret each: `etcd-ca-tls`,
/// `etcd-server-tls`, `etcd-peer-tls` and `etcd-client-tls`. Every leaf's
/// Secret carries the CA as `ca.crt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdPki {
    pub ca: CertificateAndKey,
    pub server: CertificateAndKey,
    pub peer: CertificateAndKey,
    pub client: CertificateAndKey,
}

/// The leaf certificates of an etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtcdLeaf {
    /// What etcd serves clients with (`etcd-server-tls`). It also carries
    /// client auth: etcd dials its own grpc-gateway with it.
    Server,
    /// What members serve and dial each other with (`etcd-peer-tls`).
    Peer,
    /// The `root` client (`etcd-client-tls`): etcd-operator's identity and
    /// the one Kamaji's DataStore dials with.
    Client,
}

impl EtcdLeaf {
    pub const ALL: [EtcdLeaf; 3] = [EtcdLeaf::Server, EtcdLeaf::Peer, EtcdLeaf::Client];

    /// The subject common name, as Cozystack's chart sets it.
    pub fn common_name(self) -> &'static str {
        match self {
            EtcdLeaf::Server => "etcd-server",
            EtcdLeaf::Peer => "etcd-peer",
            EtcdLeaf::Client => "root",
        }
    }

    fn extended_key_usages(self) -> Vec<ExtendedKeyUsagePurpose> {
        match self {
            EtcdLeaf::Server | EtcdLeaf::Peer => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            EtcdLeaf::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to build, sign or encode: a bug, not bad input.
    #[error("issuing {what}: {reason}")]
    Issue { what: &'static str, reason: String },
    #[error("{what} is not PEM (no {label} block)")]
    NotPem {
        what: &'static str,
        label: &'static str,
    },
    #[error("{what} is not a usable X.509 certificate: {reason}")]
    InvalidCertificate { what: &'static str, reason: String },
    #[error("unsupported CA private key: {reason}")]
    UnsupportedKey { reason: String },
    #[error("the CA private key does not belong to the CA certificate")]
    CaKeyMismatch,
    #[error("the CA certificate is not a CA (basicConstraints cA is not true)")]
    NotACa,
}

impl PkiError {
    /// Nothing here gets better by waiting: either a Secret holds material
    /// someone has to fix, or the code has a bug.
    pub fn is_transient(&self) -> bool {
        false
    }

    pub fn needs_human(&self) -> bool {
        !self.is_transient()
    }

    /// CamelCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Issue { .. } => "CertificateIssueFailed",
            Self::NotPem { .. }
            | Self::InvalidCertificate { .. }
            | Self::UnsupportedKey { .. }
            | Self::CaKeyMismatch
            | Self::NotACa => "CertificateAuthorityInvalid",
        }
    }
}

/// The DNS and IP SANs of the etcd server and peer certificates.
///
/// - `etcd`, `etcd.<ns>`, `etcd.<ns>.svc`: the headless Service, which the
///   Kamaji DataStore dials (`etcd.<ns>.svc:2379`);
/// - `*.etcd.<ns>.svc`: each member, as etcd-operator dials it and as
///   members reach each other;
/// - `*.etcd.<ns>.svc.cluster.local`: what a member's address reverse-
///   resolves to; etcd matches a peer's source address against the peer
///   certificate's wildcards that way (etcd-operator calls it load-bearing);
/// - `etcd.<ns>.svc.cluster.local`, `etcd-client.<ns>.svc[.cluster.local]`:
///   the ClusterIP Service, which the operator's snapshot Jobs dial;
/// - `*.etcd-headless.<ns>.svc`: members of an etcd adopted from the
///   StatefulSet-era operator;
/// - `localhost` and `127.0.0.1`: etcd's own grpc-gateway loopback.
pub fn etcd_dns_names(namespace: &str) -> Vec<String> {
    let cluster = ETCD_CLUSTER;
    let svc = format!("{cluster}.{namespace}.svc");
    let client_svc = format!("{cluster}-client.{namespace}.svc");
    vec![
        cluster.to_string(),
        format!("{cluster}.{namespace}"),
        svc.clone(),
        format!("{svc}.{CLUSTER_DOMAIN}"),
        format!("*.{svc}"),
        format!("*.{svc}.{CLUSTER_DOMAIN}"),
        client_svc.clone(),
        format!("{client_svc}.{CLUSTER_DOMAIN}"),
        format!("*.{ETCD_LEGACY_HEADLESS}.{namespace}.svc"),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ]
}

/// A new etcd PKI for `namespace`: a new CA and its three leaves.
pub fn etcd_pki(namespace: &str) -> Result<EtcdPki, PkiError> {
    let key = generate_key(&PKCS_ECDSA_P256_SHA256, "the etcd CA")?;
    let mut params = ca_params("etcd-ca");
    etcd_subject(&mut params.distinguished_name, namespace);
    let cert = params
        .self_signed(&key)
        .map_err(|e| issue_error("the etcd CA", e))?;
    let ca = CertificateAndKey {
        cert_pem: cert.pem(),
        key_pem: private_key_pem(&key, "the etcd CA")?,
    };
    let issuer = Issuer::new(params, key);
    etcd_leaves(ca, &issuer, namespace)
}

/// The etcd PKI around a CA that already exists (`tls.crt`/`tls.key` of
/// `etcd-ca-tls`): the CA is returned as given, byte for byte, and the three
/// leaves are new.
pub fn etcd_pki_from(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    namespace: &str,
) -> Result<EtcdPki, PkiError> {
    let issuer = load_ca(ca_cert_pem, ca_key_pem)?;
    let ca = CertificateAndKey {
        cert_pem: ca_cert_pem.to_string(),
        key_pem: ca_key_pem.to_string(),
    };
    etcd_leaves(ca, &issuer, namespace)
}

/// One etcd leaf, new key and all, issued by an existing CA: what renewing a
/// leaf, or replacing a lost leaf Secret, takes.
pub fn issue_from(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    leaf: EtcdLeaf,
    namespace: &str,
) -> Result<CertificateAndKey, PkiError> {
    let issuer = load_ca(ca_cert_pem, ca_key_pem)?;
    issue_etcd_leaf(&issuer, leaf, namespace)
}

fn etcd_leaves(
    ca: CertificateAndKey,
    issuer: &Issuer<'_, KeyPair>,
    namespace: &str,
) -> Result<EtcdPki, PkiError> {
    Ok(EtcdPki {
        server: issue_etcd_leaf(issuer, EtcdLeaf::Server, namespace)?,
        peer: issue_etcd_leaf(issuer, EtcdLeaf::Peer, namespace)?,
        client: issue_etcd_leaf(issuer, EtcdLeaf::Client, namespace)?,
        ca,
    })
}

fn issue_etcd_leaf(
    issuer: &Issuer<'_, KeyPair>,
    leaf: EtcdLeaf,
    namespace: &str,
) -> Result<CertificateAndKey, PkiError> {
    let what = match leaf {
        EtcdLeaf::Server => "the etcd server certificate",
        EtcdLeaf::Peer => "the etcd peer certificate",
        EtcdLeaf::Client => "the etcd client certificate",
    };
    let names = match leaf {
        EtcdLeaf::Server | EtcdLeaf::Peer => etcd_dns_names(namespace),
        EtcdLeaf::Client => Vec::new(),
    };
    let mut params = leaf_params(names, leaf.extended_key_usages(), what)?;
    params
        .distinguished_name
        .push(DnType::CommonName, leaf.common_name());
    etcd_subject(&mut params.distinguished_name, namespace);
    sign_leaf(&params, &PKCS_ECDSA_P256_SHA256, issuer, what)
}

/// `O=<namespace>, OU=etcd`, as the chart's `subject` (the release is `etcd`).
fn etcd_subject(name: &mut DistinguishedName, namespace: &str) {
    name.push(DnType::OrganizationName, namespace);
    name.push(DnType::OrganizationalUnitName, ETCD_CLUSTER);
}

/// The data of a `kubernetes.io/tls` Secret, laid out as cert-manager writes
/// it. A CA's own Secret passes its certificate as both `cert_pem` and
/// `ca_pem`.
pub fn tls_secret_data(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> BTreeMap<String, ByteString> {
    [
        (TLS_CERT_KEY, cert_pem),
        (TLS_PRIVATE_KEY_KEY, key_pem),
        (TLS_CA_KEY, ca_pem),
    ]
    .into_iter()
    .map(|(key, pem)| (key.to_string(), ByteString(pem.as_bytes().to_vec())))
    .collect()
}

/// A new Talos CA, `(cert_pem, key_pem)`: Ed25519, `CN=talos`, 10 years. It
/// is the machine CA workers trust (`machine.ca.crt`); the CSR signer next
/// to Kamaji signs trustd CSRs with it.
pub fn talos_ca() -> Result<(String, String), PkiError> {
    let key = generate_key(&PKCS_ED25519, "the Talos CA")?;
    let params = ca_params("talos");
    let cert = params
        .self_signed(&key)
        .map_err(|e| issue_error("the Talos CA", e))?;
    Ok((cert.pem(), private_key_pem(&key, "the Talos CA")?))
}

/// trustd's serving certificate, `(cert_pem, key_pem)`, issued by the Talos
/// CA: Ed25519, 1 year, server auth only, an empty subject (cert-manager's
/// when a Certificate has no `commonName`) and the given names as SANs. The
/// chart lists DNS names only; a name that parses as an IP address becomes an
/// IP SAN (newer charts add trustd's Service ClusterIP that way).
pub fn talos_server_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    dns_names: &[String],
) -> Result<(String, String), PkiError> {
    const WHAT: &str = "the Talos server certificate";
    if dns_names.is_empty() {
        return Err(PkiError::Issue {
            what: WHAT,
            reason: "no names to put in it".to_string(),
        });
    }
    let issuer = load_ca(ca_cert_pem, ca_key_pem)?;
    let params = leaf_params(
        dns_names.to_vec(),
        vec![ExtendedKeyUsagePurpose::ServerAuth],
        WHAT,
    )?;
    let issued = sign_leaf(&params, &PKCS_ED25519, &issuer, WHAT)?;
    Ok((issued.cert_pem, issued.key_pem))
}

/// The random Talos values of one cluster, keyed as Cozystack's
/// `<release>-talos-secrets`:
///
/// - `token`: the machine (trustd) token, Talos's format `[a-z0-9]{6}\.[a-z0-9]{16}`;
/// - `clusterId`, `clusterSecret`: 32 characters of `[A-Za-z0-9]` each (the
///   chart's `randAlphaNum 32`; `talosctl gen secrets` writes base64 of 32
///   random bytes instead, and 32 alphanumerics are valid base64 as well);
/// - `bootstrapToken`: a kubeadm bootstrap token `<id>.<secret>`
///   (`[a-z0-9]{6}\.[a-z0-9]{16}`), and its halves as `bootstrapTokenId` and
///   `bootstrapTokenSecret`.
///
/// The characters are drawn uniformly (the chart's `randAlphaNum | lower`
/// favours letters; the format is the same).
pub fn talos_secrets() -> BTreeMap<String, String> {
    let mut rng = rand::rng();
    let token = format!(
        "{}.{}",
        lower_alphanumeric(&mut rng, 6),
        lower_alphanumeric(&mut rng, 16)
    );
    let bootstrap_id = lower_alphanumeric(&mut rng, 6);
    let bootstrap_secret = lower_alphanumeric(&mut rng, 16);
    BTreeMap::from([
        (TALOS_TOKEN_KEY.to_string(), token),
        (
            TALOS_CLUSTER_ID_KEY.to_string(),
            Alphanumeric.sample_string(&mut rng, 32),
        ),
        (
            TALOS_CLUSTER_SECRET_KEY.to_string(),
            Alphanumeric.sample_string(&mut rng, 32),
        ),
        (
            TALOS_BOOTSTRAP_TOKEN_KEY.to_string(),
            format!("{bootstrap_id}.{bootstrap_secret}"),
        ),
        (TALOS_BOOTSTRAP_TOKEN_ID_KEY.to_string(), bootstrap_id),
        (
            TALOS_BOOTSTRAP_TOKEN_SECRET_KEY.to_string(),
            bootstrap_secret,
        ),
    ])
}

fn lower_alphanumeric(rng: &mut impl rand::Rng, len: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..len)
        .map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())]))
        .collect()
}

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

fn ca_params(common_name: &str) -> CertificateParams {
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
fn leaf_params(
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

fn sign_leaf(
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

fn set_validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + lifetime;
}

/// 16 random bytes, positive (RFC 5280 serials are positive integers).
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn generate_key(
    algorithm: &'static SignatureAlgorithm,
    what: &'static str,
) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(algorithm).map_err(|e| issue_error(what, e))
}

fn issue_error(what: &'static str, error: rcgen::Error) -> PkiError {
    PkiError::Issue {
        what,
        reason: error.to_string(),
    }
}

/// ECDSA keys as SEC1 `EC PRIVATE KEY`, everything else (Ed25519) as PKCS#8
/// v1 `PRIVATE KEY`: cert-manager's encodings, and the ones every Kamaji
/// release and OpenSSL read.
fn private_key_pem(key: &KeyPair, what: &'static str) -> Result<String, PkiError> {
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

fn pem_encode(label: &str, der: &[u8]) -> String {
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
fn load_ca(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Issuer<'static, KeyPair>, PkiError> {
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

fn load_private_key(pem: &str) -> Result<KeyPair, PkiError> {
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

fn certificate_der(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|_| PkiError::NotPem {
        what,
        label: "CERTIFICATE",
    })
}

fn parse_certificate<'a>(
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
mod der {
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
    pub(super) fn pkcs8_to_sec1(pkcs8: &[u8]) -> Option<Vec<u8>> {
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
    pub(super) fn sec1_to_pkcs8(sec1: &[u8]) -> Option<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::server::WebPkiClientVerifier;
    use rustls_pki_types::{ServerName, UnixTime};
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::oid_registry::{OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519};

    use super::*;

    const NS: &str = "tenant-a";

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("certificate PEM")
    }

    fn parsed<'a>(der: &'a CertificateDer<'_>) -> X509Certificate<'a> {
        x509_parser::parse_x509_certificate(der).expect("X.509").1
    }

    fn common_name(cert: &X509Certificate<'_>) -> String {
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    fn sans(cert: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>) {
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        if let Some(san) = cert.subject_alternative_name().expect("SAN extension") {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(name) => dns.push(name.to_string()),
                    GeneralName::IPAddress(bytes) => {
                        let octets: [u8; 4] = (*bytes).try_into().expect("IPv4");
                        ips.push(IpAddr::from(octets));
                    }
                    other => panic!("unexpected SAN {other:?}"),
                }
            }
        }
        (dns, ips)
    }

    /// (server auth, client auth)
    fn extended_key_usage(cert: &X509Certificate<'_>) -> (bool, bool) {
        let eku = cert
            .extended_key_usage()
            .expect("EKU extension")
            .expect("EKU present")
            .value;
        (eku.server_auth, eku.client_auth)
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn roots(ca_pem: &str) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(ca_pem)).expect("CA as trust anchor");
        Arc::new(roots)
    }

    /// What a TLS client checks of a server: chain to the CA, name, serverAuth.
    fn server_verifies(ca_pem: &str, cert_pem: &str, name: &str) -> bool {
        let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca_pem), provider())
            .build()
            .expect("verifier");
        let name = ServerName::try_from(name.to_string()).expect("server name");
        verifier
            .verify_server_cert(&der(cert_pem), &[], &name, &[], UnixTime::now())
            .is_ok()
    }

    /// What a TLS server checks of a client: chain to the CA, clientAuth.
    fn client_verifies(ca_pem: &str, cert_pem: &str) -> bool {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_pem), provider())
            .build()
            .expect("verifier");
        verifier
            .verify_client_cert(&der(cert_pem), &[], UnixTime::now())
            .is_ok()
    }

    fn is_lower_alphanumeric(s: &str, len: usize) -> bool {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    }

    /// `[a-z0-9]{6}\.[a-z0-9]{16}`
    fn is_token(s: &str) -> bool {
        s.split_once('.').is_some_and(|(id, secret)| {
            is_lower_alphanumeric(id, 6) && is_lower_alphanumeric(secret, 16)
        })
    }

    fn seconds_from_now(ts: Timestamp) -> i64 {
        ts.as_second() - Timestamp::now().as_second()
    }

    #[test]
    fn etcd_ca_is_a_ten_year_p256_ca_named_etcd_ca() {
        let pki = etcd_pki(NS).unwrap();
        let ca_der = der(&pki.ca.cert_pem);
        let ca = parsed(&ca_der);
        assert!(ca.is_ca());
        assert_eq!(common_name(&ca), "etcd-ca");
        assert_eq!(
            ca.subject()
                .iter_organization()
                .next()
                .and_then(|o| o.as_str().ok()),
            Some(NS)
        );
        assert_eq!(
            ca.public_key().algorithm.algorithm,
            OID_KEY_TYPE_EC_PUBLIC_KEY
        );
        let lifetime = seconds_from_now(certificate_expiry(&pki.ca.cert_pem).unwrap());
        assert!((lifetime - CA_VALIDITY.as_secs() as i64).abs() < 60);
    }

    #[test]
    fn etcd_server_and_peer_certificates_name_every_address_etcd_is_dialled_at() {
        let pki = etcd_pki(NS).unwrap();
        for (leaf, cn) in [(&pki.server, "etcd-server"), (&pki.peer, "etcd-peer")] {
            let leaf_der = der(&leaf.cert_pem);
            let cert = parsed(&leaf_der);
            assert_eq!(common_name(&cert), cn);
            assert!(!cert.is_ca());
            assert_eq!(extended_key_usage(&cert), (true, true));
            let (dns, ips) = sans(&cert);
            for name in [
                "etcd",
                "etcd.tenant-a",
                "etcd.tenant-a.svc",
                "*.etcd.tenant-a.svc",
                "*.etcd.tenant-a.svc.cluster.local",
                "etcd-client.tenant-a.svc",
                "*.etcd-headless.tenant-a.svc",
                "localhost",
            ] {
                assert!(dns.iter().any(|d| d == name), "{cn} lacks {name}: {dns:?}");
            }
            assert_eq!(ips, [IpAddr::from([127, 0, 0, 1])]);

            for name in [
                "etcd.tenant-a.svc",
                "etcd-0.etcd.tenant-a.svc",
                "etcd-x7k2p.etcd.tenant-a.svc.cluster.local",
                "localhost",
                "127.0.0.1",
            ] {
                assert!(
                    server_verifies(&pki.ca.cert_pem, &leaf.cert_pem, name),
                    "{cn} for {name}"
                );
            }
            assert!(!server_verifies(
                &pki.ca.cert_pem,
                &leaf.cert_pem,
                "etcd.tenant-b.svc"
            ));
            // Members dial each other, and etcd its own gateway, with these.
            assert!(client_verifies(&pki.ca.cert_pem, &leaf.cert_pem));
        }
    }

    #[test]
    fn etcd_client_certificate_is_root_with_client_auth_only() {
        let pki = etcd_pki(NS).unwrap();
        let client_der = der(&pki.client.cert_pem);
        let cert = parsed(&client_der);
        assert_eq!(common_name(&cert), "root");
        assert_eq!(extended_key_usage(&cert), (false, true));
        assert_eq!(sans(&cert), (Vec::new(), Vec::new()));
        assert!(client_verifies(&pki.ca.cert_pem, &pki.client.cert_pem));
        assert!(!server_verifies(
            &pki.ca.cert_pem,
            &pki.client.cert_pem,
            "etcd.tenant-a.svc"
        ));
    }

    #[test]
    fn etcd_leaves_last_a_year_and_are_issued_by_the_ca() {
        let pki = etcd_pki(NS).unwrap();
        for leaf in [&pki.server, &pki.peer, &pki.client] {
            assert!(is_issued_by(&leaf.cert_pem, &pki.ca.cert_pem));
            let lifetime = seconds_from_now(certificate_expiry(&leaf.cert_pem).unwrap());
            assert!((lifetime - LEAF_VALIDITY.as_secs() as i64).abs() < 60);
        }
        let other = etcd_pki(NS).unwrap();
        assert!(!is_issued_by(&pki.server.cert_pem, &other.ca.cert_pem));
    }

    #[test]
    fn ecdsa_keys_are_sec1_with_the_named_curve_as_cert_manager_writes_them() {
        let pki = etcd_pki(NS).unwrap();
        for pair in [&pki.ca, &pki.server, &pki.peer, &pki.client] {
            assert!(pair.key_pem.starts_with("-----BEGIN EC PRIVATE KEY-----\n"));
            let PrivateKeyDer::Sec1(sec1) =
                PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap()
            else {
                panic!("not SEC1");
            };
            // The layout OpenSSL and Go write for P-256: version 1, a 32-byte
            // secret, [0] prime256v1, [1] the public point.
            let bytes = sec1.secret_sec1_der();
            assert_eq!(&bytes[..7], &[0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]);
            assert_eq!(
                &bytes[39..51],
                &[
                    0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07
                ]
            );
            assert_eq!(&bytes[51..53], &[0xa1, 0x44]);
        }
        // And each key belongs to its certificate.
        for pair in [&pki.server, &pki.peer, &pki.client] {
            let key = load_private_key(&pair.key_pem).unwrap();
            let leaf_der = der(&pair.cert_pem);
            assert_eq!(
                key.subject_public_key_info(),
                parsed(&leaf_der).public_key().raw
            );
        }
    }

    #[test]
    fn reissuing_from_an_existing_ca_keeps_the_ca_byte_for_byte() {
        let first = etcd_pki(NS).unwrap();
        let again = etcd_pki_from(&first.ca.cert_pem, &first.ca.key_pem, NS).unwrap();
        assert_eq!(again.ca, first.ca);
        assert_ne!(again.server, first.server);
        assert_ne!(again.client.key_pem, first.client.key_pem);
        for leaf in [&again.server, &again.peer, &again.client] {
            assert!(is_issued_by(&leaf.cert_pem, &first.ca.cert_pem));
        }
        assert!(server_verifies(
            &first.ca.cert_pem,
            &again.server.cert_pem,
            "etcd.tenant-a.svc"
        ));

        // The authority key identifier is the CA's subject key identifier.
        let ca_der = der(&first.ca.cert_pem);
        let leaf_der = der(&again.peer.cert_pem);
        let ski = parsed(&ca_der)
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
                _ => None,
            })
            .expect("CA SKI");
        let aki = parsed(&leaf_der)
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(aki) => {
                    aki.key_identifier.as_ref().map(|id| id.0.to_vec())
                }
                _ => None,
            })
            .expect("leaf AKI");
        assert_eq!(aki, ski);
    }

    #[test]
    fn issue_from_renews_one_leaf() {
        let pki = etcd_pki(NS).unwrap();
        for leaf in EtcdLeaf::ALL {
            let renewed = issue_from(&pki.ca.cert_pem, &pki.ca.key_pem, leaf, NS).unwrap();
            assert!(is_issued_by(&renewed.cert_pem, &pki.ca.cert_pem));
            let renewed_der = der(&renewed.cert_pem);
            assert_eq!(common_name(&parsed(&renewed_der)), leaf.common_name());
        }
    }

    #[test]
    fn a_pkcs8_ca_key_is_accepted_too() {
        // A CA some other tool wrote, key in PKCS#8.
        let key = KeyPair::generate().unwrap();
        let cert = ca_params("someone-elses-ca").self_signed(&key).unwrap();
        let pki = etcd_pki_from(&cert.pem(), &key.serialize_pem(), NS).unwrap();
        assert!(is_issued_by(&pki.server.cert_pem, &cert.pem()));
        assert!(client_verifies(&cert.pem(), &pki.client.cert_pem));
    }

    #[test]
    fn a_ca_key_from_another_ca_is_refused() {
        let one = etcd_pki(NS).unwrap();
        let other = etcd_pki(NS).unwrap();
        let error = etcd_pki_from(&one.ca.cert_pem, &other.ca.key_pem, NS).unwrap_err();
        assert!(matches!(error, PkiError::CaKeyMismatch), "{error}");
        assert!(error.needs_human());
    }

    #[test]
    fn a_leaf_is_refused_as_a_ca() {
        let pki = etcd_pki(NS).unwrap();
        let error = issue_from(
            &pki.server.cert_pem,
            &pki.server.key_pem,
            EtcdLeaf::Client,
            NS,
        )
        .unwrap_err();
        assert!(matches!(error, PkiError::NotACa), "{error}");
    }

    #[test]
    fn missing_or_garbled_ca_material_is_an_error_without_key_material() {
        let pki = etcd_pki(NS).unwrap();
        for (cert, key) in [
            ("", pki.ca.key_pem.as_str()),
            (pki.ca.cert_pem.as_str(), ""),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                pki.ca.key_pem.as_str(),
            ),
        ] {
            let error = etcd_pki_from(cert, key, NS).unwrap_err();
            let message = error.to_string();
            assert!(!message.contains("BEGIN"), "{message}");
            assert_eq!(error.reason(), "CertificateAuthorityInvalid");
        }
    }

    #[test]
    fn debug_output_never_shows_a_private_key() {
        let pki = etcd_pki(NS).unwrap();
        let shown = format!("{pki:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        let key_body = pki.ca.key_pem.lines().nth(1).unwrap();
        assert!(!shown.contains(key_body));
    }

    #[test]
    fn tls_secret_data_uses_the_kubernetes_io_tls_keys() {
        let data = tls_secret_data("CERT", "KEY", "CA");
        assert_eq!(
            data,
            BTreeMap::from([
                ("tls.crt".to_string(), ByteString(b"CERT".to_vec())),
                ("tls.key".to_string(), ByteString(b"KEY".to_vec())),
                ("ca.crt".to_string(), ByteString(b"CA".to_vec())),
            ])
        );
    }

    #[test]
    fn talos_ca_is_an_ed25519_ca_named_talos_for_ten_years() {
        let (cert_pem, key_pem) = talos_ca().unwrap();
        assert!(key_pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        // PKCS#8 v1, as Go and cert-manager write it: version 0, Ed25519,
        // the 32-byte seed, nothing after.
        let PrivateKeyDer::Pkcs8(pkcs8) =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap()
        else {
            panic!("not PKCS#8");
        };
        let bytes = pkcs8.secret_pkcs8_der();
        assert_eq!(bytes.len(), 48);
        assert_eq!(
            &bytes[..16],
            &[
                0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
                0x04, 0x20
            ]
        );
        let ca_der = der(&cert_pem);
        let ca = parsed(&ca_der);
        assert!(ca.is_ca());
        assert_eq!(common_name(&ca), "talos");
        assert_eq!(ca.signature_algorithm.algorithm, OID_SIG_ED25519);
        let lifetime = seconds_from_now(certificate_expiry(&cert_pem).unwrap());
        assert!((lifetime - CA_VALIDITY.as_secs() as i64).abs() < 60);
    }

    #[test]
    fn talos_server_certificate_serves_the_given_names_only() {
        let (ca_cert, ca_key) = talos_ca().unwrap();
        let names = vec![
            "kubernetes-demo.tenant-a.svc".to_string(),
            "kubernetes-demo.tenant-a.svc.cluster.local".to_string(),
        ];
        let (cert_pem, key_pem) = talos_server_cert(&ca_cert, &ca_key, &names).unwrap();
        assert!(key_pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let leaf_der = der(&cert_pem);
        let cert = parsed(&leaf_der);
        assert_eq!(sans(&cert), (names.clone(), Vec::new()));
        assert_eq!(extended_key_usage(&cert), (true, false));
        assert_eq!(cert.signature_algorithm.algorithm, OID_SIG_ED25519);
        assert_eq!(cert.public_key().algorithm.algorithm, OID_SIG_ED25519);
        assert!(cert.subject().as_raw().len() <= 2, "empty subject");
        let lifetime = seconds_from_now(certificate_expiry(&cert_pem).unwrap());
        assert!((lifetime - LEAF_VALIDITY.as_secs() as i64).abs() < 60);

        assert!(server_verifies(
            &ca_cert,
            &cert_pem,
            "kubernetes-demo.tenant-a.svc"
        ));
        assert!(!server_verifies(
            &ca_cert,
            &cert_pem,
            "kubernetes-demo.tenant-b.svc"
        ));
        assert!(!client_verifies(&ca_cert, &cert_pem));
    }

    #[test]
    fn talos_server_certificate_takes_an_ip_address_as_an_ip_san() {
        let (ca_cert, ca_key) = talos_ca().unwrap();
        let names = vec![
            "kubernetes-demo.tenant-a.svc".to_string(),
            "10.96.0.20".to_string(),
        ];
        let (cert_pem, _) = talos_server_cert(&ca_cert, &ca_key, &names).unwrap();
        let leaf_der = der(&cert_pem);
        let (dns, ips) = sans(&parsed(&leaf_der));
        assert_eq!(dns, ["kubernetes-demo.tenant-a.svc"]);
        assert_eq!(ips, [IpAddr::from([10, 96, 0, 20])]);
        assert!(server_verifies(&ca_cert, &cert_pem, "10.96.0.20"));
    }

    #[test]
    fn talos_server_certificate_needs_a_name() {
        let (ca_cert, ca_key) = talos_ca().unwrap();
        assert!(talos_server_cert(&ca_cert, &ca_key, &[]).is_err());
    }

    #[test]
    fn talos_secrets_have_the_talos_and_kubeadm_formats() {
        let secrets = talos_secrets();
        assert_eq!(
            secrets.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "bootstrapToken",
                "bootstrapTokenId",
                "bootstrapTokenSecret",
                "clusterId",
                "clusterSecret",
                "token",
            ]
        );
        assert!(is_token(&secrets["token"]), "{}", secrets["token"]);
        assert!(is_token(&secrets["bootstrapToken"]));
        assert_eq!(
            secrets["bootstrapToken"],
            format!(
                "{}.{}",
                secrets["bootstrapTokenId"], secrets["bootstrapTokenSecret"]
            )
        );
        for key in ["clusterId", "clusterSecret"] {
            assert_eq!(secrets[key].len(), 32);
            assert!(secrets[key].bytes().all(|b| b.is_ascii_alphanumeric()));
        }
        let other = talos_secrets();
        for key in ["token", "clusterId", "clusterSecret", "bootstrapToken"] {
            assert_ne!(secrets[key], other[key], "{key} repeats");
        }
    }

    #[test]
    fn leaves_need_renewal_thirty_days_before_they_expire() {
        let pki = etcd_pki(NS).unwrap();
        let expiry = certificate_expiry(&pki.server.cert_pem).unwrap();
        let now = Timestamp::now();
        assert!(!needs_renewal(&pki.server.cert_pem, now, RENEW_BEFORE));
        let day = 86_400;
        let at = |seconds: i64| Timestamp::from_second(expiry.as_second() - seconds).unwrap();
        assert!(!needs_renewal(
            &pki.server.cert_pem,
            at(31 * day),
            RENEW_BEFORE
        ));
        assert!(needs_renewal(
            &pki.server.cert_pem,
            at(29 * day),
            RENEW_BEFORE
        ));
        assert!(needs_renewal(&pki.server.cert_pem, at(-day), RENEW_BEFORE));
        assert!(needs_renewal("not a certificate", now, RENEW_BEFORE));
        assert!(needs_renewal(&pki.server.cert_pem, now, Duration::MAX));
    }

    #[test]
    fn der_round_trip_keeps_the_ec_key() {
        let key = KeyPair::generate().unwrap();
        let sec1 = der::pkcs8_to_sec1(key.serialized_der()).unwrap();
        let pkcs8 = der::sec1_to_pkcs8(&sec1).unwrap();
        let back =
            KeyPair::try_from(&PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8))).unwrap();
        assert_eq!(
            back.subject_public_key_info(),
            key.subject_public_key_info()
        );
        assert!(
            der::pkcs8_to_sec1(
                KeyPair::generate_for(&PKCS_ED25519)
                    .unwrap()
                    .serialized_der()
            )
            .is_none()
        );
    }
}
