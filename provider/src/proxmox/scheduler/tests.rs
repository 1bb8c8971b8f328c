use super::*;

const GIB: u64 = 1 << 30;

/// A node with `cpus` logical CPUs and `memory_gib` GiB.
fn node(name: &str, cpus: u32, memory_gib: u64) -> NodeCapacity {
    NodeCapacity {
        name: name.into(),
        online: true,
        maxcpu: cpus,
        maxmem: memory_gib * GIB,
        guests: Vec::new(),
    }
}

fn with_guests(mut node: NodeCapacity, guests: &[(u32, u64)]) -> NodeCapacity {
    for (index, (cpus, memory_gib)) in guests.iter().enumerate() {
        node.guests.push(Guest {
            vmid: 100 + index as u32,
            maxmem: memory_gib * GIB,
            cpus: *cpus,
            template: false,
        });
    }
    node
}

fn machine(vcpus: u32, memory_gib: u64) -> PlacementRequest {
    PlacementRequest {
        memory: memory_gib * GIB,
        vcpus,
        ..PlacementRequest::default()
    }
}

fn chosen(nodes: &[NodeCapacity], request: &PlacementRequest) -> String {
    choose_node(nodes, request).expect("a node fits").node
}

#[test]
fn memory_only_workload_goes_to_the_node_with_most_memory_left() {
    let nodes = [
        with_guests(node("pve1", 32, 128), &[(4, 96)]),
        with_guests(node("pve2", 32, 128), &[(4, 32)]),
    ];
    let choice = choose_node(&nodes, &machine(2, 16)).unwrap();
    assert_eq!(
        choice,
        NodeChoice {
            node: "pve2".into(),
            memory_free_after: Some(80 * GIB),
            vcpus_free_after: Some(26),
        }
    );
}

#[test]
fn cpu_bound_node_is_avoided_although_it_has_the_most_free_memory() {
    // capmox would pick pve1 (most free memory) and overcommit its CPUs
    // 24 + 8 = 32 vCPUs on 16 CPUs.
    let nodes = [
        with_guests(node("pve1", 16, 256), &[(8, 16), (8, 16), (8, 16)]),
        with_guests(node("pve2", 16, 64), &[(2, 32)]),
    ];
    assert_eq!(chosen(&nodes, &machine(8, 8)), "pve2");
}

#[test]
fn the_tightest_resource_decides_between_fitting_nodes() {
    // After placement: pve1 keeps 75% of memory but 12.5% of CPUs;
    // pve2 keeps 25% of memory and 50% of CPUs. pve2's worst (25%) beats
    // pve1's worst (12.5%).
    let nodes = [
        with_guests(node("pve1", 16, 64), &[(12, 8)]),
        with_guests(node("pve2", 16, 64), &[(6, 40)]),
    ];
    assert_eq!(chosen(&nodes, &machine(2, 8)), "pve2");
}

#[test]
fn templates_hold_no_resources() {
    let mut busy = with_guests(node("pve1", 8, 32), &[(8, 32)]);
    for guest in &mut busy.guests {
        guest.template = true;
    }
    assert_eq!(chosen(&[busy], &machine(8, 32)), "pve1");
}

#[test]
fn stopped_vms_still_count() {
    // Guests are counted by configuration, not by power state: there is
    // no power state in the input at all, by design.
    let nodes = [with_guests(node("pve1", 8, 32), &[(6, 8)])];
    let error = choose_node(&nodes, &machine(4, 4)).unwrap_err();
    assert_eq!(error.reason(), "InsufficientResources");
}

#[test]
fn cpu_overcommit_lets_more_vcpus_fit() {
    let nodes = [with_guests(node("pve1", 16, 128), &[(16, 16)])];
    let mut request = machine(8, 8);
    assert!(
        choose_node(&nodes, &request).is_err(),
        "no overcommit by default"
    );
    request.hints.cpu_adjustment = 200;
    let choice = choose_node(&nodes, &request).unwrap();
    assert_eq!(choice.vcpus_free_after, Some(8));
}

#[test]
fn memory_overcommit_lets_more_memory_fit() {
    let nodes = [with_guests(node("pve1", 16, 64), &[(2, 64)])];
    let mut request = machine(2, 32);
    assert!(choose_node(&nodes, &request).is_err());
    request.hints.memory_adjustment = 300;
    let choice = choose_node(&nodes, &request).unwrap();
    assert_eq!(choice.memory_free_after, Some(96 * GIB));
}

#[test]
fn adjustment_zero_switches_a_check_off() {
    let nodes = [with_guests(node("pve1", 4, 16), &[(4, 16)])];
    let request = PlacementRequest {
        hints: SchedulerHints {
            memory_adjustment: 0,
            cpu_adjustment: 0,
        },
        ..machine(32, 512)
    };
    let choice = choose_node(&nodes, &request).unwrap();
    assert_eq!(
        choice,
        NodeChoice {
            node: "pve1".into(),
            memory_free_after: None,
            vcpus_free_after: None,
        }
    );
}

#[test]
fn offline_nodes_are_skipped() {
    let mut big = node("pve1", 64, 512);
    big.online = false;
    let nodes = [big, node("pve2", 8, 32)];
    assert_eq!(chosen(&nodes, &machine(2, 4)), "pve2");
}

#[test]
fn all_nodes_offline_is_transient() {
    let mut pve1 = node("pve1", 8, 32);
    pve1.online = false;
    let error = choose_node(&[pve1], &machine(2, 4)).unwrap_err();
    assert_eq!(error.rejections, vec![("pve1".into(), Rejection::Offline)]);
    assert!(error.is_transient());
    assert_eq!(error.reason(), "NoNodeAvailable");
    assert_eq!(
        error.to_string(),
        "no Proxmox node has room for 2 vCPUs and 4 GiB of memory: pve1: offline"
    );
}

#[test]
fn machine_allowed_nodes_override_the_clusters() {
    let nodes = [
        node("pve1", 64, 512),
        node("pve2", 8, 32),
        node("pve3", 8, 32),
    ];
    let mut request = machine(2, 4);
    assert_eq!(chosen(&nodes, &request), "pve1", "no list: every node");
    request.cluster_allowed_nodes = vec!["pve2".into(), "pve3".into()];
    assert_eq!(chosen(&nodes, &request), "pve2");
    request.machine_allowed_nodes = vec!["pve3".into()];
    assert_eq!(chosen(&nodes, &request), "pve3");
}

#[test]
fn unknown_allowed_node_is_named_and_needs_a_human() {
    let nodes = [node("pve1", 8, 32)];
    let request = PlacementRequest {
        machine_allowed_nodes: vec!["pve-1".into()],
        ..machine(2, 4)
    };
    let error = choose_node(&nodes, &request).unwrap_err();
    assert!(error.needs_human());
    assert_eq!(
        error.to_string(),
        "no Proxmox node has room for 2 vCPUs and 4 GiB of memory: \
         pve-1: not a node of this Proxmox cluster"
    );
}

#[test]
fn equal_nodes_prefer_fewer_machines_of_the_cluster_then_the_name() {
    let nodes = [
        node("pve3", 16, 64),
        node("pve1", 16, 64),
        node("pve2", 16, 64),
    ];
    let mut request = machine(2, 4);
    assert_eq!(chosen(&nodes, &request), "pve1", "name breaks the last tie");
    request.placements = BTreeMap::from([("pve1".into(), 2), ("pve2".into(), 1)]);
    assert_eq!(chosen(&nodes, &request), "pve3");
    request.placements.insert("pve3".into(), 1);
    assert_eq!(chosen(&nodes, &request), "pve2");
}

#[test]
fn placements_do_not_outweigh_free_capacity() {
    let nodes = [
        with_guests(node("pve1", 16, 64), &[(8, 32)]),
        node("pve2", 16, 64),
    ];
    let request = PlacementRequest {
        placements: BTreeMap::from([("pve2".into(), 5)]),
        ..machine(2, 4)
    };
    assert_eq!(chosen(&nodes, &request), "pve2");
}

#[test]
fn choice_does_not_depend_on_node_order() {
    let a = with_guests(node("pve1", 16, 64), &[(4, 16)]);
    let b = with_guests(node("pve2", 32, 64), &[(4, 16)]);
    let c = with_guests(node("pve3", 16, 128), &[(4, 16)]);
    let request = machine(4, 8);
    let first = chosen(&[a.clone(), b.clone(), c.clone()], &request);
    assert_eq!(first, chosen(&[c.clone(), a.clone(), b.clone()], &request));
    assert_eq!(first, chosen(&[b, c, a], &request));
}

#[test]
fn nothing_fits_names_each_node_and_what_it_lacks() {
    let mut pve4 = node("pve4", 64, 512);
    pve4.online = false;
    let nodes = [
        with_guests(node("pve1", 16, 64), &[(14, 8)]),
        with_guests(node("pve2", 32, 64), &[(8, 58), (2, 1)]),
        with_guests(node("pve3", 8, 16), &[(8, 16)]),
        pve4,
    ];
    let mut request = machine(4, 8);
    request.memory += GIB / 2;
    let error = choose_node(&nodes, &request).unwrap_err();
    assert_eq!(error.reason(), "InsufficientResources");
    assert!(error.needs_human());
    assert_eq!(
        error.to_string(),
        "no Proxmox node has room for 4 vCPUs and 8.5 GiB of memory: \
         pve1: 2 vCPUs short (2 of 16 free at 100% CPU allocation); \
         pve2: 3.5 GiB memory short (5 GiB of 64 GiB free at 100% memory allocation); \
         pve3: 4 vCPUs short (0 of 8 free at 100% CPU allocation), \
         8.5 GiB memory short (0 GiB of 16 GiB free at 100% memory allocation); \
         pve4: offline"
    );
    assert_eq!(
        error.rejections[1],
        (
            "pve2".into(),
            Rejection::Insufficient {
                memory: Some(Shortage {
                    missing: 3 * GIB + GIB / 2,
                    free: 5 * GIB,
                    capacity: 64 * GIB,
                }),
                vcpus: None,
            }
        )
    );
}

#[test]
fn overcommitted_node_reports_the_full_shortage() {
    // Allocated beyond capacity already (the adjustment was lowered):
    // free shows 0, missing covers the overshoot plus the request.
    let nodes = [with_guests(node("pve1", 8, 16), &[(10, 8)])];
    let error = choose_node(&nodes, &machine(2, 4)).unwrap_err();
    assert_eq!(
        error.rejections[0].1,
        Rejection::Insufficient {
            memory: None,
            vcpus: Some(Shortage {
                missing: 4,
                free: 0,
                capacity: 8,
            }),
        }
    );
}

#[test]
fn no_nodes_at_all_says_so() {
    let error = choose_node(&[], &machine(1, 1)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "no Proxmox node has room for 1 vCPU and 1 GiB of memory: \
         the Proxmox cluster lists no nodes"
    );
    assert!(error.needs_human());
}

#[test]
fn byte_amounts_round_towards_the_safe_side() {
    assert_eq!(bytes(GIB + GIB / 2, Rounding::Up), "1.5 GiB");
    assert_eq!(bytes(GIB + 1, Rounding::Up), "1.1 GiB");
    assert_eq!(bytes(GIB + GIB / 10 - 1, Rounding::Down), "1.0 GiB");
    assert_eq!(bytes(512 << 20, Rounding::Down), "512 MiB");
    assert_eq!(bytes(1, Rounding::Up), "1 MiB");
}
