use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;

use rcgen::PublicKeyData as _;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519};

use super::x509::*;
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
    let PrivateKeyDer::Pkcs8(pkcs8) = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap()
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
    let back = KeyPair::try_from(&PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8))).unwrap();
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
