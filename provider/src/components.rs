//! The clusterctl release artifacts of the infrastructure provider
//! `tenantry`: `infrastructure-components.yaml` (everything
//! `clusterctl init --infrastructure tenantry` installs) and `metadata.yaml`.
//!
//! They are rendered from the code they deploy — the CRDs from
//! `tenantry_api::crds::all()`, the webhook configuration from
//! `webhook::configuration`, the flags from `tenantry run` — so the manifests
//! cannot drift from the manager. `config/release/` holds the rendered files
//! and a test keeps them in step (`tenantry components --out config/release`).
//!
//! The RBAC below is what the controllers do, audited from every `Api` they
//! build: each rule names the code that needs it. Add the rule when a
//! controller starts touching a new kind.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{ServiceReference, WebhookClientConfig};
use serde_json::{Value, json};

use crate::webhook::configuration::{mutating_configuration, validating_configuration};

/// The provider's name for clusterctl (`--infrastructure tenantry`).
pub const PROVIDER_NAME: &str = "tenantry";
/// The `cluster.x-k8s.io/provider` label value clusterctl expects
/// (`<type>-<name>`).
pub const PROVIDER_LABEL: &str = "infrastructure-tenantry";
/// The one namespace of the components.
pub const NAMESPACE: &str = "tenantry-system";
/// The release version clusterctl sees (`v` + the crate version).
pub const RELEASE_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
/// The Cluster API contract this release implements.
pub const CONTRACT: &str = "v1beta2";
/// The default image; `TENANTRY_IMAGE` overrides it at `clusterctl init`.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/tenantry/tenantry:v", env!("CARGO_PKG_VERSION"));

/// The manager Deployment and its container.
pub const DEPLOYMENT_NAME: &str = "tenantry-controller-manager";
pub const CONTAINER_NAME: &str = "manager";
const SERVICE_ACCOUNT: &str = "tenantry-manager";
const MANAGER_ROLE: &str = "tenantry-manager-role";
const CAPI_AGGREGATED_ROLE: &str = "tenantry-aggregated-capi-manager-role";
const WEBHOOK_SERVICE: &str = "tenantry-webhook-service";
const WEBHOOK_SECRET: &str = "tenantry-webhook-server-cert";
const ISSUER: &str = "tenantry-selfsigned-issuer";
const CERTIFICATE: &str = "tenantry-serving-cert";
const WEBHOOK_PORT: u16 = 9443;
const HEALTH_PORT: u16 = 9440;
const CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// A clusterctl variable of the components, with its default.
pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// Every variable `infrastructure-components.yaml` reads; all have defaults.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TENANTRY_IMAGE",
        default: DEFAULT_IMAGE,
        meaning: "the manager's container image",
    },
    Variable {
        name: "TENANTRY_WATCH_NAMESPACE",
        default: "",
        meaning: "watch only this namespace (`--namespace`); empty: all namespaces",
    },
    Variable {
        name: "TENANTRY_WATCH_FILTER",
        default: "",
        meaning: "reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>` (`--watch-filter`); empty: all",
    },
    Variable {
        name: "TENANTRY_LOG_FORMAT",
        default: "json",
        meaning: "`json` or `text`",
    },
    // Named as the cluster templates' variable, so one setting in
    // clusterctl.yaml points both at a platform's own factory.
    Variable {
        name: "TALOS_IMAGE_FACTORY_URL",
        default: tenantry_api::kubevirt::DEFAULT_IMAGE_FACTORY_URL,
        meaning: "the Talos image factory of `Kubernetes` objects that name none (`--talos-image-factory-url`): their `talos.imageFactoryURL` is set to it at creation",
    },
];

/// `${NAME:=default}`, as clusterctl (drone/envsubst) reads it. clusterctl
/// counts an empty default as no default (the variable becomes required),
/// so an empty default is written `""`, which clusterctl substitutes
/// literally: it must stand alone as a YAML value, where it reads as "".
fn variable(name: &str) -> String {
    let v = VARIABLES
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("undeclared variable {name}"));
    variable_defaulting_to(name, v.default)
}

/// [`variable`] with another default than the declared one.
fn variable_defaulting_to(name: &str, default: &str) -> String {
    assert!(
        VARIABLES.iter().any(|v| v.name == name),
        "undeclared variable {name}"
    );
    let default = if default.is_empty() { "\"\"" } else { default };
    format!("${{{name}:={default}}}")
}

/// `infrastructure-components.yaml`: the documents in install order, with
/// [`DEFAULT_IMAGE`] as the default of `TENANTRY_IMAGE`.
pub fn infrastructure_components() -> Vec<Value> {
    infrastructure_components_for(DEFAULT_IMAGE)
}

/// The documents, with `image` as the default of `TENANTRY_IMAGE` (a
/// release pins its image by digest: `hack/release.sh`).
pub fn infrastructure_components_for(image: &str) -> Vec<Value> {
    let mut documents = vec![namespace()];
    for crd in tenantry_api::crds::all() {
        let tenant_facing = crd.spec.group != INFRASTRUCTURE_GROUP;
        let mut crd = serde_json::to_value(crd).expect("CRD serializes");
        // clusterctl checks that CRD names follow CAPI's pluralisation, for
        // kinds that core CAPI objects may reference. No CAPI object refers
        // to the tenant-facing kinds, and `kuberneteses` is the plural the
        // platform's users already know.
        if tenant_facing {
            crd["metadata"]["annotations"]["clusterctl.cluster.x-k8s.io/skip-crd-name-preflight-check"] =
                json!("");
        }
        documents.push(crd);
    }
    documents.extend([
        service_account(),
        manager_role(),
        manager_role_binding(),
        capi_aggregated_role(),
        webhook_service(),
        issuer(),
        certificate(),
        deployment(image),
        validating_webhook_configuration(),
        mutating_webhook_configuration(),
    ]);
    documents
}

/// `infrastructure-components.yaml` as text.
pub fn infrastructure_components_yaml() -> String {
    to_yaml(&infrastructure_components())
}

/// `infrastructure-components.yaml` as text, with `image` as the default
/// of `TENANTRY_IMAGE`.
pub fn infrastructure_components_yaml_for(image: &str) -> String {
    to_yaml(&infrastructure_components_for(image))
}

/// `metadata.yaml`: this release series and the contract it implements.
pub fn metadata_yaml() -> String {
    let mut version = env!("CARGO_PKG_VERSION").split('.');
    let major: u32 = version.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let minor: u32 = version.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let metadata = json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{ "major": major, "minor": minor, "contract": CONTRACT }],
    });
    to_yaml(&[metadata])
}

fn to_yaml(documents: &[Value]) -> String {
    documents
        .iter()
        .map(|d| format!("---\n{}", serde_norway::to_string(d).expect("YAML")))
        .collect()
}

fn labels() -> Value {
    json!({ "cluster.x-k8s.io/provider": PROVIDER_LABEL })
}

fn namespace() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": NAMESPACE, "labels": labels() },
    })
}

fn service_account() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": { "name": SERVICE_ACCOUNT, "namespace": NAMESPACE, "labels": labels() },
    })
}

/// Plurals of every kind tenantry serves in the infrastructure group.
fn own_resources() -> Vec<String> {
    let plurals: BTreeSet<String> = tenantry_api::crds::all()
        .into_iter()
        .filter(|crd| crd.spec.group == INFRASTRUCTURE_GROUP)
        .map(|crd| crd.spec.names.plural)
        .collect();
    plurals.into_iter().collect()
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({ "apiGroups": groups, "resources": resources, "verbs": verbs })
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

fn manager_role() -> Value {
    let own = own_resources();
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    let status: Vec<String> = own.iter().map(|p| format!("{p}/status")).collect();
    let finalizers: Vec<String> = own.iter().map(|p| format!("{p}/finalizers")).collect();
    let status: Vec<&str> = status.iter().map(String::as_str).collect();
    let finalizers: Vec<&str> = finalizers.iter().map(String::as_str).collect();
    let rules = vec![
        // Every reconciler: its kinds, their status (server-side apply) and
        // finalizers (kube::runtime::finalizer).
        rule(&[INFRASTRUCTURE_GROUP], &own, WRITE),
        rule(
            &[INFRASTRUCTURE_GROUP],
            &status,
            &["get", "patch", "update"],
        ),
        rule(&[INFRASTRUCTURE_GROUP], &finalizers, &["update"]),
        // capi/owner.rs reads the owner Machine and Cluster; the controllers
        // watch both. Remediation annotates and deletes the Machine it
        // remediates.
        // tenant: the Kubernetes objects, their status and finalizer.
        // tenant: the Kubernetes objects and their KubernetesNodes pools,
        // their status and finalizers.
        rule(
            &["apps.tenantry.dev"],
            &["kuberneteses", "kubernetesnodes"],
            WRITE,
        ),
        rule(
            &["apps.tenantry.dev"],
            &["kuberneteses/status", "kubernetesnodes/status"],
            &["get", "patch", "update"],
        ),
        rule(
            &["apps.tenantry.dev"],
            &["kuberneteses/finalizers", "kubernetesnodes/finalizers"],
            &["update"],
        ),
        // tenant pools: what a KubernetesNodes becomes — its workers'
        // MachineDeployment, MachineHealthCheck and Talos bootstrap template
        // (the machine templates are tenantry's own kinds, above); the
        // MachineSets still using an old machine template are read.
        rule(
            &["cluster.x-k8s.io"],
            &["machinedeployments", "machinehealthchecks"],
            WRITE,
        ),
        rule(&["cluster.x-k8s.io"], &["machinesets"], READ),
        rule(
            &["bootstrap.cluster.x-k8s.io"],
            &["talosconfigtemplates"],
            WRITE,
        ),
        // tenant: the Proxmox CSI controller and CCM of Proxmox tenants,
        // run in their management namespace.
        rule(&["apps"], &["deployments"], WRITE),
        // tenant: the infrastructure StorageClasses offered to tenants.
        rule(&["storage.k8s.io"], &["storageclasses"], READ),
        // tenant: what a Kubernetes object becomes — the CAPI Cluster, its
        // KamajiControlPlane, the namespace's etcd and its Kamaji DataStore.
        rule(&["cluster.x-k8s.io"], &["clusters"], WRITE),
        rule(
            &["controlplane.cluster.x-k8s.io"],
            &["kamajicontrolplanes"],
            WRITE,
        ),
        rule(&["etcd-operator.cozystack.io"], &["etcdclusters"], WRITE),
        // tenant: whether Kamaji's and etcd-operator's kinds are installed
        // (watched only then).
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["get"],
        ),
        rule(&["kamaji.clastix.io"], &["datastores"], WRITE),
        rule(
            &["cluster.x-k8s.io"],
            &["machines"],
            &["get", "list", "watch", "patch", "delete"],
        ),
        // proxmox/cluster reads the MachineDeployments naming the cluster's
        // templates (granted with the pools' rule above).
        // Bootstrap data, Proxmox credentials, infrastructure kubeconfigs (read);
        // the cluster SSH key pair and VM user data (written, deleted).
        rule(&[""], &["secrets"], WRITE),
        // kubevirt/cluster: the control-plane Service `<cluster>-lb`.
        rule(&[""], &["services"], WRITE),
        // runtime.rs: kube's event Recorder (events.k8s.io; core for older readers).
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        // leader.rs: the leader Lease (kube-lease-manager applies it).
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "update", "patch"],
        ),
        // kubevirt/machine: VMs created and deleted, VMIs read and waited on,
        // DataVolumes listed and deleted.
        rule(&["kubevirt.io"], &["virtualmachines"], WRITE),
        rule(
            &["kubevirt.io"],
            &["virtualmachineinstances"],
            &["get", "list", "watch", "delete"],
        ),
        rule(
            &["cdi.kubevirt.io"],
            &["datavolumes"],
            &["get", "list", "watch", "delete"],
        ),
        // proxmox: IP pools per cluster, claims per machine, the addresses
        // the IPAM provider allocates.
        rule(
            &["ipam.cluster.x-k8s.io"],
            &["inclusterippools", "ipaddressclaims"],
            WRITE,
        ),
        rule(&["ipam.cluster.x-k8s.io"], &["ipaddresses"], READ),
    ];
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": MANAGER_ROLE, "labels": labels() },
        "rules": rules,
    })
}

fn manager_role_binding() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": "tenantry-manager-rolebinding", "labels": labels() },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": MANAGER_ROLE,
        },
        "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }],
    })
}

/// Aggregated into CAPI core's manager role (`capi-aggregated-manager-role`
/// selects `cluster.x-k8s.io/aggregate-to-manager: "true"`): CAPI reads our
/// infrastructure objects, clones templates, sets owner references and
/// deletes infrastructure machines.
fn capi_aggregated_role() -> Value {
    let own = own_resources();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": CAPI_AGGREGATED_ROLE,
            "labels": {
                "cluster.x-k8s.io/provider": PROVIDER_LABEL,
                "cluster.x-k8s.io/aggregate-to-manager": "true",
            },
        },
        "rules": [rule(
            &[INFRASTRUCTURE_GROUP],
            &own.iter().map(String::as_str).collect::<Vec<_>>(),
            WRITE,
        )],
    })
}

fn webhook_service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "labels": labels() },
        "spec": {
            "ports": [{ "port": 443, "targetPort": "webhook-server" }],
            "selector": selector(),
        },
    })
}

fn selector() -> Value {
    json!({
        "cluster.x-k8s.io/provider": PROVIDER_LABEL,
        "control-plane": "controller-manager",
    })
}

fn issuer() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": { "name": ISSUER, "namespace": NAMESPACE, "labels": labels() },
        "spec": { "selfSigned": {} },
    })
}

/// The webhook serving certificate. clusterctl rewrites the namespace in
/// `dnsNames` when installing into another namespace, so the names follow
/// its `<service>.<namespace>.svc` pattern.
fn certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": { "name": CERTIFICATE, "namespace": NAMESPACE, "labels": labels() },
        "spec": {
            "dnsNames": [
                format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc"),
                format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc.cluster.local"),
            ],
            "issuerRef": { "kind": "Issuer", "name": ISSUER },
            "secretName": WEBHOOK_SECRET,
        },
    })
}

/// One replica, with leader election on (`--leader-elect`): a rollout's new
/// pod waits for the old one's Lease, and scaling up adds standbys, never a
/// second writer.
fn deployment(image: &str) -> Value {
    // The optional flags take their values from the environment (`$(VAR)`
    // is expanded by the kubelet), where an empty default can stand alone
    // as a YAML value; `tenantry run` reads empty as unset.
    let args = vec![
        "run".to_string(),
        "--namespace=$(TENANTRY_WATCH_NAMESPACE)".to_string(),
        "--watch-filter=$(TENANTRY_WATCH_FILTER)".to_string(),
        "--talos-image-factory-url=$(TENANTRY_TALOS_IMAGE_FACTORY_URL)".to_string(),
        format!("--webhook-bind=0.0.0.0:{WEBHOOK_PORT}"),
        format!("--webhook-cert-dir={CERT_DIR}"),
        format!("--health-addr=0.0.0.0:{HEALTH_PORT}"),
        "--leader-elect".to_string(),
    ];
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": DEPLOYMENT_NAME,
            "namespace": NAMESPACE,
            "labels": selector(),
        },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": selector() },
            "template": {
                "metadata": { "labels": selector() },
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "seccompProfile": { "type": "RuntimeDefault" },
                    },
                    "containers": [{
                        "name": CONTAINER_NAME,
                        "image": variable_defaulting_to("TENANTRY_IMAGE", image),
                        "imagePullPolicy": "IfNotPresent",
                        "args": args,
                        "env": [
                            { "name": "TENANTRY_WATCH_NAMESPACE", "value": variable("TENANTRY_WATCH_NAMESPACE") },
                            { "name": "TENANTRY_WATCH_FILTER", "value": variable("TENANTRY_WATCH_FILTER") },
                            { "name": "TENANTRY_LOG_FORMAT", "value": variable("TENANTRY_LOG_FORMAT") },
                            { "name": "TENANTRY_TALOS_IMAGE_FACTORY_URL", "value": variable("TALOS_IMAGE_FACTORY_URL") },
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        ],
                        "ports": [
                            { "name": "webhook-server", "containerPort": WEBHOOK_PORT, "protocol": "TCP" },
                            { "name": "healthz", "containerPort": HEALTH_PORT, "protocol": "TCP" },
                        ],
                        "livenessProbe": {
                            "httpGet": { "path": "/healthz", "port": "healthz" },
                            "initialDelaySeconds": 15,
                            "periodSeconds": 20,
                        },
                        // /readyz waits for the webhook listener and, on the
                        // leader, for every controller's first list.
                        "readinessProbe": {
                            "httpGet": { "path": "/readyz", "port": "healthz" },
                            "periodSeconds": 5,
                        },
                        // Sized from the peak memory in docs/performance.md.
                        "resources": {
                            "requests": { "cpu": "100m", "memory": "128Mi" },
                            "limits": { "cpu": "1", "memory": "512Mi" },
                        },
                        // The manager writes no file: the root filesystem
                        // stays read-only.
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "capabilities": { "drop": ["ALL"] },
                            "privileged": false,
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "runAsUser": 65532,
                            "runAsGroup": 65532,
                            "seccompProfile": { "type": "RuntimeDefault" },
                        },
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "volumeMounts": [{ "name": "cert", "mountPath": CERT_DIR, "readOnly": true }],
                    }],
                    "volumes": [{
                        "name": "cert",
                        "secret": { "secretName": WEBHOOK_SECRET },
                    }],
                    "tolerations": [
                        { "effect": "NoSchedule", "key": "node-role.kubernetes.io/master" },
                        { "effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane" },
                    ],
                },
            },
        },
    })
}

/// The webhooks of `webhook::configuration`, reached through the Service;
/// cert-manager's CA injector fills in `caBundle` from the Certificate.
fn validating_webhook_configuration() -> Value {
    let configuration = validating_configuration(|path| WebhookClientConfig {
        service: Some(ServiceReference {
            name: WEBHOOK_SERVICE.into(),
            namespace: NAMESPACE.into(),
            path: Some(path.into()),
            port: Some(443),
        }),
        ..Default::default()
    });
    let mut value = serde_json::to_value(configuration).expect("webhook configuration");
    value["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    value["kind"] = json!("ValidatingWebhookConfiguration");
    value["metadata"]["labels"] = labels();
    value["metadata"]["annotations"] =
        json!({ "cert-manager.io/inject-ca-from": format!("{NAMESPACE}/{CERTIFICATE}") });
    value
}

/// The mutating webhooks, reached like the validating ones.
fn mutating_webhook_configuration() -> Value {
    let configuration = mutating_configuration(|path| WebhookClientConfig {
        service: Some(ServiceReference {
            name: WEBHOOK_SERVICE.into(),
            namespace: NAMESPACE.into(),
            path: Some(path.into()),
            port: Some(443),
        }),
        ..Default::default()
    });
    let mut value = serde_json::to_value(configuration).expect("webhook configuration");
    value["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    value["kind"] = json!("MutatingWebhookConfiguration");
    value["metadata"]["labels"] = labels();
    value["metadata"]["annotations"] =
        json!({ "cert-manager.io/inject-ca-from": format!("{NAMESPACE}/{CERTIFICATE}") });
    value
}

#[cfg(test)]
mod tests;
