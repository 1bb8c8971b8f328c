//! Tenantry as a clusterctl provider, with the real clusterctl and a local
//! provider repository (`tenantry_e2e::clusterctl`):
//!
//! - `clusterctl generate cluster --infrastructure tenantry --flavor …`
//!   renders our templates, and the result applies cleanly (server-side,
//!   strict field validation) to a management cluster with the CRDs it
//!   references;
//! - `clusterctl init --infrastructure tenantry` installs our components (and
//!   Cluster API core from its own release artifacts) into a harness control
//!   plane. Nothing runs pods there: the Deployments never start, and
//!   cert-manager is present only as its API (its CRDs), which is what
//!   clusterctl checks for; Certificates stay unissued and the tests say so
//!   (see the `clusterctl` module for the reasoning);
//! - `clusterctl describe cluster` shows the conditions tenantry reports.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use serde_json::json;
use tenantry_api::kubevirt::KubevirtCluster;
use tenantry_e2e::clusterctl::{Clusterctl, TENANTRY_VERSION};
use tenantry_e2e::manifests::{apply_crds, crds_of, create_object, read_documents};
use tenantry_e2e::sim::kubevirt::KubevirtSimConfig;
use tenantry_e2e::{Kubevirt, World, wait};

const DEADLINE: Duration = Duration::from_secs(120);

fn variables(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn namespaced(
    client: &kube::Client,
    namespace: &str,
    (group, version, kind, plural): (&str, &str, &str, &str),
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

const CLUSTERS: (&str, &str, &str, &str) = ("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
const MACHINE_DEPLOYMENTS: (&str, &str, &str, &str) = (
    "cluster.x-k8s.io",
    "v1beta2",
    "MachineDeployment",
    "machinedeployments",
);
const KUBEVIRT_MACHINE_TEMPLATES: (&str, &str, &str, &str) = (
    "infrastructure.cluster.x-k8s.io",
    "v1alpha1",
    "KubevirtMachineTemplate",
    "kubevirtmachinetemplates",
);
const PROVIDERS: (&str, &str, &str, &str) = (
    "clusterctl.cluster.x-k8s.io",
    "v1alpha3",
    "Provider",
    "providers",
);
const CERTIFICATES: (&str, &str, &str, &str) =
    ("cert-manager.io", "v1", "Certificate", "certificates");

/// The Kamaji control-plane provider's and CABPT's CRDs, with the CAPI
/// contract labels their releases add through kustomize `commonLabels`
/// (the CRD files in `fixtures/upstream` are controller-gen output without
/// them): Kamaji's `v1alpha2` implements the v1beta2 contract (its status
/// has `initialization.controlPlaneInitialized`), CABPT's labels are
/// `v1beta1: v1alpha3`, `v1beta2: v1beta1`.
async fn install_template_dependencies(client: &kube::Client) {
    let upstream = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream");
    tenantry_e2e::sim::tenant::install_kamaji_crds(client)
        .await
        .expect("install the KamajiControlPlane CRD");
    let mut crds = Vec::new();
    let mut cabpt = crds_of(read_documents(&upstream.join("cabpt/crds")).expect("read CABPT CRDs"))
        .expect("CABPT CRDs");
    for crd in &mut cabpt {
        let labels = crd.metadata.labels.get_or_insert_default();
        labels.insert("cluster.x-k8s.io/v1beta1".into(), "v1alpha3".into());
        labels.insert("cluster.x-k8s.io/v1beta2".into(), "v1beta1".into());
    }
    crds.extend(cabpt);
    crds.extend(tenantry_api::crds::all());
    apply_crds(client, crds)
        .await
        .expect("install CRDs the templates reference");
}

#[tokio::test]
async fn generated_clusters_of_every_flavor_and_the_default_apply_cleanly() {
    let world = World::builder("clusterctl-generate")
        .without_tenantry_crds()
        .cluster_api()
        .start()
        .await;
    let (client, control_plane) = (world.client(), world.control_plane());
    install_template_dependencies(&client).await;
    let clusterctl = Clusterctl::with_local_repository().expect("local repository");

    // Only what a user must set; everything else has a default.
    let values = variables(&[
        ("STORAGE_CLASS_NAME", "replicated"),
        ("NODE_IP_RANGES", "[10.10.10.10-10.10.10.100]"),
        ("IP_PREFIX", "24"),
        ("GATEWAY", "10.10.10.1"),
        ("DNS_SERVERS", "[10.10.10.1]"),
        ("PROXMOX_CREDENTIALS_SECRET", "pve-tenant-a"),
        ("PROXMOX_SOURCENODE", "pve1"),
        ("TEMPLATE_VMID", "9000"),
        ("PROXMOX_POOL", "tenant-a"),
        ("BRIDGE", "vmbr0"),
    ]);
    // No flavor: the default `cluster-template.yaml`, which is KubeVirt's.
    for (flavor, infrastructure_kind, machine_template_kind) in [
        ("kubevirt", "KubevirtCluster", "KubevirtMachineTemplate"),
        ("proxmox", "ProxmoxCluster", "ProxmoxMachineTemplate"),
        ("", "KubevirtCluster", "KubevirtMachineTemplate"),
    ] {
        let flavor_args: &[&str] = if flavor.is_empty() {
            &[]
        } else {
            &["--flavor", flavor]
        };
        let flavor = if flavor.is_empty() { "default" } else { flavor };
        let namespace = format!("tenant-{flavor}");
        let name = format!("{flavor}-one");
        tenantry_e2e::manifests::apply_object(
            &client,
            &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace } }),
            "default",
        )
        .await
        .expect("create namespace");
        let infrastructure = clusterctl.infrastructure_provider();
        let mut args = vec![
            "generate",
            "cluster",
            &name,
            // With the version: clusterctl takes the version from the
            // inventory otherwise, and this cluster has no `clusterctl
            // init` behind it.
            "--infrastructure",
            &infrastructure,
            "--target-namespace",
            &namespace,
            "--kubernetes-version",
            "v1.35.4",
            "--worker-machine-count",
            "3",
        ];
        args.extend_from_slice(flavor_args);
        let rendered = clusterctl
            .run(control_plane.kubeconfig_path(), &args, &values)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
            .stdout;
        assert!(
            !rendered.contains("${"),
            "unsubstituted variable in:\n{rendered}"
        );
        assert!(
            !rendered.contains("kind: Secret"),
            "credentials in the {flavor} template"
        );

        // Server-side, strict: an unknown or mistyped field fails the apply.
        let manifest = control_plane.dir().join(format!("{flavor}.yaml"));
        std::fs::write(&manifest, &rendered).expect("write rendered template");
        let output = control_plane
            .kubectl()
            .expect("kubectl")
            .args(["apply", "--server-side", "--validate=strict", "-f"])
            .arg(&manifest)
            .output()
            .expect("run kubectl");
        assert!(
            output.status.success(),
            "kubectl apply of the {flavor} flavor failed:\n{}{}\n---- Cluster API manager log ----\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            world.capi().log_tail(20),
        );

        // What the user asked for landed where clusterctl put it.
        let deployment = namespaced(&client, &namespace, MACHINE_DEPLOYMENTS)
            .get(&format!("{name}-md-0"))
            .await
            .expect("MachineDeployment");
        assert_eq!(deployment.data["spec"]["replicas"], 3);
        assert_eq!(
            deployment.data["spec"]["template"]["spec"]["version"],
            "v1.35.4"
        );
        assert_eq!(
            deployment.data["spec"]["template"]["spec"]["infrastructureRef"]["kind"],
            machine_template_kind
        );
        let cluster = namespaced(&client, &namespace, CLUSTERS)
            .get(&name)
            .await
            .expect("Cluster");
        assert_eq!(
            cluster.data["spec"]["infrastructureRef"]["kind"],
            infrastructure_kind
        );
        assert_eq!(
            cluster.data["spec"]["controlPlaneRef"]["kind"],
            "KamajiControlPlane"
        );
    }
    // The Talos boot disk survived strict validation with the defaults.
    let template = namespaced(&client, "tenant-kubevirt", KUBEVIRT_MACHINE_TEMPLATES)
        .get("kubevirt-one-md-0")
        .await
        .expect("KubevirtMachineTemplate");
    let boot_disk = &template.data["spec"]["template"]["spec"]["bootDisk"];
    assert_eq!(boot_disk["imageFactoryURL"], "https://factory.talos.dev");
    assert_eq!(boot_disk["talosVersion"], "v1.13.0");
    assert_eq!(boot_disk["storageClass"], "replicated");
}

#[tokio::test]
async fn clusterctl_init_installs_tenantry_and_records_it_in_the_inventory() {
    // cert-manager's API only: see the clusterctl module.
    let world = World::builder("clusterctl-init")
        .without_tenantry_crds()
        .cert_manager_crds()
        .start()
        .await;
    let (client, control_plane) = (world.client(), world.control_plane());
    let clusterctl = Clusterctl::with_local_repository().expect("local repository");

    // First init on an empty cluster: clusterctl adds the core provider
    // `cluster-api` (which clusterctl.yaml points at Cluster API's own
    // release artifacts); `-` opts out of the kubeadm bootstrap and
    // control-plane providers it would add too.
    let output = clusterctl
        .run(
            control_plane.kubeconfig_path(),
            &[
                "init",
                "--bootstrap=-",
                "--control-plane=-",
                "--infrastructure",
                "tenantry",
            ],
            &variables(&[("TENANTRY_WATCH_FILTER", "shard-a")]),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
        .combined();
    assert!(
        output.contains("Skipping installing cert-manager as it is already installed"),
        "clusterctl did not find the cert-manager API:\n{output}"
    );
    assert!(
        output.contains(&format!(
            "Installing provider=\"infrastructure-tenantry\" version=\"{TENANTRY_VERSION}\" targetNamespace=\"tenantry-system\""
        )),
        "{output}"
    );

    // The inventory clusterctl keeps (and `clusterctl move`/`upgrade` read).
    let providers = namespaced(&client, "tenantry-system", PROVIDERS)
        .list(&ListParams::default())
        .await
        .expect("list providers");
    let [provider] = providers.items.as_slice() else {
        panic!("expected one Provider in tenantry-system, got {providers:?}");
    };
    assert_eq!(
        provider.metadata.name.as_deref(),
        Some("infrastructure-tenantry")
    );
    assert_eq!(provider.data["providerName"], "tenantry");
    assert_eq!(provider.data["type"], "InfrastructureProvider");
    assert_eq!(provider.data["version"], TENANTRY_VERSION);
    let core = namespaced(&client, "capi-system", PROVIDERS)
        .get("cluster-api")
        .await
        .expect("core Provider");
    assert_eq!(core.data["type"], "CoreProvider");

    // Exactly our namespace, labelled for clusterctl.
    let namespace = Api::<Namespace>::all(client.clone())
        .get("tenantry-system")
        .await
        .expect("namespace");
    let labels = namespace.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("cluster.x-k8s.io/provider").map(String::as_str),
        Some("infrastructure-tenantry")
    );
    assert!(labels.contains_key("clusterctl.cluster.x-k8s.io"));

    // Every CRD tenantry serves; the infrastructure kinds with their
    // contract label (CAPI resolves references to them through it).
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tenantry_api::crds::all() {
        let name = crd.metadata.name.expect("CRD name");
        let installed = crds
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
        let labels = installed.metadata.labels.unwrap_or_default();
        if crd.spec.group == "infrastructure.cluster.x-k8s.io" {
            assert!(
                labels.contains_key("cluster.x-k8s.io/v1beta2"),
                "{name} lacks the contract label"
            );
        }
        assert_eq!(
            labels.get("cluster.x-k8s.io/provider").map(String::as_str),
            Some("infrastructure-tenantry")
        );
    }

    // The manager Deployment, with the defaults and the variable we set.
    let deployment = Api::<Deployment>::namespaced(client.clone(), "tenantry-system")
        .get("tenantry-controller-manager")
        .await
        .expect("manager Deployment");
    let pod = deployment
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec");
    let [manager] = pod.containers.as_slice() else {
        panic!("expected one container, got {:?}", pod.containers);
    };
    assert_eq!(manager.name, "manager");
    assert_eq!(
        manager.image.as_deref(),
        Some(tenantry_provider::components::DEFAULT_IMAGE)
    );
    let args = manager.args.clone().unwrap_or_default();
    assert!(
        args.contains(&"--watch-filter=$(TENANTRY_WATCH_FILTER)".to_string())
            && args.contains(&"--namespace=$(TENANTRY_WATCH_NAMESPACE)".to_string()),
        "{args:?}"
    );
    let env = |name: &str| {
        manager
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("no {name} in the manager's environment"))
            .value
            .clone()
            .unwrap_or_default()
    };
    assert_eq!(env("TENANTRY_WATCH_FILTER"), "shard-a");
    // Left unset: empty, which `tenantry run` reads as all namespaces.
    assert_eq!(env("TENANTRY_WATCH_NAMESPACE"), "");
    assert_eq!(env("TENANTRY_LOG_FORMAT"), "json");

    // CAPI's manager gets access to our kinds through aggregation.
    let roles = Api::<ClusterRole>::all(client.clone())
        .list(&ListParams::default().labels("cluster.x-k8s.io/aggregate-to-manager=true,cluster.x-k8s.io/provider=infrastructure-tenantry"))
        .await
        .expect("list cluster roles");
    assert_eq!(
        roles.items.len(),
        1,
        "one aggregated role for CAPI's manager"
    );

    // The webhooks reach our Service and take their CA from our Certificate...
    let webhooks = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("tenantry-validating-webhook-configuration")
        .await
        .expect("validating webhook configuration");
    assert_eq!(
        webhooks
            .metadata
            .annotations
            .unwrap_or_default()
            .get("cert-manager.io/inject-ca-from")
            .map(String::as_str),
        Some("tenantry-system/tenantry-serving-cert")
    );
    for webhook in webhooks.webhooks.unwrap_or_default() {
        let service = webhook
            .client_config
            .service
            .expect("service client config");
        assert_eq!(
            (service.namespace.as_str(), service.name.as_str()),
            ("tenantry-system", "tenantry-webhook-service")
        );
        // ...which, with no cert-manager running, nobody issues or injects.
        assert!(
            webhook.client_config.ca_bundle.is_none(),
            "caBundle set without a CA injector"
        );
    }
    let certificate = namespaced(&client, "tenantry-system", CERTIFICATES)
        .get("tenantry-serving-cert")
        .await
        .expect("serving Certificate");
    assert!(
        certificate.data["status"]["conditions"].is_null(),
        "Certificate issued without cert-manager"
    );
    let secret = Api::<Secret>::namespaced(client.clone(), "tenantry-system")
        .get_opt("tenantry-webhook-server-cert")
        .await
        .expect("read webhook secret");
    assert!(
        secret.is_none(),
        "webhook Secret exists without cert-manager"
    );
}

#[tokio::test]
async fn clusterctl_describe_shows_the_conditions_tenantry_reports() {
    let world = World::builder("clusterctl-describe")
        .cluster_api()
        .kubevirt(Kubevirt::Real, KubevirtSimConfig::fast())
        .tenantry()
        .start()
        .await;
    let (client, control_plane) = (world.client(), world.control_plane());
    let clusterctl = Clusterctl::with_local_repository().expect("local repository");

    let name = "described";
    for object in [
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtCluster",
            "metadata": { "name": name, "namespace": "default" },
            "spec": {},
        }),
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": name, "namespace": "default" },
            "spec": {
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": name },
            },
        }),
    ] {
        create_object(&client, &object, "default")
            .await
            .expect("create object");
    }
    let kubevirt_clusters: Api<KubevirtCluster> = Api::namespaced(client.clone(), "default");
    wait::until("KubevirtCluster Ready", DEADLINE, || async {
        let cluster = kubevirt_clusters.get(name).await?;
        let ready = cluster
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Ok(ready.then_some(()))
    })
    .await
    .unwrap_or_else(|e| world.fail(e));

    // `describe` shows the KubevirtCluster under its Cluster, each
    // condition on its own line: type, status, reason.
    let infrastructure = format!("KubevirtCluster default/{name}");
    let describe = || async {
        let output = clusterctl
            .run(
                control_plane.kubeconfig_path(),
                &[
                    "describe",
                    "cluster",
                    name,
                    "--namespace",
                    "default",
                    "--show-conditions",
                    "all",
                ],
                &BTreeMap::new(),
            )
            .await?
            .stdout;
        let Some((cluster, ours)) = output.split_once(&infrastructure) else {
            anyhow::bail!("no {infrastructure} row in:\n{output}");
        };
        let ready = condition_lines(ours).contains(&row("Ready", "True", "Provisioned"));
        // CAPI's own summary of it on the Cluster follows shortly.
        let summarized =
            condition_lines(cluster).contains(&row("InfrastructureReady", "True", "Provisioned"));
        if ready && summarized {
            Ok(Some(output))
        } else {
            Err(anyhow::anyhow!("describe printed:\n{output}"))
        }
    };
    let output = wait::until(
        "describe shows the KubevirtCluster Ready",
        DEADLINE,
        describe,
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    let (cluster, ours) = output
        .split_once(&infrastructure)
        .expect("KubevirtCluster row");
    assert!(
        cluster.contains(&format!("Cluster default/{name}")),
        "{output}"
    );
    assert!(
        condition_lines(ours).contains(&row(
            "LoadBalancerAvailable",
            "True",
            "LoadBalancerAvailable"
        )),
        "{output}"
    );
}

fn row(type_: &str, status: &str, reason: &str) -> (String, String, String) {
    (type_.into(), status.into(), reason.into())
}

/// `(type, status, reason)` of each condition row of `clusterctl describe
/// --show-conditions all` output (rows like `│ ├─Ready  True  Provisioned …`).
fn condition_lines(output: &str) -> Vec<(String, String, String)> {
    output
        .lines()
        .filter_map(|line| {
            let row = line.split_once("─")?.1;
            let mut words = row.split_whitespace();
            let type_ = words.next()?;
            let status = words.next()?;
            let reason = words.next()?;
            matches!(status, "True" | "False" | "Unknown")
                .then(|| (type_.to_string(), status.to_string(), reason.to_string()))
        })
        .collect()
}
