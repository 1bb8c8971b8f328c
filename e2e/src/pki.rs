//! Certificates for harness control planes and webhook servers.
//!
//! Each control plane gets its own CA; the apiserver's serving certificate,
//! the admin client certificate and webhook serving certificates are issued
//! from it, so the one CA bundle in the kubeconfig verifies everything.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A self-signed certificate authority.
pub struct CertificateAuthority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct IssuedCertificate {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl IssuedCertificate {
    /// Writes `<stem>.crt` and `<stem>.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem)
            .with_context(|| format!("write {}", cert.display()))?;
        write_private(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

/// Writes a file readable by its owner only.
pub fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

impl CertificateAuthority {
    /// A new CA with the given common name.
    pub fn new(common_name: &str) -> anyhow::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Self { issuer })
    }

    /// The CA certificate, PEM-encoded.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA private key, PEM-encoded: what a CAPI `<cluster>-ca` Secret
    /// holds as `tls.key`.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn issue_server(
        &self,
        common_name: &str,
        names: &[&str],
    ) -> anyhow::Result<IssuedCertificate> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate: the common name is the user, the organizations
    /// are the groups (as kube-apiserver reads them).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> anyhow::Result<IssuedCertificate> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> anyhow::Result<IssuedCertificate> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The key pair kube-apiserver signs and verifies service-account tokens with.
pub struct ServiceAccountKeys {
    pub private_pem: String,
    pub public_pem: String,
}

impl ServiceAccountKeys {
    /// A fresh ECDSA P-256 key pair (tokens are signed ES256).
    pub fn generate() -> anyhow::Result<Self> {
        let key = KeyPair::generate()?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

/// An HTTPS client that trusts only the CAs in `ca_pem`, as a client given
/// a hypervisor's or webhook's CA bundle would.
pub fn http_trusting(ca_pem: &str) -> reqwest::Client {
    http_trusting_builder(ca_pem).build().expect("HTTP client")
}

/// [`http_trusting`], still to be configured.
pub fn http_trusting_builder(ca_pem: &str) -> reqwest::ClientBuilder {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("add CA");
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder().tls_backend_preconfigured(tls)
}
