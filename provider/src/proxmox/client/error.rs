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
mod tests {
    use super::*;

    fn body(message: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "data": null, "message": format!("{message}\n") }))
            .unwrap()
    }

    /// The pre-#6503 shape: message only in the reason phrase.
    fn by_reason(status: u16, reason: &str) -> ProxmoxError {
        classify(status, Some(reason), br#"{"data":null}"#)
    }

    #[test]
    fn missing_config_file_is_not_found() {
        let text = "Configuration file 'nodes/pve1/qemu-server/105.conf' does not exist";
        for error in [by_reason(500, text), classify(500, None, &body(text))] {
            assert!(error.is_not_found(), "{error:?}");
            assert!(error.needs_human());
            assert_eq!(error.to_string(), format!("not found: {text}"));
        }
    }

    #[test]
    fn other_not_found_texts() {
        for text in [
            "no such VM ('105')",
            "no such task",
            "storage 'ceph-rbd' does not exist",
            "volume 'local:iso/user-data-105.iso' does not exist",
            "unable to find configuration file for VM 105 on node 'pve1'",
        ] {
            assert!(by_reason(500, text).is_not_found(), "{text}");
        }
        assert!(classify(404, None, b"").is_not_found());
    }

    #[test]
    fn body_message_wins_over_reason_phrase() {
        let error = classify(
            500,
            Some("VM 105 is running - destroy failed"),
            &body("Configuration file 'nodes/pve1/qemu-server/105.conf' does not exist"),
        );
        assert!(error.is_not_found());
    }

    #[test]
    fn permission_denied_carries_path_and_privilege() {
        let error = by_reason(403, "Permission check failed (/vms/105, VM.Allocate)");
        let ProxmoxError::PermissionDenied {
            path,
            privilege,
            message,
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(path.as_deref(), Some("/vms/105"));
        assert_eq!(privilege.as_deref(), Some("VM.Allocate"));
        assert_eq!(message, "Permission check failed (/vms/105, VM.Allocate)");
        assert!(error.needs_human());
        assert_eq!(error.reason(), "PermissionDenied");
    }

    #[test]
    fn permission_denied_any_of_and_without_path() {
        let ProxmoxError::PermissionDenied {
            path, privilege, ..
        } = classify(
            403,
            None,
            &body("Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use|SDN.Audit)"),
        )
        else {
            panic!()
        };
        assert_eq!(path.as_deref(), Some("/sdn/zones/localnetwork/vmbr0"));
        assert_eq!(privilege.as_deref(), Some("SDN.Use|SDN.Audit"));

        for text in [
            "Permission check failed",
            "Permission check failed (user != root@pam)",
            "Permission check failed (pool 'tenant-a' does not exist)",
        ] {
            let error = by_reason(403, text);
            let ProxmoxError::PermissionDenied {
                path: None,
                privilege: None,
                message,
            } = &error
            else {
                panic!("{text}: {error:?}");
            };
            assert_eq!(message, text);
        }
    }

    #[test]
    fn parameter_errors_are_kept_per_parameter() {
        let body = br#"{"data":null,"errors":{"newid":"value must have a minimum value of 100\n","format":"value 'qcow3' does not have a value in the enumeration 'raw, qcow2, vmdk'"},"message":"Parameter verification failed.\n"}"#;
        let error = classify(400, Some("Parameter verification failed."), body);
        let ProxmoxError::ParameterVerification { errors } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(errors["newid"], "value must have a minimum value of 100");
        assert!(errors["format"].starts_with("value 'qcow3'"));
        assert!(error.needs_human());
        assert!(
            error
                .to_string()
                .contains("newid: value must have a minimum value of 100")
        );
    }

    #[test]
    fn taken_vmid_from_nextid_is_already_exists() {
        let body = br#"{"data":null,"errors":{"vmid":"VM 105 already exists"}}"#;
        let error = classify(400, Some("Parameter verification failed."), body);
        assert!(error.is_already_exists(), "{error:?}");
        assert!(error.is_transient());
    }

    #[test]
    fn clone_onto_existing_config_is_already_exists() {
        assert!(
            by_reason(500, "unable to create VM 105 - config file already exists")
                .is_already_exists()
        );
        assert!(by_reason(500, "pool 'tenant-a' already exists").is_already_exists());
    }

    #[test]
    fn destroying_a_running_vm_is_vm_running() {
        let error = by_reason(500, "VM 105 is running - destroy failed");
        let ProxmoxError::VmRunning { vmid, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(*vmid, Some(105));
        assert!(error.is_transient());
    }

    #[test]
    fn guest_agent_texts() {
        let error = by_reason(500, "QEMU guest agent is not running");
        assert!(matches!(error, ProxmoxError::GuestAgentNotRunning { .. }));
        assert!(error.is_transient());

        let error = by_reason(500, "No QEMU guest agent configured");
        assert!(matches!(
            error,
            ProxmoxError::GuestAgentNotConfigured { .. }
        ));
        assert!(error.needs_human());

        for text in ["VM 105 not running", "VM 105 is not running"] {
            let error = by_reason(500, text);
            assert!(
                matches!(
                    error,
                    ProxmoxError::VmNotRunning {
                        vmid: Some(105),
                        ..
                    }
                ),
                "{text}: {error:?}"
            );
        }
    }

    #[test]
    fn non_ascii_before_the_suffix_is_no_vmid_and_no_panic() {
        // Found by fuzz/pve_json: a reason phrase with a byte that is not
        // UTF-8, read lossily, right before " not running".
        let error = classify(595, Some("guest agent is\u{fffd} not running"), b"");
        assert!(error.is_transient(), "{error:?}");
        for text in [
            "VM\u{a0}105 is running",
            "é105 not running",
            "VM 10\u{fffd}5 is running",
        ] {
            let error = by_reason(500, text);
            assert_eq!(error.reason(), "Rejected", "{text}: {error:?}");
        }
        let error = by_reason(500, "VM\u{a0}VM 105 is running");
        assert!(matches!(
            error,
            ProxmoxError::VmRunning {
                vmid: Some(105),
                ..
            }
        ));
    }

    #[test]
    fn locks_are_transient() {
        let error = by_reason(500, "VM is locked (clone)");
        let ProxmoxError::Locked { lock, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(lock.as_deref(), Some("clone"));
        assert!(error.is_transient());

        let error = by_reason(
            500,
            "can't lock file '/var/lock/qemu-server/lock-105.conf' - got timeout",
        );
        assert!(matches!(error, ProxmoxError::Locked { lock: None, .. }));
        assert!(error.is_transient());
    }

    #[test]
    fn bad_token_is_unauthorized_with_empty_body() {
        for reason in [Some("No ticket"), Some("Authentication failed!"), None] {
            let error = classify(401, reason, b"");
            assert!(
                matches!(error, ProxmoxError::Unauthorized { .. }),
                "{error:?}"
            );
            assert!(error.needs_human());
        }
        assert_eq!(
            classify(401, None, b"").to_string(),
            "unauthorized: Unauthorized"
        );
    }

    #[test]
    fn unreachable_nodes_and_bare_500s_are_unavailable() {
        for (status, reason) in [
            (595, Some("Connection refused")),
            (595, None),
            (596, Some("Connection timed out")),
            (502, None),
            (503, Some("Service Unavailable")),
            (500, None),
            (500, Some("cluster not ready - no quorum?")),
            (
                500,
                Some("cfs-lock 'file-user_cfg' error: got lock request timeout"),
            ),
        ] {
            let error = classify(status, reason, b"");
            assert!(error.is_transient(), "{status} {reason:?}: {error:?}");
        }
        let ProxmoxError::Unavailable { status, message } = classify(595, None, b"") else {
            panic!()
        };
        assert_eq!(status, 595);
        assert!(message.starts_with("Errors during connection"));
    }

    #[test]
    fn unknown_method_is_unsupported() {
        let error = by_reason(
            501,
            "Method 'GET /nodes/pve1/qemu/105/bogus' not implemented",
        );
        assert!(matches!(error, ProxmoxError::Unsupported { .. }));
        assert!(error.needs_human());
    }

    #[test]
    fn refusals_with_a_message_need_a_human() {
        for text in [
            "shrinking disks is not supported",
            "can't clone VM to node 'pve2' (VM uses local storage)",
            "parameter 'storage' not allowed for linked clones",
            "can't resize a cdrom",
        ] {
            let error = by_reason(500, text);
            assert!(
                matches!(error, ProxmoxError::Rejected { status: 500, .. }),
                "{text}"
            );
            assert!(error.needs_human(), "{text}");
            assert_eq!(error.to_string(), format!("refused (HTTP 500): {text}"));
        }
    }

    #[test]
    fn non_json_bodies_fall_back_to_the_reason_phrase() {
        let error = classify(
            500,
            Some("VM 105 is running - destroy failed"),
            b"<html>oops</html>",
        );
        assert!(matches!(error, ProxmoxError::VmRunning { .. }));
    }

    #[test]
    fn failed_tasks_are_transient_only_for_passing_conditions() {
        let upid: Upid = "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:"
            .parse()
            .unwrap();
        let failed = |exit: &str| ProxmoxError::TaskFailed {
            upid: upid.clone(),
            exit_status: exit.to_owned(),
            log_tail: vec![],
        };
        assert!(
            failed("can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout")
                .is_transient()
        );
        assert!(failed("clone failed: storage 'local-lvm' does not exist").needs_human());
        assert!(failed("unexpected status").needs_human());
    }

    #[test]
    fn tls_errors_are_found_inside_io_errors() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Connect(#[source] std::io::Error);

        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Connect(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            refused,
        ));
        let found = rustls_error(&wrapped).expect("rustls error in the chain");
        assert!(found.to_string().contains("UnknownIssuer"), "{found}");

        let plain = Connect(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(rustls_error(&plain).is_none());

        let error = ProxmoxError::Tls {
            message: found.to_string(),
        };
        assert!(error.needs_human());
        assert_eq!(error.reason(), "TLSHandshakeFailed");
    }

    #[test]
    fn reasons_are_camel_case() {
        let samples = [
            by_reason(500, "no such VM ('1')"),
            by_reason(403, "Permission check failed"),
            classify(400, None, br#"{"errors":{"a":"b"}}"#),
            by_reason(500, "VM is locked (backup)"),
            classify(503, None, b""),
        ];
        for error in samples {
            let reason = error.reason();
            assert!(reason.chars().next().unwrap().is_ascii_uppercase());
            assert!(
                reason.chars().all(|c| c.is_ascii_alphanumeric()),
                "{reason}"
            );
        }
    }
}
