//! Which errors are waits, and how long a failed reconcile waits.

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;

use super::backoff::object_key;
use super::context::Context;

/// Errors know whether they are expected waiting (not logged as failures, no
/// backoff growth) and how long to wait.
pub trait ReconcileError: std::error::Error {
    /// `Some(delay)` when this "error" is a deliberate wait, e.g. for a VM to
    /// be gone before a finalizer may go.
    fn wait(&self) -> Option<Duration> {
        None
    }

    /// `Some(cap)` when this error passes by itself and its retries should
    /// not back off beyond `cap`, however often it failed in a row.
    fn backoff_cap(&self) -> Option<Duration> {
        None
    }
}

/// The error policy every controller uses: deliberate waits requeue after
/// their delay; real errors back off exponentially per object, up to the
/// error's own cap if it has one.
pub fn error_policy<K, E, C>(object: Arc<K>, error: &E, ctx: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    E: ReconcileError,
    C: AsRef<Context>,
{
    if let Some(delay) = error.wait() {
        return Action::requeue(delay);
    }
    let key = object_key(object.as_ref());
    let delay = (*ctx).as_ref().backoff().failed(&key);
    let delay = error.backoff_cap().map_or(delay, |cap| delay.min(cap));
    tracing::warn!(object = %key, error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
