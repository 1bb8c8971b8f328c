//! Triggers passed on at most once per interval per object.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;

/// Passes each object's triggers on at most once per `interval`: the first
/// at once, those that follow within the interval as one more at its end,
/// so the last change is always seen and a burst costs two reconciles, not
/// one per event. For triggers that report on many objects (a cluster
/// woken by each change of any of its machines), where a few seconds of
/// delay cost nothing and a reconcile per event costs a full pass each.
pub fn throttle_triggers<K>(
    triggers: impl futures::Stream<Item = ObjectRef<K>> + Send + 'static,
    interval: Duration,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    use futures::StreamExt;
    use tokio::time::Instant;
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut triggers = std::pin::pin!(triggers);
        // When each object was last passed on, and when a held trigger is due.
        let mut passed: HashMap<ObjectRef<K>, Instant> = HashMap::new();
        let mut held: HashMap<ObjectRef<K>, Instant> = HashMap::new();
        loop {
            let next_due = held.values().min().copied();
            tokio::select! {
                // The controller is gone: stop, and with it the watch feeding us.
                () = sender.closed() => break,
                trigger = triggers.next() => {
                    let Some(object) = trigger else { break };
                    let now = Instant::now();
                    match passed.get(&object) {
                        Some(&at) if now < at + interval => {
                            held.entry(object).or_insert(at + interval);
                        }
                        _ => {
                            passed.insert(object.clone(), now);
                            if sender.send(object).is_err() {
                                break;
                            }
                        }
                    }
                }
                () = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {
                    let now = Instant::now();
                    let due: Vec<ObjectRef<K>> = held
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|(object, _)| object.clone())
                        .collect();
                    for object in due {
                        held.remove(&object);
                        passed.insert(object.clone(), now);
                        if sender.send(object).is_err() {
                            return;
                        }
                    }
                    // Forget objects quiet for a whole interval.
                    passed.retain(|object, at| now < *at + interval || held.contains_key(object));
                }
            }
        }
    });
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;
    fn cluster(name: &str) -> ObjectRef<k8s_openapi::api::core::v1::ConfigMap> {
        ObjectRef::new(name).within("default")
    }

    /// The next trigger passed on, and when since `start`; time is paused,
    /// so the minute is only a bound against a hang, never waited for.
    async fn next_at<S: futures::Stream + Unpin>(
        passed: &mut S,
        start: tokio::time::Instant,
    ) -> (Option<S::Item>, Duration) {
        use futures::StreamExt;
        let next = tokio::time::timeout(Duration::from_secs(60), passed.next())
            .await
            .expect("a trigger within a minute");
        (next, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_triggers_pass_the_first_at_once_and_a_burst_as_one_more() {
        let secs = Duration::from_secs;
        let (sender, source) = futures::channel::mpsc::unbounded();
        let mut passed = Box::pin(throttle_triggers(source, secs(5)));
        let start = tokio::time::Instant::now();
        sender.unbounded_send(cluster("a")).unwrap();
        assert_eq!(
            next_at(&mut passed, start).await,
            (Some(cluster("a")), secs(0)),
            "the first goes at once"
        );

        // A burst of ten within the interval, and another object meanwhile.
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            sender.unbounded_send(cluster("a")).unwrap();
        }
        sender.unbounded_send(cluster("b")).unwrap();
        assert_eq!(
            next_at(&mut passed, start).await,
            (Some(cluster("b")), secs(1)),
            "b is not held by a"
        );
        assert_eq!(
            next_at(&mut passed, start).await,
            (Some(cluster("a")), secs(5)),
            "the burst goes once, at the end of the interval"
        );

        // Nothing more was held: the next trigger comes from the source.
        tokio::time::sleep(secs(20)).await;
        sender.unbounded_send(cluster("a")).unwrap();
        assert_eq!(
            next_at(&mut passed, start).await,
            (Some(cluster("a")), secs(25)),
            "quiet: at once again"
        );
        drop(sender);
        assert_eq!(
            next_at(&mut passed, start).await.0,
            None,
            "ends with its source"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_triggers_let_go_of_their_source_when_no_one_listens() {
        let (sender, source) =
            futures::channel::mpsc::unbounded::<ObjectRef<k8s_openapi::api::core::v1::ConfigMap>>();
        let passed = throttle_triggers(source, Duration::from_secs(5));
        drop(passed);
        // The source is a watch in production: it must not outlive the controller.
        tokio::time::timeout(Duration::from_secs(60), async {
            while !sender.is_closed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the source is dropped once the throttled stream is");
    }
}
