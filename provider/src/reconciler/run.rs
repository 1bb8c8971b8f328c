//! Running a controller until shutdown: every controller's reconciles pass
//! through here, take a fair turn, are measured, and meet the one error
//! policy.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde::de::DeserializeOwned;

use super::context::Context;
use super::error_policy::{ReconcileError, error_policy};
use crate::metrics::controller::Outcome;

/// Runs `controller` with `reconcile` until the manager shuts down.
///
/// kube's runner starts every due reconcile (the controllers are
/// configured without a runner bound); each then waits for a turn
/// ([`super::Turns`], first come first served, as many at once as
/// `--max-concurrent-reconciles`) and works on the object as the
/// controller's cache has it then, which may be newer than when it fell
/// due. Errors were already handled by the error policy (a warning and a
/// backoff); they are logged here at debug only.
pub async fn run<K, C, F, Fut, E>(controller: Controller<K>, reconcile: F, ctx: Arc<C>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    C: AsRef<Context> + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: ReconcileError + Send + 'static,
{
    let base: &Context = (*ctx).as_ref();
    let turns = Arc::new(base.config.turns());
    let metrics = crate::metrics::global()
        .controllers
        .of(base.name(), base.config.reconcile_bound());
    let store = controller.store();
    let reconcile = Arc::new(reconcile);
    let in_turn = move |object: Arc<K>, ctx: Arc<C>| {
        let (turns, metrics, store, reconcile) = (
            turns.clone(),
            metrics.clone(),
            store.clone(),
            reconcile.clone(),
        );
        async move {
            let mut queued = metrics.queued();
            let _turn = turns.take().await;
            queued.start();
            let started = Instant::now();
            // The object as it is now: it may have changed, or gone, during
            // the wait.
            let Some(object) = store.get(&ObjectRef::from_obj(object.as_ref())) else {
                metrics.finished(Outcome::Success, started.elapsed());
                return Ok(Action::await_change());
            };
            // Boxed: a reconcile waiting for its turn holds only this much.
            let result = Box::pin(reconcile(object, ctx)).await;
            metrics.finished(outcome(&result), started.elapsed());
            result
        }
    };
    controller
        .shutdown_on_signal()
        .run(in_turn, error_policy::<K, E, C>, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                let kind = K::kind(&());
                tracing::debug!(%error, "{kind} reconcile ended with an error");
            }
        })
        .await;
}

/// How controller-runtime would label a reconcile's result: a deliberate
/// wait is a requeue, not an error.
fn outcome<E: ReconcileError>(result: &Result<Action, E>) -> Outcome {
    match result {
        Ok(action) if *action == Action::await_change() => Outcome::Success,
        Ok(action) if *action == Action::requeue(Duration::ZERO) => Outcome::Requeue,
        Ok(_) => Outcome::RequeueAfter,
        Err(error) if error.wait().is_some() => Outcome::RequeueAfter,
        Err(_) => Outcome::Error,
    }
}

impl AsRef<Context> for Context {
    fn as_ref(&self) -> &Context {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("test")]
    struct TestError(Option<Duration>);

    impl ReconcileError for TestError {
        fn wait(&self) -> Option<Duration> {
            self.0
        }
    }

    #[test]
    fn waits_are_requeues_and_only_real_errors_are_errors() {
        let cases: [(Result<Action, TestError>, Outcome); 5] = [
            (Ok(Action::await_change()), Outcome::Success),
            (Ok(Action::requeue(Duration::ZERO)), Outcome::Requeue),
            (
                Ok(Action::requeue(Duration::from_secs(5))),
                Outcome::RequeueAfter,
            ),
            (
                Err(TestError(Some(Duration::from_secs(2)))),
                Outcome::RequeueAfter,
            ),
            (Err(TestError(None)), Outcome::Error),
        ];
        for (result, expected) in cases {
            assert_eq!(outcome(&result), expected, "{result:?}");
        }
    }
}
