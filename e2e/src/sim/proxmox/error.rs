//! API errors as PVE reports them.
//!
//! PVE's HTTP server puts the first line of an error message into the HTTP
//! reason phrase (clients such as go-proxmox match substrings of it) and, since
//! pve-http-server's fix for #6503, also into the JSON body as `message`.
//! Perl `die` messages end in a newline, and so do ours.

use std::collections::BTreeMap;

use http::StatusCode;

/// An error answer of the simulated API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {}", .status.as_u16(), .message.trim_end())]
pub struct ApiError {
    pub status: StatusCode,
    /// The full message, newline-terminated like PVE's.
    pub message: String,
    /// Per-parameter errors of a `400 Parameter verification failed.`.
    pub errors: BTreeMap<String, String>,
}

/// PVE answers 595 when it cannot reach the node a call is proxied to.
pub const NODE_UNREACHABLE: u16 = 595;

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if !message.ends_with('\n') {
            message.push('\n');
        }
        Self {
            status,
            message,
            errors: BTreeMap::new(),
        }
    }

    /// A `die` inside an API handler: HTTP 500 with the message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// `raise_param_exc`: 400 with one message per offending parameter.
    pub fn params<K: Into<String>, V: Into<String>>(
        errors: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let mut error = Self::new(StatusCode::BAD_REQUEST, "Parameter verification failed.");
        error.errors = errors
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        error
    }

    pub fn param(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::params([(name.into(), message.into())])
    }

    /// `raise_perm_exc("$path, $priv")`.
    pub fn permission(path: &str, privileges: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            format!("Permission check failed ({path}, {privileges})"),
        )
    }

    /// `raise_perm_exc()` without detail, as the `or` checks and VM create raise it.
    pub fn permission_denied() -> Self {
        Self::new(StatusCode::FORBIDDEN, "Permission check failed")
    }

    pub fn permission_what(what: impl AsRef<str>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            format!("Permission check failed ({})", what.as_ref()),
        )
    }

    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, message)
    }

    /// The proxy's connect error to an unreachable node (AnyEvent::HTTP
    /// reports it as status 595 with the socket error as reason).
    pub fn node_unreachable() -> Self {
        let status = StatusCode::from_u16(NODE_UNREACHABLE).expect("valid status code");
        Self::new(status, "No route to host")
    }

    /// The first line of the message: what goes into the reason phrase.
    pub fn reason(&self) -> &str {
        self.message.lines().next().unwrap_or_default()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
