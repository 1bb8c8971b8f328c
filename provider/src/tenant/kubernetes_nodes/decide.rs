//! Pure decisions for a `KubernetesNodes` pool: its workers' condition
//! from the MachineDeployment, its `Ready` summary, and the tenant-side
//! objects that let its workers join. Nothing here holds a client.

use k8s_openapi::ByteString;
use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tenantry_api::tenant_nodes::{READY_CONDITION, WORKERS_READY_CONDITION};

use super::render::{self as pool};
use crate::capi::conditions::DesiredCondition;

use super::status::Reason;

/// Tenant-side names.
pub(super) const BOOTSTRAP_TOKEN_NAMESPACE: &str = "kube-system";

pub(super) const BOOTSTRAP_TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";

/// The group kubeadm gives node bootstrap tokens; Kamaji's (kubeadm's) RBAC
/// lets it create and auto-approve kubelet CSRs.
pub(super) const NODE_BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The bootstrap token and the RBAC that let a worker's kubelet join, in
/// the tenant cluster: the token Secret kubeadm's format defines, CSR
/// creation and auto-approval for the token's group, certificate rotation
/// for nodes, and read access to endpoints for system:nodes.
pub(super) fn tenant_join_objects(
    token_id: &str,
    token_secret: &str,
) -> Vec<(ApiResource, Option<&'static str>, Value)> {
    let b64 = |s: &str| ByteString(s.as_bytes().to_vec());
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("bootstrap-token-{token_id}"),
            "namespace": BOOTSTRAP_TOKEN_NAMESPACE,
            "labels": { "app.kubernetes.io/managed-by": "tenantry" },
        },
        "type": BOOTSTRAP_TOKEN_TYPE,
        "data": {
            "description": b64("Talos worker join token, managed by tenantry"),
            "token-id": b64(token_id),
            "token-secret": b64(token_secret),
            "usage-bootstrap-authentication": b64("true"),
            "usage-bootstrap-signing": b64("true"),
            "auth-extra-groups": b64(NODE_BOOTSTRAP_GROUP),
        },
    });
    let binding = |name: &str, role: &str, group: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group }],
        })
    };
    let cluster_role_binding = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
        "clusterrolebindings",
    );
    let role = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "Role"),
        "roles",
    );
    let role_binding = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "RoleBinding"),
        "rolebindings",
    );
    let secret_resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets");
    vec![
        (secret_resource, Some(BOOTSTRAP_TOKEN_NAMESPACE), secret),
        (
            cluster_role_binding.clone(),
            None,
            binding(
                "tenantry:kubelet-bootstrap",
                "system:node-bootstrapper",
                NODE_BOOTSTRAP_GROUP,
            ),
        ),
        (
            cluster_role_binding.clone(),
            None,
            binding(
                "tenantry:node-autoapprove-bootstrap",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                NODE_BOOTSTRAP_GROUP,
            ),
        ),
        (
            cluster_role_binding,
            None,
            binding(
                "tenantry:node-autoapprove-certificate-rotation",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                "system:nodes",
            ),
        ),
        (
            role,
            Some("default"),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": { "name": "tenantry:nodes-read-endpoints", "namespace": "default" },
                "rules": [
                    { "apiGroups": [""], "resources": ["endpoints"], "verbs": ["get", "list", "watch"] },
                    { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] },
                ],
            }),
        ),
        (
            role_binding,
            Some("default"),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": { "name": "tenantry:nodes-read-endpoints", "namespace": "default" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenantry:nodes-read-endpoints" },
                "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes" }],
            }),
        ),
    ]
}

/// The WorkersReady condition from the MachineDeployment's status.
pub(super) fn workers_condition(
    deployment: &Value,
    desired: Option<i64>,
) -> (DesiredCondition, i32, i32) {
    let status = &deployment["status"];
    let desired = desired.unwrap_or(0);
    let replicas = status["replicas"].as_i64().unwrap_or(0);
    let ready = status["readyReplicas"].as_i64().unwrap_or(0);
    let up_to_date = status["upToDateReplicas"].as_i64().unwrap_or(replicas);
    let counts = format!("{ready} of {desired} workers Ready");
    let condition = if desired == 0 && replicas == 0 {
        DesiredCondition::true_(WORKERS_READY_CONDITION, Reason::NoWorkersWanted.as_str())
            .with_message("the pool wants no workers now (minReplicas 0); the autoscaler adds them when pods need them")
    } else if replicas != desired {
        DesiredCondition::false_(
            WORKERS_READY_CONDITION,
            Reason::Scaling.as_str(),
            format!("{counts}; scaling from {replicas} to {desired}"),
        )
    } else if up_to_date < desired {
        DesiredCondition::false_(
            WORKERS_READY_CONDITION,
            Reason::RollingOut.as_str(),
            format!("{counts}; {up_to_date} of {desired} run the current template"),
        )
    } else if ready < desired {
        DesiredCondition::false_(
            WORKERS_READY_CONDITION,
            Reason::WorkersNotReady.as_str(),
            format!(
                "{counts}; see the pool's Machines (kubectl get machines -l {}=<deployment>)",
                pool::DEPLOYMENT_NAME_LABEL
            ),
        )
    } else {
        DesiredCondition::true_(WORKERS_READY_CONDITION, Reason::WorkersReady.as_str())
            .with_message(counts)
    };
    let as_i32 = |v: i64| i32::try_from(v).unwrap_or(i32::MAX);
    (condition, as_i32(replicas), as_i32(ready))
}

/// `Ready`: the workers' condition, as the pool's summary.
pub(super) fn ready_summary(workers: &DesiredCondition) -> DesiredCondition {
    if workers.is_true() {
        DesiredCondition::true_(READY_CONDITION, Reason::Ready.as_str())
            .with_message(workers.message.clone())
    } else {
        DesiredCondition::false_(
            READY_CONDITION,
            workers.reason.clone(),
            workers.message.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(replicas: i64, ready: i64, up_to_date: i64) -> Value {
        json!({ "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "upToDateReplicas": up_to_date,
        } })
    }

    #[test]
    fn the_workers_condition_names_what_the_pool_waits_for() {
        let cases = [
            (
                "nothing wanted",
                deployment(0, 0, 0),
                Some(0),
                true,
                "NoWorkersWanted",
            ),
            ("scaling up", deployment(1, 1, 1), Some(3), false, "Scaling"),
            (
                "rolling out",
                deployment(3, 3, 1),
                Some(3),
                false,
                "RollingOut",
            ),
            (
                "booting",
                deployment(3, 2, 3),
                Some(3),
                false,
                "WorkersNotReady",
            ),
            (
                "all ready",
                deployment(3, 3, 3),
                Some(3),
                true,
                "WorkersReady",
            ),
        ];
        for (name, deployment, desired, ready, reason) in cases {
            let (condition, replicas, _) = workers_condition(&deployment, desired);
            assert_eq!(
                (condition.is_true(), condition.reason.as_str()),
                (ready, reason),
                "{name}: {}",
                condition.message
            );
            assert_eq!(
                replicas,
                deployment["status"]["replicas"].as_i64().unwrap() as i32
            );
            let summary = ready_summary(&condition);
            assert_eq!(summary.is_true(), ready, "{name}");
            assert_eq!(
                summary.message, condition.message,
                "{name}: Ready repeats it"
            );
        }
        let (scaling, _, _) = workers_condition(&deployment(1, 1, 1), Some(3));
        assert_eq!(scaling.message, "1 of 3 workers Ready; scaling from 1 to 3");
    }

    #[test]
    fn a_joining_worker_gets_a_bootstrap_token_in_kube_system() {
        let objects = tenant_join_objects("abcdef", "0123456789abcdef");
        let (_, namespace, secret) = &objects[0];
        assert_eq!(*namespace, Some(BOOTSTRAP_TOKEN_NAMESPACE));
        assert_eq!(secret["metadata"]["name"], "bootstrap-token-abcdef");
        assert_eq!(secret["type"], BOOTSTRAP_TOKEN_TYPE);
    }
}
