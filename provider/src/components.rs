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
//! The RBAC ([`rbac`]) is what the controllers do, audited from every `Api`
//! they build: each rule names the code that needs it. Add the rule when a
//! controller starts touching a new kind.

use k8s_openapi::api::admissionregistration::v1::{ServiceReference, WebhookClientConfig};
use serde_json::{Value, json};

use crate::webhook::configuration::{mutating_configuration, validating_configuration};

mod rbac;

/// The provider's name for clusterctl (`--infrastructure tenantry`).
pub const PROVIDER_NAME: &str = "tenantry";
/// The `cluster.x-k8s.io/provider` label value clusterctl expects
/// (`<type>-<name>`).
pub const PROVIDER_LABEL: &str = "infrastructure-tenantry";
/// The one namespace of the components.
pub const NAMESPACE: &str = "tenantry-system";
/// The release version clusterctl sees (`v` + the crate version).
pub const RELEASE_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
/// The Cluster API contract `metadata.yaml` declares for this release
/// series: v1beta1, which clusterctl 1.10 (the platform's) requires and
/// clusterctl 1.11 and later accept as compatible with v1beta2. What Cluster
/// API's core reads is decided by the CRDs' contract labels, which name
/// both, and tenantry writes the fields of both contracts.
pub const CONTRACT: &str = "v1beta1";
/// The default image; `TENANTRY_IMAGE` overrides it at `clusterctl init`.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/tenantry/tenantry:v", env!("CARGO_PKG_VERSION"));

/// The manager Deployment and its container.
pub const DEPLOYMENT_NAME: &str = "tenantry-controller-manager";
pub const CONTAINER_NAME: &str = "manager";
const SERVICE_ACCOUNT: &str = "tenantry-manager";
const WEBHOOK_SERVICE: &str = "tenantry-webhook-service";
/// The Service in front of the metrics endpoint.
pub const METRICS_SERVICE: &str = "tenantry-metrics-service";
/// The ClusterRole a scraper's ServiceAccount is bound to.
pub const METRICS_READER_ROLE: &str = "tenantry-metrics-reader";
/// The metrics endpoint's port (Cluster API's diagnostics port).
pub const METRICS_PORT: u16 = 8443;
/// The serving certificate's Secret (webhooks and metrics); its `ca.crt`
/// is what a scraper verifies the metrics endpoint with.
pub const WEBHOOK_SECRET: &str = "tenantry-webhook-server-cert";
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
    Variable {
        name: "TENANTRY_TENANT_INGRESS_CLASS",
        default: "",
        meaning: "IngressClass of the SSL-passthrough Ingress publishing a tenant apiserver when its namespace's `namespace.cozystack.io/ingress` names none (`--tenant-ingress-class`); empty: the cluster's default class",
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
        rbac::manager_role(),
        rbac::manager_role_binding(),
        rbac::capi_aggregated_role(),
        rbac::metrics_reader_role(),
        webhook_service(),
        metrics_service(),
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

/// The metrics endpoint's Service, for a ServiceMonitor to select
/// (`config/monitoring/service-monitor.yaml`).
fn metrics_service() -> Value {
    let mut labels = selector();
    labels["app.kubernetes.io/component"] = json!("metrics");
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": METRICS_SERVICE, "namespace": NAMESPACE, "labels": labels },
        "spec": {
            "ports": [{ "name": "https", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP" }],
            "selector": selector(),
        },
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

/// The serving certificate of the webhooks and the metrics endpoint.
/// clusterctl rewrites the namespace in `dnsNames` when installing into
/// another namespace, so the names follow its `<service>.<namespace>.svc`
/// pattern.
fn certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": { "name": CERTIFICATE, "namespace": NAMESPACE, "labels": labels() },
        "spec": {
            "dnsNames": [
                format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc"),
                format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc.cluster.local"),
                format!("{METRICS_SERVICE}.{NAMESPACE}.svc"),
                format!("{METRICS_SERVICE}.{NAMESPACE}.svc.cluster.local"),
            ],
            "issuerRef": { "kind": "Issuer", "name": ISSUER },
            "secretName": WEBHOOK_SECRET,
        },
    })
}

/// The manager container's arguments.
pub(crate) fn manager_args() -> Vec<String> {
    // The optional flags take their values from the environment (`$(VAR)`
    // is expanded by the kubelet), where an empty default can stand alone
    // as a YAML value; `tenantry run` reads empty as unset.
    vec![
        "run".to_string(),
        "--namespace=$(TENANTRY_WATCH_NAMESPACE)".to_string(),
        "--watch-filter=$(TENANTRY_WATCH_FILTER)".to_string(),
        "--talos-image-factory-url=$(TENANTRY_TALOS_IMAGE_FACTORY_URL)".to_string(),
        "--tenant-ingress-class=$(TENANTRY_TENANT_INGRESS_CLASS)".to_string(),
        format!("--webhook-bind=0.0.0.0:{WEBHOOK_PORT}"),
        format!("--webhook-cert-dir={CERT_DIR}"),
        format!("--health-addr=0.0.0.0:{HEALTH_PORT}"),
        // Cluster API's diagnostics convention: HTTPS, scrapers checked
        // with TokenReview and SubjectAccessReview, the serving
        // certificate shared with the webhooks.
        format!("--metrics-bind-address=:{METRICS_PORT}"),
        format!("--metrics-cert-dir={CERT_DIR}"),
        "--leader-elect".to_string(),
    ]
}

/// One replica, with leader election on (`--leader-elect`): a rollout's new
/// pod waits for the old one's Lease, and scaling up adds standbys, never a
/// second writer.
fn deployment(image: &str) -> Value {
    let args = manager_args();
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
                            { "name": "TENANTRY_TENANT_INGRESS_CLASS", "value": variable("TENANTRY_TENANT_INGRESS_CLASS") },
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        ],
                        "ports": [
                            { "name": "webhook-server", "containerPort": WEBHOOK_PORT, "protocol": "TCP" },
                            { "name": "healthz", "containerPort": HEALTH_PORT, "protocol": "TCP" },
                            { "name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP" },
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
