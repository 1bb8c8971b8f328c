//! The Validating- and MutatingWebhookConfigurations for tenantry's
//! webhooks, generated from one list each so the deployed YAML and the
//! served paths cannot drift apart.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::ObjectMeta;

/// The validating configuration's name.
pub const VALIDATING_CONFIGURATION_NAME: &str = "tenantry-validating-webhook-configuration";
/// The mutating configuration's name.
pub const MUTATING_CONFIGURATION_NAME: &str = "tenantry-mutating-webhook-configuration";

/// Path of the mutating webhook of `Kubernetes` objects.
pub const KUBERNETES_MUTATING_PATH: &str = "/mutate-apps-tenantry-dev-v1alpha1-kubernetes";
/// Path of the validating webhook of `Kubernetes` objects.
pub const KUBERNETES_VALIDATING_PATH: &str = "/validate-apps-tenantry-dev-v1alpha1-kubernetes";
/// Path of the validating webhook of `KubernetesNodes` pools.
pub const KUBERNETES_NODES_VALIDATING_PATH: &str =
    "/validate-apps-tenantry-dev-v1alpha1-kubernetesnodes";

/// One validating webhook: which kind it guards and where it is served.
pub struct ValidatingEndpoint {
    pub name: &'static str,
    pub path: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub operations: &'static [&'static str],
}

/// The mutating webhooks tenantry serves (the same shape as the validating).
pub type MutatingEndpoint = ValidatingEndpoint;

/// Every validating webhook tenantry serves.
pub const VALIDATING_ENDPOINTS: &[ValidatingEndpoint] = &[
    ValidatingEndpoint {
        name: "validation.kubevirtmachinetemplate.infrastructure.cluster.x-k8s.io",
        path: "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-kubevirtmachinetemplate",
        group: "infrastructure.cluster.x-k8s.io",
        version: "v1alpha1",
        resource: "kubevirtmachinetemplates",
        operations: &["UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.kubevirtclustertemplate.infrastructure.cluster.x-k8s.io",
        path: "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-kubevirtclustertemplate",
        group: "infrastructure.cluster.x-k8s.io",
        version: "v1alpha1",
        resource: "kubevirtclustertemplates",
        operations: &["UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.proxmoxmachinetemplate.infrastructure.cluster.x-k8s.io",
        path: "/validate-infrastructure-cluster-x-k8s-io-v1alpha2-proxmoxmachinetemplate",
        group: "infrastructure.cluster.x-k8s.io",
        version: "v1alpha2",
        resource: "proxmoxmachinetemplates",
        operations: &["UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.proxmoxclustertemplate.infrastructure.cluster.x-k8s.io",
        path: "/validate-infrastructure-cluster-x-k8s-io-v1alpha2-proxmoxclustertemplate",
        group: "infrastructure.cluster.x-k8s.io",
        version: "v1alpha2",
        resource: "proxmoxclustertemplates",
        operations: &["UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.kubevirtremediationtemplate.infrastructure.cluster.x-k8s.io",
        path: "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-kubevirtremediationtemplate",
        group: "infrastructure.cluster.x-k8s.io",
        version: "v1alpha1",
        resource: "kubevirtremediationtemplates",
        operations: &["UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.proxmoxremediationtemplate.infrastructure.cluster.x-k8s.io",
        path: "/validate-infrastructure-cluster-x-k8s-io-v1alpha2-proxmoxremediationtemplate",
        group: "infrastructure.cluster.x-k8s.io",
        version: "v1alpha2",
        resource: "proxmoxremediationtemplates",
        operations: &["UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.kubernetes.apps.tenantry.dev",
        path: KUBERNETES_VALIDATING_PATH,
        group: "apps.tenantry.dev",
        version: "v1alpha1",
        resource: "kuberneteses",
        operations: &["CREATE", "UPDATE"],
    },
    ValidatingEndpoint {
        name: "validation.kubernetesnodes.apps.tenantry.dev",
        path: KUBERNETES_NODES_VALIDATING_PATH,
        group: "apps.tenantry.dev",
        version: "v1alpha1",
        resource: "kubernetesnodes",
        operations: &["CREATE", "UPDATE"],
    },
];

/// Every mutating webhook tenantry serves.
pub const MUTATING_ENDPOINTS: &[MutatingEndpoint] = &[MutatingEndpoint {
    name: "default.kubernetes.apps.tenantry.dev",
    path: KUBERNETES_MUTATING_PATH,
    group: "apps.tenantry.dev",
    version: "v1alpha1",
    resource: "kuberneteses",
    operations: &["CREATE", "UPDATE"],
}];

fn rules(endpoint: &ValidatingEndpoint) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![endpoint.group.into()]),
        api_versions: Some(vec![endpoint.version.into()]),
        operations: Some(endpoint.operations.iter().map(|o| o.to_string()).collect()),
        resources: Some(vec![endpoint.resource.into()]),
        scope: Some("Namespaced".into()),
    }]
}

/// The mutating configuration, each webhook's client config made by
/// `client_config` from its path.
pub fn mutating_configuration(
    client_config: impl Fn(&str) -> WebhookClientConfig,
) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(MUTATING_CONFIGURATION_NAME.into()),
            ..Default::default()
        },
        webhooks: Some(
            MUTATING_ENDPOINTS
                .iter()
                .map(|endpoint| MutatingWebhook {
                    name: endpoint.name.into(),
                    admission_review_versions: vec!["v1".into()],
                    client_config: client_config(endpoint.path),
                    failure_policy: Some("Fail".into()),
                    match_policy: Some("Equivalent".into()),
                    // A later mutating webhook could add an extraArgs entry.
                    reinvocation_policy: Some("IfNeeded".into()),
                    side_effects: "None".into(),
                    rules: Some(rules(endpoint)),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// The configuration, each webhook's client config made by `client_config`
/// from its path (a Service reference when deployed, a URL in tests).
pub fn validating_configuration(
    client_config: impl Fn(&str) -> WebhookClientConfig,
) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(VALIDATING_CONFIGURATION_NAME.into()),
            ..Default::default()
        },
        webhooks: Some(
            VALIDATING_ENDPOINTS
                .iter()
                .map(|endpoint| ValidatingWebhook {
                    name: endpoint.name.into(),
                    admission_review_versions: vec!["v1".into()],
                    client_config: client_config(endpoint.path),
                    failure_policy: Some("Fail".into()),
                    match_policy: Some("Equivalent".into()),
                    side_effects: "None".into(),
                    rules: Some(rules(endpoint)),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}
