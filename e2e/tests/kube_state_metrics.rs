//! tenantry's kube-state-metrics configuration
//! (`config/monitoring/kube-state-metrics.yaml`) served by the real
//! kube-state-metrics (`hack/upstream/kube-state-metrics`) from a real
//! kube-apiserver: one object of each kind, with the status a controller
//! would write, comes out as the series a dashboard or an alert reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use kube::Resource;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tenantry_api::kubevirt::{KubevirtCluster, KubevirtMachine};
use tenantry_api::proxmox::{ProxmoxCluster, ProxmoxMachine};
use tenantry_api::tenant::Kubernetes;
use tenantry_api::tenant_nodes::KubernetesNodes;
use tenantry_e2e::control_plane::{ControlPlane, free_port};
use tenantry_e2e::fixtures::{
    self, KUBEVIRT_API_VERSION, NamespacedKind, PROXMOX_API_VERSION, infrastructure_machine,
};
use tenantry_e2e::process::{ManagedProcess, is_alive};
use tenantry_e2e::{Binary, Upstream, World, pve_lab, wait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Generous upper bound for kube-state-metrics to list, or to see a change;
/// never the thing measured.
const DEADLINE: Duration = Duration::from_secs(180);
const NAMESPACE: &str = "tenant-demo";
/// When the conditions below last changed, as their controller wrote it.
const TRANSITION: &str = "2026-12-01T10:00:00Z";

fn config_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/monitoring/kube-state-metrics.yaml")
}

fn condition(type_: &str, status: &str, reason: &str) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason,
        "message": format!("{type_} is {status}: {reason}"),
        "lastTransitionTime": TRANSITION,
    })
}

async fn set_status<K: NamespacedKind>(world: &World, name: &str, status: Value) {
    world
        .api::<K>(NAMESPACE)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("set the status of {} {name}: {e}", K::kind(&())));
}

/// A KubeVirt workload cluster `demo-kv` provisioned with one running
/// worker; a Proxmox one `demo-px` whose credentials are missing and whose
/// worker cannot find its template; a tenant cluster `demo` whose control
/// plane is coming up, with a pool of three workers, two of them Ready.
async fn create_objects(world: &World) {
    world.create_namespace(NAMESPACE).await;
    let owned_by_machine = |name: &str| {
        json!([{
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": name,
            "uid": "6f1c1f53-3d0e-4c5e-9d1e-0d9a4f3b7a21",
        }])
    };

    let mut cluster = fixtures::kubevirt_cluster(
        "demo-kv",
        json!({ "controlPlaneEndpoint": { "host": "demo-kv.example.org", "port": 6443 } }),
    );
    cluster["metadata"]["labels"] = json!({ "cluster.x-k8s.io/cluster-name": "demo-kv" });
    world.create(NAMESPACE, cluster).await;
    set_status::<KubevirtCluster>(
        world,
        "demo-kv",
        json!({
            "ready": true,
            "initialization": { "provisioned": true },
            "conditions": [condition("Ready", "True", "Provisioned")],
        }),
    )
    .await;

    let mut machine = infrastructure_machine(
        KUBEVIRT_API_VERSION,
        "KubevirtMachine",
        "demo-kv-md0-a",
        "demo-kv",
        json!({
            "providerID": "kubevirt://demo-kv-md0-a",
            "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
            "virtualMachineTemplate": { "spec": { "runStrategy": "Always", "template": { "spec": {
                "domain": { "memory": { "guest": "4Gi" }, "devices": {} }
            }}}},
        }),
    );
    machine["metadata"]["ownerReferences"] = owned_by_machine("demo-kv-md0-a");
    world.create(NAMESPACE, machine).await;
    set_status::<KubevirtMachine>(
        world,
        "demo-kv-md0-a",
        json!({
            "ready": true,
            "initialization": { "provisioned": true },
            "addresses": [
                { "type": "Hostname", "address": "demo-kv-md0-a" },
                { "type": "InternalIP", "address": "10.244.0.17" },
            ],
            "conditions": [
                condition("Ready", "True", "Ready"),
                condition("VMProvisioned", "True", "Provisioned"),
            ],
        }),
    )
    .await;

    let mut cluster = fixtures::proxmox_cluster("demo-px", 3, "demo-px-credentials");
    cluster["metadata"]["labels"] = json!({ "cluster.x-k8s.io/cluster-name": "demo-px" });
    world.create(NAMESPACE, cluster).await;
    set_status::<ProxmoxCluster>(
        world,
        "demo-px",
        json!({
            "ready": false,
            "conditions": [condition("Ready", "False", "CredentialsSecretNotFound")],
        }),
    )
    .await;

    let mut spec = pve_lab::worker_spec("tenant-demo");
    spec["providerID"] = json!("proxmox://2b7c3f0e-5a4d-4f3e-9c1b-8e6d7a5b4c3d");
    spec["virtualMachineID"] = json!(104);
    let mut machine = infrastructure_machine(
        PROXMOX_API_VERSION,
        "ProxmoxMachine",
        "demo-px-md0-a",
        "demo-px",
        spec,
    );
    machine["metadata"]["ownerReferences"] = owned_by_machine("demo-px-md0-a");
    world.create(NAMESPACE, machine).await;
    // No status.initialization: the contract reads that as not provisioned.
    set_status::<ProxmoxMachine>(
        world,
        "demo-px-md0-a",
        json!({
            "ready": false,
            "proxmoxNode": "pve1",
            "conditions": [
                condition("Ready", "False", "TemplateNotFound"),
                condition("VirtualMachineProvisioned", "False", "TemplateNotFound"),
            ],
        }),
    )
    .await;

    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "apps.tenantry.dev/v1alpha1", "kind": "Kubernetes",
                "metadata": { "name": "demo" },
                "spec": { "version": "v1.35", "controlPlane": { "replicas": 3 } },
            }),
        )
        .await;
    set_status::<Kubernetes>(
        world,
        "demo",
        json!({
            "version": "v1.35.4",
            "endpoint": "https://demo.example.org:443",
            "conditions": [
                condition("EtcdReady", "True", "EtcdAvailable"),
                condition("ControlPlaneReady", "False", "ControlPlaneProvisioning"),
                condition("Ready", "False", "ControlPlaneProvisioning"),
            ],
        }),
    )
    .await;

    world
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "apps.tenantry.dev/v1alpha1", "kind": "KubernetesNodes",
                "metadata": { "name": "demo-md0" },
                "spec": { "cluster": "demo", "minReplicas": 1, "maxReplicas": 5, "instanceType": "u1.large" },
            }),
        )
        .await;
    set_status::<KubernetesNodes>(
        world,
        "demo-md0",
        json!({
            "replicas": 3,
            "readyReplicas": 2,
            "conditions": [
                condition("WorkersReady", "False", "WorkersNotReady"),
                condition("Ready", "False", "WorkersNotReady"),
            ],
        }),
    )
    .await;
}

/// kube-state-metrics serving only tenantry's configuration, on loopback.
struct KubeStateMetrics {
    process: ManagedProcess,
    address: String,
}

impl KubeStateMetrics {
    fn start(control_plane: &ControlPlane) -> anyhow::Result<Self> {
        let upstream = Upstream::locate()?;
        let port = free_port()?;
        let mut command = Command::new(upstream.binary(Binary::KubeStateMetrics)?);
        command.args([
            format!("--kubeconfig={}", control_plane.kubeconfig_path().display()),
            "--custom-resource-state-only".to_string(),
            format!(
                "--custom-resource-state-config-file={}",
                config_path().display()
            ),
            "--host=127.0.0.1".to_string(),
            format!("--port={port}"),
            "--telemetry-host=127.0.0.1".to_string(),
            format!("--telemetry-port={}", free_port()?),
            // The condition metrics log a missing path at this verbosity
            // (errorLogV); the test wants to see every such error.
            "--v=4".to_string(),
        ]);
        let process = ManagedProcess::spawn(
            &format!("{}/kube-state-metrics", control_plane.name()),
            command,
            &control_plane.dir().join("kube-state-metrics.log"),
        )?;
        Ok(Self {
            process,
            address: format!("127.0.0.1:{port}"),
        })
    }

    /// The series of one scrape of /metrics; an error if it has exited.
    async fn scrape(&self) -> anyhow::Result<Vec<Sample>> {
        if !is_alive(self.process.pid()) {
            bail!("kube-state-metrics exited:\n{}", self.process.log_tail(30));
        }
        let mut stream = tokio::net::TcpStream::connect(&self.address).await?;
        stream
            .write_all(
                format!("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.address).as_bytes(),
            )
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .context("an HTTP response")?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            bail!("GET /metrics answered {head}");
        }
        parse_scrape(body)
    }

    /// Scrapes until `ready` holds for the series; fails the test with
    /// kube-state-metrics' log after the deadline.
    async fn wait_for(&self, what: &str, ready: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
        let ready = &ready;
        wait::until(what, DEADLINE, || async move {
            let samples = self.scrape().await?;
            Ok(ready(&samples).then_some(samples))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.process.log_tail(30)))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.process.log_path()).unwrap_or_default()
    }
}

/// One series of a scrape: `name{label="value",…} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The series of a Prometheus text exposition; comments skipped.
fn parse_scrape(text: &str) -> anyhow::Result<Vec<Sample>> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| parse_series(line).with_context(|| format!("parse {line:?}")))
        .collect()
}

fn parse_series(line: &str) -> anyhow::Result<Sample> {
    let (series, value) = line.rsplit_once(' ').context("no value")?;
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (
            name,
            parse_labels(labels.strip_suffix('}').context("no closing brace")?)?,
        ),
        None => (series, BTreeMap::new()),
    };
    Ok(Sample {
        name: name.to_string(),
        labels,
        value: value.parse()?,
    })
}

/// `a="x",b="y \"quoted\""`, with the exposition format's escapes.
fn parse_labels(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").context("label without value")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().context("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().context("dangling escape")?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Ok(labels)
}

/// The series `name` whose labels include `labels`.
fn matching<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The value of the one series `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    match matching(samples, name, labels).as_slice() {
        [one] => one.value,
        found => panic!(
            "expected one series {name} with {labels:?}, found {}; all {name}: {:#?}",
            found.len(),
            samples
                .iter()
                .filter(|s| s.name == name)
                .collect::<Vec<_>>()
        ),
    }
}

/// The labels of the one series `name` of the object `object`.
fn labels_of<'a>(samples: &'a [Sample], name: &str, object: &str) -> &'a BTreeMap<String, String> {
    match matching(samples, name, &[("name", object)]).as_slice() {
        [one] => &one.labels,
        found => panic!("expected one series {name} of {object}, found {found:#?}"),
    }
}

fn unix_seconds(rfc3339: &str) -> f64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .expect("an RFC 3339 time")
        .timestamp() as f64
}

#[tokio::test]
async fn kube_state_metrics_reports_each_kind_as_its_status_says() {
    let world = World::builder("kube-state-metrics")
        .without_controller_manager()
        .start()
        .await;
    create_objects(&world).await;

    let ksm = KubeStateMetrics::start(world.control_plane()).expect("start kube-state-metrics");
    let prefixes = [
        "tenantry_kubevirtmachine",
        "tenantry_proxmoxmachine",
        "tenantry_kubevirtcluster",
        "tenantry_proxmoxcluster",
        "tenantry_kubernetes",
        "tenantry_kubernetesnodes",
    ];
    let samples = ksm
        .wait_for("every kind's info series", |samples| {
            prefixes
                .iter()
                .all(|prefix| samples.iter().any(|s| s.name == format!("{prefix}_info")))
        })
        .await;
    let ns = ("namespace", NAMESPACE);

    // Conditions: one series per status, 1 on the one the object has, with
    // its reason: what an alert on "Ready False for 15m" selects.
    let px = ("name", "demo-px-md0-a");
    let px_condition = "tenantry_proxmoxmachine_status_condition";
    let ready_false = [
        ns,
        px,
        ("type", "Ready"),
        ("reason", "TemplateNotFound"),
        ("status", "False"),
    ];
    assert_eq!(value(&samples, px_condition, &ready_false), 1.0);
    for other in ["True", "Unknown"] {
        let labels = [px, ("type", "Ready"), ("status", other)];
        assert_eq!(value(&samples, px_condition, &labels), 0.0, "{other}");
    }
    assert_eq!(
        value(
            &samples,
            "tenantry_proxmoxmachine_status_condition_last_transition_time",
            &[px, ("type", "Ready"), ("status", "False")],
        ),
        unix_seconds(TRANSITION)
    );
    assert_eq!(
        value(
            &samples,
            "tenantry_proxmoxcluster_status_condition",
            &[
                ("name", "demo-px"),
                ("type", "Ready"),
                ("status", "False"),
                ("reason", "CredentialsSecretNotFound"),
            ],
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "tenantry_kubernetes_status_condition",
            &[
                ("name", "demo"),
                ("type", "ControlPlaneReady"),
                ("status", "False"),
                ("reason", "ControlPlaneProvisioning"),
            ],
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "tenantry_kubevirtmachine_status_condition",
            &[
                ("name", "demo-kv-md0-a"),
                ("type", "Ready"),
                ("status", "True")
            ],
        ),
        1.0
    );

    // Machines: provisioned or not, by either contract; an absent
    // initialization counts as not provisioned.
    let kv = ("name", "demo-kv-md0-a");
    for (metric, labels, expected) in [
        (
            "tenantry_kubevirtmachine_status_initialization_provisioned",
            kv,
            1.0,
        ),
        ("tenantry_kubevirtmachine_status_ready", kv, 1.0),
        (
            "tenantry_proxmoxmachine_status_initialization_provisioned",
            px,
            0.0,
        ),
        ("tenantry_proxmoxmachine_status_ready", px, 0.0),
        (
            "tenantry_kubevirtcluster_status_initialization_provisioned",
            ("name", "demo-kv"),
            1.0,
        ),
        (
            "tenantry_proxmoxcluster_status_initialization_provisioned",
            ("name", "demo-px"),
            0.0,
        ),
    ] {
        assert_eq!(value(&samples, metric, &[labels]), expected, "{metric}");
    }

    // Info: what joins a machine to its Cluster API Cluster and Machine,
    // and where it runs.
    let info = labels_of(&samples, "tenantry_proxmoxmachine_info", "demo-px-md0-a");
    for (label, expected) in [
        ("namespace", NAMESPACE),
        ("cluster_name", "demo-px"),
        ("machine", "demo-px-md0-a"),
        (
            "provider_id",
            "proxmox://2b7c3f0e-5a4d-4f3e-9c1b-8e6d7a5b4c3d",
        ),
        ("vm_id", "104"),
        ("pool", "tenant-demo"),
        ("proxmox_node", "pve1"),
    ] {
        assert_eq!(
            info.get(label).map(String::as_str),
            Some(expected),
            "{label}: {info:?}"
        );
    }
    let info = labels_of(&samples, "tenantry_kubevirtmachine_info", "demo-kv-md0-a");
    for (label, expected) in [
        ("cluster_name", "demo-kv"),
        ("machine", "demo-kv-md0-a"),
        ("provider_id", "kubevirt://demo-kv-md0-a"),
        ("internal_ip", "10.244.0.17"),
    ] {
        assert_eq!(
            info.get(label).map(String::as_str),
            Some(expected),
            "{label}: {info:?}"
        );
    }
    let info = labels_of(&samples, "tenantry_kubevirtcluster_info", "demo-kv");
    assert_eq!(info["cluster_name"], "demo-kv");
    assert_eq!(info["control_plane_endpoint_host"], "demo-kv.example.org");
    assert_eq!(info["control_plane_endpoint_port"], "6443");
    assert_eq!(
        labels_of(&samples, "tenantry_proxmoxcluster_info", "demo-px")["cluster_name"],
        "demo-px"
    );
    let info = labels_of(&samples, "tenantry_kubernetes_info", "demo");
    assert_eq!(info["kubernetes"], "demo");
    assert_eq!(info["version"], "v1.35");
    assert_eq!(info["running_version"], "v1.35.4");
    assert_eq!(info["substrate"], "kubevirt");
    assert_eq!(info["endpoint"], "https://demo.example.org:443");
    let info = labels_of(&samples, "tenantry_kubernetesnodes_info", "demo-md0");
    assert_eq!(info["kubernetes"], "demo");
    assert_eq!(info["instance_type"], "u1.large");

    // The pool's size, wanted and had; the control plane's.
    let pool = [ns, ("name", "demo-md0"), ("kubernetes", "demo")];
    for (metric, expected) in [
        ("tenantry_kubernetesnodes_spec_min_replicas", 1.0),
        ("tenantry_kubernetesnodes_spec_max_replicas", 5.0),
        ("tenantry_kubernetesnodes_status_replicas", 3.0),
        ("tenantry_kubernetesnodes_status_ready_replicas", 2.0),
    ] {
        assert_eq!(value(&samples, metric, &pool), expected, "{metric}");
    }
    assert_eq!(
        value(
            &samples,
            "tenantry_kubernetes_spec_control_plane_replicas",
            &[("name", "demo")]
        ),
        3.0
    );

    // Creation time, as the apiserver stamped it.
    let created = world
        .api::<Kubernetes>(NAMESPACE)
        .get("demo")
        .await
        .expect("get Kubernetes demo")
        .meta()
        .creation_timestamp
        .clone()
        .expect("a creation timestamp");
    assert_eq!(
        value(&samples, "tenantry_kubernetes_created", &[("name", "demo")]),
        created.0.as_second() as f64
    );
    for prefix in prefixes {
        assert_eq!(
            matching(&samples, &format!("{prefix}_created"), &[ns]).len(),
            1,
            "{prefix}_created"
        );
    }

    // A status change reaches the series through kube-state-metrics' watch.
    set_status::<KubernetesNodes>(
        &world,
        "demo-md0",
        json!({
            "readyReplicas": 3,
            "conditions": [
                condition("WorkersReady", "True", "WorkersReady"),
                condition("Ready", "True", "WorkersReady"),
            ],
        }),
    )
    .await;
    ksm.wait_for("the pool's third Ready worker", |samples| {
        let ready = [("name", "demo-md0"), ("type", "Ready"), ("status", "True")];
        matching(
            samples,
            "tenantry_kubernetesnodes_status_ready_replicas",
            &[("name", "demo-md0")],
        )
        .iter()
        .any(|s| s.value == 3.0)
            && matching(samples, "tenantry_kubernetesnodes_status_condition", &ready)
                .iter()
                .any(|s| s.value == 1.0 && s.labels["reason"] == "WorkersReady")
    })
    .await;

    // kube-state-metrics logs a path it cannot resolve on an object (klog
    // error lines, `E<date>`), and a kind it cannot find.
    let log = ksm.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|line| {
            (line.starts_with('E') && line.contains("tenantry_"))
                || line.contains("failed to resolve GVK")
        })
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    for prefix in prefixes {
        assert!(
            log.contains(&format!("{prefix}_status_condition")),
            "kube-state-metrics loaded no {prefix} metrics:\n{log}"
        );
    }
}

/// The configuration names only fields kube-state-metrics v2 reads (it
/// ignores unknown ones silently, so a misspelt `nilIsZero` would pass
/// unnoticed), and covers exactly tenantry's six kinds at the versions the
/// CRDs serve.
#[test]
fn configuration_names_only_fields_kube_state_metrics_reads() {
    let text = std::fs::read_to_string(config_path()).expect("read the configuration");
    let config: Value = serde_norway::from_str(&text).expect("YAML");
    let mut unknown = Vec::new();
    check_keys(&config, "", &["kind", "spec"], &mut unknown);
    assert_eq!(config["kind"], "CustomResourceStateMetrics");
    check_keys(&config["spec"], "spec", &["resources"], &mut unknown);

    let mut kinds = BTreeSet::new();
    for (i, resource) in config["spec"]["resources"]
        .as_array()
        .expect("spec.resources")
        .iter()
        .enumerate()
    {
        let at = format!("spec.resources[{i}]");
        check_keys(
            resource,
            &at,
            &[
                "groupVersionKind",
                "metricNamePrefix",
                "labelsFromPath",
                "commonLabels",
                "metrics",
                "resourcePlural",
                "errorLogV",
            ],
            &mut unknown,
        );
        let gvk = &resource["groupVersionKind"];
        check_keys(gvk, &at, &["group", "version", "kind"], &mut unknown);
        let kind = gvk["kind"].as_str().expect("kind");
        kinds.insert((
            gvk["group"].as_str().expect("group").to_string(),
            gvk["version"].as_str().expect("version").to_string(),
            kind.to_string(),
        ));
        assert_eq!(
            resource["metricNamePrefix"],
            format!("tenantry_{}", kind.to_lowercase()),
            "{at}"
        );
        let mut names = BTreeSet::new();
        for metric in resource["metrics"].as_array().expect("metrics") {
            let at = format!("{at}.metrics.{}", metric["name"]);
            let name = metric["name"].as_str().expect("a metric name");
            assert!(names.insert(name), "{at} twice");
            check_keys(
                metric,
                &at,
                &[
                    "name",
                    "help",
                    "each",
                    "labelsFromPath",
                    "commonLabels",
                    "errorLogV",
                ],
                &mut unknown,
            );
            let each = &metric["each"];
            check_keys(
                each,
                &at,
                &["type", "gauge", "stateSet", "info"],
                &mut unknown,
            );
            let (field, known): (&str, &[&str]) = match each["type"].as_str() {
                Some("Gauge") => (
                    "gauge",
                    &[
                        "path",
                        "labelsFromPath",
                        "valueFrom",
                        "labelFromKey",
                        "nilIsZero",
                    ],
                ),
                Some("StateSet") => (
                    "stateSet",
                    &["path", "labelsFromPath", "valueFrom", "labelName", "list"],
                ),
                Some("Info") => ("info", &["path", "labelsFromPath", "labelFromKey"]),
                other => panic!("{at}: each.type {other:?}"),
            };
            assert!(each[field].is_object(), "{at}: each.{field}");
            check_keys(
                &each[field],
                &format!("{at}.each.{field}"),
                known,
                &mut unknown,
            );
        }
        for name in ["info", "created", "status_condition"] {
            assert!(names.contains(name), "{at} has no {name}");
        }
    }
    assert!(
        unknown.is_empty(),
        "fields kube-state-metrics ignores: {unknown:?}"
    );

    fn gvk<K: Resource<DynamicType = ()>>() -> (String, String, String) {
        (
            K::group(&()).into_owned(),
            K::version(&()).into_owned(),
            K::kind(&()).into_owned(),
        )
    }
    let served = BTreeSet::from([
        gvk::<KubevirtMachine>(),
        gvk::<ProxmoxMachine>(),
        gvk::<KubevirtCluster>(),
        gvk::<ProxmoxCluster>(),
        gvk::<Kubernetes>(),
        gvk::<KubernetesNodes>(),
    ]);
    assert_eq!(kinds, served);
}

fn check_keys(object: &Value, at: &str, known: &[&str], unknown: &mut Vec<String>) {
    let Some(map) = object.as_object() else {
        unknown.push(format!("{at}: not a mapping"));
        return;
    };
    for key in map.keys() {
        if !known.contains(&key.as_str()) {
            unknown.push(format!("{at}.{key}"));
        }
    }
}
