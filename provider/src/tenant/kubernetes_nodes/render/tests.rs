use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tenantry_api::tenant::KubernetesSpec;
use tenantry_api::tenant_nodes::{KubernetesNodesSpec, WorkerResources};

/// The manager's default image factory in these tests.
const FACTORY: &str = "http://factory.internal:8080";

fn parent(substrate: Substrate) -> Kubernetes {
    let mut k = Kubernetes::new("demo", KubernetesSpec::default());
    k.metadata.namespace = Some("tenant-a".into());
    k.spec.substrate = substrate;
    k
}

fn pool(spec: KubernetesNodesSpec) -> KubernetesNodes {
    let mut p = KubernetesNodes::new("demo-md0", spec);
    p.metadata.namespace = Some("tenant-a".into());
    p
}

#[test]
fn names_follow_the_platform_chart() {
    let names = PoolNames::of(&pool(KubernetesNodesSpec::for_cluster("demo"))).unwrap();
    assert_eq!(names.objects, "kubernetes-demo-md0");
    assert_eq!(names.cluster, "kubernetes-demo");
    let wrong = KubernetesNodes::new("other-md0", KubernetesNodesSpec::for_cluster("demo"));
    assert_eq!(PoolNames::of(&wrong), None);
}

#[test]
fn the_machine_template_name_changes_with_what_rolls_workers_only() {
    let k = parent(Substrate::Kubevirt);
    let p = pool(KubernetesNodesSpec::for_cluster("demo"));
    let names = PoolNames::of(&p).unwrap();
    let first = machine_template(&k, &p, &names, FACTORY);
    assert_eq!(first, machine_template(&k, &p, &names, FACTORY), "stable");
    let name = first["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("kubernetes-demo-md0-") && name.len() == 20 + HASH_LENGTH);

    let mut upgraded = k.clone();
    upgraded.spec.talos.version = "v1.13.7".into();
    assert_ne!(
        machine_template(&upgraded, &p, &names, FACTORY)["metadata"]["name"],
        first["metadata"]["name"]
    );

    // Scaling and kubelet reservations do not touch the template.
    let mut scaled = p.clone();
    scaled.spec.min_replicas = 5;
    scaled.spec.kubelet.eviction_hard_memory = "5%".into();
    assert_eq!(
        machine_template(&k, &scaled, &names, FACTORY)["metadata"]["name"],
        first["metadata"]["name"]
    );

    let mut bigger = p.clone();
    bigger.spec.disk_size = Quantity("40Gi".into());
    assert_ne!(
        machine_template(&k, &bigger, &names, FACTORY)["metadata"]["name"],
        first["metadata"]["name"]
    );
}

#[test]
fn kubevirt_workers_use_the_instance_type_unless_sized_by_resources() {
    let k = parent(Substrate::Kubevirt);
    let mut p = pool(KubernetesNodesSpec::for_cluster("demo"));
    p.spec.roles = vec!["ingress-nginx".into()];
    let names = PoolNames::of(&p).unwrap();
    let t = machine_template(&k, &p, &names, FACTORY);
    let spec = &t["spec"]["template"]["spec"];
    assert_eq!(
        spec["virtualMachineTemplate"]["spec"]["instancetype"]["name"],
        "u1.medium"
    );
    assert!(spec["virtualMachineTemplate"]["spec"]["template"]["spec"]["domain"]["cpu"].is_null());
    assert_eq!(spec["bootDisk"]["storageClass"], "replicated");
    assert_eq!(spec["bootDisk"]["diskSize"], "20Gi");
    assert_eq!(spec["bootDisk"]["talosVersion"], k.spec.talos.version);
    assert_eq!(
        spec["virtualMachineTemplate"]["metadata"]["labels"]["node-role.kubernetes.io/ingress-nginx"],
        ""
    );

    p.spec.resources = Some(WorkerResources {
        cpu: Some(Quantity("3".into())),
        memory: Some(Quantity("6Gi".into())),
    });
    let t = machine_template(&k, &p, &names, FACTORY);
    let vm = &t["spec"]["template"]["spec"]["virtualMachineTemplate"]["spec"];
    assert!(vm["instancetype"].is_null());
    assert_eq!(vm["template"]["spec"]["domain"]["cpu"]["cores"], 3);
    assert_eq!(vm["template"]["spec"]["domain"]["memory"]["guest"], "6Gi");
}

#[test]
fn kubevirt_workers_boot_from_the_clusters_factory_else_the_managers() {
    let mut k = parent(Substrate::Kubevirt);
    let p = pool(KubernetesNodesSpec::for_cluster("demo"));
    let names = PoolNames::of(&p).unwrap();
    let boot_disk = |k: &Kubernetes, default: &str| {
        machine_template(k, &p, &names, default)["spec"]["template"]["spec"]["bootDisk"].clone()
    };
    // Stored without one (it bypassed the webhook): the manager's.
    assert_eq!(boot_disk(&k, FACTORY)["imageFactoryURL"], FACTORY);
    assert_eq!(
        boot_disk(&k, FACTORY)["schematicID"],
        tenantry_api::tenant::DEFAULT_TALOS_SCHEMATIC_ID
    );
    k.spec.talos.image_factory_url = Some("https://mirror.example.org".into());
    assert_eq!(
        boot_disk(&k, FACTORY)["imageFactoryURL"],
        "https://mirror.example.org"
    );
    // The cluster's own value wins whatever the manager's default is,
    // so a new manager default rolls no pool that names its factory.
    assert_eq!(
        machine_template(&k, &p, &names, FACTORY)["metadata"]["name"],
        machine_template(&k, &p, &names, "https://factory.talos.dev")["metadata"]["name"]
    );
}

#[test]
fn proxmox_workers_clone_into_the_pool() {
    let k = parent(Substrate::Proxmox);
    let mut p = pool(KubernetesNodesSpec::for_cluster("demo"));
    p.spec.proxmox = Some(tenantry_api::tenant_nodes::ProxmoxPoolSettings {
        pool: "tenant-a".into(),
        source_node: Some("pve1".into()),
        template_id: Some(9000),
        storage: Some("tenant-a-disks".into()),
        iso_storage: Some("tenant-a-iso".into()),
        template_selector: None,
    });
    let names = PoolNames::of(&p).unwrap();
    let t = machine_template(&k, &p, &names, FACTORY);
    assert_eq!(t["kind"], "ProxmoxMachineTemplate");
    let spec = &t["spec"]["template"]["spec"];
    assert_eq!(spec["pool"], "tenant-a");
    assert_eq!(spec["templateID"], 9000);
    assert_eq!(spec["numCores"], 1, "u1.medium has one vCPU");
    assert_eq!(spec["memoryMiB"], 4096);
    assert_eq!(spec["disks"]["bootVolume"]["sizeGb"], 20);
}

#[test]
fn the_deployment_leaves_replicas_to_the_autoscaler() {
    let k = parent(Substrate::Kubevirt);
    let mut p = pool(KubernetesNodesSpec::for_cluster("demo"));
    p.spec.min_replicas = 2;
    p.spec.max_replicas = 6;
    let names = PoolNames::of(&p).unwrap();
    let md = machine_deployment(
        &k,
        &p,
        &names,
        "kubernetes-demo-md0-abc",
        "kubernetes-demo-md0-def",
    );
    assert!(md["spec"]["replicas"].is_null());
    let a = &md["metadata"]["annotations"];
    assert_eq!(a[MIN_SIZE_ANNOTATION], "2");
    assert_eq!(a[MAX_SIZE_ANNOTATION], "6");
    assert_eq!(a[MAX_PROVISION_TIME_ANNOTATION], "30m");
    // u1.medium: 1 vCPU, 4Gi. Reservations 256Mi twice (5% < 256Mi),
    // 7% eviction: 4096 - 512 - 286.72 = 3297 MiB; CPU 1000 - 50 - 50.
    assert_eq!(a[CAPACITY_MEMORY_ANNOTATION], "3297Mi");
    assert_eq!(a[CAPACITY_CPU_ANNOTATION], "900m");
    assert_eq!(
        md["spec"]["template"]["spec"]["version"],
        k.spec.version.pinned_patch()
    );
    assert_eq!(
        md["spec"]["template"]["spec"]["infrastructureRef"]["name"],
        "kubernetes-demo-md0-abc"
    );
    assert_eq!(
        md["spec"]["template"]["spec"]["bootstrap"]["configRef"]["kind"],
        "TalosConfigTemplate"
    );
    assert_eq!(
        md["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"],
        "kubernetes-demo-md0-def"
    );
}

#[test]
fn a_new_worker_config_is_a_new_bootstrap_template() {
    let k = parent(Substrate::Kubevirt);
    let p = pool(KubernetesNodesSpec::for_cluster("demo"));
    let names = PoolNames::of(&p).unwrap();
    let name = |config: &str| {
        talos_config_template(&k, &names, config)["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(name("a"), name("a"));
    assert_ne!(name("a"), name("b"));
    assert!(name("a").starts_with("kubernetes-demo-md0-"));
}

#[test]
fn the_health_check_takes_the_pool_settings() {
    let mut p = pool(KubernetesNodesSpec::for_cluster("demo"));
    p.spec.node_health_check.max_unhealthy = IntOrString::Int(1);
    p.spec.node_health_check.ready_unknown_timeout = "1h30m".into();
    let names = PoolNames::of(&p).unwrap();
    let mhc = machine_health_check(&p, &names);
    assert_eq!(
        mhc["spec"]["remediation"]["triggerIf"]["unhealthyLessThanOrEqualTo"],
        1
    );
    assert_eq!(mhc["spec"]["checks"]["nodeStartupTimeoutSeconds"], 1200);
    assert_eq!(
        mhc["spec"]["checks"]["unhealthyNodeConditions"][0]["timeoutSeconds"],
        5400
    );
    let default = machine_health_check(&pool(KubernetesNodesSpec::for_cluster("demo")), &names);
    assert_eq!(
        default["spec"]["remediation"]["triggerIf"]["unhealthyLessThanOrEqualTo"],
        "50%"
    );
}

#[test]
fn durations() {
    assert_eq!(duration_seconds("20m"), Some(1200));
    assert_eq!(duration_seconds("1h30m"), Some(5400));
    assert_eq!(duration_seconds("90s"), Some(90));
    assert_eq!(duration_seconds("5"), None);
    assert_eq!(duration_seconds("1.5h"), None);
}

#[test]
fn durations_past_i64_seconds_are_none_not_a_panic() {
    // Found by fuzz/quantity_duration.
    assert_eq!(duration_seconds("88088777388088777h"), None);
    assert_eq!(duration_seconds("9223372036854775807s1s"), None);
    assert_eq!(
        duration_seconds("2562047788015215h"),
        Some(9_223_372_036_854_774_000)
    );
}
