//! An ingress controller with SSL passthrough, as ingress-nginx runs it
//! for Cozystack's tenant apiservers (`--enable-ssl-passthrough` and the
//! Ingress annotation `nginx.ingress.kubernetes.io/ssl-passthrough: "true"`):
//! it reads the server name of each TLS ClientHello and forwards the
//! connection, bytes untouched, to the backend Service of the Ingress whose
//! rule names that host, so TLS ends at the tenant apiserver and the
//! certificate a client sees is the apiserver's.
//!
//! What it copies: only Ingresses of its class (`spec.ingressClassName`;
//! one without a class when it is the default class) with the passthrough
//! annotation are served; the first rule whose `host` equals the SNI name
//! wins, its backend is `service.name`/`port.number` in the Ingress's
//! namespace. A connection nothing matches is closed, as ingress-nginx
//! hands it to its own HTTPS server, which has no such host.
//!
//! Left out: plain HTTP, paths (passthrough ignores them), wildcard hosts,
//! named Service ports, the ingress Service itself (clients connect to
//! [`IngressController::port`] on loopback; a test points the host name
//! there with a resolver override, as DNS would). The backend Service is
//! reached the way a worker reaches it here: through the tenant registry,
//! which maps `<service>.<namespace>.svc:<port>` to the tenant apiserver.
//!
//! Fault injection: [`IngressController::set_refusing`] closes every
//! connection, as an ingress controller that is down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::tenant::TenantClusters;

/// The annotation that asks ingress-nginx for SSL passthrough.
pub const SSL_PASSTHROUGH_ANNOTATION: &str = "nginx.ingress.kubernetes.io/ssl-passthrough";
/// The largest ClientHello read before giving up on a connection.
const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// A running passthrough ingress controller.
pub struct IngressController {
    port: u16,
    refusing: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

struct Routes {
    client: kube::Client,
    tenants: TenantClusters,
    class: String,
    default_class: bool,
}

impl IngressController {
    /// Listens on a free loopback port for Ingresses of `class` (also those
    /// without a class when `default_class`) in the management cluster of
    /// `client`.
    pub async fn start(
        client: kube::Client,
        tenants: TenantClusters,
        class: &str,
        default_class: bool,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("bind the ingress controller")?;
        let port = listener.local_addr()?.port();
        let refusing = Arc::new(AtomicBool::new(false));
        let routes = Arc::new(Routes {
            client,
            tenants,
            class: class.to_string(),
            default_class,
        });
        let task = tokio::spawn({
            let refusing = refusing.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    if refusing.load(Ordering::Relaxed) {
                        continue;
                    }
                    let routes = routes.clone();
                    tokio::spawn(async move {
                        if let Err(error) = routes.serve(stream).await {
                            tracing::debug!(
                                error = format!("{error:#}"),
                                "ingress connection closed"
                            );
                        }
                    });
                }
            }
        });
        Ok(Self {
            port,
            refusing,
            task,
        })
    }

    /// The loopback port it listens on (the ingress Service's 443).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes every new connection while set.
    pub fn set_refusing(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::Relaxed);
    }
}

impl Drop for IngressController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Routes {
    async fn serve(&self, mut client: TcpStream) -> anyhow::Result<()> {
        let (hello, server_name) = read_client_hello(&mut client).await?;
        let backend = self
            .backend_of(&server_name)
            .await?
            .with_context(|| format!("no passthrough Ingress for host {server_name}"))?;
        let tenant = self
            .tenants
            .by_endpoint(&backend)
            .with_context(|| format!("nothing answers at Service {backend}"))?;
        let target = tenant
            .endpoint
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let mut upstream = TcpStream::connect(&target)
            .await
            .with_context(|| format!("connect {target}"))?;
        upstream.write_all(&hello).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        Ok(())
    }

    /// `<service>.<namespace>.svc:<port>` of the Ingress rule for `host`.
    async fn backend_of(&self, host: &str) -> anyhow::Result<Option<String>> {
        let ingresses = Api::<Ingress>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .context("list Ingresses")?;
        for ingress in ingresses {
            let annotations: BTreeMap<String, String> =
                ingress.metadata.annotations.clone().unwrap_or_default();
            if annotations
                .get(SSL_PASSTHROUGH_ANNOTATION)
                .map(String::as_str)
                != Some("true")
            {
                continue;
            }
            let Some(spec) = &ingress.spec else { continue };
            let ours = match spec.ingress_class_name.as_deref() {
                Some(class) => class == self.class,
                None => self.default_class,
            };
            if !ours {
                continue;
            }
            let namespace = ingress.metadata.namespace.clone().unwrap_or_default();
            for rule in spec.rules.iter().flatten() {
                if rule.host.as_deref() != Some(host) {
                    continue;
                }
                let service = rule
                    .http
                    .as_ref()
                    .and_then(|http| http.paths.first())
                    .and_then(|path| path.backend.service.as_ref());
                if let Some(service) = service
                    && let Some(port) = service.port.as_ref().and_then(|p| p.number)
                {
                    return Ok(Some(format!("{}.{namespace}.svc:{port}", service.name)));
                }
            }
        }
        Ok(None)
    }
}

/// Reads a TLS ClientHello off `stream` without answering it: the bytes
/// read (to replay to the backend) and the server name it asks for.
async fn read_client_hello(stream: &mut TcpStream) -> anyhow::Result<(Vec<u8>, String)> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await?;
        anyhow::ensure!(read > 0, "closed before a ClientHello");
        seen.extend_from_slice(&chunk[..read]);
        anyhow::ensure!(seen.len() <= MAX_CLIENT_HELLO, "ClientHello too large");
        let mut unread = &chunk[..read];
        while !unread.is_empty() {
            acceptor.read_tls(&mut unread)?;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let name = accepted
                    .client_hello()
                    .server_name()
                    .context("ClientHello without a server name")?
                    .to_string();
                return Ok((seen, name));
            }
            Ok(None) => continue,
            Err((error, _)) => return Err(anyhow::anyhow!("not a TLS ClientHello: {error}")),
        }
    }
}
