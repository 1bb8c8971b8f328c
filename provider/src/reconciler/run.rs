//! Running a controller until shutdown: every controller's reconciles pass
//! through here, with the one error policy.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use serde::de::DeserializeOwned;

use super::context::Context;
use super::error_policy::{ReconcileError, error_policy};

/// Runs `controller` with `reconcile` until the manager shuts down. Errors were already handled by the error
/// policy (a warning and a backoff); they are logged here at debug only.
pub async fn run<K, C, F, Fut, E>(controller: Controller<K>, reconcile: F, ctx: Arc<C>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    C: AsRef<Context> + Send + Sync + 'static,
    F: FnMut(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: ReconcileError + Send + 'static,
{
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy::<K, E, C>, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                let kind = K::kind(&());
                tracing::debug!(%error, "{kind} reconcile ended with an error");
            }
        })
        .await;
}

impl AsRef<Context> for Context {
    fn as_ref(&self) -> &Context {
        self
    }
}
