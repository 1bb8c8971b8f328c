use super::*;

#[test]
fn version_and_major() {
    let v: Version =
        serde_json::from_str(r#"{"version":"8.2.4","release":"8.2","repoid":"faa83925c9641325"}"#)
            .unwrap();
    assert_eq!(v.major(), Some(8));
    assert_eq!(v.release.as_deref(), Some("8.2"));
}

#[test]
fn nodes_list() {
    let nodes: Vec<NodeSummary> = serde_json::from_str(
        r#"[{"node":"pve1","status":"online","cpu":0.0123,"maxcpu":16,"mem":8123456789,
             "maxmem":67345678336,"uptime":123456,"level":"","id":"node/pve1","type":"node",
             "ssl_fingerprint":"AB:CD"},
            {"node":"pve2","status":"offline","id":"node/pve2","type":"node"}]"#,
    )
    .unwrap();
    assert!(nodes[0].is_online());
    assert_eq!(nodes[0].maxmem, Some(67_345_678_336));
    assert!(!nodes[1].is_online());
    assert_eq!(nodes[1].maxcpu, None);
}

#[test]
fn node_status_memory() {
    let status: NodeStatus = serde_json::from_str(
        r#"{"memory":{"total":67345678336,"used":8123456789,"free":59222221547},
            "cpu":0.02,"uptime":99,"cpuinfo":{"cpus":16,"sockets":1,"model":"AMD EPYC"},
            "loadavg":["0.10","0.20","0.30"],"kversion":"Linux 6.8.12-1-pve"}"#,
    )
    .unwrap();
    assert_eq!(status.memory.total, 67_345_678_336);
    assert!(status.extra.contains_key("kversion"));
}

#[test]
fn cluster_resources_mixed_rows() {
    let rows: Vec<ClusterResource> = serde_json::from_str(
        r#"[{"id":"qemu/9000","type":"qemu","vmid":9000,"node":"pve1","name":"talos-1.8",
             "status":"stopped","template":1,"tags":"talos;v1.8","maxmem":2147483648,
             "maxcpu":2,"maxdisk":10737418240,"cpu":0,"mem":0,"uptime":0,"pool":"templates"},
            {"id":"qemu/105","type":"qemu","vmid":"105","node":"pve2","name":"worker-a",
             "status":"running","template":0,"cpu":0.031,"mem":1073741824,"lock":"clone"},
            {"id":"qemu/106","type":"qemu","vmid":106,"node":"pve2","status":"unknown"},
            {"id":"storage/pve1/local","type":"storage","node":"pve1","storage":"local",
             "status":"available","content":"iso,vztmpl,backup","shared":0,"plugintype":"dir"},
            {"id":"node/pve1","type":"node","node":"pve1","status":"online"},
            {"id":"sdn/pve1/localnetwork","type":"sdn","node":"pve1","sdn":"localnetwork"},
            {"id":"lxc/200","type":"lxc","vmid":200,"node":"pve1"},
            {"id":"network/pve1/vmbr0","type":"network","node":"pve1"}]"#,
    )
    .unwrap();
    assert!(rows[0].template);
    assert_eq!(rows[0].tag_list(), ["talos", "v1.8"]);
    assert_eq!(rows[1].vmid, Some(105));
    assert!(!rows[1].template);
    assert_eq!(rows[1].lock.as_deref(), Some("clone"));
    assert_eq!(rows[2].name, None);
    assert_eq!(rows[3].resource_type, ResourceType::Storage);
    assert_eq!(rows[3].storage.as_deref(), Some("local"));
    assert_eq!(rows[5].resource_type, ResourceType::Sdn);
    assert_eq!(rows[6].resource_type, ResourceType::Lxc);
    assert_eq!(rows[7].resource_type, ResourceType::Other);
    assert_eq!(rows.iter().filter(|r| r.is_vm()).count(), 3);
}

#[test]
fn qemu_list_per_node() {
    let vms: Vec<VmSummary> = serde_json::from_str(
        r#"[{"vmid":105,"name":"worker-a","status":"running","maxmem":4294967296,"cpus":2,
             "uptime":100,"pid":12345,"netin":1,"netout":2,"tags":"tenant-a"},
            {"vmid":"9000","name":"talos","status":"stopped","template":1,"maxmem":2147483648}]"#,
    )
    .unwrap();
    assert_eq!(vms[0].vmid, 105);
    assert!(!vms[0].template);
    assert_eq!(vms[1].vmid, 9000);
    assert!(vms[1].template);
}

#[test]
fn vm_status_current() {
    let status: VmStatus = serde_json::from_str(
        r#"{"vmid":105,"name":"VM 105","status":"stopped","qmpstatus":"stopped",
            "lock":"clone","cpus":2,"maxmem":4294967296,"uptime":0,
            "ha":{"managed":0},"diskread":0}"#,
    )
    .unwrap();
    assert!(!status.is_running());
    assert_eq!(status.lock.as_deref(), Some("clone"));
    assert!(!status.agent);
    assert_eq!(status.name.as_deref(), Some("VM 105"));

    let status: VmStatus = serde_json::from_str(
        r#"{"vmid":"105","name":"worker-a","status":"running","qmpstatus":"paused","agent":1,
            "running-qemu":"9.0.2","running-machine":"pc-i440fx-9.0+pve0"}"#,
    )
    .unwrap();
    assert!(status.is_running());
    assert!(status.is_paused());
    assert!(status.agent);
}

#[test]
fn vm_config_fields_and_helpers() {
    let config: VmConfig = serde_json::from_str(
        r#"{"digest":"3f2a…","name":"worker-a","cores":2,"sockets":"1","memory":"4096",
            "smbios1":"uuid=8a8a2f3c-5d3c-4b8e-9e5e-0c2f1f0a9b11,manufacturer=UHJveG1veA==,base64=1",
            "net0":"virtio=BC:24:11:2A:3B:4C,bridge=vmbr0,firewall=1,tag=20,mtu=1450",
            "net1":"e1000=BC:24:11:00:00:01,bridge=vmbr1",
            "net10":"model=virtio,macaddr=BC:24:11:00:00:0A,bridge=vmbr2",
            "scsi0":"local-lvm:vm-105-disk-0,iothread=1,size=20G",
            "ide2":"none,media=cdrom","boot":"order=scsi0;net0","agent":"enabled=1,fstrim_cloned_disks=1",
            "tags":"tenant-a;worker","ostype":"l26","scsihw":"virtio-scsi-single","vmgenid":"x"}"#,
    )
    .unwrap();
    assert_eq!(config.memory, Some(4096));
    assert_eq!(config.sockets, Some(1));
    assert_eq!(
        config.smbios_uuid(),
        Some("8a8a2f3c-5d3c-4b8e-9e5e-0c2f1f0a9b11")
    );
    assert!(config.agent_enabled());
    assert_eq!(config.tag_list(), ["tenant-a", "worker"]);
    assert!(!config.template);
    assert_eq!(
        config.get("scsi0").as_deref(),
        Some("local-lvm:vm-105-disk-0,iothread=1,size=20G")
    );
    let nets = config.network_devices();
    let keys: Vec<&str> = nets.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["net0", "net1", "net10"]);
    let net0 = &nets[0].1;
    assert_eq!(net0.model, "virtio");
    assert_eq!(net0.mac.as_deref(), Some("BC:24:11:2A:3B:4C"));
    assert_eq!(net0.bridge.as_deref(), Some("vmbr0"));
    assert_eq!(net0.vlan, Some(20));
    assert_eq!(net0.mtu, Some(1450));
    assert_eq!(nets[2].1.mac.as_deref(), Some("BC:24:11:00:00:0A"));
}

#[test]
fn template_config_and_disabled_agent() {
    let config: VmConfig = serde_json::from_str(
        r#"{"template":1,"memory":"current=2048","agent":"0","net0":"virtio,bridge=vmbr0"}"#,
    )
    .unwrap();
    assert!(config.template);
    assert_eq!(config.memory, Some(2048));
    assert!(!config.agent_enabled());
    // A NIC without a MAC yet (PVE generates one on clone/config).
    assert_eq!(config.network_devices()[0].1.mac, None);
    assert_eq!(config.smbios_uuid(), None);
}

#[test]
fn storage_list_and_content() {
    let storages: Vec<StorageSummary> = serde_json::from_str(
        r#"[{"storage":"local","type":"dir","content":"iso,vztmpl,backup","enabled":1,"active":1,
             "shared":0,"total":100861726720,"used":12345,"avail":100861714375,"used_fraction":0.0001},
            {"storage":"local-lvm","type":"lvmthin","content":"rootdir,images","active":1,"shared":0},
            {"storage":"nfs-iso","type":"nfs","content":"iso","enabled":0,"active":0,"shared":1}]"#,
    )
    .unwrap();
    assert!(storages[0].holds("iso"));
    assert!(!storages[1].holds("iso"));
    assert!(storages[1].is_enabled());
    assert!(!storages[2].is_enabled());
    assert!(storages[2].shared);

    let content: Vec<StorageContent> = serde_json::from_str(
        r#"[{"volid":"local:iso/user-data-105.iso","content":"iso","format":"iso","size":372736,"ctime":1716580771},
            {"volid":"local-lvm:vm-105-disk-0","content":"images","format":"raw","size":21474836480,"vmid":"105"}]"#,
    )
    .unwrap();
    assert_eq!(content[0].volid, "local:iso/user-data-105.iso");
    assert_eq!(content[1].vmid, Some(105));
}

#[test]
fn pools_with_members() {
    let pools: Vec<Pool> = serde_json::from_str(
        r#"[{"poolid":"tenant-a","comment":"tenant A workers","members":[
              {"id":"qemu/105","type":"qemu","vmid":105,"node":"pve1","name":"worker-a","status":"running"},
              {"id":"storage/pve1/local-lvm","type":"storage","node":"pve1","storage":"local-lvm"}]},
            {"poolid":"templates"}]"#,
    )
    .unwrap();
    assert_eq!(pools[0].vmids(), [105]);
    assert!(pools[0].contains_vm(105));
    assert!(!pools[0].contains_vm(106));
    assert!(pools[1].members.is_empty());
    assert_eq!(pools[0].members[1].member_type, ResourceType::Storage);
}

#[test]
fn permissions_map() {
    let perms: Permissions = serde_json::from_str(
        r#"{"/":{"Sys.Audit":0},"/pool/tenant-a":{"VM.Allocate":1,"VM.Clone":1,"VM.Audit":"1"},
            "/vms/105":{"VM.PowerMgmt":1}}"#,
    )
    .unwrap();
    assert!(perms.has("/", "Sys.Audit"));
    assert!(
        !perms.at("/").unwrap()["Sys.Audit"],
        "held but not propagated"
    );
    assert!(perms.at("/pool/tenant-a").unwrap()["VM.Audit"]);
    assert!(!perms.has("/vms/105", "VM.Allocate"));
    assert!(!perms.has("/storage/local", "Datastore.Audit"));
}

#[test]
fn acl_entries() {
    let acl: Vec<AclEntry> = serde_json::from_str(
        r#"[{"path":"/pool/tenant-a","roleid":"PVEVMAdmin","type":"token","ugid":"capmox@pve!capi","propagate":1},
            {"path":"/","roleid":"PVEAuditor","type":"group","ugid":"ops","propagate":0}]"#,
    )
    .unwrap();
    assert_eq!(acl[0].subject, AclSubject::Token);
    assert!(acl[0].propagate);
    assert!(!acl[1].propagate);
}

#[test]
fn guest_interfaces_with_prefixes() {
    let raw: AgentResult<Vec<RawGuestInterface>> = serde_json::from_str(
        r#"{"result":[
            {"name":"lo","hardware-address":"00:00:00:00:00:00","ip-addresses":[
                {"ip-address-type":"ipv4","ip-address":"127.0.0.1","prefix":8},
                {"ip-address-type":"ipv6","ip-address":"::1","prefix":128}],
             "statistics":{"rx-bytes":1}},
            {"name":"eth0","hardware-address":"bc:24:11:2a:3b:4c","ip-addresses":[
                {"ip-address-type":"ipv4","ip-address":"10.0.0.15","prefix":24},
                {"ip-address-type":"ipv6","ip-address":"fe80::be24:11ff:fe2a:3b4c%eth0","prefix":64},
                {"ip-address-type":"ipv4","ip-address":"not-an-ip","prefix":24}]},
            {"name":"cilium_host"}]}"#,
    )
    .unwrap();
    let interfaces: Vec<GuestInterface> = raw.result.into_iter().map(Into::into).collect();
    assert!(interfaces[0].is_loopback());
    let eth0 = &interfaces[1];
    assert!(!eth0.is_loopback());
    assert_eq!(eth0.mac.as_deref(), Some("bc:24:11:2a:3b:4c"));
    assert_eq!(
        eth0.addresses,
        [
            GuestIpAddress {
                ip: "10.0.0.15".parse().unwrap(),
                prefix: 24
            },
            GuestIpAddress {
                ip: "fe80::be24:11ff:fe2a:3b4c".parse().unwrap(),
                prefix: 64
            },
        ]
    );
    assert!(interfaces[2].addresses.is_empty());
    assert_eq!(interfaces[2].mac, None);
}

#[test]
fn guest_os_info() {
    let info: AgentResult<GuestOsInfo> = serde_json::from_str(
        r##"{"result":{"id":"talos","name":"Talos","pretty-name":"Talos (v1.8.0)",
            "version":"v1.8.0","version-id":"v1.8.0","kernel-release":"6.6.52-talos",
            "kernel-version":"#1 SMP","machine":"x86_64"}}"##,
    )
    .unwrap();
    assert_eq!(info.result.id.as_deref(), Some("talos"));
    assert_eq!(info.result.pretty_name.as_deref(), Some("Talos (v1.8.0)"));
    assert!(info.result.extra.contains_key("kernel-version"));
}
