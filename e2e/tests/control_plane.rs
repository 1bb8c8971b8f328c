//! The harness itself: a real control plane starts, answers, runs several at
//! once, cascades deletions, and never leaves a process behind.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use tenantry_e2e::process::{children_of, is_alive};
use tenantry_e2e::{ControlPlane, ControlPlaneOptions, wait};

const DEADLINE: Duration = Duration::from_secs(60);

/// The Kubernetes version `hack/upstream/kubernetes/go.mod` pins.
fn pinned_kubernetes_version() -> String {
    let go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/upstream/kubernetes/go.mod");
    let text = std::fs::read_to_string(go_mod).expect("read the kubernetes wrapper go.mod");
    // Either `require k8s.io/kubernetes vX` or a line in a require block.
    text.lines()
        .map(|line| line.trim().trim_start_matches("require").trim())
        .find_map(|line| line.strip_prefix("k8s.io/kubernetes v"))
        .map(|version| format!("v{}", version.split_whitespace().next().unwrap_or_default()))
        .expect("k8s.io/kubernetes requirement")
}

fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn control_plane_serves_the_pinned_version_and_stops_cleanly() {
    let control_plane = ControlPlane::start().await.expect("start control plane");
    let version = control_plane
        .client()
        .apiserver_version()
        .await
        .expect("GET /version");
    assert_eq!(version.git_version, pinned_kubernetes_version());
    assert!(
        version.git_version.starts_with("v1.35."),
        "{}",
        version.git_version
    );

    let pids = control_plane.pids();
    assert_eq!(
        pids.len(),
        3,
        "etcd, kube-apiserver and kube-controller-manager"
    );
    assert!(pids.iter().all(|pid| is_alive(*pid)));
    control_plane.stop();
    let survivors: Vec<u32> = pids.into_iter().filter(|pid| is_alive(*pid)).collect();
    assert!(
        survivors.is_empty(),
        "processes left running after stop: {survivors:?}"
    );
}

#[tokio::test]
async fn kubeconfig_file_works_for_kubectl() {
    let control_plane = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: false,
        ..Default::default()
    })
    .await
    .expect("start control plane");
    let output = control_plane
        .kubectl()
        .expect("kubectl")
        .args(["auth", "whoami", "-o", "jsonpath={.status.userInfo.groups}"])
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("system:masters"));
}

#[tokio::test]
async fn several_control_planes_run_at_once_and_are_isolated() {
    let options = |name: &str| ControlPlaneOptions {
        name: name.into(),
        controller_manager: false,
        ..Default::default()
    };
    let (a, b, c) = tokio::join!(
        ControlPlane::start_with(options("a")),
        ControlPlane::start_with(options("b")),
        ControlPlane::start_with(options("c")),
    );
    let (a, b, c) = (
        a.expect("start a"),
        b.expect("start b"),
        c.expect("start c"),
    );
    let urls = [a.server_url(), b.server_url(), c.server_url()];
    assert!(
        urls[0] != urls[1] && urls[1] != urls[2] && urls[0] != urls[2],
        "{urls:?}"
    );

    Api::<Namespace>::all(a.client())
        .create(&PostParams::default(), &namespace("only-in-a"))
        .await
        .expect("create namespace in a");
    for other in [&b, &c] {
        let found = Api::<Namespace>::all(other.client())
            .get_opt("only-in-a")
            .await
            .expect("get namespace");
        assert!(
            found.is_none(),
            "namespace of a visible in {}",
            other.name()
        );
    }
}

#[tokio::test]
async fn garbage_collector_deletes_dependents_of_a_deleted_owner() {
    let control_plane = ControlPlane::start().await.expect("start control plane");
    let client = control_plane.client();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let owner = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create owner");
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("dependent".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: "owner".into(),
                        uid: owner.metadata.uid.clone().expect("owner uid"),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create dependent");

    config_maps
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    wait::until(
        "the garbage collector to delete the dependent Secret",
        DEADLINE,
        || {
            let secrets = secrets.clone();
            async move { Ok(secrets.get_opt("dependent").await?.is_none().then_some(())) }
        },
    )
    .await
    .expect("dependent deleted");
}

#[test]
fn processes_are_killed_when_a_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async move {
            let control_plane = ControlPlane::start().await.expect("start control plane");
            tx.send(control_plane.pids()).expect("send pids");
            panic!("deliberate panic while the control plane runs");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread should have panicked");
    let pids = rx.recv().expect("pids from the panicking thread");
    let survivors: Vec<u32> = pids.into_iter().filter(|pid| is_alive(*pid)).collect();
    assert!(
        survivors.is_empty(),
        "processes left running after a panic: {survivors:?}"
    );
}

/// SIGKILL gives no chance to unwind: the children must still die, through
/// the parent-death signal. The sandbox binary is the harness process here.
#[tokio::test]
async fn children_die_when_the_harness_process_is_killed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let log_path = dir.path().join("sandbox.log");
    let log = std::fs::File::create(&log_path).expect("sandbox log");
    let mut sandbox = std::process::Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .arg("--no-cluster-api")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("RUST_LOG", "debug")
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .spawn()
        .expect("start sandbox");
    let sandbox_pid = sandbox.id();
    let children = wait::until(
        "the sandbox to write its kubeconfig",
        Duration::from_secs(120),
        || {
            let ready = kubeconfig.exists();
            async move { Ok(ready.then(|| children_of(sandbox_pid))) }
        },
    )
    .await
    .expect("sandbox started");
    assert!(
        children.len() >= 2,
        "etcd and kube-apiserver expected, found {children:?}; sandbox log:\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );

    sandbox.kill().expect("SIGKILL the sandbox");
    sandbox.wait().expect("reap the sandbox");
    wait::until(
        "children of the killed sandbox to die",
        Duration::from_secs(30),
        || {
            let alive: Vec<u32> = children
                .iter()
                .copied()
                .filter(|pid| is_alive(*pid))
                .collect();
            async move { Ok(alive.is_empty().then_some(())) }
        },
    )
    .await
    .expect("no child outlives its harness");
}
