use super::*;

const UUID: &str = "5b0c2c7e-1f3a-4d2b-9c8e-0a1b2c3d4e5f";

fn ipv4(addresses: &[&str]) -> IpConfigSpec {
    IpConfigSpec {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        prefix: 24,
        gateway: "10.0.0.1".into(),
        metric: None,
    }
}

#[test]
fn provider_id_round_trips_the_smbios_uuid() {
    let id = provider_id(UUID).unwrap();
    assert_eq!(id, format!("proxmox://{UUID}"));
    assert_eq!(id.len(), 46, "the CRD pins providerID to 46 characters");
    assert_eq!(parse_provider_id(&id).unwrap(), UUID);
}

#[test]
fn provider_id_keeps_the_uuid_case() {
    let upper = UUID.to_uppercase();
    assert_eq!(
        parse_provider_id(&format!("proxmox://{upper}")).unwrap(),
        upper
    );
}

#[test]
fn provider_ids_of_other_forms_are_refused() {
    assert!(matches!(
        parse_provider_id(&format!("kubevirt://{UUID}")),
        Err(ProviderIdError::WrongScheme(_))
    ));
    // The Proxmox CCM's default form, region/vmid, is not capmox's.
    assert!(matches!(
        parse_provider_id("proxmox://region-1/105"),
        Err(ProviderIdError::NotAUuid(_))
    ));
    assert!(matches!(
        parse_provider_id("proxmox://5b0c2c7e1f3a4d2b9c8e0a1b2c3d4e5f"),
        Err(ProviderIdError::NotAUuid(_))
    ));
    assert!(provider_id("not-a-uuid").is_err());
}

#[test]
fn machine_allowed_nodes_replace_the_clusters() {
    let cluster = ProxmoxClusterSpec {
        allowed_nodes: Some(vec!["pve1".into(), "pve2".into()]),
        ..Default::default()
    };
    let mut machine = ProxmoxMachineSpec::default();
    assert_eq!(machine.effective_allowed_nodes(&cluster), ["pve1", "pve2"]);
    machine.allowed_nodes = Some(vec![]);
    assert_eq!(
        machine.effective_allowed_nodes(&cluster),
        ["pve1", "pve2"],
        "an empty list on the machine does not override"
    );
    machine.allowed_nodes = Some(vec!["pve3".into()]);
    assert_eq!(machine.effective_allowed_nodes(&cluster), ["pve3"]);
}

#[test]
fn no_allowed_nodes_anywhere_means_every_node() {
    let machine = ProxmoxMachineSpec::default();
    assert!(
        machine
            .effective_allowed_nodes(&ProxmoxClusterSpec::default())
            .is_empty()
    );
}

#[test]
fn clone_source_is_a_template_or_a_selector() {
    let by_id = ProxmoxMachineSpec {
        source_node: Some("pve1".into()),
        template_id: Some(9000),
        ..Default::default()
    };
    assert_eq!(
        by_id.clone_source(),
        Some(CloneSource::Template {
            source_node: "pve1",
            template_id: 9000
        })
    );
    let by_tags = ProxmoxMachineSpec {
        template_selector: Some(TemplateSelector {
            match_tags: vec!["capi".into(), "ubuntu".into()],
            match_policy: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        by_tags.clone_source(),
        Some(CloneSource::Selector {
            match_tags: &["capi".to_string(), "ubuntu".to_string()],
            match_policy: TemplateMatchPolicy::Exact
        })
    );
    let half = ProxmoxMachineSpec {
        template_id: Some(9000),
        ..Default::default()
    };
    assert_eq!(half.clone_source(), None);
    let both = ProxmoxMachineSpec {
        source_node: Some("pve1".into()),
        ..by_tags.clone()
    };
    assert_eq!(both.clone_source(), None);
}

#[test]
fn defaulted_list_keys_default_in_rust_too() {
    assert_eq!(NetworkDevice::default().name, "net0");
    assert_eq!(InClusterZoneRef::default().zone, "default");
    let device: NetworkDevice = serde_json::from_value(serde_json::json!({})).unwrap();
    assert_eq!(device, NetworkDevice::default());
}

#[test]
fn clones_are_full_unless_said_otherwise() {
    assert!(ProxmoxMachineSpec::default().full_clone());
    let linked = ProxmoxMachineSpec {
        full: Some(false),
        ..Default::default()
    };
    assert!(!linked.full_clone());
}

#[test]
fn credentials_are_read_from_the_clusters_own_namespace_only() {
    let with_ref = |name: Option<&str>, namespace: Option<&str>| ProxmoxClusterSpec {
        credentials_ref: Some(SecretReference {
            name: name.map(str::to_string),
            namespace: namespace.map(str::to_string),
        }),
        ..Default::default()
    };
    assert_eq!(
        ProxmoxClusterSpec::default().credentials_secret_name("tenant-a"),
        Ok(None)
    );
    assert_eq!(
        with_ref(Some("creds"), None).credentials_secret_name("tenant-a"),
        Ok(Some("creds"))
    );
    assert_eq!(
        with_ref(Some("creds"), Some("tenant-a")).credentials_secret_name("tenant-a"),
        Ok(Some("creds"))
    );
    assert_eq!(
        with_ref(Some("creds"), Some("tenant-b")).credentials_secret_name("tenant-a"),
        Err(CredentialsRefError::OtherNamespace {
            referenced: "tenant-b".into(),
            own: "tenant-a".into()
        })
    );
    assert_eq!(
        with_ref(None, None).credentials_secret_name("tenant-a"),
        Err(CredentialsRefError::MissingName)
    );
}

#[test]
fn pool_names_follow_capmox() {
    assert_eq!(
        in_cluster_ip_pool_name("demo", None, IpFamily::V4),
        "demo-v4-icip"
    );
    assert_eq!(
        in_cluster_ip_pool_name("demo", None, IpFamily::V6),
        "demo-v6-icip"
    );
    assert_eq!(
        in_cluster_ip_pool_name("demo", Some("zone-a"), IpFamily::V4),
        "demo-zone-a-v4-icip"
    );
}

#[test]
fn address_entries_parse_as_ips_ranges_and_cidrs() {
    assert_eq!(
        "10.0.0.5".parse::<IpBlock>().unwrap(),
        IpBlock::Address("10.0.0.5".parse().unwrap())
    );
    let range: IpBlock = " 10.0.0.10 - 10.0.0.20 ".parse().unwrap();
    assert_eq!(range.to_string(), "10.0.0.10-10.0.0.20");
    assert_eq!(range.len(), 11);
    let cidr: IpBlock = "10.0.1.7/28".parse().unwrap();
    assert_eq!(cidr.to_string(), "10.0.1.0/28", "host bits are cleared");
    assert_eq!(cidr.len(), 16);
    let v6: IpBlock = "2001:db8::10-2001:db8::100".parse().unwrap();
    assert_eq!(v6.family(), IpFamily::V6);
    assert_eq!(v6.len(), 0xf1);
    assert_eq!("::/0".parse::<IpBlock>().unwrap().len(), u128::MAX);
    assert_eq!("0.0.0.0/0".parse::<IpBlock>().unwrap().len(), 1 << 32);
}

#[test]
fn bad_address_entries_are_refused() {
    assert!(matches!(
        "10.0.0.300".parse::<IpBlock>(),
        Err(AddressError::Unparsable(_))
    ));
    assert!(matches!(
        "10.0.0.20-10.0.0.10".parse::<IpBlock>(),
        Err(AddressError::BackwardsRange(_))
    ));
    assert!(matches!(
        "10.0.0.1-2001:db8::1".parse::<IpBlock>(),
        Err(AddressError::Malformed(_))
    ));
    assert!(matches!(
        "10.0.0.0/33".parse::<IpBlock>(),
        Err(AddressError::Malformed(_))
    ));
    assert!(matches!(
        "10.0.0.0/x".parse::<IpBlock>(),
        Err(AddressError::Unparsable(_))
    ));
}

#[test]
fn blocks_know_what_they_contain() {
    let range: IpBlock = "10.0.0.10-10.0.0.20".parse().unwrap();
    assert!(range.contains("10.0.0.10".parse().unwrap()));
    assert!(range.contains("10.0.0.20".parse().unwrap()));
    assert!(!range.contains("10.0.0.21".parse().unwrap()));
    assert!(!range.contains("::ffff:10.0.0.15".parse().unwrap()));
    let cidr: IpBlock = "10.0.1.0/30".parse().unwrap();
    assert!(cidr.contains("10.0.1.3".parse().unwrap()));
    assert!(!cidr.contains("10.0.1.4".parse().unwrap()));
}

#[test]
fn the_endpoint_is_found_in_a_pool_that_covers_it() {
    let config = ipv4(&["10.0.0.10-10.0.0.20", "10.0.0.64/28"]);
    assert_eq!(config.contains("10.0.0.15".parse().unwrap()), Ok(true));
    assert_eq!(config.contains("10.0.0.70".parse().unwrap()), Ok(true));
    assert_eq!(config.contains("10.0.0.9".parse().unwrap()), Ok(false));
    assert_eq!(config.contains("2001:db8::1".parse().unwrap()), Ok(false));
    assert!(
        ipv4(&["nonsense"])
            .contains("10.0.0.1".parse().unwrap())
            .is_err()
    );
}

#[test]
fn an_ipv4_config_becomes_an_in_cluster_ip_pool_spec() {
    let config = ipv4(&["10.0.0.10-10.0.0.20", "10.0.0.70/28", "10.0.0.99"]);
    let spec = config.in_cluster_ip_pool_spec(IpFamily::V4).unwrap();
    assert_eq!(
        spec.addresses,
        ["10.0.0.10-10.0.0.20", "10.0.0.64/28", "10.0.0.99"]
    );
    assert_eq!(spec.prefix, 24);
    assert_eq!(spec.gateway.as_deref(), Some("10.0.0.1"));
    assert_eq!(spec.address_reuse_grace_period_seconds, Some(60));
    assert_eq!(spec.allocate_reserved_ip_addresses, None);
}

#[test]
fn a_pool_of_the_wrong_family_is_refused() {
    let v6_in_v4 = ipv4(&["2001:db8::10-2001:db8::20"]);
    assert!(matches!(
        v6_in_v4.in_cluster_ip_pool_spec(IpFamily::V4),
        Err(AddressError::WrongFamily { .. })
    ));
    let v4_gateway = IpConfigSpec {
        addresses: vec!["2001:db8::10-2001:db8::20".into()],
        prefix: 64,
        gateway: "10.0.0.1".into(),
        metric: None,
    };
    assert!(matches!(
        v4_gateway.in_cluster_ip_pool_spec(IpFamily::V6),
        Err(AddressError::WrongFamily { .. })
    ));
    let long_prefix = IpConfigSpec {
        prefix: 64,
        ..ipv4(&["10.0.0.10"])
    };
    assert_eq!(
        long_prefix.in_cluster_ip_pool_spec(IpFamily::V4),
        Err(AddressError::PrefixTooLong {
            prefix: 64,
            family: IpFamily::V4
        })
    );
}

#[test]
fn a_dual_stack_cluster_with_a_zone_needs_four_pools() {
    let v6 = IpConfigSpec {
        addresses: vec!["2001:db8::10-2001:db8::100".into()],
        prefix: 64,
        gateway: "2001:db8::1".into(),
        metric: Some(200),
    };
    let cluster = ProxmoxClusterSpec {
        ipv4_config: Some(ipv4(&["10.0.0.10-10.0.0.20"])),
        ipv6_config: Some(v6.clone()),
        zone_config: Some(vec![ZoneConfigSpec {
            zone: "zone-a".into(),
            ipv4_config: Some(ipv4(&["10.0.0.30-10.0.0.40"])),
            ipv6_config: Some(v6),
            dns_servers: vec!["10.0.0.53".into()],
        }]),
        ..Default::default()
    };
    let pools = cluster.desired_ip_pools("demo").unwrap();
    let summary: Vec<_> = pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.zone.as_deref(),
                p.family,
                p.gateway_metric,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("demo-v4-icip", None, IpFamily::V4, 100),
            ("demo-v6-icip", None, IpFamily::V6, 200),
            ("demo-zone-a-v4-icip", Some("zone-a"), IpFamily::V4, 100),
            ("demo-zone-a-v6-icip", Some("zone-a"), IpFamily::V6, 200),
        ]
    );
    assert_eq!(pools[2].spec.addresses, ["10.0.0.30-10.0.0.40"]);
    assert_eq!(IpFamily::V6.annotation_value(), "ipv6");
}

#[test]
fn a_bad_entry_anywhere_fails_the_whole_cluster() {
    let cluster = ProxmoxClusterSpec {
        ipv4_config: Some(ipv4(&["10.0.0.10-10.0.0.20", "10.0.0.x"])),
        ..Default::default()
    };
    assert_eq!(
        cluster.desired_ip_pools("demo"),
        Err(AddressError::Unparsable("10.0.0.x".into()))
    );
}
