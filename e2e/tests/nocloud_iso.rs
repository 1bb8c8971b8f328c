//! The NoCloud seed tenantry renders, read back by code that shares nothing
//! with the writer: the PVE simulator's own ISO 9660 reader and NoCloud
//! parsers, then a simulated guest that boots from the uploaded ISO and
//! reports its static addresses through the guest agent.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tenantry_e2e::sim::proxmox::{PveSimConfig, PveSimulator, cloud_init, iso9660};
use tenantry_e2e::wait;
use tenantry_provider::proxmox::client::{
    ApiUrl, ClientConfig, Credentials, GuestInterface, ProxmoxClient, ProxmoxError, TaskWaitConfig,
    TlsVerification, Upid, VmConfigUpdate,
};
use tenantry_provider::proxmox::nocloud::{
    Ipv4Static, Ipv6Static, MacAddress, NetworkDevice, NoCloudSeed, Route, UserData, iso_file_name,
};

const NODE: &str = "pve";
const DEADLINE: Duration = Duration::from_secs(30);

/// A Talos worker config in shape; the token stands in for its secrets.
const TALOS_CONFIG: &str = "version: v1alpha1\n\
                            debug: false\n\
                            machine:\n  type: worker\n  token: abcdef.0123456789abcdef\n";

fn dual_stack(mac: MacAddress) -> NetworkDevice {
    NetworkDevice {
        ipv4: Some(Ipv4Static {
            address: "10.10.0.50".parse().unwrap(),
            prefix: 24,
            gateway: Some("10.10.0.1".parse().unwrap()),
            metric: Some(100),
        }),
        ipv6: Some(Ipv6Static {
            address: "2001:db8:10::50".parse().unwrap(),
            prefix: 64,
            gateway: Some("fe80::1".parse().unwrap()),
            metric: None,
        }),
        dns_servers: vec!["10.10.0.2".parse().unwrap()],
        ..NetworkDevice::new("eth0", mac)
    }
}

fn storage_network(mac: MacAddress) -> NetworkDevice {
    NetworkDevice {
        ipv4: Some(Ipv4Static {
            address: "192.168.50.50".parse().unwrap(),
            prefix: 24,
            gateway: None,
            metric: None,
        }),
        routes: vec![Route {
            destination: "192.168.0.0".parse().unwrap(),
            prefix: 16,
            via: "192.168.50.1".parse().unwrap(),
            metric: None,
        }],
        mtu: Some(9000),
        ..NetworkDevice::new("eth1", mac)
    }
}

fn seed(instance_id: &str, macs: [MacAddress; 2], user_data: &[u8]) -> NoCloudSeed {
    NoCloudSeed {
        instance_id: instance_id.to_string(),
        hostname: "tenant-a-workers-x2k4q".into(),
        provider_id: Some(format!("proxmox://{instance_id}")),
        network: vec![dual_stack(macs[0]), storage_network(macs[1])],
        user_data: UserData::new(user_data),
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn seed_iso_round_trips_through_the_simulators_reader() {
    let macs = [
        "BC:24:11:00:00:01".parse().unwrap(),
        "BC:24:11:00:00:02".parse().unwrap(),
    ];
    // Not UTF-8 at the end: the reader must hand back exactly these bytes.
    let mut user_data = TALOS_CONFIG.as_bytes().to_vec();
    user_data.extend_from_slice(b"# \xff\xfe\r\n");
    let rendered = seed("8d5e7c1a-0b2f-4c3d-9e8f-7a6b5c4d3e2f", macs, &user_data)
        .render()
        .expect("seed renders");

    let image = iso9660::parse(rendered.image.as_bytes()).expect("a valid ISO 9660 image");
    assert_eq!(image.label(), "cidata");
    assert_eq!(image.volume_id, "cidata");
    assert_eq!(image.joliet_volume_id.as_deref(), Some("cidata"));
    assert_eq!(
        image.files.keys().map(String::as_str).collect::<Vec<_>>(),
        ["meta-data", "network-config", "user-data"]
    );
    assert_eq!(image.file("user-data"), Some(user_data.as_slice()));
    assert_eq!(image.file("meta-data"), Some(rendered.meta_data.as_bytes()));
    assert_eq!(
        image.file("network-config"),
        Some(rendered.network_config.as_bytes())
    );

    let meta = cloud_init::parse_meta_data(&image.file_text("meta-data").unwrap());
    assert_eq!(
        meta.instance_id.as_deref(),
        Some("8d5e7c1a-0b2f-4c3d-9e8f-7a6b5c4d3e2f")
    );
    assert_eq!(
        meta.local_hostname.as_deref(),
        Some("tenant-a-workers-x2k4q")
    );

    let network = cloud_init::parse_network_config(&image.file_text("network-config").unwrap())
        .expect("network-config parses");
    assert_eq!(network.version, 2);
    // Matched by MAC whatever the kernel calls the NIC.
    let eth0 = network.for_nic("bc:24:11:00:00:01", "ens18").expect("eth0");
    assert_eq!(eth0.set_name.as_deref(), Some("eth0"));
    assert_eq!(
        eth0.addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["10.10.0.50/24", "2001:db8:10::50/64"]
    );
    assert_eq!(eth0.gateways, [ip("10.10.0.1"), ip("fe80::1")]);
    let eth1 = network.for_nic("BC:24:11:00:00:02", "ens19").expect("eth1");
    assert_eq!(eth1.addresses[0].to_string(), "192.168.50.50/24");
    assert!(
        eth1.gateways.is_empty(),
        "a plain route is no default gateway"
    );
}

#[test]
fn the_same_seed_renders_to_the_same_image() {
    let macs = [
        "bc:24:11:00:00:01".parse().unwrap(),
        "bc:24:11:00:00:02".parse().unwrap(),
    ];
    let input = seed("instance-1", macs, TALOS_CONFIG.as_bytes());
    let first = input.render().unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let second = input.render().unwrap();
    assert_eq!(first.image.as_bytes(), second.image.as_bytes());
}

// ------------------------------------------------------------ guest boot

fn quick_tasks() -> TaskWaitConfig {
    TaskWaitConfig {
        initial_interval: Duration::from_millis(20),
        max_interval: Duration::from_millis(200),
        timeout: DEADLINE,
        ..TaskWaitConfig::default()
    }
}

fn root_client(sim: &PveSimulator) -> ProxmoxClient {
    let token = sim.root_token();
    let credentials = Credentials::parse(&token.id, &token.secret).expect("valid token");
    let url = ApiUrl::parse(sim.url().as_str()).expect("simulator URL");
    let config = ClientConfig::new(url, credentials)
        .with_tls(TlsVerification::HypervisorCa {
            pem: sim.ca_pem().to_string(),
        })
        .with_task_wait(quick_tasks());
    ProxmoxClient::new(config).expect("client builds")
}

/// The client has no endpoint to create a VM from scratch (tenantry only
/// clones), so the test creates one as `qm create` would.
async fn create_vm(sim: &PveSimulator, vmid: u32) -> Upid {
    let http = tenantry_e2e::pki::http_trusting(sim.ca_pem());
    let response = http
        .post(format!("{}nodes/{NODE}/qemu", sim.api_url()))
        .header("Authorization", sim.root_token().authorization())
        .json(&json!({
            "vmid": vmid, "name": format!("worker-{vmid}"), "cores": 2, "memory": 2048,
            "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:8",
            "net0": "virtio,bridge=vmbr0", "net1": "virtio,bridge=vmbr0", "agent": 1,
        }))
        .send()
        .await
        .expect("create request");
    assert!(response.status().is_success(), "{response:?}");
    let body: Value = response.json().await.expect("JSON body");
    body["data"]
        .as_str()
        .expect("a UPID")
        .parse()
        .expect("a valid UPID")
}

fn interface_with_mac<'a>(
    interfaces: &'a [GuestInterface],
    mac: &MacAddress,
) -> &'a GuestInterface {
    interfaces
        .iter()
        .find(|i| {
            i.mac
                .as_deref()
                .is_some_and(|m| m.eq_ignore_ascii_case(&mac.to_string()))
        })
        .unwrap_or_else(|| panic!("no interface with MAC {mac}: {interfaces:?}"))
}

fn has_address(interface: &GuestInterface, address: &str, prefix: u8) -> bool {
    interface
        .addresses
        .iter()
        .any(|a| a.ip == ip(address) && a.prefix == prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_booted_from_the_uploaded_seed_reports_its_static_addresses() {
    let sim = PveSimulator::start(PveSimConfig::for_tests())
        .await
        .expect("simulator starts");
    let pve = root_client(&sim);
    let vmid = 120;
    pve.wait_for_task(&create_vm(&sim, vmid).await)
        .await
        .expect("VM created");
    let vm = pve.qemu(NODE, vmid);

    // What the reconciler observes: the SMBIOS uuid and the MACs PVE chose.
    let config = vm.config().await.expect("VM config");
    let uuid = config.smbios_uuid().expect("SMBIOS uuid").to_string();
    let macs: Vec<MacAddress> = config
        .network_devices()
        .into_iter()
        .map(|(_, nic)| nic.mac.expect("PVE assigned a MAC").parse().unwrap())
        .collect();
    let rendered = seed(&uuid, [macs[0], macs[1]], TALOS_CONFIG.as_bytes())
        .render()
        .expect("seed renders");

    let file_name = iso_file_name("0f8e2d4c-6b1a-4e3f-9d7c-5a4b3c2d1e0f").unwrap();
    let storage = pve.storage(NODE, "local");
    let upload = storage
        .upload_iso(&file_name, rendered.image.clone().into_bytes())
        .await
        .expect("upload accepted");
    pve.wait_for_task(&upload).await.expect("upload finishes");
    let volid = storage.iso_volume_id(&file_name);
    assert_eq!(
        volid,
        "local:iso/tenantry-0f8e2d4c-6b1a-4e3f-9d7c-5a4b3c2d1e0f.iso"
    );

    let attach = VmConfigUpdate::new()
        .set("ide2", format!("{volid},media=cdrom"))
        .set("boot", "order=scsi0;ide2");
    let upid = vm.update_config(&attach).await.expect("config accepted");
    pve.wait_for_task(&upid).await.expect("ISO attached");
    let upid = vm.start().await.expect("start accepted");
    pve.wait_for_task(&upid).await.expect("VM started");

    let vm_ref = &vm;
    let interfaces = wait::until("the guest agent answers", DEADLINE, || async move {
        match vm_ref.agent().network_interfaces().await {
            Ok(interfaces) => Ok(Some(interfaces)),
            Err(ProxmoxError::GuestAgentNotRunning { .. }) => Ok(None),
            Err(other) => Err(other.into()),
        }
    })
    .await
    .expect("guest agent reports interfaces");

    let eth0 = interface_with_mac(&interfaces, &macs[0]);
    assert_eq!(eth0.name, "eth0");
    assert!(has_address(eth0, "10.10.0.50", 24), "{eth0:?}");
    assert!(has_address(eth0, "2001:db8:10::50", 64), "{eth0:?}");
    let eth1 = interface_with_mac(&interfaces, &macs[1]);
    assert_eq!(eth1.name, "eth1");
    assert!(has_address(eth1, "192.168.50.50", 24), "{eth1:?}");

    // The guest read this seed, identified itself by the VM's uuid, and saw
    // the machine config unchanged.
    let snapshot = sim.snapshot();
    let seed_read = snapshot
        .vm(vmid)
        .and_then(|vm| vm.seed_read.clone())
        .expect("the guest read a seed");
    assert_eq!(seed_read.volid, volid);
    assert_eq!(seed_read.label, "cidata");
    assert_eq!(seed_read.user_data, TALOS_CONFIG);
    assert_eq!(seed_read.meta_data, rendered.meta_data);
    assert_eq!(seed_read.network_error, None);
    assert!(
        seed_read
            .meta_data
            .contains(&format!("instance-id: \"{uuid}\"")),
        "{}",
        seed_read.meta_data
    );
}
