//! CAPK's `capk` user in cloud-config bootstrap data, so that the ssh
//! bootstrap check can log in. Pure: bytes in, bytes out.

use serde_norway::{Mapping, Value};

use crate::kubevirt::ssh::SSH_USER;

/// The sudo rule CAPK gives the user: the check itself needs none, but
/// CAPK's users rely on it to debug their nodes with the cluster's key.
const SUDO_RULE: &str = "ALL=(ALL) NOPASSWD:ALL";

/// Why a `#cloud-config` document cannot take the user. Messages name the
/// problem, never the data (it holds cluster secrets).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CloudConfigError {
    #[error("the bootstrap data is not UTF-8")]
    NotUtf8,
    #[error("the bootstrap data has no #cloud-config header line")]
    NoHeader,
    #[error("the bootstrap data is not valid YAML after its #cloud-config header (line {line})")]
    NotYaml { line: usize },
    #[error("the bootstrap data's cloud-config is not a YAML mapping")]
    NotAMapping,
    #[error(
        "the bootstrap data's cloud-config 'users' is neither a list nor a comma-separated string"
    )]
    UnsupportedUsers,
}

/// The data with user `capk` (passwordless sudo, `authorized_key` as its only
/// key) added to the cloud-config's `users`. Users already listed stay, in
/// order; a `capk` entry already there is replaced. Without a `users` list,
/// cloud-init would create its distribution's `default` user, and a list
/// without `default` drops it, so `default` is kept first. The header lines
/// (`## template: jinja` that CABPK writes, then `#cloud-config`) are kept
/// as they were; the document after them is re-emitted as YAML.
pub fn with_capk_user(data: &[u8], authorized_key: &str) -> Result<Vec<u8>, CloudConfigError> {
    let text = std::str::from_utf8(data).map_err(|_| CloudConfigError::NotUtf8)?;
    let (header, body) = split_header(text).ok_or(CloudConfigError::NoHeader)?;
    let document: Value = serde_norway::from_str(body).map_err(|e| CloudConfigError::NotYaml {
        line: e
            .location()
            .map_or(0, |l| l.line() + header.lines().count()),
    })?;
    let mut config = match document {
        Value::Null => Mapping::new(),
        Value::Mapping(mapping) => mapping,
        _ => return Err(CloudConfigError::NotAMapping),
    };
    let mut users = match config.remove("users") {
        None | Some(Value::Null) => vec![Value::String("default".into())],
        Some(Value::Sequence(users)) => users,
        // cloud-init also reads `users: "default, alice"`.
        Some(Value::String(names)) => names
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| Value::String(n.into()))
            .collect(),
        Some(_) => return Err(CloudConfigError::UnsupportedUsers),
    };
    users.retain(|user| user_name(user) != Some(SSH_USER));
    users.push(capk_user(authorized_key));
    config.insert("users".into(), Value::Sequence(users));
    let body = serde_norway::to_string(&Value::Mapping(config)).expect("a YAML mapping serializes");
    Ok(format!("{header}{body}").into_bytes())
}

/// The header lines up to and including `#cloud-config`, and the rest.
fn split_header(text: &str) -> Option<(&str, &str)> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        offset += line.len();
        let trimmed = line.trim();
        if trimmed.starts_with("#cloud-config") {
            return Some(text.split_at(offset));
        }
        // Only blank lines and cloud-init's template marker may come first.
        if !(trimmed.is_empty() || trimmed.starts_with("## template:")) {
            return None;
        }
    }
    None
}

fn user_name(user: &Value) -> Option<&str> {
    match user {
        Value::String(name) => Some(name.as_str()),
        Value::Mapping(fields) => fields.get("name").and_then(Value::as_str),
        _ => None,
    }
}

fn capk_user(authorized_key: &str) -> Value {
    let mut user = Mapping::new();
    user.insert("name".into(), SSH_USER.into());
    user.insert("gecos".into(), "CAPK User".into());
    user.insert("sudo".into(), SUDO_RULE.into());
    user.insert(
        "ssh_authorized_keys".into(),
        Value::Sequence(vec![authorized_key.trim().into()]),
    );
    Value::Mapping(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBk tenantry:ns/demo";

    fn parse(data: &[u8]) -> (String, Value) {
        let text = String::from_utf8(data.to_vec()).unwrap();
        let (header, body) = split_header(&text).unwrap();
        (header.to_string(), serde_norway::from_str(body).unwrap())
    }

    fn names(config: &Value) -> Vec<String> {
        config["users"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|u| user_name(u).unwrap().to_string())
            .collect()
    }

    #[test]
    fn kubeadm_data_gets_the_user_and_keeps_everything_else() {
        // As CABPK writes it: a jinja header, files, commands writing the sentinel.
        let data = "## template: jinja\n#cloud-config\n\nwrite_files:\n-   path: /run/kubeadm/kubeadm-join-config.yaml\n    owner: root:root\n    permissions: '0640'\n    content: |\n      apiVersion: kubeadm.k8s.io/v1beta4\n      kind: JoinConfiguration\n      nodeRegistration:\n        name: '{{ ds.meta_data.local_hostname }}'\nruncmd:\n  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete\n";
        let injected = with_capk_user(data.as_bytes(), KEY).unwrap();
        let (header, config) = parse(&injected);
        assert_eq!(header, "## template: jinja\n#cloud-config\n");
        assert_eq!(names(&config), ["default", "capk"]);
        let capk = &config["users"][1];
        assert_eq!(capk["sudo"], "ALL=(ALL) NOPASSWD:ALL");
        assert_eq!(capk["ssh_authorized_keys"][0], KEY);
        let original: Value =
            serde_norway::from_str(data.split_once("#cloud-config\n").unwrap().1).unwrap();
        assert_eq!(config["write_files"], original["write_files"]);
        assert_eq!(config["runcmd"], original["runcmd"]);
        // The jinja expression is still in the text cloud-init renders.
        assert!(String::from_utf8_lossy(&injected).contains("{{ ds.meta_data.local_hostname }}"));
    }

    #[test]
    fn existing_users_stay_and_an_old_capk_entry_is_replaced() {
        let data = "#cloud-config\nusers:\n  - name: alice\n    groups: users\n  - name: capk\n    ssh_authorized_keys: [ssh-ed25519 OLD]\n  - default\n";
        let (header, config) = parse(&with_capk_user(data.as_bytes(), KEY).unwrap());
        assert_eq!(header, "#cloud-config\n");
        assert_eq!(names(&config), ["alice", "default", "capk"]);
        assert_eq!(config["users"][0]["groups"], "users");
        assert_eq!(config["users"][2]["ssh_authorized_keys"][0], KEY);
    }

    #[test]
    fn a_comma_separated_users_string_becomes_a_list() {
        let data = "#cloud-config\nusers: default, bob\n";
        let (_, config) = parse(&with_capk_user(data.as_bytes(), KEY).unwrap());
        assert_eq!(names(&config), ["default", "bob", "capk"]);
    }

    #[test]
    fn injection_is_stable() {
        // Applied on every reconcile: the same input gives the same bytes,
        // and injecting twice changes nothing more.
        let data = b"#cloud-config\nhostname: n1\nruncmd: [echo hi]\n";
        let once = with_capk_user(data, KEY).unwrap();
        assert_eq!(once, with_capk_user(data, KEY).unwrap());
        assert_eq!(with_capk_user(&once, KEY).unwrap(), once);
    }

    #[test]
    fn an_empty_document_gets_default_and_capk() {
        let (_, config) = parse(&with_capk_user(b"#cloud-config\n", KEY).unwrap());
        assert_eq!(names(&config), ["default", "capk"]);
    }

    #[test]
    fn data_that_cannot_take_the_user_is_refused_with_a_reason() {
        assert_eq!(
            with_capk_user(b"#!/bin/sh\necho hi\n", KEY),
            Err(CloudConfigError::NoHeader)
        );
        assert_eq!(
            with_capk_user(b"#cloud-config\n- a\n- b\n", KEY),
            Err(CloudConfigError::NotAMapping)
        );
        assert_eq!(
            with_capk_user(b"#cloud-config\nusers: {alice: {}}\n", KEY),
            Err(CloudConfigError::UnsupportedUsers)
        );
        assert!(matches!(
            with_capk_user(b"#cloud-config\nruncmd: [\n", KEY),
            Err(CloudConfigError::NotYaml { .. })
        ));
        assert_eq!(
            with_capk_user(&[0xff, 0xfe], KEY),
            Err(CloudConfigError::NotUtf8)
        );
        let secret = b"#cloud-config\ntoken: abcdef.0123456789abcdef\nruncmd: [\n";
        let message = with_capk_user(secret, KEY).unwrap_err().to_string();
        assert!(!message.contains("0123456789abcdef"), "{message}");
    }
}
