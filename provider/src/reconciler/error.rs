//! The one error type of every reconciler: a deliberate wait, which is not
//! a failure (requeued after its delay, the backoff untouched), or an error
//! that backs off per object.

use std::fmt;
use std::time::Duration;

use super::error_policy::ReconcileError;
use super::finalizer::finalizer_wait;

/// What a controller adds to the Kubernetes API's errors: its hypervisor's
/// API, the infrastructure cluster, certificates. [`Infallible`] for a
/// controller that speaks only to Kubernetes.
///
/// [`Infallible`]: std::convert::Infallible
pub trait OwnError: std::error::Error + Send + Sync + 'static {
    /// `Some(cap)` when this error passes by itself and its retries should
    /// not back off beyond `cap`, however often it failed in a row.
    fn backoff_cap(&self) -> Option<Duration> {
        None
    }
}

impl OwnError for std::convert::Infallible {}

/// A reconcile that did not finish: `Waiting` is deliberate, the rest back
/// off. (Display and `Error` are written out: derived, their bounds would
/// recurse through the finalizer's error.)
#[derive(Debug)]
pub enum Error<E: OwnError = std::convert::Infallible> {
    Kube(kube::Error),
    /// Not a failure: look again after the delay.
    Waiting(String, Duration),
    /// Boxed: the substrate errors are large, and a reconcile returns this.
    Own(Box<E>),
    Finalizer(Box<kube::runtime::finalizer::Error<Error<E>>>),
}

impl<E: OwnError> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Kube(error) => write!(f, "Kubernetes API: {error}"),
            Error::Waiting(message, _) => write!(f, "waiting: {message}"),
            Error::Own(error) => fmt::Display::fmt(error.as_ref(), f),
            Error::Finalizer(error) => write!(f, "finalizer: {error}"),
        }
    }
}

impl<E: OwnError> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Kube(error) => Some(error),
            Error::Waiting(..) => None,
            Error::Own(error) => error.source(),
            Error::Finalizer(error) => Some(error.as_ref()),
        }
    }
}

impl<E: OwnError> From<kube::Error> for Error<E> {
    fn from(error: kube::Error) -> Self {
        Error::Kube(error)
    }
}

impl<E: OwnError> ReconcileError for Error<E> {
    fn wait(&self) -> Option<Duration> {
        match self {
            Error::Waiting(_, delay) => Some(*delay),
            Error::Finalizer(inner) => finalizer_wait(inner),
            _ => None,
        }
    }

    fn backoff_cap(&self) -> Option<Duration> {
        match self {
            Error::Own(own) => own.backoff_cap(),
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.backoff_cap(),
                _ => None,
            },
            _ => None,
        }
    }
}

impl<E: OwnError> From<kube::runtime::finalizer::Error<Error<E>>> for Error<E> {
    fn from(error: kube::runtime::finalizer::Error<Error<E>>) -> Self {
        Error::Finalizer(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("passing")]
    struct Passing;

    impl OwnError for Passing {
        fn backoff_cap(&self) -> Option<Duration> {
            Some(Duration::from_secs(30))
        }
    }

    #[test]
    fn waits_are_not_failures_and_own_errors_keep_their_cap() {
        let wait: Error<Passing> = Error::Waiting("VM still there".into(), Duration::from_secs(2));
        assert_eq!(wait.wait(), Some(Duration::from_secs(2)));
        let during_cleanup: Error<Passing> = kube::runtime::finalizer::Error::CleanupFailed(
            Error::Waiting("gone soon".into(), Duration::from_secs(5)),
        )
        .into();
        assert_eq!(during_cleanup.wait(), Some(Duration::from_secs(5)));
        let own: Error<Passing> = Error::Own(Box::new(Passing));
        assert_eq!(
            (own.wait(), own.backoff_cap()),
            (None, Some(Duration::from_secs(30)))
        );
        let nested: Error<Passing> =
            kube::runtime::finalizer::Error::ApplyFailed(Error::Own(Box::new(Passing))).into();
        assert_eq!(nested.backoff_cap(), Some(Duration::from_secs(30)));
        let plain: Error = Error::Waiting("x".into(), Duration::ZERO);
        assert_eq!(plain.backoff_cap(), None);
    }
}
