//! A tenant cluster published as the platform publishes it, end to end on
//! what the platform runs (Cluster API v1.10, KamajiControlPlane v1alpha1):
//! the tenant namespace carries the platform's domain and ingress class, the
//! `Kubernetes` object names no host, and tenantry derives
//! `kubernetes-<name>.<tenant domain>`. Kamaji (simulated) turns the
//! KamajiControlPlane's `network.ingress` into an Ingress, and an
//! SSL-passthrough ingress controller (simulated, as ingress-nginx with
//! `--enable-ssl-passthrough`) routes the host to the real tenant
//! kube-apiserver. A user's view is checked: the Ingress, the names on the
//! certificate the tenant apiserver serves through it (the host, the
//! Service's DNS names and its ClusterIP), and `admin.conf` reaching the
//! tenant by the host name it claims, resolved to the ingress as DNS would.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tenantry_api::tenant::Kubernetes;
use tenantry_e2e::cluster_api::ClusterApiRelease;
use tenantry_e2e::sim::tenant::{KamajiApi, TenantControlPlaneOptions};
use tenantry_e2e::{World, wait};
use x509_parser::extensions::{GeneralName, ParsedExtension};

const NAMESPACE: &str = "tenant-a";
const NAME: &str = "demo";
const TENANT_DOMAIN: &str = "a.example.org";
const INGRESS_CLASS: &str = "tenant-a";
const HOST: &str = "kubernetes-demo.a.example.org";
/// Generous upper bound for a step; never the thing measured.
const DEADLINE: Duration = Duration::from_secs(240);

async fn start() -> World {
    let world = World::builder("management")
        .cluster_api_release(ClusterApiRelease::V1_10)
        .kamaji(TenantControlPlaneOptions {
            api: KamajiApi::V1alpha1,
            ..Default::default()
        })
        .kamaji_waits_for_data_stores()
        .etcd()
        .ingress_controller(INGRESS_CLASS, false)
        .tenantry()
        .webhooks()
        .start()
        .await;
    // The platform records each tenant's domain and ingress class on its
    // namespace.
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {
            "name": NAMESPACE,
            "annotations": {
                "namespace.cozystack.io/host": TENANT_DOMAIN,
                "namespace.cozystack.io/ingress": INGRESS_CLASS,
            },
        },
    }))
    .expect("namespace");
    Api::<Namespace>::all(world.client())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the tenant namespace");
    world
}

fn fail(world: &World, error: anyhow::Error) -> ! {
    panic!("{error:#}\n{}", world.diagnostics())
}

/// The tenant CA and the client credentials of a kubeconfig, and its
/// server URL.
struct Kubeconfig {
    server: String,
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Kubeconfig {
    fn parse(text: &str) -> Self {
        let config: Value = serde_norway::from_str(text).expect("kubeconfig YAML");
        let decode = |value: &Value| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(value.as_str().expect("base64 field"))
                    .expect("base64"),
            )
            .expect("PEM")
        };
        let cluster = &config["clusters"][0]["cluster"];
        let user = &config["users"][0]["user"];
        Self {
            server: cluster["server"].as_str().expect("server").to_string(),
            ca_pem: decode(&cluster["certificate-authority-data"]),
            cert_pem: decode(&user["client-certificate-data"]),
            key_pem: decode(&user["client-key-data"]),
        }
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("add CA");
        }
        roots
    }

    fn tls(&self, client_auth: bool) -> rustls::ClientConfig {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(self.roots());
        if !client_auth {
            return builder.with_no_client_auth();
        }
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("client certificate");
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("client key");
        builder
            .with_client_auth_cert(chain, key)
            .expect("client credentials")
    }
}

async fn admin_kubeconfigs(world: &World) -> std::collections::BTreeMap<String, String> {
    let secret = Api::<Secret>::namespaced(world.client(), NAMESPACE)
        .get("kubernetes-demo-admin-kubeconfig")
        .await
        .expect("admin kubeconfig Secret");
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).expect("UTF-8 kubeconfig")))
        .collect()
}

/// The SANs (DNS names and IP addresses, as text) of the certificate the
/// tenant apiserver serves to a client asking for `server_name` through the
/// ingress, verified against the tenant CA for that name.
async fn served_sans(
    ingress_port: u16,
    server_name: &str,
    kubeconfig: &Kubeconfig,
) -> anyhow::Result<BTreeSet<String>> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(kubeconfig.tls(false)));
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", ingress_port)).await?;
    let name = ServerName::try_from(server_name.to_string())?;
    let tls = connector.connect(name, stream).await?;
    let (_, connection) = tls.get_ref();
    let leaf = connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or_else(|| anyhow::anyhow!("no certificate served"))?;
    let (_, certificate) = x509_parser::parse_x509_certificate(leaf.as_ref())?;
    let mut sans = BTreeSet::new();
    for extension in certificate.extensions() {
        if let ParsedExtension::SubjectAlternativeName(names) = extension.parsed_extension() {
            for name in &names.general_names {
                match name {
                    GeneralName::DNSName(dns) => {
                        sans.insert(dns.to_string());
                    }
                    GeneralName::IPAddress(bytes) if bytes.len() == 4 => {
                        let octets: [u8; 4] = (*bytes).try_into().expect("4 bytes");
                        sans.insert(std::net::Ipv4Addr::from(octets).to_string());
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(sans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_apiserver_is_published_on_its_host_through_an_ssl_passthrough_ingress() {
    let world = start().await;
    let kubernetes: Kubernetes = serde_json::from_value(json!({
        "apiVersion": "apps.tenantry.dev/v1alpha1",
        "kind": "Kubernetes",
        "metadata": { "name": NAME, "namespace": NAMESPACE },
        "spec": {},
    }))
    .expect("object");
    let objects: Api<Kubernetes> = Api::namespaced(world.client(), NAMESPACE);
    objects
        .create(&PostParams::default(), &kubernetes)
        .await
        .expect("create Kubernetes");

    // The Ingress Kamaji writes from what tenantry renders.
    let ingresses: Api<Ingress> = Api::namespaced(world.client(), NAMESPACE);
    let ingress = wait::until("the tenant's Ingress", DEADLINE, || {
        let ingresses = ingresses.clone();
        async move { Ok(ingresses.get_opt("kubernetes-demo").await?) }
    })
    .await
    .unwrap_or_else(|e| fail(&world, e));
    let spec = ingress.spec.clone().expect("Ingress spec");
    assert_eq!(spec.ingress_class_name.as_deref(), Some(INGRESS_CLASS));
    let rule = &spec.rules.as_deref().expect("rules")[0];
    assert_eq!(rule.host.as_deref(), Some(HOST));
    let backend = rule.http.as_ref().expect("http").paths[0]
        .backend
        .service
        .clone()
        .expect("a Service backend");
    assert_eq!(backend.name, "kubernetes-demo");
    assert_eq!(backend.port.and_then(|p| p.number), Some(6443));
    assert_eq!(
        ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("nginx.ingress.kubernetes.io/ssl-passthrough"))
            .map(String::as_str),
        Some("true")
    );

    // Ready, and published under the host.
    let endpoint = format!("https://{HOST}:443");
    wait::until("the cluster Ready at its host", DEADLINE, || {
        let objects = objects.clone();
        let endpoint = endpoint.clone();
        async move {
            let object = objects.get(NAME).await?;
            let status = object.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_deref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let published = status.and_then(|s| s.endpoint.as_deref()) == Some(endpoint.as_str());
            Ok((ready && published).then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| fail(&world, e));

    let kubeconfigs = admin_kubeconfigs(&world).await;
    let admin = Kubeconfig::parse(&kubeconfigs["admin.conf"]);
    assert_eq!(admin.server, endpoint, "admin.conf names the external host");
    let in_cluster = Kubeconfig::parse(&kubeconfigs["super-admin.svc"]);
    assert_eq!(
        in_cluster.server, "https://kubernetes-demo.tenant-a.svc:6443",
        "super-admin.svc names the Service"
    );

    // The certificate the tenant apiserver serves through the ingress
    // names the host, the Service's DNS names and, once allocated and
    // rendered, its ClusterIP.
    let service_ip = Api::<Service>::namespaced(world.client(), NAMESPACE)
        .get("kubernetes-demo")
        .await
        .expect("the control plane Service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP");
    let port = world.ingress().port();
    let expected: BTreeSet<String> = [
        HOST,
        "kubernetes-demo.tenant-a.svc",
        "kubernetes-demo.tenant-a.svc.cluster.local",
        service_ip.as_str(),
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    let sans = wait::until(
        "the served certificate to carry the platform's names",
        DEADLINE,
        || {
            let admin = &admin;
            let expected = &expected;
            async move {
                // Connection errors while Kamaji rolls the apiserver are
                // waited out; a certificate without the names too.
                Ok(served_sans(port, HOST, admin)
                    .await
                    .ok()
                    .filter(|sans| sans.is_superset(expected)))
            }
        },
    )
    .await
    .unwrap_or_else(|e| fail(&world, e));
    assert!(sans.is_superset(&expected), "served SANs: {sans:?}");

    // admin.conf, used as written: its server's name resolved to the
    // ingress (as DNS does), TLS verified for that name, the client
    // certificate accepted by the tenant apiserver.
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(admin.tls(true))
        .resolve(HOST, ([127, 0, 0, 1], port).into())
        .no_proxy()
        .build()
        .expect("HTTP client");
    let version: Value = http
        .get(format!("{}/version", admin.server))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("GET /version through the host")
        .json()
        .await
        .expect("version JSON");
    assert!(
        version["gitVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.35.")),
        "the tenant answers {version}"
    );
    let namespaces: Value = http
        .get(format!("{}/api/v1/namespaces/kube-system", admin.server))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("the admin reads kube-system through the host")
        .json()
        .await
        .expect("namespace JSON");
    assert_eq!(namespaces["metadata"]["name"], "kube-system");

    // A name no Ingress routes reaches nothing.
    assert!(
        served_sans(port, "kubernetes-other.a.example.org", &admin)
            .await
            .is_err(),
        "the ingress routed a host it does not publish"
    );

    // Deleting the cluster takes the Ingress with it.
    objects
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete Kubernetes");
    wait::until("the Ingress to go", DEADLINE, || {
        let ingresses = ingresses.clone();
        async move {
            Ok(ingresses
                .get_opt("kubernetes-demo")
                .await?
                .is_none()
                .then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| fail(&world, e));
}
