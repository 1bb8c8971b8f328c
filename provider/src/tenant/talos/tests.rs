use super::schema_check::schema_violations;
use super::*;
use crate::tenant::pki;
use serde_json::json;
use tenantry_api::tenant::{KubernetesSpec, KubernetesVersion};
use tenantry_api::tenant_nodes::{Gpu, KubernetesNodesSpec, WorkerResources};

/// A cluster's trust material: fresh random tokens and CAs, with the
/// CA keys kept to prove they never leak.
struct Material {
    secrets: std::collections::BTreeMap<String, String>,
    talos_ca: (String, String),
    kubernetes_ca: (String, String),
}

impl Material {
    fn new() -> Self {
        Self {
            secrets: pki::talos_secrets(),
            talos_ca: pki::talos_ca().expect("Talos CA"),
            // Any CA certificate does for the tenant's Kubernetes CA.
            kubernetes_ca: pki::talos_ca().expect("Kubernetes CA"),
        }
    }

    fn trust(&self) -> WorkerTrust<'_> {
        WorkerTrust {
            machine_token: &self.secrets[pki::TALOS_TOKEN_KEY],
            talos_ca_pem: &self.talos_ca.0,
            cluster_id: &self.secrets[pki::TALOS_CLUSTER_ID_KEY],
            cluster_secret: &self.secrets[pki::TALOS_CLUSTER_SECRET_KEY],
            bootstrap_token: &self.secrets[pki::TALOS_BOOTSTRAP_TOKEN_KEY],
            kubernetes_ca_pem: &self.kubernetes_ca.0,
        }
    }

    /// Everything of this cluster another cluster's config must not
    /// contain.
    fn secrets(&self) -> Vec<String> {
        let trust = self.trust();
        vec![
            trust.machine_token.to_string(),
            trust.cluster_secret.to_string(),
            trust.bootstrap_token.to_string(),
            STANDARD.encode(trust.talos_ca_pem),
            STANDARD.encode(trust.kubernetes_ca_pem),
        ]
    }
}

fn kubernetes(name: &str, namespace: &str, spec: Value) -> Kubernetes {
    let mut kubernetes = Kubernetes::new(
        name,
        serde_json::from_value::<KubernetesSpec>(spec).expect("spec"),
    );
    kubernetes.metadata.namespace = Some(namespace.into());
    kubernetes
}

fn pool(cluster: &str, edit: impl FnOnce(&mut KubernetesNodesSpec)) -> KubernetesNodes {
    let mut spec = KubernetesNodesSpec::for_cluster(cluster);
    edit(&mut spec);
    KubernetesNodes::new(&format!("{cluster}-md0"), spec)
}

fn parse(yaml: &str) -> Value {
    serde_norway::from_str(yaml).expect("the worker config is YAML")
}

fn decoded(value: &Value) -> String {
    let text = value.as_str().expect("a base64 string");
    String::from_utf8(STANDARD.decode(text).expect("base64")).expect("UTF-8 PEM")
}

const MIRRORS: &str = "docker.io";

/// A cluster with every optional part set, so the schema check sees
/// every path the renderer can emit.
fn full_cluster() -> Kubernetes {
    kubernetes(
        "demo",
        "tenant-a",
        json!({
            "talos": {
                "registryMirrors": {
                    MIRRORS: {
                        "endpoints": ["http://registry-mirror:5000"],
                        "overridePath": false,
                        "skipFallback": true,
                    },
                },
            },
        }),
    )
}

#[test]
fn the_worker_config_uses_only_talos_fields_and_carries_what_a_worker_needs() {
    let material = Material::new();
    let kubernetes = full_cluster();
    let pool = pool("demo", |spec| {
        spec.gpus = vec![Gpu {
            name: "nvidia.com/AD102GL_L40S".into(),
        }];
    });
    let config = parse(&worker_config(
        &kubernetes,
        &pool,
        &material.trust(),
        Some("10.96.0.12"),
    ));

    let mut violations = Vec::new();
    schema_violations(&config, "", "", &mut violations);
    assert!(violations.is_empty(), "{violations:#?}");
    // The check is not vacuous: a misspelt field and a wrong type show.
    let mut broken = config.clone();
    broken["machine"]["kubelet"]["extraArgz"] = json!({});
    broken["machine"]["install"]["wipe"] = json!("false");
    schema_violations(&broken, "", "", &mut violations);
    assert_eq!(violations.len(), 2, "{violations:#?}");

    assert_eq!(config["version"], "v1alpha1");
    assert_eq!(config["machine"]["type"], "worker");
    let trust = material.trust();
    for (path, want) in [
        ("/machine/token", trust.machine_token),
        ("/cluster/token", trust.bootstrap_token),
        ("/cluster/id", trust.cluster_id),
        ("/cluster/secret", trust.cluster_secret),
        ("/cluster/clusterName", "kubernetes-demo"),
        (
            "/machine/install/image",
            &format!(
                "{}/{}:{}",
                kubernetes.spec.talos.installer_repository,
                kubernetes.spec.talos.schematic_id,
                kubernetes.spec.talos.version
            ),
        ),
        (
            "/cluster/controlPlane/endpoint",
            "https://kubernetes-demo.tenant-a.svc:6443",
        ),
    ] {
        assert_eq!(
            config.pointer(path).and_then(Value::as_str),
            Some(want),
            "{path}"
        );
    }
    assert_eq!(
        control_plane_endpoint(&kubernetes),
        "https://kubernetes-demo.tenant-a.svc:6443"
    );
    assert_eq!(config["machine"]["ca"]["key"], "");
    assert_eq!(config["cluster"]["ca"]["key"], "");
    assert_eq!(decoded(&config["machine"]["ca"]["crt"]), trust.talos_ca_pem);
    assert_eq!(
        decoded(&config["cluster"]["ca"]["crt"]),
        trust.kubernetes_ca_pem
    );
    assert_eq!(
        config["cluster"]["network"]["podSubnets"],
        json!([POD_CIDR])
    );
    assert_eq!(
        config["cluster"]["network"]["serviceSubnets"],
        json!([SERVICE_CIDR])
    );
    assert_eq!(
        config["machine"]["registries"]["mirrors"][MIRRORS],
        json!({
            "endpoints": ["http://registry-mirror:5000"],
            "overridePath": false,
            "skipFallback": true,
        })
    );
}

#[test]
fn a_worker_config_carries_no_secret_of_another_cluster_and_no_private_key() {
    let (a, b) = (Material::new(), Material::new());
    let config_a = worker_config(
        &kubernetes("a", "tenant-a", json!({})),
        &pool("a", |_| {}),
        &a.trust(),
        Some("10.96.0.10"),
    );
    let config_b = worker_config(
        &kubernetes("b", "tenant-b", json!({})),
        &pool("b", |_| {}),
        &b.trust(),
        Some("10.96.0.11"),
    );
    for (config, own, other) in [(&config_a, &a, &b), (&config_b, &b, &a)] {
        for secret in other.secrets() {
            assert!(
                !config.contains(&secret),
                "{secret:?} leaked into\n{config}"
            );
        }
        for secret in own.secrets() {
            assert!(
                config.contains(&secret),
                "{secret:?} missing from\n{config}"
            );
        }
        let parsed = parse(config);
        for ca in ["/machine/ca", "/cluster/ca"] {
            assert_eq!(parsed.pointer(&format!("{ca}/key")), Some(&json!("")));
            assert!(
                !decoded(parsed.pointer(&format!("{ca}/crt")).unwrap()).contains("PRIVATE KEY")
            );
        }
        assert!(!config.contains("PRIVATE KEY"));
        for material in [&a, &b] {
            for key in [&material.talos_ca.1, &material.kubernetes_ca.1] {
                assert!(key.contains("PRIVATE KEY"), "the fixture holds a real key");
                assert!(!config.contains(key.as_str()));
                assert!(!config.contains(&STANDARD.encode(key)));
            }
        }
    }
}

#[test]
fn rendering_is_deterministic_and_changes_with_mirrors_and_reservations() {
    let material = Material::new();
    let trust = material.trust();
    let kubernetes = kubernetes("demo", "tenant-a", json!({}));
    let pool = pool("demo", |_| {});
    let config = worker_config(&kubernetes, &pool, &trust, Some("10.96.0.12"));
    assert_eq!(
        config,
        worker_config(&kubernetes, &pool, &trust, Some("10.96.0.12"))
    );

    let mirrored = full_cluster();
    assert_ne!(
        config,
        worker_config(&mirrored, &pool, &trust, Some("10.96.0.12"))
    );

    let reserved = self::pool("demo", |spec| {
        spec.kubelet.system_reserved_memory = Some(Quantity("512Mi".into()));
    });
    assert_ne!(
        config,
        worker_config(&kubernetes, &reserved, &trust, Some("10.96.0.12"))
    );
    let evicting = self::pool("demo", |spec| {
        spec.kubelet.eviction_hard_memory = "5%".into();
    });
    assert_ne!(
        config,
        worker_config(&kubernetes, &evicting, &trust, Some("10.96.0.12"))
    );
}

#[test]
fn the_installer_image_is_the_repository_schematic_and_talos_version() {
    let material = Material::new();
    let kubernetes = kubernetes(
        "demo",
        "tenant-a",
        json!({
            "talos": {
                "version": "v1.12.4",
                "schematicID": "a".repeat(64),
                "installerRepository": "registry.example.org/talos/installer",
            },
        }),
    );
    let config = parse(&worker_config(
        &kubernetes,
        &pool("demo", |_| {}),
        &material.trust(),
        None,
    ));
    assert_eq!(
        config["machine"]["install"],
        json!({
            "disk": "/dev/vda",
            "image": format!("registry.example.org/talos/installer/{}:v1.12.4", "a".repeat(64)),
            "wipe": false,
        })
    );
    assert_eq!(talos_minor("v1.12.4"), "v1.12");
    assert_eq!(talos_minor("v1.13.0-alpha.1"), "v1.13");
    assert_eq!(
        talos_minor(tenantry_api::tenant::DEFAULT_TALOS_VERSION),
        "v1.13"
    );
}

#[test]
fn the_kubelet_image_follows_the_pools_version_when_it_lags_the_cluster() {
    let material = Material::new();
    let kubernetes = kubernetes("demo", "tenant-a", json!({ "version": "v1.35" }));
    let image = |pool: &KubernetesNodes| {
        parse(&worker_config(&kubernetes, pool, &material.trust(), None))["machine"]["kubelet"]
            ["image"]
            .clone()
    };
    assert_eq!(
        image(&pool("demo", |_| {})),
        "ghcr.io/siderolabs/kubelet:v1.35.6"
    );
    let lagging = pool("demo", |spec| spec.version = Some(KubernetesVersion::V1_33));
    assert_eq!(
        image(&lagging),
        format!(
            "ghcr.io/siderolabs/kubelet:{}",
            KubernetesVersion::V1_33.pinned_patch()
        )
    );
}

#[test]
fn host_entries_for_the_apiserver_only_with_its_service_ip() {
    let material = Material::new();
    let kubernetes = kubernetes("demo", "tenant-a", json!({}));
    let pool = pool("demo", |_| {});
    let with_ip = parse(&worker_config(
        &kubernetes,
        &pool,
        &material.trust(),
        Some("10.96.0.12"),
    ));
    assert_eq!(
        with_ip["machine"]["network"],
        json!({
            "extraHostEntries": [{
                "ip": "10.96.0.12",
                "aliases": [
                    "kubernetes-demo.tenant-a.svc",
                    "kubernetes-demo.tenant-a.svc.cluster.local",
                ],
            }],
        })
    );
    let without = parse(&worker_config(&kubernetes, &pool, &material.trust(), None));
    assert_eq!(without["machine"].get("network"), None);
}

#[test]
fn unset_reservations_are_computed_from_the_worker_size() {
    let material = Material::new();
    let kubernetes = kubernetes("demo", "tenant-a", json!({}));
    let extra = |pool: &KubernetesNodes| {
        parse(&worker_config(&kubernetes, pool, &material.trust(), None))["machine"]["kubelet"]
            ["extraConfig"]
            .clone()
    };
    let reserved = |cpu: &str, memory: &str| json!({ "cpu": cpu, "memory": memory });

    // u1.medium, 1 vCPU and 4Gi: 5% is below the floors of 50m and 256Mi.
    let medium = extra(&pool("demo", |_| {}));
    assert_eq!(medium["systemReserved"], reserved("50m", "256Mi"));
    assert_eq!(medium["kubeReserved"], reserved("50m", "256Mi"));
    assert_eq!(
        medium["evictionHard"],
        json!({
            "memory.available": "7%",
            "nodefs.available": "10%",
            "imagefs.available": "15%",
            "nodefs.inodesFree": "5%",
        })
    );
    assert_eq!(medium["evictionSoft"]["memory.available"], "10%");
    assert_eq!(
        medium["evictionSoftGracePeriod"]["memory.available"],
        "1m30s"
    );
    assert_eq!(
        medium["evictionMinimumReclaim"]["memory.available"],
        "256Mi"
    );

    // u1.large, 2 vCPUs and 8Gi: 5% is 100m and 409.6Mi, rounded down.
    let large = extra(&pool("demo", |spec| spec.instance_type = "u1.large".into()));
    assert_eq!(large["systemReserved"], reserved("100m", "409Mi"));
    assert_eq!(large["kubeReserved"], reserved("100m", "409Mi"));

    // resources win over the instance type; 5% of 32 vCPUs and 64Gi
    // hits the ceilings of 500m and 1Gi.
    let big = extra(&pool("demo", |spec| {
        spec.resources = Some(WorkerResources {
            cpu: Some(Quantity("32".into())),
            memory: Some(Quantity("64Gi".into())),
        });
    }));
    assert_eq!(big["systemReserved"], reserved("500m", "1024Mi"));

    // What the pool sets is passed through as written.
    let set = extra(&pool("demo", |spec| {
        spec.kubelet.system_reserved_cpu = Some(Quantity("150m".into()));
        spec.kubelet.kube_reserved_memory = Some(Quantity("1Gi".into()));
        spec.kubelet.eviction_hard_memory = "500Mi".into();
        spec.kubelet.eviction_soft_memory = "1Gi".into();
    }));
    assert_eq!(set["systemReserved"], reserved("150m", "256Mi"));
    assert_eq!(set["kubeReserved"], reserved("50m", "1Gi"));
    assert_eq!(set["evictionHard"]["memory.available"], "500Mi");
    assert_eq!(set["evictionSoft"]["memory.available"], "1Gi");
}

#[test]
fn gpu_workers_are_labelled_gpu_on_as_a_string() {
    let material = Material::new();
    let kubernetes = kubernetes("demo", "tenant-a", json!({}));
    let gpu = pool("demo", |spec| {
        spec.gpus = vec![Gpu {
            name: "nvidia.com/AD102GL_L40S".into(),
        }];
    });
    let yaml = worker_config(&kubernetes, &gpu, &material.trust(), None);
    // serde_norway writes YAML 1.2, where a plain `on` is a string; Talos
    // reads the config with go-yaml v3, which also keeps yes/no/on/off
    // strings unless the target field is a bool (nodeLabels maps strings
    // to strings).
    assert_eq!(
        parse(&yaml)["machine"]["nodeLabels"],
        json!({ "gpu": "on" })
    );
    let plain = parse(&worker_config(
        &kubernetes,
        &pool("demo", |_| {}),
        &material.trust(),
        None,
    ));
    assert_eq!(plain["machine"].get("nodeLabels"), None);
}
