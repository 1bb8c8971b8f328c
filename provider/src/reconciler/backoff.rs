//! Per-object exponential backoff after errors.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::reflector::ObjectRef;

/// Per-object exponential backoff after errors: 1 s doubling to 5 min,
/// reset by the next successful reconcile. The delay grows with the retries
/// that failed, not with every failure: a reconcile woken by a watch event
/// before the scheduled retry, and failing the same way, keeps the retry
/// where it was, or a busy object would reach the cap within seconds of a
/// short outage and sit out minutes after it (docs/reliability.md).
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, Failing>>,
}

struct Failing {
    /// Retries that failed in a row (the first failure counts as one).
    count: u32,
    /// When the retry scheduled by the last counted failure is due.
    retry_at: Instant,
}

impl Backoff {
    const BASE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);

    /// Records a failure of `key`; returns how long to wait before retrying.
    pub fn failed(&self, key: &str) -> Duration {
        self.failed_at(key, Instant::now())
    }

    fn failed_at(&self, key: &str, now: Instant) -> Duration {
        let mut failures = self.failures.lock().expect("backoff lock");
        let failing = failures.entry(key.to_string()).or_insert(Failing {
            count: 0,
            retry_at: now,
        });
        if failing.count > 0 && now < failing.retry_at {
            // Woken early: the scheduled retry stands.
            return (failing.retry_at - now).max(Self::BASE);
        }
        failing.count = failing.count.saturating_add(1);
        let factor = 2u32.saturating_pow((failing.count - 1).min(16));
        let delay = (Self::BASE * factor).min(Self::MAX);
        failing.retry_at = now + delay;
        delay
    }

    /// Forgets the failures of `key`.
    pub fn succeeded(&self, key: &str) {
        self.failures.lock().expect("backoff lock").remove(key);
    }
}

/// The key of an object in the backoff table.
pub fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String
where
    K::DynamicType: Eq + Hash + Clone,
{
    ObjectRef::from_obj(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn backoff_doubles_up_to_five_minutes_and_resets() {
        let backoff = Backoff::default();
        let mut now = Instant::now();
        let delays: Vec<u64> = (0..12)
            .map(|_| {
                // Each failure is the scheduled retry failing again.
                let delay = backoff.failed_at("a", now);
                now += delay;
                delay.as_secs()
            })
            .collect();
        assert_eq!(&delays[..5], &[1, 2, 4, 8, 16]);
        assert_eq!(*delays.last().unwrap(), 300);
        assert_eq!(
            backoff.failed_at("b", now).as_secs(),
            1,
            "objects back off independently"
        );
        backoff.succeeded("a");
        assert_eq!(backoff.failed_at("a", now).as_secs(), 1);
    }

    #[test]
    fn failures_before_the_scheduled_retry_do_not_grow_the_backoff() {
        let backoff = Backoff::default();
        let start = Instant::now();
        assert_eq!(backoff.failed_at("a", start), Duration::from_secs(1));
        assert_eq!(
            backoff.failed_at("a", start + Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        // Forty watch events in the next second, each failing the same way.
        for i in 0..40 {
            let at = start + Duration::from_secs(1) + Duration::from_millis(25 * i);
            let delay = backoff.failed_at("a", at);
            assert!(delay <= Duration::from_secs(2), "{delay:?}");
        }
        // The retry that was due fails: the backoff grows by one step.
        assert_eq!(
            backoff.failed_at("a", start + Duration::from_secs(3)),
            Duration::from_secs(4)
        );
    }
}
