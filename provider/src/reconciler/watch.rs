//! How the controllers watch: timeouts that bound a silent watch, the
//! backoffs of cache watches and of a controller's triggers, and caches that
//! keep only what reconciles read.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use kube::Resource;
use kube::api::Api;
use serde::de::DeserializeOwned;

/// How long a watch may stay open before kube-apiserver ends it and the
/// watcher opens the next one from where it was (no relist); kube's watcher
/// also gives up on a watch silent for this long plus 5 s. Shorter than
/// kube's 290 s: a watch opened while kube-apiserver restarts can be
/// accepted and then deliver nothing, and this bounds that silence, at the
/// cost of one watch request per minute per watch (docs/reliability.md).
pub const WATCH_TIMEOUT_SECONDS: u32 = 60;

/// The manager client's read timeout: no byte for this long on a
/// connection ends the request. A little longer than
/// [`WATCH_TIMEOUT_SECONDS`], so a healthy watch always ends first, and a
/// watch the apiserver forgot (or a request on a connection that died
/// silently) fails instead of waiting forever.
pub const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS as u64 + 20);

/// How long the manager's client waits for a response to begin (its
/// status line and headers; a watch's events and a list's body stream
/// after that). kube-apiserver answers at once even when a watch then
/// waits; a request it took in while restarting can stay unanswered, and
/// neither the watch timeout (not yet begun) nor kube's watch idle timeout
/// (no stream yet) would end it. The request fails instead, and is retried
/// with backoff.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS as u64);

/// Drops what a cached object carries but no reconcile reads before the
/// object goes into a reflector store: `managedFields` (a JSON tree per
/// field manager, often the largest part of an object's memory).
pub fn slim_for_cache<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The backoff of one watch of a controller's caches after an error (the
/// apiserver away, a relist after 410 Gone): 200 ms doubling to 10 s, reset
/// after 30 s without errors. Shorter than kube's default (up to 30 s, a
/// minute with jitter, reset after 120 s), so that watches are back soon
/// after kube-apiserver is.
pub fn watch_backoff()
-> kube::runtime::utils::ResetTimerBackoff<kube::runtime::watcher::ExponentialBackoff> {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    kube::runtime::utils::ResetTimerBackoff::new(exponential.into(), Duration::from_secs(30))
}

/// The backoff kube's Controller puts on all of its trigger streams
/// together: an error of any one watch pauses every watch of the
/// controller, so kube's default (up to a minute, reset only after 120 s
/// without errors) would blind a controller for minutes after an apiserver
/// restart. Each cache watch backs off by itself ([`watch_backoff`]); this
/// one only keeps the controller's own watch from spinning: 100 ms doubling
/// to 1 s.
pub fn trigger_backoff()
-> kube::runtime::utils::ResetTimerBackoff<kube::runtime::watcher::ExponentialBackoff> {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(1))
        .with_factor(2.0)
        .without_max_times();
    kube::runtime::utils::ResetTimerBackoff::new(exponential.into(), Duration::from_secs(10))
}

/// A controller for `K` whose own store holds objects slimmed by
/// [`slim_for_cache`]: `Controller::new` with one step more. At hundreds
/// of machines the machine kinds' stores are most of the manager's memory.
pub fn slim_controller<K>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
) -> kube::runtime::Controller<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
{
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (reader, writer) = reflector::store();
    let trigger = watcher(api, config)
        .modify(slim_for_cache)
        .reflect(writer)
        .applied_objects();
    kube::runtime::Controller::for_stream(trigger, reader).trigger_backoff(trigger_backoff())
}

/// One watch feeding a cache store: backs off by [`watch_backoff`], keeps
/// objects slimmed by [`slim_for_cache`], and yields each object it
/// touched (to map to the reconciles it concerns). Returns the store and
/// the watch, which fills the store only while a controller polls it.
pub fn cache_watch<K>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
) -> (
    kube::runtime::reflector::Store<K>,
    impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .backoff(watch_backoff())
        .modify(slim_for_cache)
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// A watcher configuration with tenantry's watch timeout.
pub fn watch_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}
