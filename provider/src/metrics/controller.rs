//! controller-runtime's controller and workqueue series, under its names
//! and labels. kube's runner has no work queue to measure; tenantry's
//! equivalent is the wait for a turn (`reconciler::run`): a reconcile that
//! fell due and waits for a free slot is what controller-runtime counts in
//! `workqueue_depth`.

use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Histograms, Labels, histogram};

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets.
const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// client-go's workqueue latency buckets: 10 ns to 10 s, by tens.
const QUEUE_BUCKETS: &[f64] = &[1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

fn reconcile_histogram() -> Histogram {
    histogram(RECONCILE_BUCKETS)
}

fn queue_histogram() -> Histogram {
    histogram(QUEUE_BUCKETS)
}

/// The families; [`ControllerSeries::of`] gives one controller's series.
pub struct ControllerSeries {
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    time: Histograms,
    max_concurrent: Family<Labels, Gauge>,
    active: Family<Labels, Gauge>,
    depth: Family<Labels, Gauge>,
    adds: Family<Labels, Counter>,
    queue: Histograms,
    retries: Family<Labels, Counter>,
}

impl ControllerSeries {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let series = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            time: Family::new_with_constructor(reconcile_histogram),
            max_concurrent: Family::default(),
            active: Family::default(),
            depth: Family::default(),
            adds: Family::default(),
            queue: Family::new_with_constructor(queue_histogram),
            retries: Family::default(),
        };
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles finished, per controller and result (success, error, requeue, requeue_after)",
            series.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed, per controller (deliberate waits are not failures)",
            series.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time one reconcile took, per controller, not counting its wait for a turn",
            series.time.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Reconciles a controller runs at once at most (0: no bound)",
            series.max_concurrent.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Reconciles running now, per controller",
            series.active.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Reconciles due and waiting for a turn, per controller",
            series.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Reconciles that fell due, per controller",
            series.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long a due reconcile waited for its turn, per controller",
            series.queue.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Failed reconciles retried after a backoff, per controller",
            series.retries.clone(),
        );
        series
    }

    /// The series of controller `name`, which runs at most `bound`
    /// reconciles at once (0: no bound).
    pub fn of(&self, name: &str, bound: u16) -> ControllerMetrics {
        let controller = || vec![("controller", name.to_string())];
        let queue = || vec![("controller", name.to_string()), ("name", name.to_string())];
        let result = |result: &str| {
            self.reconciles.get_or_create_owned(&vec![
                ("controller", name.to_string()),
                ("result", result.to_string()),
            ])
        };
        self.max_concurrent
            .get_or_create(&controller())
            .set(i64::from(bound));
        ControllerMetrics {
            success: result("success"),
            error: result("error"),
            requeue: result("requeue"),
            requeue_after: result("requeue_after"),
            errors: self.errors.get_or_create_owned(&controller()),
            time: self.time.get_or_create_owned(&controller()),
            active: self.active.get_or_create_owned(&controller()),
            depth: self.depth.get_or_create_owned(&queue()),
            adds: self.adds.get_or_create_owned(&queue()),
            queue: self.queue.get_or_create_owned(&queue()),
            retries: self.retries.get_or_create_owned(&queue()),
        }
    }
}

/// How one reconcile ended, as controller-runtime labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done until something changes.
    Success,
    /// Failed: retried after a backoff.
    Error,
    /// Asked to run again at once.
    Requeue,
    /// Asked to run again after a while (also a deliberate wait).
    RequeueAfter,
}

/// One controller's series; cheap to clone (shared counters).
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    success: Counter,
    error: Counter,
    requeue: Counter,
    requeue_after: Counter,
    errors: Counter,
    time: Histogram,
    active: Gauge,
    depth: Gauge,
    adds: Counter,
    queue: Histogram,
    retries: Counter,
}

impl ControllerMetrics {
    /// A reconcile fell due: it waits for a turn until the guard's
    /// [`Queued::start`].
    pub fn queued(&self) -> Queued<'_> {
        self.adds.inc();
        self.depth.inc();
        Queued {
            metrics: self,
            since: Instant::now(),
            waiting: true,
        }
    }

    /// Records how a reconcile ended.
    pub fn finished(&self, outcome: Outcome, took: Duration) {
        self.time.observe(took.as_secs_f64());
        match outcome {
            Outcome::Success => self.success.inc(),
            Outcome::Requeue => self.requeue.inc(),
            Outcome::RequeueAfter => self.requeue_after.inc(),
            Outcome::Error => {
                self.errors.inc();
                self.retries.inc();
                self.error.inc()
            }
        };
    }
}

/// A reconcile waiting for its turn, then running; dropped (shutdown), it
/// leaves the gauges as they were.
pub struct Queued<'a> {
    metrics: &'a ControllerMetrics,
    since: Instant,
    waiting: bool,
}

impl Queued<'_> {
    /// It got its turn: out of the queue, one more worker active.
    pub fn start(&mut self) {
        if std::mem::take(&mut self.waiting) {
            self.metrics.depth.dec();
            self.metrics
                .queue
                .observe(self.since.elapsed().as_secs_f64());
            self.metrics.active.inc();
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.waiting {
            self.metrics.depth.dec();
        } else {
            self.metrics.active.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconcile_moves_from_the_queue_to_the_workers_and_out() {
        let mut registry = Registry::default();
        let series = ControllerSeries::register(&mut registry);
        let metrics = series.of("widget", 4);
        let mut first = metrics.queued();
        let second = metrics.queued();
        assert_eq!((metrics.depth.get(), metrics.active.get()), (2, 0));
        first.start();
        assert_eq!((metrics.depth.get(), metrics.active.get()), (1, 1));
        drop(second);
        drop(first);
        assert_eq!((metrics.depth.get(), metrics.active.get()), (0, 0));
        assert_eq!(metrics.adds.get(), 2);
        metrics.finished(Outcome::Error, Duration::from_millis(3));
        metrics.finished(Outcome::RequeueAfter, Duration::from_millis(3));
        assert_eq!((metrics.errors.get(), metrics.retries.get()), (1, 1));
        assert_eq!(metrics.time.count(), 2);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "controller_runtime_reconcile_total{controller=\"widget\",result=\"error\"} 1",
            "controller_runtime_reconcile_total{controller=\"widget\",result=\"requeue_after\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"widget\"} 1",
            "controller_runtime_max_concurrent_reconciles{controller=\"widget\"} 4",
            "workqueue_depth{controller=\"widget\",name=\"widget\"} 0",
            "workqueue_adds_total{controller=\"widget\",name=\"widget\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
