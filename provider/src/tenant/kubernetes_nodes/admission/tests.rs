use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use tenantry_api::proxmox::TemplateSelector;
use tenantry_api::tenant::{KubernetesSpec, KubernetesVersion};
use tenantry_api::tenant_nodes::{Gpu, KubernetesNodesSpec, ProxmoxPoolSettings, WorkerResources};

fn q(text: &str) -> Quantity {
    Quantity(text.to_string())
}

fn parent(edit: impl FnOnce(&mut KubernetesSpec)) -> Kubernetes {
    let mut spec = KubernetesSpec::default();
    edit(&mut spec);
    Kubernetes::new("demo", spec)
}

fn proxmox_parent() -> Kubernetes {
    parent(|spec| spec.substrate = Substrate::Proxmox)
}

fn pool(edit: impl FnOnce(&mut KubernetesNodesSpec)) -> KubernetesNodes {
    let mut spec = KubernetesNodesSpec::for_cluster("demo");
    edit(&mut spec);
    KubernetesNodes::new("demo-md0", spec)
}

fn proxmox_settings() -> ProxmoxPoolSettings {
    ProxmoxPoolSettings {
        pool: "tenant-demo".into(),
        template_selector: Some(TemplateSelector {
            match_tags: vec!["talos".into()],
            match_policy: None,
        }),
        ..ProxmoxPoolSettings::default()
    }
}

fn sized(cpu: &str, memory: &str) -> impl FnOnce(&mut KubernetesNodesSpec) {
    let (cpu, memory) = (q(cpu), q(memory));
    move |spec| {
        spec.instance_type = String::new();
        spec.resources = Some(WorkerResources {
            cpu: Some(cpu),
            memory: Some(memory),
        });
    }
}

struct Case {
    name: &'static str,
    pool: KubernetesNodes,
    parent: Option<Kubernetes>,
    /// (field, a phrase of its message)
    errors: &'static [(&'static str, &'static str)],
}

fn check(cases: Vec<Case>) {
    for case in cases {
        let verdict = validate(&case.pool, None, case.parent.as_ref());
        verdict.assert_errors(case.name, case.errors);
    }
}

#[test]
fn a_default_pool_of_an_existing_cluster_is_admitted_without_warnings() {
    let verdict = validate(&pool(|_| {}), None, Some(&parent(|_| {})));
    assert_eq!(verdict, Verdict::default());
}

#[test]
fn parent_and_name_rules() {
    check(vec![
        Case {
            name: "a missing parent is refused naming spec.cluster",
            pool: pool(|_| {}),
            parent: None,
            errors: &[(
                "spec.cluster",
                "there is no Kubernetes \"demo\" in this namespace",
            )],
        },
        Case {
            name: "a parent being deleted takes no new pools",
            pool: pool(|_| {}),
            parent: Some({
                let mut parent = parent(|_| {});
                parent.metadata.deletion_timestamp = Some(Time(Default::default()));
                parent
            }),
            errors: &[("spec.cluster", "is being deleted")],
        },
        Case {
            name: "a name without the cluster prefix is refused",
            pool: KubernetesNodes::new("md0", KubernetesNodesSpec::for_cluster("demo")),
            parent: Some(parent(|_| {})),
            errors: &[("metadata.name", "must be <cluster>-<pool>")],
        },
        Case {
            name: "a derived name over 53 characters is refused with the room left",
            pool: KubernetesNodes::new(
                &format!("{}-workers", "c".repeat(32)),
                KubernetesNodesSpec::for_cluster("c".repeat(32)),
            ),
            parent: Some(parent(|_| {})),
            errors: &[(
                "metadata.name",
                "has 57 characters, more than 53: shorten the pool name \"workers\" to at most 3 characters",
            )],
        },
        Case {
            name: "the longest cluster name leaves a pool name of three",
            pool: KubernetesNodes::new(
                &format!("{}-md0", "c".repeat(32)),
                KubernetesNodesSpec::for_cluster("c".repeat(32)),
            ),
            parent: Some(parent(|_| {})),
            errors: &[],
        },
    ]);
}

#[test]
fn substrate_rules() {
    check(vec![
        Case {
            name: "a Proxmox cluster's pool needs the proxmox block",
            pool: pool(|_| {}),
            parent: Some(proxmox_parent()),
            errors: &[(
                "spec.proxmox",
                "substrate: proxmox), so the pool needs spec.proxmox",
            )],
        },
        Case {
            name: "a KubeVirt cluster's pool may not carry one",
            pool: pool(|spec| spec.proxmox = Some(proxmox_settings())),
            parent: Some(parent(|_| {})),
            errors: &[(
                "spec.proxmox",
                "applies only to pools of clusters with substrate: proxmox",
            )],
        },
        Case {
            name: "a Proxmox pool with its block is admitted",
            pool: pool(|spec| spec.proxmox = Some(proxmox_settings())),
            parent: Some(proxmox_parent()),
            errors: &[],
        },
        Case {
            name: "GPUs only on KubeVirt",
            pool: pool(|spec| {
                spec.proxmox = Some(proxmox_settings());
                spec.gpus = vec![Gpu {
                    name: "nvidia.com/AD102GL_L40S".into(),
                }];
            }),
            parent: Some(proxmox_parent()),
            errors: &[("spec.gpus", "KubeVirt workers only")],
        },
        Case {
            name: "Proxmox grows disks in whole GiB",
            pool: pool(|spec| {
                spec.proxmox = Some(proxmox_settings());
                spec.disk_size = q("20G");
            }),
            parent: Some(proxmox_parent()),
            errors: &[("spec.diskSize", "not a whole number of GiB")],
        },
        Case {
            name: "any positive disk size on KubeVirt",
            pool: pool(|spec| spec.disk_size = q("20G")),
            parent: Some(parent(|_| {})),
            errors: &[],
        },
        Case {
            name: "Proxmox memory in multiples of 8Mi",
            pool: pool(|spec| {
                sized("2", "4100Mi")(spec);
                spec.proxmox = Some(proxmox_settings());
            }),
            parent: Some(proxmox_parent()),
            errors: &[("spec.resources.memory", "not a multiple of 8Mi")],
        },
    ]);
}

#[test]
fn version_rules() {
    let at = |version: KubernetesVersion| Some(parent(move |spec| spec.version = version));
    check(vec![
        Case {
            name: "the cluster's minor",
            pool: pool(|spec| spec.version = Some(KubernetesVersion::V1_34)),
            parent: at(KubernetesVersion::V1_34),
            errors: &[],
        },
        Case {
            name: "three minors behind",
            pool: pool(|spec| spec.version = Some(KubernetesVersion::V1_31)),
            parent: at(KubernetesVersion::V1_34),
            errors: &[],
        },
        Case {
            name: "four minors behind",
            pool: pool(|spec| spec.version = Some(KubernetesVersion::V1_31)),
            parent: at(KubernetesVersion::V1_35),
            errors: &[(
                "spec.version",
                "more than 3 minors older than Kubernetes \"demo\" (v1.35)",
            )],
        },
        Case {
            name: "newer than the cluster",
            pool: pool(|spec| spec.version = Some(KubernetesVersion::V1_35)),
            parent: at(KubernetesVersion::V1_34),
            errors: &[(
                "spec.version",
                "v1.35 is newer than Kubernetes \"demo\" (v1.34)",
            )],
        },
    ]);
}

#[test]
fn size_rules() {
    let cluster = || Some(parent(|_| {}));
    check(vec![
        Case {
            name: "every instance type of the table",
            pool: pool(|spec| spec.instance_type = "m1.8xlarge1gi".into()),
            parent: cluster(),
            errors: &[],
        },
        Case {
            name: "an unknown instance type",
            pool: pool(|spec| spec.instance_type = "u1.3xlarge".into()),
            parent: cluster(),
            errors: &[(
                "spec.instanceType",
                "\"u1.3xlarge\" is not an instance type the platform provides; use <series>.<size> with a series of cx1, d1, gn1, m1, n1, o1, rt1, u1",
            )],
        },
        Case {
            name: "an unknown instance type is fine when resources size the workers",
            pool: pool(|spec| {
                sized("2", "4Gi")(spec);
                spec.instance_type = "custom.type".into();
            }),
            parent: cluster(),
            errors: &[],
        },
        Case {
            name: "no size at all",
            pool: pool(|spec| spec.instance_type = String::new()),
            parent: cluster(),
            errors: &[("spec.instanceType", "the workers need a size")],
        },
        Case {
            name: "fractional vCPUs",
            pool: pool(sized("1500m", "4Gi")),
            parent: cluster(),
            errors: &[("spec.resources.cpu", "not a whole number of vCPUs")],
        },
        Case {
            name: "whole vCPUs in millicores",
            pool: pool(sized("2000m", "4Gi")),
            parent: cluster(),
            errors: &[],
        },
        Case {
            name: "zero and negative sizes",
            pool: pool(|spec| {
                sized("0", "-1Gi")(spec);
                spec.disk_size = q("0");
            }),
            parent: cluster(),
            errors: &[
                ("spec.resources.cpu", "\"0\" is not a whole number of vCPUs"),
                (
                    "spec.resources.memory",
                    "\"-1Gi\" is not a positive memory quantity",
                ),
                ("spec.diskSize", "\"0\" is not a positive size"),
            ],
        },
    ]);
}

#[test]
fn kubelet_rules() {
    let cluster = || Some(parent(|_| {}));
    let kubelet = |edit: fn(&mut tenantry_api::tenant_nodes::KubeletReservations)| {
        pool(move |spec| {
            sized("2", "8Gi")(spec);
            edit(&mut spec.kubelet);
        })
    };
    check(vec![
        Case {
            name: "absolute thresholds with hard below soft",
            pool: kubelet(|k| {
                k.eviction_hard_memory = "200Mi".into();
                k.eviction_soft_memory = "1Gi".into();
            }),
            parent: cluster(),
            errors: &[],
        },
        Case {
            name: "absolute thresholds with hard above soft",
            pool: kubelet(|k| {
                k.eviction_hard_memory = "1Gi".into();
                k.eviction_soft_memory = "200Mi".into();
            }),
            parent: cluster(),
            errors: &[(
                "spec.kubelet.evictionHardMemory",
                "evictionHardMemory (1Gi) must be below evictionSoftMemory (200Mi)",
            )],
        },
        Case {
            name: "equal percentages",
            pool: kubelet(|k| {
                k.eviction_hard_memory = "10%".into();
            }),
            parent: cluster(),
            errors: &[(
                "spec.kubelet.evictionHardMemory",
                "evictionHardMemory (10%) must be below evictionSoftMemory (10%)",
            )],
        },
        Case {
            name: "mixed kinds",
            pool: kubelet(|k| {
                k.eviction_hard_memory = "1Gi".into();
            }),
            parent: cluster(),
            errors: &[(
                "spec.kubelet.evictionHardMemory",
                "must be of the same kind: both percentages or both amounts",
            )],
        },
        Case {
            name: "percentages out of range",
            pool: kubelet(|k| {
                k.eviction_hard_memory = "0%".into();
                k.eviction_soft_memory = "150%".into();
            }),
            parent: cluster(),
            errors: &[
                (
                    "spec.kubelet.evictionHardMemory",
                    "evictionHardMemory percentage must be greater than 0 and at most 100, got 0%",
                ),
                (
                    "spec.kubelet.evictionSoftMemory",
                    "evictionSoftMemory percentage must be greater than 0 and at most 100, got 150%",
                ),
            ],
        },
        Case {
            name: "zero reservations",
            pool: kubelet(|k| {
                k.system_reserved_memory = Some(q("0"));
                k.kube_reserved_cpu = Some(q("-100m"));
            }),
            parent: cluster(),
            errors: &[
                (
                    "spec.kubelet.systemReservedMemory",
                    "\"0\" is not a positive memory quantity",
                ),
                (
                    "spec.kubelet.kubeReservedCpu",
                    "\"-100m\" is not a positive CPU quantity",
                ),
            ],
        },
        Case {
            name: "reservations eating the memory",
            pool: kubelet(|k| {
                k.system_reserved_memory = Some(q("4Gi"));
                k.kube_reserved_memory = Some(q("4Gi"));
            }),
            parent: cluster(),
            errors: &[(
                "spec.kubelet",
                "systemReservedMemory (4Gi) + kubeReservedMemory (4Gi) + evictionHardMemory (7%) = 8765.5Mi leave no memory for pods on workers with 8Gi (resources)",
            )],
        },
        Case {
            name: "reservations eating the CPU",
            pool: kubelet(|k| {
                k.system_reserved_cpu = Some(q("1200m"));
                k.kube_reserved_cpu = Some(q("0.8"));
            }),
            parent: cluster(),
            errors: &[(
                "spec.kubelet",
                "systemReservedCpu (1200m) + kubeReservedCpu (0.8) = 2000m leave no CPU for pods on workers with 2 vCPUs",
            )],
        },
        Case {
            name: "the computed reservations do not fit a 512Mi worker",
            pool: pool(|spec| spec.instance_type = "u1.nano".into()),
            parent: cluster(),
            errors: &[(
                "spec.kubelet",
                "systemReservedMemory (computed: 256Mi) + kubeReservedMemory (computed: 256Mi) + evictionHardMemory (7%) = 547.9Mi leave no memory for pods on workers with 512Mi (instance type u1.nano)",
            )],
        },
        Case {
            name: "the computed reservations fit a 1Gi worker",
            pool: pool(|spec| spec.instance_type = "u1.micro".into()),
            parent: cluster(),
            errors: &[],
        },
    ]);
}

#[test]
fn storage_class_may_be_written_down_only_as_the_clusters() {
    let old = pool(|_| {});
    let cluster = parent(|_| {});
    let same = pool(|spec| spec.storage_class = Some("replicated".into()));
    assert!(validate(&same, Some(&old), Some(&cluster)).allowed());
    let other = pool(|spec| spec.storage_class = Some("local".into()));
    let verdict = validate(&other, Some(&old), Some(&cluster));
    assert_eq!(verdict.errors.len(), 1, "{verdict:?}");
    assert_eq!(verdict.errors[0].field, "spec.storageClass");
    assert!(
        verdict.errors[0]
            .message
            .contains("use the cluster's storageClass \"replicated\""),
        "{verdict:?}"
    );
    // On create, any class.
    assert!(validate(&other, None, Some(&cluster)).allowed());
}

#[test]
fn metadata_updates_and_deleting_pools_pass_even_without_a_parent() {
    let old = pool(|_| {});
    let mut new = old.clone();
    new.metadata.finalizers = Some(vec![]);
    assert_eq!(validate(&new, Some(&old), None), Verdict::default());

    let mut deleting = pool(|spec| spec.min_replicas = 2);
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert_eq!(validate(&deleting, Some(&old), None), Verdict::default());

    // A spec change of a live pool still needs the parent.
    let changed = pool(|spec| spec.min_replicas = 2);
    assert!(!validate(&changed, Some(&old), None).allowed());
    assert!(validate(&changed, Some(&old), Some(&parent(|_| {}))).allowed());
}

#[test]
fn warnings() {
    let cluster = parent(|_| {});
    let single = pool(|spec| {
        spec.min_replicas = 1;
        spec.max_replicas = 1;
    });
    let verdict = validate(&single, None, Some(&cluster));
    assert!(verdict.allowed());
    assert!(
        verdict.warnings[0].contains("50% of at most 1 worker(s) rounds down to 0"),
        "{verdict:?}"
    );
    let off = pool(|spec| {
        spec.max_replicas = 1;
        spec.node_health_check.max_unhealthy = IntOrString::String("0%".into());
    });
    assert!(validate(&off, None, Some(&cluster)).warnings.is_empty());

    let small_gpu = pool(|spec| {
        spec.instance_type = "u1.small".into();
        spec.gpus = vec![Gpu {
            name: "nvidia.com/AD102GL_L40S".into(),
        }];
    });
    let verdict = validate(&small_gpu, None, Some(&cluster));
    assert!(verdict.allowed());
    assert!(
        verdict.warnings[0].contains("the workers have 2Gi of memory"),
        "{verdict:?}"
    );

    let proxmox_class = pool(|spec| {
        spec.proxmox = Some(proxmox_settings());
        spec.storage_class = Some("replicated".into());
    });
    let verdict = validate(&proxmox_class, None, Some(&proxmox_parent()));
    assert!(verdict.allowed(), "{verdict:?}");
    assert!(verdict.warnings[0].contains("no effect on Proxmox VE workers"));
}

#[test]
fn a_pool_from_yaml_is_checked_like_one_built_in_code() {
    let pool: KubernetesNodes = serde_json::from_value(json!({
        "apiVersion": "apps.tenantry.dev/v1alpha1",
        "kind": "KubernetesNodes",
        "metadata": { "name": "demo-gpu", "namespace": "tenant-a" },
        "spec": {
            "cluster": "demo",
            "minReplicas": 1,
            "maxReplicas": 3,
            "instanceType": "u1.xlarge",
            "diskSize": "50Gi",
            "roles": ["ingress-nginx"],
            "gpus": [{ "name": "nvidia.com/AD102GL_L40S" }],
            "kubelet": { "systemReservedMemory": "1Gi", "evictionHardMemory": "5%" },
            "nodeHealthCheck": { "maxUnhealthy": 1 }
        }
    }))
    .unwrap();
    let verdict = validate(&pool, None, Some(&parent(|_| {})));
    assert_eq!(verdict, Verdict::default());
}
