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

use k8s_openapi::ByteString;
use rand::distr::{Alphanumeric, SampleString as _};
use rcgen::{
    DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, PKCS_ECDSA_P256_SHA256,
    PKCS_ED25519,
};

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

mod x509;
use x509::*;
pub use x509::{certificate_expiry, is_issued_by, needs_renewal};

#[cfg(test)]
mod tests;
