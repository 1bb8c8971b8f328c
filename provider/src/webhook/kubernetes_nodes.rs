//! The validating webhook of `KubernetesNodes` pools: the rules of
//! `tenant::kubernetes_nodes::admission`, which need the pool's parent `Kubernetes`
//! object, looked up in the pool's namespace when the request arrives.

use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use tenantry_api::tenant::Kubernetes;
use tenantry_api::tenant_nodes::KubernetesNodes;

use super::kubernetes::Decision;
use crate::tenant::kubernetes_nodes::admission as nodes_admission;

fn typed(object: &Option<DynamicObject>) -> Result<Option<KubernetesNodes>, String> {
    object
        .as_ref()
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value::<KubernetesNodes>))
        .transpose()
        .map_err(|e| format!("not a readable KubernetesNodes object: {e}"))
}

/// The decision on a CREATE or UPDATE of a pool. Without a client (the
/// webhook server started without one) the parent cannot be looked up, and
/// the pool is refused rather than admitted unchecked.
pub async fn validate(
    request: &AdmissionRequest<DynamicObject>,
    client: Option<&kube::Client>,
) -> Decision {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Decision::default();
    }
    let (pool, old) = match (typed(&request.object), typed(&request.old_object)) {
        (Ok(Some(new)), Ok(old)) => (new, old),
        (Err(error), _) | (_, Err(error)) => return denied(error),
        (Ok(None), _) => return Decision::default(),
    };
    let old = old.filter(|_| request.operation == Operation::Update);
    // Spec-preserving updates (finalizers, status-free metadata) and pools
    // being deleted never need the parent: they must pass even after the
    // parent is gone.
    if let Some(old) = &old
        && (pool.metadata.deletion_timestamp.is_some() || old.spec == pool.spec)
    {
        return Decision::default();
    }
    let Some(client) = client else {
        return denied(
            "the webhook cannot reach the Kubernetes API to look up spec.cluster; retry".into(),
        );
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pool.metadata.namespace.clone())
        .unwrap_or_default();
    let parent = match Api::<Kubernetes>::namespaced(client.clone(), &namespace)
        .get_opt(&pool.spec.cluster)
        .await
    {
        Ok(parent) => parent,
        Err(error) => {
            return denied(format!(
                "cannot look up the Kubernetes {:?} named in spec.cluster ({error}); retry",
                pool.spec.cluster
            ));
        }
    };
    let verdict = nodes_admission::validate(&pool, old.as_ref(), parent.as_ref());
    Decision {
        denied: (!verdict.allowed()).then(|| {
            verdict
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        }),
        warnings: verdict.warnings,
    }
}

fn denied(message: String) -> Decision {
    Decision {
        denied: Some(message),
        warnings: Vec::new(),
    }
}
