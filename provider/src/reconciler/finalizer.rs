//! One reconcile under a finalizer, `clusterctl move` honoured.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::Action;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenantry_api::contract::DELETE_FOR_MOVE_ANNOTATION;

use super::backoff::object_key;
use super::context::Context;
use super::error_policy::ReconcileError;
use crate::metrics::machines::Substrate;

/// How long a finalizer-wrapped error asks to wait: the wait of the apply
/// or cleanup error inside it, if any.
pub fn finalizer_wait<E: ReconcileError>(
    error: &kube::runtime::finalizer::Error<E>,
) -> Option<Duration> {
    match error {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e.wait(),
        _ => None,
    }
}

/// One reconcile of a namespaced object under a finalizer: apply or cleanup
/// (from `kube::runtime::finalizer`) inside a span naming the object, and the
/// object's backoff reset when it succeeds.
pub async fn reconcile_with_finalizer<K, E, F, Fut>(
    base: &Context,
    object: Arc<K>,
    finalizer_name: &str,
    reconcile: F,
) -> Result<Action, E>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static,
    E: std::error::Error + Send + 'static + From<kube::runtime::finalizer::Error<E>>,
    F: FnOnce(kube::runtime::finalizer::Event<K>) -> Fut,
    Fut: std::future::Future<Output = Result<Action, E>>,
{
    use tracing::Instrument;
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(base.client.clone(), &namespace);
    let key = object_key(object.as_ref());
    let span = tracing::info_span!(
        "reconcile",
        kind = %K::kind(&()),
        namespace = %namespace,
        name = object.meta().name.as_deref().unwrap_or_default()
    );
    // `clusterctl move` marks the source's objects before deleting them: the
    // infrastructure lives on under the target management cluster, so
    // neither a last reconcile nor a cleanup may touch it. Dropping the
    // finalizer is all that is left to do.
    let moving = object
        .meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DELETE_FOR_MOVE_ANNOTATION));
    let reconcile = |event: kube::runtime::finalizer::Event<K>| async move {
        if moving {
            tracing::info!("deleted by clusterctl move: the infrastructure is left as it is");
            return Ok(Action::await_change());
        }
        reconcile(event).await
    };
    // Cleanup's success removes the finalizer: the end of a deletion.
    let deleting = object.meta().deletion_timestamp.clone().filter(|_| {
        object
            .meta()
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == finalizer_name))
    });
    let result = kube::runtime::finalizer(&api, finalizer_name, object, reconcile)
        .instrument(span)
        .await
        .map_err(E::from);
    if result.is_ok() {
        base.backoff().succeeded(&key);
        if let (Some(requested), Some(substrate)) = (deleting, Substrate::of_kind(&K::kind(&()))) {
            crate::metrics::global()
                .machines
                .deleted(substrate, &requested);
        }
    }
    result
}
