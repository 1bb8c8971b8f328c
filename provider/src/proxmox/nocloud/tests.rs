use super::*;

const UUID: &str = "3f2a9c4e-7b1d-4e8a-9c0f-1a2b3c4d5e6f";

fn mac(text: &str) -> MacAddress {
    text.parse().unwrap()
}

fn v4(address: &str, prefix: u8, gateway: Option<&str>) -> Ipv4Static {
    Ipv4Static {
        address: address.parse().unwrap(),
        prefix,
        gateway: gateway.map(|g| g.parse().unwrap()),
        metric: None,
    }
}

fn v6(address: &str, prefix: u8, gateway: Option<&str>) -> Ipv6Static {
    Ipv6Static {
        address: address.parse().unwrap(),
        prefix,
        gateway: gateway.map(|g| g.parse().unwrap()),
        metric: None,
    }
}

fn seed(network: Vec<NetworkDevice>) -> NoCloudSeed {
    NoCloudSeed {
        instance_id: UUID.into(),
        hostname: "tenant-a-workers-7d9f8-x2k4q".into(),
        provider_id: Some(format!("proxmox://{UUID}")),
        network,
        user_data: UserData::new("version: v1alpha1\nmachine:\n  type: worker\n  token: s3cr3t\n"),
    }
}

fn eth0() -> NetworkDevice {
    NetworkDevice::new("eth0", mac("BC:24:11:0A:0B:0C"))
}

fn network_config(network: Vec<NetworkDevice>) -> String {
    seed(network).render().unwrap().network_config
}

/// Lines joined as a file: each ends in a newline.
fn file(lines: &[&str]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

#[test]
fn meta_data_names_instance_host_and_provider() {
    let rendered = seed(vec![]).render().unwrap();
    assert_eq!(
        rendered.meta_data,
        file(&[
            &format!("instance-id: \"{UUID}\""),
            "local-hostname: \"tenant-a-workers-7d9f8-x2k4q\"",
            "hostname: \"tenant-a-workers-7d9f8-x2k4q\"",
            &format!("provider-id: \"proxmox://{UUID}\""),
        ])
    );
    let mut without = seed(vec![]);
    without.provider_id = None;
    let meta = without.render().unwrap().meta_data;
    assert!(!meta.contains("provider-id"), "{meta}");
}

#[test]
fn ipv4_only_device_gets_address_default_route_and_dns() {
    let mut device = eth0();
    device.ipv4 = Some(Ipv4Static {
        metric: Some(100),
        ..v4("10.10.0.21", 24, Some("10.10.0.1"))
    });
    device.dns_servers = vec!["10.10.0.2".parse().unwrap(), "1.1.1.1".parse().unwrap()];
    assert_eq!(
        network_config(vec![device]),
        file(&[
            "version: 2",
            "ethernets:",
            "  \"eth0\":",
            "    match:",
            "      macaddress: \"bc:24:11:0a:0b:0c\"",
            "    set-name: \"eth0\"",
            "    addresses:",
            "      - \"10.10.0.21/24\"",
            "    routes:",
            "      - to: \"0.0.0.0/0\"",
            "        via: \"10.10.0.1\"",
            "        metric: 100",
            "    nameservers:",
            "      addresses:",
            "        - \"10.10.0.2\"",
            "        - \"1.1.1.1\"",
        ])
    );
}

#[test]
fn ipv6_only_device_may_use_a_link_local_gateway() {
    let mut device = eth0();
    device.ipv6 = Some(v6("2001:db8:10::21", 64, Some("fe80::1")));
    device.dns_servers = vec!["2001:4860:4860::8888".parse().unwrap()];
    assert_eq!(
        network_config(vec![device]),
        file(&[
            "version: 2",
            "ethernets:",
            "  \"eth0\":",
            "    match:",
            "      macaddress: \"bc:24:11:0a:0b:0c\"",
            "    set-name: \"eth0\"",
            "    addresses:",
            "      - \"2001:db8:10::21/64\"",
            "    routes:",
            "      - to: \"::/0\"",
            "        via: \"fe80::1\"",
            "    nameservers:",
            "      addresses:",
            "        - \"2001:4860:4860::8888\"",
        ])
    );
}

#[test]
fn dual_stack_device_lists_ipv4_before_ipv6() {
    let mut device = eth0();
    device.ipv4 = Some(v4("10.10.0.21", 24, Some("10.10.0.1")));
    device.ipv6 = Some(v6("2001:db8:10::21", 64, Some("2001:db8:10::1")));
    device.mtu = Some(1450);
    assert_eq!(
        network_config(vec![device]),
        file(&[
            "version: 2",
            "ethernets:",
            "  \"eth0\":",
            "    match:",
            "      macaddress: \"bc:24:11:0a:0b:0c\"",
            "    set-name: \"eth0\"",
            "    mtu: 1450",
            "    addresses:",
            "      - \"10.10.0.21/24\"",
            "      - \"2001:db8:10::21/64\"",
            "    routes:",
            "      - to: \"0.0.0.0/0\"",
            "        via: \"10.10.0.1\"",
            "      - to: \"::/0\"",
            "        via: \"2001:db8:10::1\"",
        ])
    );
}

#[test]
fn several_devices_keep_their_order_and_extra_routes() {
    let mut public = eth0();
    public.ipv4 = Some(v4("10.10.0.21", 24, Some("10.10.0.1")));
    let mut storage = NetworkDevice::new("eth1", mac("bc:24:11:0a:0b:0d"));
    storage.ipv4 = Some(v4("192.168.50.21", 24, None));
    storage.routes = vec![Route {
        destination: "192.168.0.0".parse().unwrap(),
        prefix: 16,
        via: "192.168.50.1".parse().unwrap(),
        metric: Some(200),
    }];
    storage.mtu = Some(9000);
    let text = network_config(vec![public, storage]);
    assert_eq!(
        text,
        file(&[
            "version: 2",
            "ethernets:",
            "  \"eth0\":",
            "    match:",
            "      macaddress: \"bc:24:11:0a:0b:0c\"",
            "    set-name: \"eth0\"",
            "    addresses:",
            "      - \"10.10.0.21/24\"",
            "    routes:",
            "      - to: \"0.0.0.0/0\"",
            "        via: \"10.10.0.1\"",
            "  \"eth1\":",
            "    match:",
            "      macaddress: \"bc:24:11:0a:0b:0d\"",
            "    set-name: \"eth1\"",
            "    mtu: 9000",
            "    addresses:",
            "      - \"192.168.50.21/24\"",
            "    routes:",
            "      - to: \"192.168.0.0/16\"",
            "        via: \"192.168.50.1\"",
            "        metric: 200",
        ])
    );

    // The structure a YAML reader sees, as Talos' decoder would map it.
    let value: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    assert_eq!(value["version"], serde_norway::Value::from(2));
    let eth1 = &value["ethernets"]["eth1"];
    assert_eq!(eth1["match"]["macaddress"], "bc:24:11:0a:0b:0d");
    assert_eq!(eth1["addresses"][0], "192.168.50.21/24");
    assert_eq!(eth1["routes"][0]["metric"], serde_norway::Value::from(200));
    assert!(value.get("network").is_none(), "no top-level network: key");
}

#[test]
fn no_devices_render_an_empty_version_2_config() {
    let text = network_config(vec![]);
    assert_eq!(text, "version: 2\nethernets: {}\n");
    let value: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    assert!(value["ethernets"].as_mapping().unwrap().is_empty());
}

#[test]
fn mac_addresses_parse_in_either_case_and_print_lowercase() {
    assert_eq!(mac("BC:24:11:AA:bb:0c").to_string(), "bc:24:11:aa:bb:0c");
    for bad in [
        "",
        "bc:24:11:aa:bb",
        "bc:24:11:aa:bb:0c:01",
        "bc-24-11-aa-bb-0c",
        "bc:24:11:aa:bb:0g",
        "bc:24:11:aa:bb:c",
        "+c:24:11:aa:bb:0c",
        "bc:24:11:aa:bb:+c",
    ] {
        assert!(
            matches!(
                bad.parse::<MacAddress>(),
                Err(NoCloudError::InvalidMacAddress { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn user_data_is_passed_through_byte_for_byte() {
    // Not UTF-8, CRLF line ends, no final newline: nothing is touched.
    let bytes = b"#cloud-config\r\nwrite_files: []\r\n\xff\xfe\x00tail".to_vec();
    let mut input = seed(vec![]);
    input.user_data = UserData::new(bytes.clone());
    let rendered = input.render().unwrap();
    assert_eq!(rendered.user_data.as_bytes(), bytes.as_slice());
    let image = rendered.image.as_bytes();
    assert!(
        image.windows(bytes.len()).any(|w| w == bytes.as_slice()),
        "the image holds the user-data unchanged"
    );
}

#[test]
fn image_is_iso9660_labelled_cidata() {
    let rendered = seed(vec![]).render().unwrap();
    let image = rendered.image.as_bytes();
    // The primary volume descriptor: sector 16, type 1, "CD001", and
    // the volume identifier at bytes 40..72, padded with spaces.
    let pvd = &image[16 * 2048..17 * 2048];
    assert_eq!(pvd[0], 1);
    assert_eq!(&pvd[1..6], b"CD001");
    assert_eq!(String::from_utf8_lossy(&pvd[40..72]).trim_end(), "cidata");
    assert_eq!(image.len() % 2048, 0);
}

#[test]
fn rendering_twice_gives_identical_bytes() {
    let mut device = eth0();
    device.ipv4 = Some(v4("10.10.0.21", 24, Some("10.10.0.1")));
    let input = seed(vec![device]);
    let first = input.render().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(first, input.render().unwrap());
}

#[test]
fn debug_never_prints_user_data() {
    let rendered = seed(vec![]).render().unwrap();
    let printed = format!("{:?} {rendered:?}", seed(vec![]));
    assert!(!printed.contains("s3cr3t"), "{printed}");
    assert!(printed.contains("bytes redacted"), "{printed}");
}

#[test]
fn iso_file_name_is_unique_per_machine_uid() {
    assert_eq!(
        iso_file_name("9b2e8d1c-4f6a-4b3e-8c7d-0e1f2a3b4c5d").unwrap(),
        "tenantry-9b2e8d1c-4f6a-4b3e-8c7d-0e1f2a3b4c5d.iso"
    );
    for bad in ["", "../etc/passwd", "a b", &"x".repeat(65)] {
        assert!(
            matches!(
                iso_file_name(bad),
                Err(NoCloudError::InvalidMachineUid { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn hostnames_must_be_dns_names() {
    for bad in [
        "",
        "Worker-1",
        "worker_1",
        "-worker",
        "a..b",
        &"a".repeat(64),
    ] {
        let mut input = seed(vec![]);
        input.hostname = bad.to_string();
        let error = input.render().unwrap_err();
        assert!(
            matches!(error, NoCloudError::InvalidHostname { .. }),
            "{bad:?}: {error:?}"
        );
        assert_eq!(error.reason(), "InvalidSeedMetadata");
    }
    let mut dotted = seed(vec![]);
    dotted.hostname = "worker-1.tenant-a.example".into();
    dotted.render().unwrap();
}

#[test]
fn instance_and_provider_ids_must_be_printable_tokens() {
    let mut input = seed(vec![]);
    input.instance_id = "a\nb".into();
    assert!(matches!(
        input.validate(),
        Err(NoCloudError::InvalidInstanceId { .. })
    ));
    let mut input = seed(vec![]);
    input.provider_id = Some(String::new());
    assert!(matches!(
        input.validate(),
        Err(NoCloudError::InvalidProviderId { .. })
    ));
}

#[test]
fn gateway_outside_the_subnet_is_refused_with_the_device_named() {
    let mut device = eth0();
    device.ipv4 = Some(v4("10.10.0.21", 24, Some("10.20.0.1")));
    let error = seed(vec![device]).render().unwrap_err();
    assert_eq!(
        error.to_string(),
        "network device eth0: address 10.10.0.21/24: gateway 10.20.0.1 is outside the subnet"
    );
    assert_eq!(error.reason(), "InvalidNetworkConfig");
    assert!(error.needs_human());

    let mut device = eth0();
    device.ipv6 = Some(v6("2001:db8:10::21", 64, Some("2001:db8:20::1")));
    assert!(matches!(
        seed(vec![device]).render(),
        Err(NoCloudError::InvalidAddress { .. })
    ));
}

#[test]
fn bad_addresses_routes_and_mtus_are_refused() {
    type Change = Box<dyn Fn(&mut NetworkDevice)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "prefix 33",
            Box::new(|d| d.ipv4 = Some(v4("10.0.0.5", 33, None))),
        ),
        (
            "prefix 0",
            Box::new(|d| d.ipv6 = Some(v6("2001:db8::5", 0, None))),
        ),
        (
            "gateway is the address",
            Box::new(|d| d.ipv4 = Some(v4("10.0.0.5", 24, Some("10.0.0.5")))),
        ),
        (
            "metric without gateway",
            Box::new(|d| {
                d.ipv4 = Some(Ipv4Static {
                    metric: Some(10),
                    ..v4("10.0.0.5", 24, None)
                })
            }),
        ),
        (
            "route with host bits",
            Box::new(|d| {
                d.routes = vec![Route {
                    destination: "192.168.1.1".parse().unwrap(),
                    prefix: 16,
                    via: "10.0.0.1".parse().unwrap(),
                    metric: None,
                }]
            }),
        ),
        (
            "route across families",
            Box::new(|d| {
                d.routes = vec![Route {
                    destination: "192.168.0.0".parse().unwrap(),
                    prefix: 16,
                    via: "fe80::1".parse().unwrap(),
                    metric: None,
                }]
            }),
        ),
        (
            "second default route",
            Box::new(|d| {
                d.ipv4 = Some(v4("10.0.0.5", 24, Some("10.0.0.1")));
                d.routes = vec![Route {
                    destination: "0.0.0.0".parse().unwrap(),
                    prefix: 0,
                    via: "10.0.0.254".parse().unwrap(),
                    metric: None,
                }]
            }),
        ),
        ("MTU 40", Box::new(|d| d.mtu = Some(40))),
        (
            "MTU below IPv6 minimum",
            Box::new(|d| {
                d.ipv6 = Some(v6("2001:db8::5", 64, None));
                d.mtu = Some(1200)
            }),
        ),
        ("uppercase name", Box::new(|d| d.name = "Eth0".into())),
        (
            "long name",
            Box::new(|d| d.name = "eth0123456789012".into()),
        ),
    ];
    for (case, change) in cases {
        let mut device = eth0();
        change(&mut device);
        let error = seed(vec![device]).render().unwrap_err();
        assert_eq!(error.reason(), "InvalidNetworkConfig", "{case}: {error}");
    }
}

#[test]
fn devices_must_differ_in_name_and_mac() {
    let other_mac = NetworkDevice::new("eth0", mac("bc:24:11:00:00:99"));
    assert_eq!(
        seed(vec![eth0(), other_mac]).render().unwrap_err(),
        NoCloudError::DuplicateDeviceName {
            name: "eth0".into()
        }
    );
    let same_mac = NetworkDevice::new("eth1", mac("BC:24:11:0a:0b:0c"));
    assert_eq!(
        seed(vec![eth0(), same_mac])
            .render()
            .unwrap_err()
            .to_string(),
        "MAC address bc:24:11:0a:0b:0c is used by two network devices"
    );
}
