//! Table tests of the provisioning's next step.
use super::*;
use serde_json::json;

fn vm(status: serde_json::Value, config: serde_json::Value) -> VmFacts {
    VmFacts {
        vmid: 120,
        node: "pve1".into(),
        status: serde_json::from_value(status).unwrap(),
        config: serde_json::from_value(config).unwrap(),
    }
}

fn spec(mut value: serde_json::Value) -> ProxmoxMachineSpec {
    value["network"] = json!({ "networkDevices": [] });
    serde_json::from_value(value).unwrap()
}

fn allocated() -> Addresses {
    Addresses::Allocated(vec![DeviceAddress {
        device: "net0".into(),
        address: "10.0.0.10".parse().unwrap(),
        prefix: 24,
        gateway: Some("10.0.0.1".parse().unwrap()),
    }])
}

fn seed(drive: SeedDrive, uploaded: Option<bool>) -> SeedState {
    SeedState {
        storage: "local".into(),
        volid: "local:iso/seed.iso".into(),
        drive,
        uploaded,
    }
}

fn interfaces(ip: &str) -> GuestReport {
    GuestReport::Interfaces(vec![GuestInterface {
        name: "eth0".into(),
        mac: None,
        addresses: vec![crate::proxmox::client::GuestIpAddress {
            ip: ip.parse().unwrap(),
            prefix: 24,
        }],
    }])
}

struct Case {
    name: &'static str,
    spec: serde_json::Value,
    status: serde_json::Value,
    config: serde_json::Value,
    provisioned: bool,
    seed_removed: bool,
    addresses: Addresses,
    retry_after_secs: Option<i64>,
    seed: Option<SeedState>,
    guest: Option<GuestReport>,
    pool_storages: Vec<String>,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            spec: json!({ "sourceNode": "pve1", "templateID": 100 }),
            status: json!({ "status": "stopped" }),
            config: json!({
                "cores": 1,
                "memory": 2048,
                "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
                "smbios1": "uuid=5b0f5c55-8f4d-4d6e-9d4b-0d6a6d0b1a11",
            }),
            provisioned: false,
            seed_removed: false,
            addresses: allocated(),
            retry_after_secs: None,
            seed: None,
            guest: None,
            pool_storages: vec![],
        }
    }
}

fn decide(case: &Case) -> Step {
    let now: Timestamp = "2026-12-06T12:00:00Z".parse().unwrap();
    let spec = spec(case.spec.clone());
    let vm = vm(case.status.clone(), case.config.clone());
    let retry_after = case.retry_after_secs.map(|secs| {
        (
            now + k8s_openapi::jiff::SignedDuration::from_secs(secs),
            Reason::CloningFailed,
            "the clone failed",
        )
    });
    let observed = Observed {
        spec: &spec,
        pool_storages: &case.pool_storages,
        vm: &vm,
        provisioned: case.provisioned,
        seed_removed: case.seed_removed,
        addresses: &case.addresses,
        retry_after,
        seed: case.seed.as_ref(),
        guest: case.guest.as_ref(),
    };
    next_step(&observed, now)
}

fn waits(step: &Step) -> Option<(Reason, Option<Duration>)> {
    match step {
        Step::Wait(wait) => Some((wait.reason, wait.retry)),
        _ => None,
    }
}

#[test]
fn provisioning_goes_configure_seed_start_guest_provisioned_ready() {
    let attached = || Some(seed(SeedDrive::Attached("ide2".into()), None));
    let cases = [
        Case {
            name: "a clone sized differently is configured first",
            spec: json!({ "sourceNode": "pve1", "templateID": 100, "numCores": 4 }),
            ..Case::default()
        },
        Case {
            name: "a configured clone's seed is looked at",
            ..Case::default()
        },
        Case {
            name: "a seed to attach: is it on the storage?",
            seed: Some(seed(SeedDrive::Attach("ide2".into()), None)),
            ..Case::default()
        },
        Case {
            name: "a seed not on the storage is uploaded",
            seed: Some(seed(SeedDrive::Attach("ide2".into()), Some(false))),
            ..Case::default()
        },
        Case {
            name: "an uploaded seed is attached",
            seed: Some(seed(SeedDrive::Attach("ide2".into()), Some(true))),
            ..Case::default()
        },
        Case {
            name: "with the seed attached the VM starts",
            seed: attached(),
            ..Case::default()
        },
        Case {
            name: "a running VM without the agent's word waits for it",
            status: json!({ "status": "running" }),
            guest: Some(GuestReport::NotAnswering),
            ..Case::default()
        },
        Case {
            name: "the guest reporting its address is provisioned",
            status: json!({ "status": "running" }),
            guest: Some(interfaces("10.0.0.10")),
            ..Case::default()
        },
        Case {
            name: "a provisioned machine's seed goes",
            status: json!({ "status": "running" }),
            provisioned: true,
            ..Case::default()
        },
        Case {
            name: "then it is ready",
            status: json!({ "status": "running" }),
            provisioned: true,
            seed_removed: true,
            ..Case::default()
        },
    ];
    let steps: Vec<Step> = cases.iter().map(decide).collect();
    assert!(
        matches!(&steps[0], Step::Configure(update) if !update.is_empty()),
        "{}: {:?}",
        cases[0].name,
        steps[0]
    );
    let expected = [
        None,
        Some(Step::Observe(Need::Seed)),
        Some(Step::Observe(Need::SeedUpload)),
        Some(Step::UploadSeed),
        Some(Step::AttachSeed {
            slot: "ide2".into(),
        }),
        Some(Step::Start),
        None,
        Some(Step::MarkProvisioned),
        Some(Step::RemoveSeed),
        Some(Step::Ready),
    ];
    for ((case, step), expected) in cases.iter().zip(&steps).zip(expected) {
        if let Some(expected) = expected {
            assert_eq!(step, &expected, "{}", case.name);
        }
    }
    assert_eq!(
        waits(&steps[6]),
        Some((Reason::WaitingForGuestAgent, Some(POLL))),
        "{}",
        cases[6].name
    );
}

#[test]
fn waits_say_why_and_when_to_look_again() {
    let cases = [
        (
            Case {
                name: "a locked VM waits for PVE's operation",
                status: json!({ "status": "stopped", "lock": "clone" }),
                ..Case::default()
            },
            (Reason::VmLocked, Some(POLL)),
        ),
        (
            Case {
                name: "no task while retryAfter holds, saying what failed",
                spec: json!({ "sourceNode": "pve1", "templateID": 100, "numCores": 4 }),
                retry_after_secs: Some(10),
                ..Case::default()
            },
            (Reason::CloningFailed, Some(Duration::from_secs(10))),
        ),
        (
            Case {
                name: "a pending claim holds the seed back",
                addresses: Addresses::Pending("claim a-net0 has no address".into()),
                ..Case::default()
            },
            (Reason::WaitingForStaticIp, Some(ADDRESS_RETRY)),
        ),
        (
            Case {
                name: "a failed claim says so",
                addresses: Addresses::Failed("pool exhausted".into()),
                ..Case::default()
            },
            (Reason::IpAllocationFailed, Some(ADDRESS_RETRY)),
        ),
        (
            Case {
                name: "the seed outside the pool's storages is refused",
                spec: json!({ "sourceNode": "pve1", "templateID": 100, "pool": "tenants" }),
                pool_storages: vec!["ceph".into()],
                seed: Some(seed(SeedDrive::Attach("ide2".into()), None)),
                ..Case::default()
            },
            (Reason::StorageOutsidePool, Some(REFUSED_RETRY)),
        ),
        (
            Case {
                name: "no free slot for the seed needs a human",
                seed: Some(seed(SeedDrive::NoFreeSlot, None)),
                ..Case::default()
            },
            (Reason::BootstrapDataFailed, None),
        ),
        (
            Case {
                name: "a running VM without addresses waits for them",
                status: json!({ "status": "running" }),
                addresses: Addresses::Pending("claim a-net0 has no address".into()),
                ..Case::default()
            },
            (Reason::WaitingForStaticIp, Some(POLL)),
        ),
        (
            Case {
                name: "a guest with other addresses is waited for",
                status: json!({ "status": "running" }),
                guest: Some(interfaces("192.168.1.5")),
                ..Case::default()
            },
            (Reason::WaitingForGuestAddresses, Some(POLL)),
        ),
        (
            Case {
                name: "a template without agent needs a human",
                status: json!({ "status": "running" }),
                guest: Some(GuestReport::NotConfigured(
                    "No QEMU guest agent configured".into(),
                )),
                ..Case::default()
            },
            (Reason::GuestAgentNotConfigured, Some(HUMAN_RETRY)),
        ),
        (
            Case {
                name: "a provisioned machine's stopped VM is reported",
                provisioned: true,
                seed_removed: true,
                ..Case::default()
            },
            (Reason::VmNotRunning, Some(STOPPED_RETRY)),
        ),
        (
            Case {
                name: "a provisioned machine's paused VM is reported",
                status: json!({ "status": "running", "qmpstatus": "paused" }),
                provisioned: true,
                seed_removed: true,
                ..Case::default()
            },
            (Reason::VmNotRunning, Some(STOPPED_RETRY)),
        ),
    ];
    for (case, expected) in cases {
        assert_eq!(waits(&decide(&case)), Some(expected), "{}", case.name);
    }
}

#[test]
fn the_guest_is_asked_only_when_its_answer_decides() {
    let skip = Case {
        name: "skipQemuGuestAgent provisions a running VM at once",
        spec: json!({ "sourceNode": "pve1", "templateID": 100, "checks": { "skipQemuGuestAgent": true } }),
        status: json!({ "status": "running" }),
        ..Case::default()
    };
    assert_eq!(decide(&skip), Step::MarkProvisioned, "{}", skip.name);
    let unasked = Case {
        name: "a running VM's guest is asked first",
        status: json!({ "status": "running" }),
        ..Case::default()
    };
    assert_eq!(
        decide(&unasked),
        Step::Observe(Need::Guest),
        "{}",
        unasked.name
    );
}
