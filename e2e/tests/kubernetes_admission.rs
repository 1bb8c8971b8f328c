//! Admission of `Kubernetes` objects against a real kube-apiserver: every
//! rule, in the CRD's schema and CEL or in tenantry's webhooks, refuses a
//! bad input with a message naming the field, and admits a good one.
//! Requests are server-side dry runs: the apiserver runs defaulting, CEL and
//! both webhooks, and stores nothing.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tenantry_api::tenant::Kubernetes;
use tenantry_e2e::World;

const NAMESPACE: &str = "tenant-a";

fn object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "apps.tenantry.dev/v1alpha1",
        "kind": "Kubernetes",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": spec,
    })
}

/// One row: a spec and, for a refusal, a fragment the error must contain.
struct Case {
    rule: &'static str,
    spec: Value,
    refused_with: Option<&'static str>,
}

fn refused(rule: &'static str, spec: Value, fragment: &'static str) -> Case {
    Case {
        rule,
        spec,
        refused_with: Some(fragment),
    }
}

fn accepted(rule: &'static str, spec: Value) -> Case {
    Case {
        rule,
        spec,
        refused_with: None,
    }
}

fn api_server(fields: Value) -> Value {
    json!({ "controlPlane": { "apiServer": fields } })
}

fn create_cases() -> Vec<Case> {
    let proxmox = json!({
        "ipv4Config": { "addresses": ["10.0.0.10-10.0.0.20"], "gateway": "10.0.0.1" },
        "dnsServers": ["10.0.0.1"],
    });
    vec![
        // Versions and the Talos support matrix.
        accepted("version", json!({ "version": "v1.31" })),
        refused("version", json!({ "version": "v1.30" }), "spec.version"),
        accepted(
            "talos matrix",
            json!({ "version": "v1.35", "talos": { "version": "v1.13.6" } }),
        ),
        refused(
            "talos matrix",
            json!({ "version": "v1.35", "talos": { "version": "v1.10.7" } }),
            "v1.10",
        ),
        // extraArgs: flags the control plane owns, and the moved two.
        accepted(
            "extraArgs free flag",
            api_server(json!({ "extraArgs": ["--audit-log-maxage=7"] })),
        ),
        refused(
            "extraArgs owned flag",
            api_server(json!({ "extraArgs": ["--etcd-servers=https://x:2379"] })),
            "spec.controlPlane.apiServer.extraArgs[0]",
        ),
        refused(
            "extraArgs owned flag",
            api_server(json!({ "extraArgs": ["--secure-port=7443"] })),
            "--secure-port",
        ),
        accepted(
            "enable-admission-plugins moves",
            api_server(json!({ "extraArgs": ["--enable-admission-plugins=NodeRestriction"] })),
        ),
        refused(
            "enable-admission-plugins with the field set",
            api_server(json!({
                "extraArgs": ["--enable-admission-plugins=NodeRestriction"],
                "admissionControllers": ["PodSecurity"],
            })),
            "admissionControllers",
        ),
        refused(
            "feature gate bare and kube:-prefixed",
            api_server(json!({ "extraArgs": [
                "--feature-gates=MutatingAdmissionPolicy=true",
                "--feature-gates=kube:MutatingAdmissionPolicy=true",
            ] })),
            "MutatingAdmissionPolicy",
        ),
        accepted(
            "one feature gate spelling",
            api_server(
                json!({ "extraArgs": ["--feature-gates=kube:MutatingAdmissionPolicy=true"] }),
            ),
        ),
        refused(
            "two emulated versions for kube",
            api_server(json!({ "extraArgs": [
                "--emulated-version=kube=1.34",
                "--emulated-version=kube=1.33",
            ] })),
            "--emulated-version",
        ),
        accepted(
            "one emulated version for kube",
            api_server(json!({ "extraArgs": ["--emulated-version=kube=1.34"] })),
        ),
        refused(
            "oidc flags with OIDC on",
            json!({
                "oidc": { "mode": "CustomConfig", "customConfig": { "config": "apiVersion: x" } },
                "controlPlane": { "apiServer": { "extraArgs": ["--oidc-issuer-url=https://idp"] } },
            }),
            "--oidc-",
        ),
        accepted(
            "oidc flags with OIDC off",
            api_server(json!({ "extraArgs": ["--oidc-issuer-url=https://idp"] })),
        ),
        // admissionControllers and preferredAddressTypes.
        accepted(
            "admissionControllers",
            api_server(json!({ "admissionControllers": ["NodeRestriction", "PodSecurity"] })),
        ),
        refused(
            "admissionControllers unknown",
            api_server(json!({ "admissionControllers": ["MadeUpPlugin"] })),
            "admissionControllers",
        ),
        refused(
            "admissionControllers repeated",
            api_server(json!({ "admissionControllers": ["PodSecurity", "PodSecurity"] })),
            "each plugin once",
        ),
        refused(
            "preferredAddressTypes repeated",
            json!({ "controlPlane": { "kubelet": { "preferredAddressTypes": ["InternalIP", "InternalIP"] } } }),
            "each address type once",
        ),
        accepted(
            "preferredAddressTypes",
            json!({ "controlPlane": { "kubelet": { "preferredAddressTypes": ["InternalIP", "Hostname"] } } }),
        ),
        // extraVolumes and mounts.
        accepted(
            "extraVolumes",
            api_server(json!({
                "extraVolumes": [{ "name": "audit", "configMap": { "name": "audit-policy" } }],
                "extraVolumeMounts": [{ "name": "audit", "mountPath": "/etc/audit" }],
            })),
        ),
        refused(
            "extraVolumes unique names",
            api_server(json!({ "extraVolumes": [
                { "name": "a", "configMap": { "name": "x" } },
                { "name": "a", "secret": { "secretName": "y" } },
            ] })),
            "unique",
        ),
        refused(
            "extraVolumes one source",
            api_server(json!({ "extraVolumes": [
                { "name": "a", "configMap": { "name": "x" }, "secret": { "secretName": "y" } },
            ] })),
            "exactly one volume source",
        ),
        refused(
            "extraVolumes configMap or secret",
            api_server(
                json!({ "extraVolumes": [{ "name": "a", "hostPath": { "path": "/etc" } }] }),
            ),
            "configMap and secret",
        ),
        refused(
            "extraVolumes reserved talos names",
            api_server(
                json!({ "extraVolumes": [{ "name": "talos-ca", "secret": { "secretName": "y" } }] }),
            ),
            "reserved",
        ),
        refused(
            "authentication-config reserved with OIDC",
            json!({
                "oidc": { "mode": "CustomConfig", "customConfig": { "config": "apiVersion: x" } },
                "controlPlane": { "apiServer": { "extraVolumes": [
                    { "name": "authentication-config", "secret": { "secretName": "y" } },
                ] } },
            }),
            "authentication-config is reserved",
        ),
        refused(
            "extraVolumeMounts name a user volume",
            api_server(json!({ "extraVolumeMounts": [{ "name": "talos-ca", "mountPath": "/x" }] })),
            "extraVolumeMounts",
        ),
        // OIDC custom config.
        refused(
            "CustomConfig needs config or secretRef",
            json!({ "oidc": { "mode": "CustomConfig" } }),
            "oidc.customConfig",
        ),
        refused(
            "CustomConfig not both",
            json!({ "oidc": { "mode": "CustomConfig", "customConfig": {
                "config": "apiVersion: x", "secretRef": { "name": "authn" },
            } } }),
            "mutually exclusive",
        ),
        accepted(
            "CustomConfig with a Secret",
            json!({ "oidc": { "mode": "CustomConfig", "customConfig": { "secretRef": { "name": "authn" } } } }),
        ),
        // Addons.
        refused(
            "hami needs gpuOperator",
            json!({ "addons": { "hami": { "enabled": true } } }),
            "addons.hami",
        ),
        accepted(
            "hami with gpuOperator",
            json!({ "addons": { "hami": { "enabled": true }, "gpuOperator": { "enabled": true } } }),
        ),
        refused(
            "ouroboros needs ingressNginx",
            json!({ "addons": { "ouroboros": { "enabled": true } } }),
            "addons.ouroboros",
        ),
        accepted(
            "ouroboros with ingressNginx",
            json!({ "addons": { "ouroboros": { "enabled": true }, "ingressNginx": { "enabled": true } } }),
        ),
        accepted(
            "authentication-config is a free name without OIDC",
            api_server(json!({ "extraVolumes": [
                { "name": "authentication-config", "secret": { "secretName": "y" } },
            ] })),
        ),
        // Talos URLs.
        refused(
            "imageFactoryURL trailing slash",
            json!({ "talos": { "imageFactoryURL": "https://factory.talos.dev/" } }),
            "talos.imageFactoryURL must not end with a slash",
        ),
        accepted(
            "imageFactoryURL",
            json!({ "talos": { "imageFactoryURL": "https://mirror.example.org" } }),
        ),
        refused(
            "installerRepository trailing slash",
            json!({ "talos": { "installerRepository": "factory.talos.dev/installer/" } }),
            "talos.installerRepository must not end with a slash",
        ),
        accepted(
            "installerRepository",
            json!({ "talos": { "installerRepository": "registry.example.org/installer" } }),
        ),
        // Substrates.
        accepted(
            "proxmox",
            json!({ "substrate": "proxmox", "proxmox": proxmox }),
        ),
        refused(
            "proxmox block on kubevirt",
            json!({ "substrate": "kubevirt", "proxmox": proxmox }),
            "spec.proxmox applies only to substrate: proxmox",
        ),
    ]
}

async fn start() -> World {
    let world = World::builder("admission").webhooks().start().await;
    world.create_namespace(NAMESPACE).await;
    world
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn every_rule_refuses_bad_input_and_admits_good_input() {
    let world = start().await;
    // Untyped: some cases hold what the Rust types cannot (an unknown
    // version), as a client could send it.
    let api: Api<DynamicObject> = Api::namespaced_with(
        world.client(),
        NAMESPACE,
        &ApiResource::erase::<Kubernetes>(&()),
    );
    let mut failures = Vec::new();
    for (index, case) in create_cases().into_iter().enumerate() {
        let kubernetes: DynamicObject =
            serde_json::from_value(object(&format!("case-{index}"), case.spec.clone()))
                .expect("case decodes");
        let result = api.create(&dry_run(), &kubernetes).await;
        match (result, case.refused_with) {
            (Ok(_), None) => {}
            (Err(kube::Error::Api(status)), Some(fragment))
                if status.message.contains(fragment) => {}
            (outcome, expected) => failures.push(format!(
                "{} ({}): expected {}, got {}",
                case.rule,
                case.spec,
                expected.map_or("admission".to_string(), |f| format!(
                    "refusal containing {f:?}"
                )),
                match outcome {
                    Ok(_) => "admission".to_string(),
                    Err(error) => error.to_string(),
                }
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn names_are_capped_at_32_characters() {
    let world = start().await;
    let api: Api<Kubernetes> = Api::namespaced(world.client(), NAMESPACE);
    let long: Kubernetes =
        serde_json::from_value(object(&"a".repeat(33), json!({}))).expect("decodes");
    let error = api
        .create(&dry_run(), &long)
        .await
        .expect_err("a 33-character name is refused");
    assert!(
        error.to_string().contains("at most 32 characters"),
        "{error}"
    );
    let fits: Kubernetes =
        serde_json::from_value(object(&"a".repeat(32), json!({}))).expect("decodes");
    api.create(&dry_run(), &fits)
        .await
        .expect("a 32-character name is admitted");
}

#[tokio::test]
async fn moved_flags_land_in_their_fields_and_removed_fields_are_kept() {
    let world = start().await;
    let api: Api<Kubernetes> = Api::namespaced(world.client(), NAMESPACE);
    let kubernetes: Kubernetes = serde_json::from_value(object(
        "moved",
        json!({
            "controlPlane": {
                "apiServer": { "extraArgs": [
                    "--enable-admission-plugins=NodeRestriction,PodSecurity",
                    "--audit-log-maxage=7",
                ] },
                "kubelet": {},
            },
            "nodeGroups": { "md0": { "minReplicas": 1 } },
        }),
    ))
    .expect("decodes");
    let stored = api.create(&dry_run(), &kubernetes).await.expect("admitted");
    let api_server = &stored.spec.control_plane.api_server;
    assert_eq!(api_server.extra_args, ["--audit-log-maxage=7"]);
    assert_eq!(
        api_server.admission_controllers,
        ["NodeRestriction", "PodSecurity"]
    );
    // The removed field is kept as written (its admission warning is
    // checked in the webhook's unit tests: kube's client does not surface
    // warnings).
    assert!(stored.spec.node_groups.is_some());
}

#[tokio::test]
async fn storage_class_and_substrate_cannot_change() {
    let world = start().await;
    let api: Api<Kubernetes> = Api::namespaced(world.client(), NAMESPACE);
    let kubernetes: Kubernetes =
        serde_json::from_value(object("fixed", json!({ "storageClass": "replicated" })))
            .expect("decodes");
    api.create(&PostParams::default(), &kubernetes)
        .await
        .expect("created");
    let patch = |spec: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "fixed",
                &PatchParams {
                    dry_run: true,
                    ..Default::default()
                },
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
        }
    };
    let error = patch(json!({ "storageClass": "local" }))
        .await
        .expect_err("storageClass is immutable");
    assert!(
        error.to_string().contains("storageClass is immutable"),
        "{error}"
    );
    let error = patch(json!({ "substrate": "proxmox", "proxmox": {
        "ipv4Config": { "addresses": ["10.0.0.10-10.0.0.20"], "gateway": "10.0.0.1" },
        "dnsServers": ["10.0.0.1"],
    } }))
    .await
    .expect_err("substrate is immutable");
    assert!(
        error.to_string().contains("substrate is immutable"),
        "{error}"
    );
    patch(json!({ "version": "v1.35", "controlPlane": { "replicas": 3 } }))
        .await
        .expect("other fields change");
}
