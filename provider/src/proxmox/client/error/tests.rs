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
        by_reason(500, "unable to create VM 105 - config file already exists").is_already_exists()
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
