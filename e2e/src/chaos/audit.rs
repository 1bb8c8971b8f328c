//! kube-apiserver's audit log of writes, read to see who wrote what and
//! when: with every tenantry replica authenticating as a user of its own,
//! it shows whether any replica wrote while another held the leader Lease.
//!
//! The log is kube-apiserver's own (`--audit-policy-file`,
//! `--audit-log-path`, JSON lines, one event per request at the
//! `ResponseComplete` stage), so it survives the replicas it judges.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;

/// Writes only, at `Metadata` level (who, what, when, the answer), and
/// nothing else: reads would make the log large without telling anything.
const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
";

/// The audit log of one control plane: its policy and its file, in a
/// folder of their own made before the control plane starts.
pub(crate) struct AuditLog {
    dir: tempfile::TempDir,
}

impl AuditLog {
    pub(crate) fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tenantry-chaos-audit-")
            .tempdir()
            .context("make the audit log folder")?;
        std::fs::write(dir.path().join("policy.yaml"), POLICY).context("write the audit policy")?;
        Ok(Self { dir })
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// kube-apiserver's flags for this log (the blocking backend: an event
    /// is written before the response goes out).
    pub(crate) fn apiserver_args(&self) -> Vec<String> {
        vec![
            format!(
                "--audit-policy-file={}",
                self.dir.path().join("policy.yaml").display()
            ),
            format!("--audit-log-path={}", self.path().display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ]
    }

    /// The writes recorded so far, in the order they completed.
    pub(crate) fn writes(&self) -> anyhow::Result<Vec<Write>> {
        let text = std::fs::read_to_string(self.path()).context("read the audit log")?;
        let mut writes = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let event: Event = serde_json::from_str(line)
                .with_context(|| format!("parse an audit event: {line}"))?;
            writes.push(Write {
                user: event.user.username,
                verb: event.verb,
                resource: event.object_ref.resource,
                subresource: event.object_ref.subresource,
                name: event.object_ref.name,
                code: event.response_status.map_or(0, |s| s.code),
                received: event.request_received_timestamp,
                completed: event.stage_timestamp,
            });
        }
        writes.sort_by_key(|w| w.completed);
        Ok(writes)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    user: UserInfo,
    verb: String,
    #[serde(default)]
    object_ref: ObjectRef,
    response_status: Option<ResponseStatus>,
    request_received_timestamp: DateTime<Utc>,
    stage_timestamp: DateTime<Utc>,
}

#[derive(Deserialize)]
struct UserInfo {
    #[serde(default)]
    username: String,
}

#[derive(Default, Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

/// One write request as the apiserver saw it.
#[derive(Clone, Debug)]
pub(crate) struct Write {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
    /// The HTTP status it was answered with.
    pub code: u16,
    pub received: DateTime<Utc>,
    pub completed: DateTime<Utc>,
}

impl Write {
    fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    fn describe(&self) -> String {
        format!(
            "{} {} {}{} {} at {} ({})",
            self.user,
            self.verb,
            self.resource,
            self.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            self.name.as_deref().unwrap_or(""),
            self.received.format("%H:%M:%S%.3f"),
            self.code
        )
    }
}

/// Who wrote while leading, and who did not.
#[derive(Debug, Default)]
pub(crate) struct Leadership {
    /// Writes (other than to the Lease) per replica user.
    pub writes_per_user: BTreeMap<String, usize>,
    /// Writes a replica sent while the Lease was another's, or nobody's.
    pub by_non_leaders: Vec<String>,
    /// How often the Lease went to another replica.
    pub changes: usize,
}

/// Judges the writes of the replica users (`user_prefix*`): the holder of
/// the Lease `lease` at a moment is the replica whose last successful write
/// to it completed before that moment (a replica writes the Lease only to
/// take or renew it while the other still holds it fails). Every other
/// write of a replica must come from the holder of that moment.
pub(crate) fn leadership(writes: &[Write], lease: &str, user_prefix: &str) -> Leadership {
    let lease_writes: Vec<&Write> = writes
        .iter()
        .filter(|w| {
            w.user.starts_with(user_prefix)
                && w.resource == "leases"
                && w.name.as_deref() == Some(lease)
                && w.succeeded()
        })
        .collect();
    let holder_at = |moment: DateTime<Utc>| {
        lease_writes
            .iter()
            .take_while(|w| w.completed <= moment)
            .last()
            .map(|w| w.user.as_str())
    };
    let mut result = Leadership::default();
    let mut last: Option<&str> = None;
    for write in &lease_writes {
        if last.is_some_and(|l| l != write.user) {
            result.changes += 1;
        }
        last = Some(&write.user);
    }
    for write in writes
        .iter()
        .filter(|w| w.user.starts_with(user_prefix) && w.resource != "leases")
    {
        *result
            .writes_per_user
            .entry(write.user.clone())
            .or_default() += 1;
        if holder_at(write.received) != Some(write.user.as_str()) {
            result.by_non_leaders.push(format!(
                "{} while the Lease was {}",
                write.describe(),
                holder_at(write.received).unwrap_or("nobody's")
            ));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(user: &str, resource: &str, at_ms: i64, code: u16) -> Write {
        let at = DateTime::from_timestamp_millis(1_700_000_000_000 + at_ms).unwrap();
        Write {
            user: user.into(),
            verb: "update".into(),
            resource: resource.into(),
            subresource: None,
            name: Some(if resource == "leases" { "lead" } else { "m" }.into()),
            code,
            received: at,
            completed: at,
        }
    }

    #[test]
    fn a_write_while_another_replica_holds_the_lease_is_found() {
        let writes = vec![
            write("r-1", "leases", 0, 200),
            write("r-1", "proxmoxmachines", 10, 200),
            // r-2 tries to take the Lease and is refused: r-1 still leads.
            write("r-2", "leases", 20, 409),
            write("r-2", "proxmoxmachines", 30, 200),
            write("r-2", "leases", 40, 200),
            write("r-2", "proxmoxmachines", 50, 200),
        ];
        let judged = leadership(&writes, "lead", "r-");
        assert_eq!(judged.changes, 1);
        assert_eq!(
            judged.by_non_leaders.len(),
            1,
            "{:?}",
            judged.by_non_leaders
        );
        assert!(judged.by_non_leaders[0].starts_with("r-2 update proxmoxmachines"));
        assert_eq!(judged.writes_per_user["r-1"], 1);
        assert_eq!(judged.writes_per_user["r-2"], 2);
    }

    #[test]
    fn writes_before_any_lease_are_not_a_leaders() {
        let writes = vec![
            write("r-1", "secrets", 0, 201),
            write("r-1", "leases", 5, 201),
        ];
        assert_eq!(leadership(&writes, "lead", "r-").by_non_leaders.len(), 1);
    }

    #[test]
    fn the_policy_parses_as_yaml() {
        let policy: serde_json::Value = serde_norway::from_str(POLICY).unwrap();
        assert_eq!(policy["kind"], "Policy");
    }
}
