//! Proxmox VE API client: the one place in tenantry that builds PVE URLs and
//! parses PVE JSON.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tenantry_provider::proxmox::client::*;
//!
//! let credentials = Credentials::parse("capmox@pve!capi", "5e1c7a56-…")?;
//! let config = ClientConfig::new(ApiUrl::parse("https://pve.example:8006")?, credentials)
//!     .with_tls(TlsVerification::HypervisorCa { pem: std::fs::read_to_string("pve-root-ca.pem")? });
//! let client = ProxmoxClient::new(config)?;
//!
//! let upid = client
//!     .qemu("pve1", 9000)
//!     .clone_to(&CloneParams::new(105).name("worker-a").pool("tenant-a").full(true))
//!     .await?;
//! client.wait_for_task(&upid).await?;
//! # Ok(()) }
//! ```
//!
//! Requests are form-urlencoded (see [`ProxmoxClient`]); responses are the
//! `{"data": …}` envelope, decoded leniently (`serde_helpers`). Errors are
//! classified from what PVE says ([`error::classify`]). Each request is logged
//! at debug level with method, path, status and duration — never headers —
//! and counted in `tenantry_proxmox_api_*` (`metrics::proxmox`).

mod access;
mod agent;
mod auth;
mod cluster;
mod config;
pub mod error;
mod pools;
mod qemu;
mod serde_helpers;
mod storage;
mod task;
mod types;
mod upid;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, RequestBuilder};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use access::AccessApi;
pub use agent::AgentApi;
pub use auth::{Credentials, CredentialsError, TokenId, TokenSecret};
pub use cluster::{ClusterApi, NodeApi, TaskSummary};
pub use config::{ApiUrl, ClientConfig, ConfigError, TlsVerification};
pub use error::{ProxmoxError, Result, classify};
pub use pools::{PoolUpdate, PoolsApi};
pub use qemu::{
    CloneParams, DeleteParams, DiskFormat, DiskSize, QemuApi, ShutdownParams, VmConfigUpdate,
};
pub use storage::StorageApi;
pub use task::{TaskExit, TaskOutcome, TaskState, TaskStatus, TaskWaitConfig};
pub use types::*;
pub use upid::{Upid, UpidParseError};

/// A PVE API client. Cheap to clone (one shared connection pool).
///
/// Request bodies are `application/x-www-form-urlencoded`. PVE accepts JSON
/// too, but its API schema is string-based — every parameter is validated
/// from its text form, booleans documented as `0`/`1`, lists as
/// comma-separated strings — and forms are what its web GUI sends, so
/// they are the encoding every PVE release handles identically. GET and
/// DELETE carry their parameters in the query (PVE answers a body on them
/// with 501).
#[derive(Clone)]
pub struct ProxmoxClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    base: ApiUrl,
    token_id: TokenId,
    authorization: HeaderValue,
    tls: TlsVerification,
    tasks: TaskWaitConfig,
}

impl fmt::Debug for ProxmoxClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Deliberately no `authorization` and no reqwest internals.
        f.debug_struct("ProxmoxClient")
            .field("url", &self.inner.base)
            .field("token_id", &self.inner.token_id)
            .field("tls", &self.inner.tls)
            .finish_non_exhaustive()
    }
}

/// `{"data": …}`, plus `total` which paged endpoints (task logs) add.
#[derive(serde::Deserialize)]
struct Envelope<T> {
    data: T,
    #[serde(default, deserialize_with = "serde_helpers::opt_number")]
    total: Option<u64>,
}

/// No query parameters.
#[derive(Serialize)]
pub(crate) struct NoParams;

impl ProxmoxClient {
    pub fn new(config: ClientConfig) -> Result<Self, ConfigError> {
        let tls = config::rustls_config(&config.tls)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            // Reason phrases (PVE's error texts) exist only in HTTP/1.1.
            .http1_only()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(concat!("tenantry/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ConfigError::HttpClient)?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base: config.url,
                authorization: config.credentials.authorization_header(),
                token_id: config.credentials.token_id,
                tls: config.tls,
                tasks: config.tasks,
            }),
        })
    }

    /// The normalised API root (`https://host:8006/api2/json`).
    pub fn url(&self) -> &ApiUrl {
        &self.inner.base
    }

    /// The token this client authenticates with.
    pub fn token_id(&self) -> &TokenId {
        &self.inner.token_id
    }

    /// `GET /version`: also the connectivity and credentials probe.
    pub async fn version(&self) -> Result<Version> {
        self.get("/version", &NoParams).await
    }

    /// `GET /nodes`.
    pub async fn nodes(&self) -> Result<Vec<NodeSummary>> {
        self.get("/nodes", &NoParams).await
    }

    /// Cluster-wide endpoints: resources, next free vmid.
    pub fn cluster(&self) -> ClusterApi<'_> {
        ClusterApi::new(self)
    }

    /// Endpoints of one node.
    pub fn node(&self, node: &str) -> NodeApi<'_> {
        NodeApi::new(self, node)
    }

    /// One QEMU VM (or template) on a node.
    pub fn qemu(&self, node: &str, vmid: u32) -> QemuApi<'_> {
        QemuApi::new(self, node, vmid)
    }

    /// One storage as seen from a node.
    pub fn storage(&self, node: &str, storage: &str) -> StorageApi<'_> {
        StorageApi::new(self, node, storage)
    }

    /// Resource pools.
    pub fn pools(&self) -> PoolsApi<'_> {
        PoolsApi::new(self)
    }

    /// ACLs and effective permissions.
    pub fn access(&self) -> AccessApi<'_> {
        AccessApi::new(self)
    }

    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &impl Serialize,
    ) -> Result<T> {
        let (data, _) = self.get_with_total(path, query).await?;
        Ok(data)
    }

    /// A GET whose envelope carries `total` next to `data`. A read is
    /// retried a few times within the call when PVE or the way to it
    /// hiccups (see [`is_worth_retrying_at_once`]): a single 503 from a busy
    /// pveproxy should not cost a whole reconcile and its backoff. Writes are
    /// never retried here: whether a refused POST had an effect is for the
    /// caller's next reconcile to find out.
    pub(crate) async fn get_with_total<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &impl Serialize,
    ) -> Result<(T, Option<u64>)> {
        (|| self.send(Method::GET, path, |r| r.query(query)))
            .retry(read_retries())
            .when(is_worth_retrying_at_once)
            .notify(|error, pause| {
                tracing::debug!(path, ?pause, %error, "PVE API read failed; retrying");
            })
            .await
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        form: &impl Serialize,
    ) -> Result<T> {
        Ok(self.send(Method::POST, path, |r| r.form(form)).await?.0)
    }

    pub(crate) async fn put<T: DeserializeOwned>(
        &self,
        path: &str,
        form: &impl Serialize,
    ) -> Result<T> {
        Ok(self.send(Method::PUT, path, |r| r.form(form)).await?.0)
    }

    pub(crate) async fn delete<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &impl Serialize,
    ) -> Result<T> {
        Ok(self.send(Method::DELETE, path, |r| r.query(query)).await?.0)
    }

    pub(crate) async fn post_multipart<T: DeserializeOwned>(
        &self,
        path: &str,
        form: reqwest::multipart::Form,
    ) -> Result<T> {
        Ok(self
            .send(Method::POST, path, |r| r.multipart(form))
            .await?
            .0)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        build: impl FnOnce(RequestBuilder) -> RequestBuilder,
    ) -> Result<(T, Option<u64>)> {
        let url = self.inner.base.join(path);
        let request = build(self.inner.http.request(method.clone(), url))
            .header(AUTHORIZATION, self.inner.authorization.clone());
        let started = Instant::now();
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                let took = started.elapsed();
                crate::metrics::global()
                    .proxmox
                    .request(method.as_str(), path, None, took);
                tracing::debug!(
                    %method, path, elapsed_ms = took.as_millis() as u64, %error,
                    "PVE API request failed"
                );
                return Err(error::transport_error(error));
            }
        };
        let status = response.status();
        // hyper keeps a non-canonical reason phrase — where PVE puts its
        // error text — as a response extension, and reqwest passes it on.
        let reason = response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned());
        let body = response.bytes().await;
        crate::metrics::global().proxmox.request(
            method.as_str(),
            path,
            Some(status.as_u16()),
            started.elapsed(),
        );
        tracing::debug!(
            %method, path, status = status.as_u16(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "PVE API request"
        );
        let body = body.map_err(error::transport_error)?;
        decode_response(path, status.as_u16(), reason.as_deref(), &body)
    }
}

/// The pauses between tries of one read: two more tries within about a
/// second, jittered so that many machines hitting one outage spread out.
fn read_retries() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(1))
        .with_max_times(2)
        .with_jitter()
}

/// A read is tried again at once when PVE answered "unavailable" (a 5xx
/// it marks as passing) or the connection failed before a request was
/// sent. A timed-out read is not: it already waited its full timeout.
fn is_worth_retrying_at_once(error: &ProxmoxError) -> bool {
    match error {
        ProxmoxError::Unavailable { .. } => true,
        ProxmoxError::Transport(transport) => transport.is_connect(),
        _ => false,
    }
}

/// What a PVE answer means, as every call of the client reads it: a status
/// outside 2xx is the error [`classify`] makes of it; a 2xx body is the
/// `{"data": …}` envelope, giving its `data` as `T` and the `total` paged
/// endpoints add. Pure, and public for the fuzz targets (`fuzz/`), which feed
/// it arbitrary bodies.
#[allow(
    clippy::result_large_err,
    reason = "ProxmoxError is what every client call returns; see `Result`"
)]
pub fn decode_response<T: DeserializeOwned>(
    path: &str,
    status: u16,
    reason_phrase: Option<&str>,
    body: &[u8],
) -> Result<(T, Option<u64>)> {
    if !(200..300).contains(&status) {
        return Err(classify(status, reason_phrase, body));
    }
    let envelope: Envelope<T> = serde_json::from_slice(body).map_err(|e| ProxmoxError::Decode {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    Ok((envelope.data, envelope.total))
}

/// An API path from raw segments, each percent-encoded as one path segment
/// (node names, storage ids, UPIDs — whose `:`, `@` and `!` are legal in a
/// segment and stay as they are).
pub(crate) fn api_path(segments: &[&str]) -> String {
    let mut path = String::new();
    for segment in segments {
        path.push('/');
        encode_segment(segment, &mut path);
    }
    path
}

/// Percent-encodes everything outside RFC 3986 `pchar`.
fn encode_segment(segment: &str, out: &mut String) {
    for byte in segment.bytes() {
        let keep = byte.is_ascii_alphanumeric()
            || matches!(
                byte,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        if keep {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// A volume id such as `local:iso/user-data-105.iso` as the trailing part of
/// a path: PVE's router takes the rest of the path as the volume, so its `/`
/// stays a slash (pve-storage's own GUI sends it that way).
pub(crate) fn api_path_with_volume(segments: &[&str], volid: &str) -> String {
    let mut path = api_path(segments);
    for part in volid.split('/') {
        path.push('/');
        encode_segment(part, &mut path);
    }
    path
}

#[cfg(test)]
pub(crate) mod test_support {
    /// A bare reqwest client (built with our ring config: reqwest has no
    /// default crypto provider with `rustls-no-provider`).
    fn http() -> reqwest::Client {
        let tls = super::config::rustls_config(&super::TlsVerification::Insecure).unwrap();
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .build()
            .unwrap()
    }

    /// How reqwest form-encodes a request body.
    pub(crate) fn form_body<T: serde::Serialize>(value: &T) -> String {
        let request = http()
            .post("https://pve.invalid/")
            .form(value)
            .build()
            .unwrap();
        String::from_utf8(request.body().unwrap().as_bytes().unwrap().to_vec()).unwrap()
    }

    /// How reqwest query-encodes parameters.
    pub(crate) fn query_string<T: serde::Serialize>(value: &T) -> String {
        let request = http()
            .get("https://pve.invalid/")
            .query(value)
            .build()
            .unwrap();
        request.url().query().unwrap_or_default().to_owned()
    }

    pub(crate) fn client() -> super::ProxmoxClient {
        let credentials = super::Credentials::parse("tenantry@pve!capi", SECRET).unwrap();
        let config = super::ClientConfig::new(
            super::ApiUrl::parse("https://pve.invalid:8006").unwrap(),
            credentials,
        );
        super::ProxmoxClient::new(config).unwrap()
    }

    pub(crate) const SECRET: &str = "0b5fa8cd-9c3e-4d53-a1e2-7f00c0ffee42";
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn config_debug_never_shows_the_secret() {
        let credentials = Credentials::parse("tenantry@pve!capi", SECRET).unwrap();
        let config = ClientConfig::new(
            ApiUrl::parse("https://pve.invalid:8006").unwrap(),
            credentials,
        );
        let debug = format!("{config:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn client_debug_never_shows_the_secret() {
        let client = client();
        for debug in [format!("{client:?}"), format!("{client:#?}")] {
            assert!(!debug.contains(SECRET), "{debug}");
            assert!(!debug.contains("PVEAPIToken"), "{debug}");
            assert!(debug.contains("tenantry@pve!capi"), "{debug}");
        }
    }

    #[test]
    fn client_exposes_its_normalised_url_and_token() {
        let client = client();
        assert_eq!(client.url().as_str(), "https://pve.invalid:8006/api2/json");
        assert_eq!(client.token_id().to_string(), "tenantry@pve!capi");
    }

    #[test]
    fn insecure_and_ca_clients_build() {
        let credentials = Credentials::parse("tenantry@pve!capi", SECRET).unwrap();
        let url = ApiUrl::parse("https://pve.invalid:8006").unwrap();
        let client = ProxmoxClient::new(
            ClientConfig::new(url, credentials).with_tls(TlsVerification::Insecure),
        )
        .unwrap();
        assert!(format!("{client:?}").contains("Insecure"));
    }

    #[test]
    fn path_segments_are_encoded_but_upids_stay_readable() {
        assert_eq!(
            api_path(&[
                "nodes",
                "pve1",
                "tasks",
                "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:tenantry@pve!capi:",
                "status"
            ]),
            "/nodes/pve1/tasks/UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:tenantry@pve!capi:/status"
        );
        assert_eq!(api_path(&["pools", "a b/c"]), "/pools/a%20b%2Fc");
        assert_eq!(api_path(&["x", "ü%"]), "/x/%C3%BC%25");
    }

    #[test]
    fn volume_ids_keep_their_slash() {
        assert_eq!(
            api_path_with_volume(
                &["nodes", "pve1", "storage", "local", "content"],
                "local:iso/user-data-105.iso"
            ),
            "/nodes/pve1/storage/local/content/local:iso/user-data-105.iso"
        );
    }

    #[test]
    fn no_params_encode_to_nothing() {
        assert_eq!(query_string(&NoParams), "");
        assert_eq!(form_body(&NoParams), "");
    }

    #[test]
    fn responses_decode_as_envelopes_or_classified_errors() {
        let (data, total): (Vec<u32>, _) =
            decode_response("/x", 200, None, br#"{"data":[1],"total":1}"#).unwrap();
        assert_eq!((data, total), (vec![1], Some(1)));
        let error = decode_response::<u32>("/x", 200, None, br#"{"data":"x"}"#).unwrap_err();
        assert!(matches!(&error, ProxmoxError::Decode { path, .. } if path == "/x"));
        let error = decode_response::<u32>("/x", 500, Some("no such VM ('105')"), b"").unwrap_err();
        assert!(error.is_not_found(), "{error:?}");
    }

    #[test]
    fn envelopes_decode_data_and_total() {
        let envelope: Envelope<Vec<u32>> =
            serde_json::from_str(r#"{"data":[1,2],"total":"17"}"#).unwrap();
        assert_eq!(envelope.data, [1, 2]);
        assert_eq!(envelope.total, Some(17));
        let envelope: Envelope<Option<Upid>> = serde_json::from_str(r#"{"data":null}"#).unwrap();
        assert!(envelope.data.is_none());
        let envelope: Envelope<()> = serde_json::from_str(r#"{"data":null}"#).unwrap();
        assert_eq!(envelope.total, None);
    }
}
