//! The real cert-manager controller and CA injector
//! (`tenantry_e2e::cert_manager`) issue the certificates and inject the CA
//! bundles that Cluster API's components (and tenantry's) ask for in a
//! management cluster. Everything asserted is written by cert-manager, never
//! by the test: the Secret, the Certificate's conditions and revision, the
//! `caBundle` of the webhook configuration and of the CRD, and a TLS
//! handshake proves that the injected bundle verifies the issued serving
//! certificate for the Service's DNS name, as kube-apiserver checks it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tenantry_e2e::cert_manager::CertManager;
use tenantry_e2e::manifests::create_object;
use tenantry_e2e::{World, wait};

const DEADLINE: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "webhook-system";
const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

fn certificates(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate");
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(&gvk, "certificates"),
    )
}

fn issuer(name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": spec,
    })
}

fn certificate(name: &str, issuer: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut spec = spec;
    spec["secretName"] = json!(name);
    spec["issuerRef"] = json!({ "kind": "Issuer", "name": issuer });
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": spec,
    })
}

fn service_dns_name(service: &str) -> String {
    format!("{service}.{NAMESPACE}.svc")
}

/// Waits until cert-manager reports the Certificate `Ready=True` and returns it.
async fn ready_certificate(
    client: &kube::Client,
    name: &str,
    cert_manager: &CertManager,
) -> DynamicObject {
    let api = certificates(client);
    // cert-manager's readiness controller can mark the Certificate Ready from
    // the new Secret before the issuing controller records the revision, so
    // an issued Certificate is one that is both.
    wait::until(
        format!("Certificate {name} Ready and issued"),
        DEADLINE,
        || {
            let api = api.clone();
            async move {
                let certificate = api.get(name).await?;
                let ready = certificate.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let issued = certificate.data["status"]["revision"].is_u64();
                Ok((ready && issued).then_some(certificate))
            }
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", cert_manager.log_tails(40)))
}

/// The Secret a Ready Certificate wrote, with its three keys as bytes.
struct IssuedSecret {
    secret: Secret,
    tls_crt: Vec<u8>,
    tls_key: Vec<u8>,
    ca_crt: Vec<u8>,
}

async fn issued_secret(client: &kube::Client, name: &str) -> IssuedSecret {
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get(name)
        .await
        .unwrap_or_else(|error| panic!("get Secret {name}: {error}"));
    let data = secret.data.clone().unwrap_or_default();
    let key = |k: &str| {
        data.get(k)
            .map(|v| v.0.clone())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| panic!("Secret {name} has no {k}"))
    };
    IssuedSecret {
        tls_crt: key("tls.crt"),
        tls_key: key("tls.key"),
        ca_crt: key("ca.crt"),
        secret,
    }
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A TLS handshake, in memory, between a server presenting `served` and a
/// client trusting only `ca_bundle` and asking for `dns_name`: what
/// kube-apiserver does when it calls a webhook through its Service.
async fn handshake(ca_bundle: &[u8], served: &IssuedSecret, dns_name: &str) -> anyhow::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(&served.tls_crt).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(&served.tls_key)?;
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_bundle) {
        roots.add(certificate?)?;
    }
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = ServerName::try_from(dns_name.to_owned())?;
    let (accepted, connected) = tokio::join!(
        acceptor.accept(server_io),
        connector.connect(name, client_io)
    );
    connected?;
    accepted?;
    Ok(())
}

#[tokio::test]
async fn a_self_signed_certificate_is_issued_and_its_ca_injected() {
    let world = World::builder("cert-manager")
        .without_tenantry_crds()
        .cert_manager()
        .start()
        .await;
    let (client, cert_manager) = (world.client(), world.cert_manager());
    let create = |document: serde_json::Value| {
        let client = client.clone();
        async move {
            create_object(&client, &document, NAMESPACE)
                .await
                .unwrap_or_else(|error| panic!("{error:#}"));
        }
    };
    create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})).await;

    // Cluster API's pattern: a selfSigned Issuer signs each provider's
    // webhook serving certificate, and the CA injector puts that certificate
    // into the webhook configurations that name it.
    let webhook_service = service_dns_name("webhook-service");
    create(issuer("selfsigned-issuer", json!({ "selfSigned": {} }))).await;
    create(certificate(
        "serving-cert",
        "selfsigned-issuer",
        json!({ "dnsNames": [webhook_service, format!("{webhook_service}.cluster.local")] }),
    ))
    .await;
    create(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": "widgets-validating-webhook-configuration",
            "annotations": { INJECT_CA_FROM: format!("{NAMESPACE}/serving-cert") },
        },
        "webhooks": [{
            "name": "validation.widgets.example.tenantry.dev",
            "clientConfig": {
                "service": { "namespace": NAMESPACE, "name": "webhook-service", "path": "/validate" },
            },
            // A group nothing serves, so no request is ever sent to it.
            "rules": [{
                "apiGroups": ["example.tenantry.dev"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["widgets"],
            }],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .await;

    let serving_cert = ready_certificate(&client, "serving-cert", cert_manager).await;
    assert_eq!(serving_cert.data["status"]["revision"], 1, "first issuance");
    let serving = issued_secret(&client, "serving-cert").await;
    assert_eq!(
        serving.ca_crt, serving.tls_crt,
        "a self-signed certificate is its own CA"
    );
    assert_eq!(
        annotation(&serving.secret, "cert-manager.io/certificate-name"),
        Some("serving-cert")
    );
    assert_eq!(
        annotation(&serving.secret, "cert-manager.io/issuer-name"),
        Some("selfsigned-issuer")
    );

    let webhooks = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let injected = wait::until("caBundle injected into the webhook", DEADLINE, || {
        let webhooks = webhooks.clone();
        async move {
            let configuration = webhooks
                .get("widgets-validating-webhook-configuration")
                .await?;
            Ok(configuration
                .webhooks
                .unwrap_or_default()
                .first()
                .and_then(|w| w.client_config.ca_bundle.clone())
                .map(|bundle| bundle.0)
                .filter(|bundle| !bundle.is_empty()))
        }
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", cert_manager.log_tails(40)));
    assert_eq!(injected, serving.ca_crt, "the Secret's ca.crt is injected");
    handshake(&injected, &serving, &webhook_service)
        .await
        .expect("the injected bundle verifies the webhook's serving certificate");

    // A CA chain: the selfSigned Issuer signs a CA certificate, a CA Issuer
    // signs a leaf with it, and a CRD's conversion webhook gets the CA.
    let conversion_service = service_dns_name("conversion-service");
    create(certificate(
        "root-ca",
        "selfsigned-issuer",
        json!({ "isCA": true, "commonName": "tenantry-e2e-root-ca" }),
    ))
    .await;
    create(issuer(
        "ca-issuer",
        json!({ "ca": { "secretName": "root-ca" } }),
    ))
    .await;
    create(certificate(
        "conversion-cert",
        "ca-issuer",
        json!({ "dnsNames": [conversion_service] }),
    ))
    .await;
    let versions: Vec<_> = ["v1alpha1", "v1"]
        .map(|version| {
            json!({
                "name": version, "served": true, "storage": version == "v1",
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } },
            })
        })
        .into();
    create(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "widgets.example.tenantry.dev",
            "annotations": { INJECT_CA_FROM: format!("{NAMESPACE}/conversion-cert") },
        },
        "spec": {
            "group": "example.tenantry.dev",
            "names": { "kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget" },
            "scope": "Namespaced",
            "versions": versions,
            "conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {
                        "service": { "namespace": NAMESPACE, "name": "conversion-service", "path": "/convert" },
                    },
                },
            },
        },
    }))
    .await;

    ready_certificate(&client, "conversion-cert", cert_manager).await;
    let root = issued_secret(&client, "root-ca").await;
    let leaf = issued_secret(&client, "conversion-cert").await;
    assert_eq!(leaf.ca_crt, root.tls_crt, "the leaf's ca.crt is the CA");
    assert_ne!(leaf.tls_crt, root.tls_crt);
    assert_eq!(
        annotation(&leaf.secret, "cert-manager.io/issuer-name"),
        Some("ca-issuer")
    );

    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let injected = wait::until("caBundle injected into the CRD", DEADLINE, || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("widgets.example.tenantry.dev").await?;
            Ok(crd
                .spec
                .conversion
                .and_then(|c| c.webhook)
                .and_then(|w| w.client_config)
                .and_then(|c| c.ca_bundle)
                .map(|bundle| bundle.0)
                .filter(|bundle| !bundle.is_empty()))
        }
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}\n{}", cert_manager.log_tails(40)));
    assert_eq!(injected, root.tls_crt, "the CA is injected into the CRD");
    handshake(&injected, &leaf, &conversion_service)
        .await
        .expect("the injected CA verifies the leaf for the conversion Service");
    handshake(&serving.ca_crt, &leaf, &conversion_service)
        .await
        .expect_err("another CA's bundle does not verify the leaf");
}
