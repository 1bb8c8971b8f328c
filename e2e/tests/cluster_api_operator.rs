//! The real Cluster API Operator installs providers the way the hosting
//! platform asks it to: a `CoreProvider`/`InfrastructureProvider` whose
//! `fetchConfig.selector` points at a ConfigMap named after the version,
//! holding the gzipped components. Everything asserted here is written by
//! the operator (conditions, installed version, the components themselves),
//! except one Deployment status, which a test writes in place of the kubelet
//! and the Deployment controller, which do not run here.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tenantry_e2e::cluster_api_operator::{
    ClusterApiOperator, ProviderKind, compressed_provider_config_map, provider,
    provider_components_selector,
};
use tenantry_e2e::clusterctl::pinned_cluster_api_version;
use tenantry_e2e::manifests::create_object;
use tenantry_e2e::{Upstream, World, wait};
use tenantry_provider::components;

/// Loading and processing Cluster API's 1.2 MB of components takes the
/// operator a few seconds; the bound is for a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(180);
const CORE_NAMESPACE: &str = "capi-system";
const CORE_DEPLOYMENT: &str = "capi-controller-manager";

fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a serde_json::Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn has_condition(object: &DynamicObject, type_: &str, status: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == status)
}

/// Waits until the provider's condition `type_` has `status`; returns the
/// provider as it was then.
async fn wait_for_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
    operator: &ClusterApiOperator,
) -> DynamicObject {
    wait_for_provider(api, name, &format!("{type_}={status}"), operator, |p| {
        has_condition(p, type_, status)
    })
    .await
}

/// Waits until the provider reports `ProviderInstalled=True` and its
/// installed version. The operator's patch helper writes conditions before
/// the rest of the status, so one can be seen without the other for a moment.
async fn wait_until_installed(
    api: &Api<DynamicObject>,
    name: &str,
    operator: &ClusterApiOperator,
) -> DynamicObject {
    wait_for_provider(api, name, "installed", operator, |p| {
        has_condition(p, "ProviderInstalled", "True")
            && p.data["status"]["installedVersion"].is_string()
    })
    .await
}

async fn wait_for_provider(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    operator: &ClusterApiOperator,
    check: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let found = wait::until(format!("{name} {what}"), DEADLINE, || async {
        let object = api.get(name).await?;
        Ok(check(&object).then_some(object))
    })
    .await;
    match found {
        Ok(object) => object,
        Err(error) => {
            let last = api.get(name).await.map(|o| o.data["status"].clone());
            panic!(
                "{error:#}\nstatus: {last:?}\noperator log tail:\n{}",
                operator.log_tail(40)
            )
        }
    }
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// A control plane with cert-manager's CRDs (Cluster API's components hold a
/// cert-manager Issuer and Certificate, which cannot be created without them;
/// the operator itself checks nothing of cert-manager) and the operator.
async fn world_with_operator() -> World {
    World::builder("harness")
        .without_tenantry_crds()
        .cert_manager_crds()
        .cluster_api_operator()
        .start()
        .await
}

/// What the platform puts in place for the core provider: its namespace, a
/// compressed ConfigMap named after the version holding Cluster API's own
/// release artifacts, and the `CoreProvider` pointing at it. Returns the
/// version.
async fn request_core_provider(client: &kube::Client) -> String {
    let version = pinned_cluster_api_version().expect("pinned Cluster API version");
    let release = Upstream::locate()
        .and_then(|upstream| upstream.cluster_api_release())
        .expect("Cluster API release artifacts");
    let components = std::fs::read_to_string(release.join("core-components.yaml")).unwrap();
    let metadata = std::fs::read_to_string(release.join("metadata.yaml")).unwrap();
    create_namespace(client, CORE_NAMESPACE).await;
    let config_map = compressed_provider_config_map(
        CORE_NAMESPACE,
        &version,
        "cluster-api",
        &components,
        &metadata,
    );
    create_object(client, &config_map, CORE_NAMESPACE)
        .await
        .expect("create the core provider's ConfigMap");
    let core = provider(
        ProviderKind::Core,
        CORE_NAMESPACE,
        "cluster-api",
        &version,
        &provider_components_selector("cluster-api"),
    );
    create_object(client, &core, CORE_NAMESPACE)
        .await
        .expect("create the CoreProvider");
    version
}

#[tokio::test]
async fn operator_installs_core_provider_from_a_compressed_config_map() {
    let world = world_with_operator().await;
    let (client, operator) = (world.client(), world.operator());
    let version = request_core_provider(&client).await;
    let core_providers = ProviderKind::Core.api(&client, CORE_NAMESPACE);

    let core = wait_until_installed(&core_providers, "cluster-api", operator).await;
    assert!(
        has_condition(&core, "PreflightCheckPassed", "True"),
        "{:#}",
        core.data["status"]
    );
    assert_eq!(core.data["status"]["installedVersion"], version.as_str());
    // Cluster API v1.14's metadata.yaml says its series implements v1beta2.
    assert_eq!(core.data["status"]["contract"], "v1beta2");

    // The components the operator applied: Cluster API's CRDs, labelled for
    // clusterctl as `clusterctl init` labels them, and its manager
    // Deployment, owned by the CoreProvider, with the release's image.
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for name in [
        "clusters.cluster.x-k8s.io",
        "clusterclasses.cluster.x-k8s.io",
        "machines.cluster.x-k8s.io",
        "machinesets.cluster.x-k8s.io",
        "machinedeployments.cluster.x-k8s.io",
        "machinehealthchecks.cluster.x-k8s.io",
    ] {
        let crd = crds
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
        let labels = crd.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("cluster.x-k8s.io/provider").map(String::as_str),
            Some("cluster-api"),
            "CRD {name} labels: {labels:?}"
        );
    }
    let deployment = Api::<Deployment>::namespaced(client.clone(), CORE_NAMESPACE)
        .get(CORE_DEPLOYMENT)
        .await
        .expect("the core provider's Deployment");
    let owners = deployment.metadata.owner_references.unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "CoreProvider" && o.name == "cluster-api"),
        "owners: {owners:?}"
    );
    let image = deployment
        .spec
        .and_then(|spec| spec.template.spec)
        .and_then(|pod| pod.containers.first().and_then(|c| c.image.clone()));
    assert_eq!(
        image.as_deref(),
        Some(format!("registry.k8s.io/cluster-api/cluster-api-controller:{version}").as_str())
    );

    // The operator finalizes a provider by recording the hash of what it
    // applied on its cache Secret, so an unchanged provider is re-applied
    // from the cache after a restart.
    let cache_name = format!("core-cluster-api-{version}-cache");
    let cached = wait::until(format!("cache Secret {cache_name}"), DEADLINE, || {
        let secrets = Api::<Secret>::namespaced(client.clone(), CORE_NAMESPACE);
        let cache_name = cache_name.clone();
        async move {
            let secret = secrets.get(&cache_name).await?;
            let annotations = secret.metadata.annotations.unwrap_or_default();
            Ok(annotations
                .contains_key("operator.cluster.x-k8s.io/applied-spec-hash")
                .then_some(annotations))
        }
    })
    .await
    .expect("the provider's cache Secret, finalized");
    assert_eq!(
        cached
            .get("provider.cluster.x-k8s.io/compressed")
            .map(String::as_str),
        Some("true"),
        "over 1 MiB of components are cached gzipped: {cached:?}"
    );

    // Ready mirrors the Deployment's Available condition. No pods and no
    // Deployment controller run here, so the Deployment has no conditions
    // and the operator says so.
    let core = wait_for_condition(&core_providers, "cluster-api", "Ready", "False", operator).await;
    assert_eq!(
        condition(&core, "Ready").unwrap()["reason"],
        "NoDeploymentAvailableConditionReason"
    );
}

#[tokio::test]
async fn infrastructure_provider_waits_for_the_core_provider_to_be_ready() {
    let world = world_with_operator().await;
    let (client, operator) = (world.client(), world.operator());
    request_core_provider(&client).await;
    let core_providers = ProviderKind::Core.api(&client, CORE_NAMESPACE);
    wait_until_installed(&core_providers, "cluster-api", operator).await;

    // Tenantry's own release artifacts, as the platform will install them.
    create_namespace(&client, components::NAMESPACE).await;
    let config_map = compressed_provider_config_map(
        components::NAMESPACE,
        components::RELEASE_VERSION,
        components::PROVIDER_NAME,
        &components::infrastructure_components_yaml(),
        &components::metadata_yaml(),
    );
    create_object(&client, &config_map, components::NAMESPACE)
        .await
        .expect("create tenantry's ConfigMap");
    let infrastructure = provider(
        ProviderKind::Infrastructure,
        components::NAMESPACE,
        components::PROVIDER_NAME,
        components::RELEASE_VERSION,
        &provider_components_selector(components::PROVIDER_NAME),
    );
    create_object(&client, &infrastructure, components::NAMESPACE)
        .await
        .expect("create the InfrastructureProvider");
    let infrastructure_providers = ProviderKind::Infrastructure.api(&client, components::NAMESPACE);

    let waiting = wait_for_condition(
        &infrastructure_providers,
        components::PROVIDER_NAME,
        "PreflightCheckPassed",
        "False",
        operator,
    )
    .await;
    assert_eq!(
        condition(&waiting, "PreflightCheckPassed").unwrap()["reason"],
        "WaitingForCoreProviderReady"
    );
    let deployments = Api::<Deployment>::namespaced(client.clone(), components::NAMESPACE);
    assert!(
        deployments
            .get_opt(components::DEPLOYMENT_NAME)
            .await
            .unwrap()
            .is_none(),
        "nothing of tenantry is installed while the core provider is not Ready"
    );

    // In place of the kubelet and the Deployment controller: the core
    // manager's pod runs and its Deployment reports Available.
    let status = json!({
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
            "conditions": [{
                "type": "Available",
                "status": "True",
                "reason": "MinimumReplicasAvailable",
                "message": "Deployment has minimum availability.",
                "lastUpdateTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        }
    });
    Api::<Deployment>::namespaced(client.clone(), CORE_NAMESPACE)
        .patch_status(
            CORE_DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .expect("report the core Deployment Available");
    let core = wait_for_condition(&core_providers, "cluster-api", "Ready", "True", operator).await;
    assert_eq!(
        condition(&core, "Ready").unwrap()["reason"],
        "MinimumReplicasAvailable"
    );

    let installed = wait_until_installed(
        &infrastructure_providers,
        components::PROVIDER_NAME,
        operator,
    )
    .await;
    assert!(has_condition(&installed, "PreflightCheckPassed", "True"));
    assert_eq!(
        installed.data["status"]["installedVersion"],
        components::RELEASE_VERSION
    );
    let deployment = deployments
        .get(components::DEPLOYMENT_NAME)
        .await
        .expect("tenantry's Deployment");
    let labels: BTreeMap<String, String> = deployment.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("cluster.x-k8s.io/provider").map(String::as_str),
        Some(components::PROVIDER_LABEL)
    );
}

#[tokio::test]
async fn operator_webhook_defaults_the_config_secret_namespace() {
    let world = World::builder("harness")
        .without_tenantry_crds()
        .cluster_api_operator()
        .start()
        .await;
    let client = world.client();
    let mut object = provider(
        ProviderKind::Infrastructure,
        "default",
        components::PROVIDER_NAME,
        components::RELEASE_VERSION,
        &provider_components_selector(components::PROVIDER_NAME),
    );
    object["spec"]["configSecret"] = json!({ "name": "tenantry-variables" });
    let object: DynamicObject = serde_json::from_value(object).unwrap();

    // A dry run goes through admission, the operator's webhooks included,
    // and stores nothing.
    let defaulted = ProviderKind::Infrastructure
        .api(&client, "default")
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &object,
        )
        .await
        .expect("dry-run create an InfrastructureProvider");
    assert_eq!(
        defaulted.data["spec"]["configSecret"],
        json!({ "name": "tenantry-variables", "namespace": "default" })
    );
}
