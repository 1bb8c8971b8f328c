//! The HTTPS side: TLS accept loop, HTTP/1.1 connections (pveproxy speaks
//! no HTTP/2, and reason phrases only exist in HTTP/1), authentication with
//! PVE's delay on failures, request faults, parameter parsing and the JSON
//! envelope with the error message in the reason phrase.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::{Layer, ServiceExt};

use super::auth::{self, AuthError};
use super::config::PveSimConfig;
use super::counters::{CallCounters, UNAUTHENTICATED, UNKNOWN_PATH};
use super::error::ApiError;
use super::faults::{DropMode, FaultPlan, RequestAction, lock};
use super::params::Params;
use super::router::{self, Call, Reply, Resolved};
use super::state::Cluster;
use super::storage::Upload;

/// The API's base path.
pub const BASE_PATH: &str = "/api2/json";
/// Largest request body accepted (uploads included).
const MAX_BODY: usize = 256 * 1024 * 1024;

/// State shared by connections, tasks and the test handle.
pub struct Shared {
    pub cluster: Mutex<Cluster>,
    pub(crate) faults: Mutex<FaultPlan>,
    pub(crate) counters: Mutex<CallCounters>,
    pub config: PveSimConfig,
}

/// A connection-level failure: hyper closes the connection without answer.
#[derive(Debug, thiserror::Error)]
#[error("pve-sim dropped the connection (injected fault)")]
struct DroppedConnection;

pub(crate) fn tls_acceptor(cert_pem: &str, key_pem: &str) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parse serving certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("parse serving key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("TLS serving certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections until `shutdown` flips.
pub(crate) async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "pve-sim accept failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let shared = Arc::downgrade(&shared);
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::debug!(%error, %peer, "pve-sim TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let shared = shared.clone();
                async move {
                    match shared.upgrade() {
                        Some(shared) => handle(shared, request).await,
                        None => Err(DroppedConnection),
                    }
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tls), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, %peer, "pve-sim connection ended");
                    }
                }
                _ = shutdown.changed() => {}
            }
        });
    }
}

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, DroppedConnection> {
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let Some(rel_path) = relative_path(&path) else {
        return Ok(error_response(&ApiError::not_implemented("no such uri")));
    };
    let resolved = router::resolve(&method, &rel_path);
    let template = match &resolved {
        Resolved::Found(route, _) => route.template,
        Resolved::NotImplemented => UNKNOWN_PATH,
    };

    // pveproxy authenticates before it looks at the path.
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let authenticated = {
        let cluster = lock(&shared.cluster);
        auth::authenticate(&cluster.users, authorization.as_deref())
    };
    let authid = match authenticated {
        Ok(authid) => authid,
        Err(error) => {
            lock(&shared.counters).record(UNAUTHENTICATED, &method, template);
            if let AuthError::Failed { reason } = &error {
                tracing::debug!(%reason, %path, "pve-sim authentication failure");
            }
            tokio::time::sleep(shared.config.timings.auth_failure_delay).await;
            return Ok(unauthorized_response(&error));
        }
    };
    lock(&shared.counters).record(&authid, &method, template);

    let faults = lock(&shared.faults).for_request(&method, &rel_path);
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    let mut drop_mid_response = false;
    match faults.action {
        Some(RequestAction::Error { status, message }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Ok(error_response(&ApiError::new(status, message)));
        }
        Some(RequestAction::Drop(DropMode::BeforeResponse)) => {
            tracing::debug!(%method, %path, "pve-sim dropping connection");
            return Err(DroppedConnection);
        }
        Some(RequestAction::Drop(DropMode::MidResponse)) => drop_mid_response = true,
        None => {}
    }

    let Resolved::Found(route, path_params) = resolved else {
        return Ok(error_response(&ApiError::not_implemented(format!(
            "Method '{method} {rel_path}' not implemented"
        ))));
    };

    let mut params = Params::new();
    if let Some(query) = request.uri().query() {
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            params.push_text(&key, &value);
        }
    }

    let (parts, body) = request.into_parts();
    let has_body = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|len| len > 0);
    if has_body && !(parts.method == Method::POST || parts.method == Method::PUT) {
        return Ok(error_response(&ApiError::not_implemented(format!(
            "Unexpected content for method '{method}'"
        ))));
    }
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();

    let mut upload = None;
    if route.is_upload() {
        // pveproxy checks the upload privilege before it reads the body.
        let storage = path_params
            .iter()
            .find(|(k, _)| *k == "storage")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let allowed = {
            let cluster = lock(&shared.cluster);
            super::permissions::Perms::new(&cluster.users, &authid).check(
                &format!("/storage/{storage}"),
                &["Datastore.AllocateTemplate"],
            )
        };
        if let Err(error) = allowed {
            return Ok(error_response(&error));
        }
        match read_multipart(Request::from_parts(parts, Body::new(body)), &mut params).await {
            Ok(file) => upload = file,
            Err(error) => return Ok(error_response(&error)),
        }
    } else if has_body || parts.headers.contains_key(header::TRANSFER_ENCODING) {
        let bytes = match axum::body::to_bytes(Body::new(body), MAX_BODY).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return Ok(error_response(&ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body too large",
                )));
            }
        };
        if let Err(error) = parse_body(&content_type, &bytes, &mut params) {
            return Ok(error_response(&error));
        }
    }
    for (name, value) in path_params {
        params.set(name, value);
    }

    let result = {
        let mut cluster = lock(&shared.cluster);
        let node_ok = if route.proxied_to_node() {
            cluster
                .check_node(params.str("node").unwrap_or_default())
                .map(|_| ())
        } else {
            Ok(())
        };
        node_ok.and_then(|()| {
            let mut call = Call {
                shared: &shared,
                cluster: &mut cluster,
                authid: &authid,
                params,
                upload,
            };
            (route.handler)(&mut call)
        })
    };
    let response = match result {
        Ok(reply) => success_response(reply),
        Err(error) => {
            tracing::debug!(%method, %path, %error, "pve-sim call failed");
            error_response(&error)
        }
    };
    Ok(if drop_mid_response {
        truncate_body(response).await
    } else {
        response
    })
}

fn relative_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix(BASE_PATH)?;
    if rest.is_empty() {
        return Some("/".into());
    }
    if !rest.starts_with('/') {
        return None;
    }
    // Collapse duplicate slashes as pveproxy's URI split does.
    let mut collapsed = String::new();
    for segment in rest.split('/').filter(|s| !s.is_empty()) {
        collapsed.push('/');
        collapsed.push_str(segment);
    }
    Some(if collapsed.is_empty() {
        "/".into()
    } else {
        collapsed
    })
}

fn parse_body(content_type: &str, bytes: &Bytes, params: &mut Params) -> Result<(), ApiError> {
    if bytes.is_empty() {
        return Ok(());
    }
    if content_type.starts_with("application/json") {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, format!("JSON decode error: {e}"))
        })?;
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    params.push_json(&key, value);
                }
                Ok(())
            }
            Value::Null => Ok(()),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "JSON body must be an object",
            )),
        }
    } else {
        // pveproxy treats any other body as form-urlencoded.
        let mut body_params = Params::new();
        for (key, value) in url::form_urlencoded::parse(bytes) {
            body_params.push_text(&key, &value);
        }
        for key in body_params.keys().map(str::to_string).collect::<Vec<_>>() {
            if !params.contains(&key) {
                for value in body_params.array(&key) {
                    params.push_text(&key, &value);
                }
            }
        }
        Ok(())
    }
}

/// Reads a `multipart/form-data` upload: text fields become parameters,
/// the part named `filename` is the file (its file name the `filename`).
async fn read_multipart(
    request: Request<Body>,
    params: &mut Params,
) -> Result<Option<Upload>, ApiError> {
    let limit = axum::extract::DefaultBodyLimit::max(MAX_BODY);
    let extract = limit.layer(tower::service_fn(|request: Request<Body>| async move {
        Ok::<_, Infallible>(Multipart::from_request(request, &()).await)
    }));
    let mut multipart = match extract.oneshot(request).await {
        Ok(Ok(multipart)) => multipart,
        Ok(Err(rejection)) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("multipart: {rejection}"),
            ));
        }
        Err(never) => match never {},
    };
    let bad = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("multipart: {e}"))
    };
    let mut upload = None;
    while let Some(field) = multipart.next_field().await.map_err(bad)? {
        let name = field.name().unwrap_or_default().to_string();
        if name == "filename" {
            let file_name = field.file_name().unwrap_or_default().to_string();
            let data = field.bytes().await.map_err(bad)?;
            params.set("filename", file_name.clone());
            upload = Some(Upload {
                file_name,
                data: data.to_vec(),
            });
        } else {
            let value = field.text().await.map_err(bad)?;
            params.set(&name, value);
        }
    }
    Ok(upload)
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json;charset=UTF-8"),
    );
    response
}

fn success_response(reply: Reply) -> Response<Body> {
    let mut body = json!({ "data": reply.data });
    if let Some(total) = reply.total {
        body["total"] = json!(total);
    }
    json_response(StatusCode::OK, &body)
}

/// An error as pveproxy writes it: status, first message line as reason
/// phrase, `{"data":null,"message":…}` body, connection closed afterwards.
pub(crate) fn error_response(error: &ApiError) -> Response<Body> {
    let mut body = json!({ "data": null, "message": error.message });
    if !error.errors.is_empty() {
        body["errors"] = json!(error.errors);
    }
    let mut response = json_response(error.status, &body);
    set_reason(&mut response, error.reason());
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn unauthorized_response(error: &AuthError) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    set_reason(&mut response, &error.to_string());
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn set_reason(response: &mut Response<Body>, reason: &str) {
    let printable: String = reason
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .collect();
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(printable) {
        response.extensions_mut().insert(phrase);
    }
}

/// Sends the status line, headers (with the full length) and half of the
/// body, then fails the body so hyper aborts the connection.
async fn truncate_body(response: Response<Body>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    let half = bytes.slice(..bytes.len() / 2);
    let stream = futures::stream::iter(vec![
        Ok::<Bytes, std::io::Error>(half),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "pve-sim: injected mid-response drop",
        )),
    ]);
    let mut response = Response::from_parts(parts, Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_LENGTH,
        HeaderValue::from_str(&bytes.len().to_string()).expect("valid header"),
    );
    response
}
