//! What can go wrong talking to PVE, classified from what PVE says.
//!
//! PVE reports an API error as an HTTP status plus a human message. The
//! message is the response's reason phrase (first line only), e.g.
//! `HTTP/1.1 500 Configuration file 'nodes/pve1/qemu-server/105.conf' does not exist`;
//! since pve-http-server's fix for #6503 the JSON body also carries it as
//! `"message"` (with a trailing newline). Parameter errors come as
//! `400 Parameter verification failed.` with a per-parameter `"errors"` map.
//! PVE has no error codes, so — like every PVE client — we match on message
//! texts; the texts matched here are the ones PVE's Perl code dies with.
//! [`classify`] is pure so every text can be unit-tested.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::serde_helpers::value_to_string;
use super::upid::Upid;

/// Result of a PVE API call.
pub type Result<T, E = ProxmoxError> = std::result::Result<T, E>;

/// An error from the PVE API or from talking to it.
///
/// Each variant knows whether it is transient ([`ProxmoxError::is_transient`]:
/// requeue with backoff) or needs a human ([`ProxmoxError::needs_human`]:
/// set a condition, emit an event, back off slowly). [`ProxmoxError::reason`]
/// gives a CamelCase name for condition reasons and metric labels.
#[derive(Debug, thiserror::Error)]
pub enum ProxmoxError {
    /// The VM, storage, volume, pool, task or config file does not exist
    /// ("Configuration file 'nodes/pve1/qemu-server/105.conf' does not exist",
    /// "no such VM ('105')", "no such task", HTTP 404).
    #[error("not found: {message}")]
    NotFound { message: String },

    /// The object to create is already there ("VM 105 already exists",
    /// "unable to create VM 105 - config file already exists").
    #[error("already exists: {message}")]
    AlreadyExists { message: String },

    /// The token lacks a privilege: `403 Permission check failed (<path>, <priv>)`.
    /// `privilege` may list alternatives joined with `|` (PVE's `check_any`);
    /// both are `None` when PVE gave no path (`raise_perm_exc()` without argument).
    #[error("permission denied: {message}")]
    PermissionDenied {
        path: Option<String>,
        privilege: Option<String>,
        message: String,
    },

    /// `400 Parameter verification failed.`: per-parameter messages.
    #[error("parameter verification failed: {}", format_param_errors(.errors))]
    ParameterVerification { errors: BTreeMap<String, String> },

    /// The VM has an agent configured but it does not answer (yet): the guest
    /// is booting or the agent is not installed.
    #[error("guest agent not running: {message}")]
    GuestAgentNotRunning { message: String },

    /// The VM's config has no `agent: 1`; only a template change fixes that.
    #[error("guest agent not configured: {message}")]
    GuestAgentNotConfigured { message: String },

    /// An operation needs a running VM ("VM 105 not running").
    #[error("VM not running: {message}")]
    VmNotRunning { vmid: Option<u32>, message: String },

    /// An operation needs a stopped VM ("VM 105 is running - destroy failed").
    #[error("VM running: {message}")]
    VmRunning { vmid: Option<u32>, message: String },

    /// The VM is locked by a running operation ("VM is locked (clone)"), or
    /// its config lock could not be taken in time.
    #[error("locked: {message}")]
    Locked {
        lock: Option<String>,
        message: String,
    },

    /// 401: missing, unknown, expired or mistyped API token.
    #[error("unauthorized: {message}")]
    Unauthorized { message: String },

    /// The API or a node behind it is unreachable or overloaded: 502/503/504,
    /// 595/596 (pveproxy could not reach the target node), 500 without a
    /// message, or a cluster-filesystem timeout / lost quorum.
    #[error("Proxmox VE unavailable (HTTP {status}): {message}")]
    Unavailable { status: u16, message: String },

    /// 501: this PVE release has no such method or path.
    #[error("not implemented by this Proxmox VE: {message}")]
    Unsupported { message: String },

    /// Any other refusal with a message a human has to read ("shrinking disks
    /// is not supported", "can't clone VM to node 'pve2' (VM uses local storage)").
    #[error("refused (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },

    /// A task ended with an exit status other than `OK` / `WARNINGS: N`.
    #[error("task {upid} failed: {exit_status}")]
    TaskFailed {
        upid: Upid,
        exit_status: String,
        /// The last lines of the task log, oldest first.
        log_tail: Vec<String>,
    },

    /// A task was still running when the wait deadline passed. The task
    /// itself goes on; poll it again later.
    #[error("task {upid} still running after {waited:?}")]
    TaskTimeout { upid: Upid, waited: Duration },

    /// The server's certificate was refused (unknown CA, wrong name,
    /// expired) or TLS could not be negotiated: the CA or `insecure` setting
    /// is wrong, retrying will not help.
    #[error("TLS: {message}")]
    Tls { message: String },

    /// Connecting, sending or reading failed, or the request timed out.
    #[error("transport: {0}")]
    Transport(#[source] reqwest::Error),

    /// The response is not the JSON shape we expect from this endpoint.
    #[error("unexpected response from {path}: {reason}")]
    Decode { path: String, reason: String },
}

fn format_param_errors(errors: &BTreeMap<String, String>) -> String {
    errors
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ProxmoxError {
    /// Retrying with backoff is expected to succeed eventually without anyone
    /// changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            // A booting guest, a running clone, a VM that is being stopped:
            // all settle by themselves.
            Self::GuestAgentNotRunning { .. }
            | Self::VmNotRunning { .. }
            | Self::VmRunning { .. }
            | Self::Locked { .. }
            | Self::Unavailable { .. }
            | Self::TaskTimeout { .. }
            | Self::Transport(_) => true,
            // The usual cause is two machines racing for the same free vmid;
            // the next attempt picks a fresh one.
            Self::AlreadyExists { .. } => true,
            // A task that died on a lock or cluster-filesystem timeout is worth
            // retrying; one that died on anything else is not.
            Self::TaskFailed { exit_status, .. } => is_transient_message(exit_status),
            Self::NotFound { .. }
            | Self::PermissionDenied { .. }
            | Self::ParameterVerification { .. }
            | Self::GuestAgentNotConfigured { .. }
            | Self::Unauthorized { .. }
            | Self::Unsupported { .. }
            | Self::Rejected { .. }
            | Self::Tls { .. }
            | Self::Decode { .. } => false,
        }
    }

    /// Someone has to change the PVE setup, the token, or the spec.
    pub fn needs_human(&self) -> bool {
        !self.is_transient()
    }

    /// CamelCase name for condition reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::PermissionDenied { .. } => "PermissionDenied",
            Self::ParameterVerification { .. } => "ParameterVerificationFailed",
            Self::GuestAgentNotRunning { .. } => "GuestAgentNotRunning",
            Self::GuestAgentNotConfigured { .. } => "GuestAgentNotConfigured",
            Self::VmNotRunning { .. } => "VirtualMachineNotRunning",
            Self::VmRunning { .. } => "VirtualMachineRunning",
            Self::Locked { .. } => "Locked",
            Self::Unauthorized { .. } => "Unauthorized",
            Self::Unavailable { .. } => "Unavailable",
            Self::Unsupported { .. } => "Unsupported",
            Self::Rejected { .. } => "Rejected",
            Self::TaskFailed { .. } => "TaskFailed",
            Self::TaskTimeout { .. } => "TaskTimeout",
            Self::Tls { .. } => "TLSHandshakeFailed",
            Self::Transport(_) => "TransportError",
            Self::Decode { .. } => "UnexpectedResponse",
        }
    }

    /// The object is gone (or never was): what a deletion waits for.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// The object to create is already there.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Self::AlreadyExists { .. })
    }
}

/// A failed request: TLS refusals apart (they need a human), everything
/// else is transport trouble.
pub(crate) fn transport_error(error: reqwest::Error) -> ProxmoxError {
    match rustls_error(&error) {
        Some(tls) => ProxmoxError::Tls {
            message: tls.to_string(),
        },
        None => ProxmoxError::Transport(error),
    }
}

/// Finds a rustls error in a source chain. hyper-util reports it as an
/// `io::Error` inside an `io::Error`, and `io::Error::source()` skips the
/// error it wraps, so descend through `get_ref` there.
fn rustls_error<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        current = match error.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

/// The JSON body of a PVE error response; every field optional, since 401s
/// have an empty body and releases before the #6503 fix send no `message`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    errors: Option<Value>,
}

/// Classifies a failed PVE response: pure, from the status code, the server's
/// reason phrase (`None` when it was the canonical one or absent, e.g. over
/// HTTP/2 or behind a proxy that rewrites it) and the raw body.
///
/// The body's `message` wins over the reason phrase: it is the full text,
/// while the reason phrase is cut at the first line and is lost behind
/// proxies (capmox #265).
pub fn classify(status: u16, reason_phrase: Option<&str>, body: &[u8]) -> ProxmoxError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let body_message = parsed.message.as_ref().and_then(value_to_string);
    let message = body_message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .or_else(|| reason_phrase.map(str::trim).filter(|m| !m.is_empty()))
        .map(str::to_owned);
    let errors: BTreeMap<String, String> = match parsed.errors {
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    value_to_string(v).unwrap_or_default().trim().to_owned(),
                )
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    let text = message
        .clone()
        .unwrap_or_else(|| canonical_reason(status).to_owned());

    match status {
        401 => return ProxmoxError::Unauthorized { message: text },
        403 => return permission_denied(&text),
        _ => {}
    }
    if let Some(m) = &message
        && m.starts_with("Permission check failed")
    {
        return permission_denied(m);
    }
    // `/cluster/nextid?vmid=N` answers a taken id with a parameter error
    // `{"vmid": "VM N already exists"}`: that is an existence answer.
    if let Some(existing) = errors.values().find(|v| v.contains("already exists")) {
        return ProxmoxError::AlreadyExists {
            message: existing.clone(),
        };
    }
    if status == 400 && !errors.is_empty() {
        return ProxmoxError::ParameterVerification { errors };
    }
    if let Some(m) = &message
        && let Some(error) = classify_message(m)
    {
        return error;
    }
    match status {
        404 => ProxmoxError::NotFound { message: text },
        501 => ProxmoxError::Unsupported { message: text },
        500 if message.is_none() => ProxmoxError::Unavailable {
            status,
            message: text,
        },
        500 if is_transient_message(&text) => ProxmoxError::Unavailable {
            status,
            message: text,
        },
        // 595/596 are pveproxy's own codes for "could not reach the node".
        502..=504 | 595..=599 => ProxmoxError::Unavailable {
            status,
            message: text,
        },
        _ => ProxmoxError::Rejected {
            status,
            message: text,
        },
    }
}

/// Recognises the texts of PVE errors that mean the same thing whatever the
/// HTTP status (also used for task exit statuses).
pub(crate) fn classify_message(message: &str) -> Option<ProxmoxError> {
    let lower = message.to_ascii_lowercase();
    let msg = || message.to_owned();

    // qemu-server's `vm_destroy`: "VM 105 is running - destroy failed".
    if let Some(vmid) = vmid_before(message, " is running") {
        return Some(ProxmoxError::VmRunning {
            vmid,
            message: msg(),
        });
    }
    // PVE::QemuServer::Agent: "QEMU guest agent is not running" /
    // "No QEMU guest agent configured".
    if lower.contains("guest agent is not running") {
        return Some(ProxmoxError::GuestAgentNotRunning { message: msg() });
    }
    if lower.contains("no qemu guest agent configured") {
        return Some(ProxmoxError::GuestAgentNotConfigured { message: msg() });
    }
    // "VM 105 not running" (monitor), "VM 105 is not running" (agent).
    if let Some(vmid) =
        vmid_before(message, " not running").or_else(|| vmid_before(message, " is not running"))
    {
        return Some(ProxmoxError::VmNotRunning {
            vmid,
            message: msg(),
        });
    }
    // PVE::AbstractConfig::check_lock: "VM is locked (clone)".
    if let Some(lock) = locked_reason(message) {
        return Some(ProxmoxError::Locked {
            lock: Some(lock),
            message: msg(),
        });
    }
    // PVE::Tools::lock_file: "can't lock file '/var/lock/qemu-server/lock-105.conf' - got timeout".
    if lower.contains("can't lock file") || lower.contains("cfs-lock") {
        return Some(ProxmoxError::Locked {
            lock: None,
            message: msg(),
        });
    }
    if lower.contains("already exists") {
        return Some(ProxmoxError::AlreadyExists { message: msg() });
    }
    if lower.contains("does not exist")
        || lower.contains("no such ")
        || lower.contains("unable to find configuration file")
    {
        return Some(ProxmoxError::NotFound { message: msg() });
    }
    None
}

/// Messages that describe a passing condition of the cluster rather than a
/// problem with the request.
pub(crate) fn is_transient_message(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "got timeout",
        "timeout",
        "timed out",
        "no quorum",
        "cluster not ready",
        "connection refused",
        "can't lock file",
        "is locked",
        "temporarily unavailable",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

/// `"… VM <vmid><suffix>…"` ⇒ `Some(Some(vmid))`; `"… VM<suffix>"` (no id) is
/// not matched, so "VM is running" without a number does not count.
fn vmid_before(message: &str, suffix: &str) -> Option<Option<u32>> {
    let end = message.find(suffix)?;
    let head = &message[..end];
    // Counted in bytes from the end: the character before the digits may be
    // several bytes long (a reason phrase read lossily holds U+FFFD).
    let digits_start = head.len() - head.bytes().rev().take_while(u8::is_ascii_digit).count();
    let digits = &head[digits_start..];
    let before = &head[..digits_start];
    if digits.is_empty() || !(before.ends_with("VM ") || before.ends_with("CT ")) {
        return None;
    }
    Some(digits.parse().ok())
}

fn locked_reason(message: &str) -> Option<String> {
    let start = message.find("is locked (")? + "is locked (".len();
    let len = message[start..].find(')')?;
    Some(message[start..start + len].to_owned())
}

/// `Permission check failed (/vms/105, VM.Allocate)` ⇒ path and privilege.
fn permission_denied(message: &str) -> ProxmoxError {
    let detail = message
        .strip_prefix("Permission check failed")
        .map(str::trim)
        .and_then(|d| d.strip_prefix('('))
        .and_then(|d| d.strip_suffix(')'));
    let (path, privilege) = match detail.and_then(|d| d.split_once(", ")) {
        Some((path, privilege)) if path.starts_with('/') => {
            (Some(path.to_owned()), Some(privilege.trim().to_owned()))
        }
        _ => (None, None),
    };
    ProxmoxError::PermissionDenied {
        path,
        privilege,
        message: message.to_owned(),
    }
}

fn canonical_reason(status: u16) -> &'static str {
    match status {
        595 => "Errors during connection establishment, proxy handshake",
        596 => "Errors during TLS negotiation, request sending and header processing",
        _ => reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("unknown status"),
    }
}

#[cfg(test)]
mod tests;
