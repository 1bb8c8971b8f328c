//! PVE API answers through `decode_response` (provider/src/proxmox/client/mod.rs),
//! the function every client call decodes with: the `{"data": …}` envelope
//! into the response types of `types.rs`, `task.rs` and `cluster.rs`, and a
//! non-2xx answer through `classify` (`error.rs`).
//!
//! Input: the first byte picks the endpoint (see `KINDS`; seeds use the
//! letters), the rest is the response body. `E` is a failed request: the
//! header line is `E<3-digit status> <reason phrase>`, the body follows the
//! first newline.
//!
//! Invariants: nothing panics; a failed request always decodes to exactly
//! the error `classify` makes, which is either transient or needs a human,
//! has a CamelCase reason and a message, and is `Unauthorized` for 401 and
//! `PermissionDenied` for 403; a 2xx body that does not fit is a `Decode`
//! error; the helper methods of decoded values agree with their fields.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use tenantry_provider::proxmox::client::{
    AclEntry, ClusterResource, NetDevice, NodeStatus, NodeSummary, Permissions, Pool, ProxmoxError,
    ResourceType, StorageContent, StorageSummary, TaskExit, TaskState, TaskStatus, TaskSummary,
    Upid, Version, VmConfig, VmStatus, VmSummary, classify, decode_response,
};

/// Endpoint letters, in the order a non-letter first byte picks them
/// (modulo the count).
const KINDS: &[u8] = b"vnNrqscSCpPatTuUxdkE";

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let kind = if KINDS.contains(&first) {
        first
    } else {
        KINDS[usize::from(first) % KINDS.len()]
    };
    match kind {
        b'v' => {
            if let Some(version) = ok::<Version>("/version", body) {
                let _ = version.major();
            }
        }
        b'n' => {
            for node in ok::<Vec<NodeSummary>>("/nodes", body).unwrap_or_default() {
                assert_eq!(node.is_online(), node.status.as_deref() == Some("online"));
            }
        }
        b'N' => {
            let _ = ok::<NodeStatus>("/nodes/pve1/status", body);
        }
        b'r' => {
            for row in ok::<Vec<ClusterResource>>("/cluster/resources", body).unwrap_or_default() {
                assert_eq!(row.is_vm(), row.resource_type == ResourceType::Qemu);
                check_list(&row.tag_list());
            }
        }
        b'q' => {
            let _ = ok::<Vec<VmSummary>>("/nodes/pve1/qemu", body);
        }
        b's' => {
            if let Some(status) = ok::<VmStatus>("/nodes/pve1/qemu/105/status/current", body) {
                let _ = (status.is_running(), status.is_paused());
            }
        }
        b'c' => {
            if let Some(config) = ok::<VmConfig>("/nodes/pve1/qemu/105/config", body) {
                check_vm_config(&config);
            }
        }
        b'S' => {
            for storage in
                ok::<Vec<StorageSummary>>("/nodes/pve1/storage", body).unwrap_or_default()
            {
                let types = storage.content_types();
                check_list(&types);
                assert!(types.iter().all(|t| storage.holds(t)));
                assert_eq!(storage.is_enabled(), storage.enabled != Some(false));
            }
        }
        b'C' => {
            let _ = ok::<Vec<StorageContent>>("/nodes/pve1/storage/local/content", body);
        }
        b'p' => {
            for pool in ok::<Vec<Pool>>("/pools", body).unwrap_or_default() {
                let vmids = pool.vmids();
                assert!(vmids.len() <= pool.members.len());
                assert!(vmids.iter().all(|&vmid| pool.contains_vm(vmid)));
            }
        }
        b'P' => {
            if let Some(permissions) = ok::<Permissions>("/access/permissions", body) {
                for (path, privileges) in &permissions.0 {
                    assert_eq!(permissions.at(path), Some(privileges));
                    assert!(privileges.keys().all(|p| permissions.has(path, p)));
                }
            }
        }
        b'a' => {
            let _ = ok::<Vec<AclEntry>>("/access/acl", body);
        }
        b't' => {
            if let Some(status) = ok::<TaskStatus>("/nodes/pve1/tasks/x/status", body) {
                check_task_status(&status);
            }
        }
        b'T' => {
            for task in ok::<Vec<TaskSummary>>("/nodes/pve1/tasks", body).unwrap_or_default() {
                assert_eq!(
                    task.is_running(),
                    matches!(task.status.as_deref(), None | Some("running"))
                );
            }
        }
        b'u' => {
            if let Some(upid) = ok::<Upid>("/nodes/pve1/qemu/9000/clone", body) {
                check_upid(&upid);
            }
        }
        b'U' => {
            if let Some(Some(upid)) = ok::<Option<Upid>>("/nodes/pve1/qemu/105/resize", body) {
                check_upid(&upid);
            }
        }
        b'x' => {
            let _ = ok::<serde_json::Value>("/nodes/pve1/qemu/105/config", body);
        }
        b'd' => {
            if let Ok(text) = std::str::from_utf8(body)
                && let Some(device) = NetDevice::parse(text)
            {
                check_net_device(&device);
            }
        }
        b'k' => {
            if let Ok(text) = std::str::from_utf8(body) {
                check_task_exit(text, &TaskExit::parse(text));
            }
        }
        _ => failed_request(body),
    }
});

/// Decodes a 2xx answer; `None` when it does not fit `T`, which must then be
/// a `Decode` error.
fn ok<T: DeserializeOwned>(path: &str, body: &[u8]) -> Option<T> {
    match decode_response::<T>(path, 200, None, body) {
        Ok((data, _total)) => Some(data),
        Err(error) => {
            assert!(
                matches!(&error, ProxmoxError::Decode { path: p, .. } if p == path),
                "{error:?}"
            );
            assert_eq!(error.reason(), "UnexpectedResponse");
            assert!(error.needs_human());
            None
        }
    }
}

/// `E<status> <reason phrase>\n<body>`: a status outside 100..=599 or
/// not written as three digits is taken from the first two bytes instead.
fn failed_request(input: &[u8]) {
    let (header, body) = match input.iter().position(|&b| b == b'\n') {
        Some(end) => (&input[..end], &input[end + 1..]),
        None => (input, &[][..]),
    };
    let digits = header.get(..3).and_then(|d| std::str::from_utf8(d).ok());
    let (status, rest) = match digits.and_then(|d| d.parse::<u16>().ok()) {
        Some(status) if (100..=599).contains(&status) => (status, &header[3..]),
        _ => {
            let raw = u16::from_le_bytes([
                header.first().copied().unwrap_or(0),
                header.get(1).copied().unwrap_or(0),
            ]);
            (100 + raw % 500, header.get(2..).unwrap_or_default())
        }
    };
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    // hyper hands over a non-canonical reason phrase as bytes; the client
    // reads it lossily.
    let reason = (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned());

    let classified = classify(status, reason.as_deref(), body);
    check_error(status, &classified);
    if (200..300).contains(&status) {
        return;
    }
    let Err(decoded) = decode_response::<serde_json::Value>("/x", status, reason.as_deref(), body)
    else {
        panic!("HTTP {status} decoded as a success");
    };
    assert_eq!(decoded.reason(), classified.reason());
    assert_eq!(decoded.to_string(), classified.to_string());
}

fn check_error(status: u16, error: &ProxmoxError) {
    assert_ne!(error.is_transient(), error.needs_human());
    let reason = error.reason();
    assert!(
        reason.starts_with(|c: char| c.is_ascii_uppercase())
            && reason.chars().all(|c| c.is_ascii_alphanumeric()),
        "{reason}"
    );
    assert!(!error.to_string().is_empty());
    match status {
        401 => assert_eq!(reason, "Unauthorized"),
        403 => assert_eq!(reason, "PermissionDenied"),
        _ => {}
    }
}

fn check_list(items: &[String]) {
    for item in items {
        assert!(!item.is_empty());
        assert_eq!(item.trim(), item);
        assert!(!item.contains([';', ',', ' ']), "{item:?}");
    }
}

fn check_vm_config(config: &VmConfig) {
    let _ = (
        config.smbios_uuid(),
        config.agent_enabled(),
        config.get("scsi0"),
    );
    check_list(&config.tag_list());
    let devices = config.network_devices();
    let indices: Vec<u32> = devices
        .iter()
        .map(|(key, _)| {
            key.strip_prefix("net")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{key:?} is no netN key"))
        })
        .collect();
    assert!(indices.is_sorted(), "{indices:?}");
    for (_, device) in &devices {
        check_net_device(device);
    }
}

fn check_net_device(device: &NetDevice) {
    let property = |key: &str| device.properties.get(key).cloned();
    assert_eq!(device.bridge, property("bridge"));
    assert_eq!(device.vlan, property("tag").and_then(|v| v.parse().ok()));
    assert_eq!(device.mtu, property("mtu").and_then(|v| v.parse().ok()));
}

fn check_task_status(status: &TaskStatus) {
    let exit = status.exit();
    assert_eq!(exit.is_some(), status.status == TaskState::Stopped);
    if let Some(exit) = exit {
        check_task_exit(
            status.exitstatus.as_deref().unwrap_or("unexpected status"),
            &exit,
        );
    }
}

fn check_task_exit(text: &str, exit: &TaskExit) {
    match exit {
        TaskExit::Ok => assert_eq!(text.trim(), "OK"),
        TaskExit::Warnings(n) => assert_eq!(
            text.trim()
                .strip_prefix("WARNINGS: ")
                .and_then(|count| count.parse::<u32>().ok()),
            Some(*n)
        ),
        TaskExit::Failed(message) => assert_eq!(message, text.trim()),
    }
    assert_eq!(exit.is_success(), !matches!(exit, TaskExit::Failed(_)));
}

fn check_upid(upid: &Upid) {
    let again: Upid = upid.to_string().parse().expect("a decoded UPID re-parses");
    assert_eq!(&again, upid);
}
