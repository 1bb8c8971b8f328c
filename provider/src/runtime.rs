//! What every reconciler shares: the context (client, events, settings), the
//! error policy with per-object exponential backoff, and status writing.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenantry_api::contract::DELETE_FOR_MOVE_ANNOTATION;

/// The field manager of every write tenantry makes.
pub const FIELD_MANAGER: &str = "tenantry";

/// How long a watch may stay open before kube-apiserver ends it and the
/// watcher opens the next one from where it was (no relist); kube's watcher
/// also gives up on a watch silent for this long plus 5 s. Shorter than
/// kube's 290 s because a watch opened while kube-apiserver restarts can be
/// accepted and then never deliver an event (the chaos suite's
/// apiserver-restart scenario saw a watch silent until kube's idle timeout,
/// over four minutes, while its objects changed); a short timeout bounds
/// that silence, at the cost of one watch request per minute per watch.
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
/// (no stream yet) ends it: the chaos suite saw three watches of one
/// controller wait so for minutes. The request fails instead, and is
/// retried with backoff.
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
/// minute with jitter, reset after 120 s), which left watches asleep for a
/// minute after kube-apiserver was back.
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
/// controller. With kube's default (up to a minute, reset only after 120 s
/// without errors) the watches' errors during a kube-apiserver restart kept
/// a controller from reading any watch for minutes while its objects
/// changed (the chaos suite's apiserver-restart scenario). Each cache watch
/// backs off by itself ([`watch_backoff`]); this one only keeps the
/// controller's own watch from spinning: 100 ms doubling to 1 s.
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
/// [`slim_for_cache`]: [`Controller::new`] with one step more. At hundreds
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
/// touched (to map to the reconciles it concerns).
pub fn cache_watch<K>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
    writer: kube::runtime::reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    use kube::runtime::{WatchStreamExt, watcher};
    watcher(api, config)
        .backoff(watch_backoff())
        .modify(slim_for_cache)
        .reflect(writer)
        .touched_objects()
}

/// A watcher configuration with tenantry's watch timeout.
pub fn watch_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}

/// Settings that apply to all controllers of one manager.
#[derive(Clone, Debug, Default)]
pub struct ManagerConfig {
    /// Watch only this namespace (CAPI's `--namespace`); all when unset.
    pub namespace: Option<String>,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`
    /// (CAPI's `--watch-filter`), for sharding tenants across managers.
    pub watch_filter: Option<String>,
    /// Identity reported on Kubernetes Events (the pod name in a cluster).
    pub instance: Option<String>,
    /// Serve the admission webhooks, when set.
    pub webhook: Option<crate::webhook::WebhookConfig>,
    /// The key of Kamaji's `<cluster>-admin-kubeconfig` Secret tenantry
    /// reaches tenant clusters with; `super-admin.svc` (the control plane's
    /// Service, resolvable inside the management cluster) when unset. A
    /// manager running outside the cluster uses `super-admin.conf`.
    pub tenant_kubeconfig_key: Option<String>,
    /// How many objects one controller reconciles at once;
    /// [`DEFAULT_MAX_CONCURRENT_RECONCILES`] when unset, unbounded at 0.
    pub max_concurrent_reconciles: Option<u16>,
    /// What `/readyz` reports; the controllers add their caches to it.
    pub readiness: crate::health::Readiness,
    /// The Talos image factory a `Kubernetes` object's workers boot from
    /// when its `talos.imageFactoryURL` is unset (the mutating webhook
    /// writes it into new objects); the public factory when unset. A
    /// platform with its own factory or mirror sets it once here instead of
    /// in every object.
    pub talos_image_factory_url: Option<String>,
}

/// Reconciles one controller runs at once unless configured. Unbounded, a
/// wave of hundreds of machines is reconciled all at once: each reconcile
/// holds its objects and buffers while it waits on the apiserver, so the
/// peak memory grew with the wave, for no gain in time (see
/// docs/performance.md).
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 16;

impl ManagerConfig {
    /// The image factory of objects that name none (see
    /// [`Self::talos_image_factory_url`]).
    pub fn default_image_factory_url(&self) -> &str {
        self.talos_image_factory_url
            .as_deref()
            .unwrap_or(tenantry_api::kubevirt::DEFAULT_IMAGE_FACTORY_URL)
    }

    /// The label selector implementing `--watch-filter`, if any.
    pub fn label_selector(&self) -> Option<String> {
        self.watch_filter
            .as_ref()
            .map(|value| format!("cluster.x-k8s.io/watch-filter={value}"))
    }

    /// The settings every controller of this manager runs with.
    pub fn controller_config(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default().concurrency(self.reconcile_bound())
    }

    /// How many objects one controller reconciles at once; 0: no bound.
    pub fn reconcile_bound(&self) -> u16 {
        self.max_concurrent_reconciles
            .unwrap_or(DEFAULT_MAX_CONCURRENT_RECONCILES)
    }

    /// The settings of a controller that bounds its reconciles with
    /// [`Turns`] instead: its runner starts every due reconcile at once,
    /// and each waits for its turn before it does anything.
    pub fn controller_config_taking_turns(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default()
    }

    /// The turns of one controller, as many at once as its bound allows.
    pub fn turns(&self) -> Turns {
        Turns::new(self.reconcile_bound())
    }

    /// A watcher configuration honouring the watch filter.
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        let config = watch_config().any_semantic();
        match self.label_selector() {
            Some(selector) => config.labels(&selector),
            None => config,
        }
    }

    /// An Api for a namespaced kind, scoped to the watched namespace.
    pub fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + DeserializeOwned
            + Clone
            + Debug,
    {
        match &self.namespace {
            Some(namespace) => Api::namespaced(client.clone(), namespace),
            None => Api::all(client.clone()),
        }
    }
}

/// Turns for a controller's reconciles, given first come, first served.
///
/// kube's runner bounds concurrency itself, but while every slot is busy it
/// parks the objects that fall due in a hash set and takes them out in hash
/// order: under a steady load (a wave of machines on a slow hypervisor)
/// some objects wait again and again while others get turn after turn — a
/// machine went 25 s without its first reconcile while others had ten. A
/// controller whose runner is unbounded and whose reconciles take a turn
/// here first keeps the bound and serves objects in the order they fell
/// due (tokio's semaphore is fair).
pub struct Turns {
    /// `None`: no bound.
    semaphore: Option<tokio::sync::Semaphore>,
}

impl Turns {
    /// `limit` reconciles at once; 0 for no bound.
    pub fn new(limit: u16) -> Self {
        Self {
            semaphore: (limit > 0).then(|| tokio::sync::Semaphore::new(usize::from(limit))),
        }
    }

    /// Waits for a turn; it lasts as long as the returned guard.
    pub async fn take(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match &self.semaphore {
            // Never closed, so acquiring cannot fail.
            Some(semaphore) => semaphore.acquire().await.ok(),
            None => None,
        }
    }
}

/// Shared by all reconciles of one controller.
pub struct Context {
    pub client: kube::Client,
    pub config: ManagerConfig,
    name: String,
    recorder: Recorder,
    backoff: Backoff,
}

impl Context {
    pub fn new(client: kube::Client, config: ManagerConfig, controller: &str) -> Arc<Self> {
        let reporter = Reporter {
            controller: format!("tenantry-{controller}"),
            instance: config.instance.clone(),
        };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            name: controller.to_string(),
            backoff: Backoff::default(),
        })
    }

    /// Holds `/readyz` until the controller's own watch has listed once.
    pub fn track_cache<K>(&self, store: kube::runtime::reflector::Store<K>)
    where
        K: Resource + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        self.config.readiness.track_cache(&self.name, store);
    }

    /// Publishes a Kubernetes Event about an object. Failing to publish is
    /// logged, never fatal: events are for humans, status is the record.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference: ObjectReference = object.object_ref(&());
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note, 1000)),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, reason, "could not publish event");
        }
    }

    /// The per-object backoff the error policy uses.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Per-object exponential backoff after errors: 1 s doubling to 5 min,
/// reset by the next successful reconcile. The delay grows with the retries
/// that failed, not with every failure: a reconcile woken by a watch event
/// before the scheduled retry, and failing the same way, keeps the retry
/// where it was. Otherwise a busy object (its VM, VMI and DataVolume
/// changing) reaches the 5 min cap within seconds of a short outage, such as
/// RBAC deleted and restored, and sits out the rest after it is over.
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
    let result = kube::runtime::finalizer(&api, finalizer_name, object, reconcile)
        .instrument(span)
        .await
        .map_err(E::from);
    if result.is_ok() {
        base.backoff().succeeded(&key);
    }
    result
}

/// The error policy every controller uses: deliberate waits requeue after
/// their delay; real errors back off exponentially per object, up to the
/// error's own cap if it has one.
pub fn error_policy<K, E>(object: Arc<K>, error: &E, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()>,
    E: ReconcileError,
{
    if let Some(delay) = error.wait() {
        return Action::requeue(delay);
    }
    let key = object_key(object.as_ref());
    let delay = ctx.backoff().failed(&key);
    let delay = error.backoff_cap().map_or(delay, |cap| delay.min(cap));
    tracing::warn!(object = %key, error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Writes an object's status with server-side apply under tenantry's field
/// manager; skips the write when nothing changed: when the object already
/// shows `desired`, or when tenantry wrote exactly `desired` to this object
/// (same UID) within [`RECENT_STATUS`] — a reconcile woken by another watch
/// may still hold the object from before its own last write, and writing the
/// same status again only costs a request and wakes everyone up. Returns
/// the object as written, or `None` when nothing was written.
pub async fn apply_status<K, S>(
    api: &Api<K>,
    object: &K,
    current: Option<&S>,
    desired: &S,
) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
    S: Serialize + PartialEq,
{
    if current == Some(desired) {
        return Ok(None);
    }
    let uid = object.meta().uid.clone().unwrap_or_default();
    let fingerprint = status_fingerprint(desired);
    if !uid.is_empty() && written_recently().matches(&uid, fingerprint) {
        return Ok(None);
    }
    write_status(api, object, desired, None).await.map(Some)
}

/// Writes an object's status with server-side apply, on the condition that
/// the object is still at the resourceVersion `object` shows (else the
/// apiserver answers 409 Conflict and nothing is written). For a status
/// that decides something irreversible next — a VM ID reserved before the
/// clone is asked for — so that a stale copy of the object can never lead
/// to it twice.
pub async fn apply_status_at_version<K, S>(api: &Api<K>, object: &K, desired: &S) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
    S: Serialize,
{
    let version = object.meta().resource_version.clone();
    write_status(api, object, desired, Some(version)).await
}

/// Applies `desired` as the object's status under tenantry's field manager
/// (with `resourceVersion` as a precondition when given) and remembers the
/// write for [`apply_status`].
async fn write_status<K, S>(
    api: &Api<K>,
    object: &K,
    desired: &S,
    precondition: Option<Option<String>>,
) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
    S: Serialize,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let mut patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": desired,
    });
    if let Some(version) = precondition {
        patch["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    let updated = api
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    if let Some(uid) = object.meta().uid.clone().filter(|u| !u.is_empty()) {
        written_recently().record(uid, status_fingerprint(desired));
    }
    Ok(updated)
}

/// How long a status write is remembered (see [`apply_status`]): longer than
/// a watch takes to deliver the write back, short enough that a status
/// changed behind tenantry's back is put right on the next resync.
pub const RECENT_STATUS: Duration = Duration::from_secs(30);

/// A hash of a status's JSON form: equal statuses, equal fingerprints.
pub fn status_fingerprint<S: Serialize>(status: &S) -> u64 {
    use std::hash::Hasher as _;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(&serde_json::to_vec(status).unwrap_or_default());
    hasher.finish()
}

/// The status tenantry last wrote per object UID, and when.
#[derive(Default)]
struct RecentStatusWrites {
    writes: Mutex<HashMap<String, (u64, Instant)>>,
}

impl RecentStatusWrites {
    fn matches(&self, uid: &str, fingerprint: u64) -> bool {
        let writes = self.writes.lock().expect("recent status writes");
        writes
            .get(uid)
            .is_some_and(|(last, at)| *last == fingerprint && at.elapsed() < RECENT_STATUS)
    }

    fn record(&self, uid: String, fingerprint: u64) {
        let mut writes = self.writes.lock().expect("recent status writes");
        // Forget what is too old to matter, so deleted objects do not pile up.
        if writes.len() > 1024 {
            writes.retain(|_, (_, at)| at.elapsed() < RECENT_STATUS);
        }
        writes.insert(uid, (fingerprint, Instant::now()));
    }
}

fn written_recently() -> &'static RecentStatusWrites {
    static WRITES: std::sync::OnceLock<RecentStatusWrites> = std::sync::OnceLock::new();
    WRITES.get_or_init(RecentStatusWrites::default)
}

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

    #[test]
    fn a_status_written_recently_is_not_written_again() {
        let writes = RecentStatusWrites::default();
        let first = status_fingerprint(&serde_json::json!({ "ready": true }));
        let second = status_fingerprint(&serde_json::json!({ "ready": false }));
        assert!(!writes.matches("uid-1", first));
        writes.record("uid-1".into(), first);
        assert!(writes.matches("uid-1", first));
        assert!(
            !writes.matches("uid-1", second),
            "a different status is written"
        );
        assert!(!writes.matches("uid-2", first), "another object is written");
    }

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

    #[test]
    fn watch_filter_becomes_a_label_selector() {
        let config = ManagerConfig {
            watch_filter: Some("shard-1".into()),
            ..Default::default()
        };
        assert_eq!(
            config.label_selector().as_deref(),
            Some("cluster.x-k8s.io/watch-filter=shard-1")
        );
        assert_eq!(ManagerConfig::default().label_selector(), None);
    }

    #[test]
    fn the_default_image_factory_is_the_public_one_unless_configured() {
        assert_eq!(
            ManagerConfig::default().default_image_factory_url(),
            "https://factory.talos.dev"
        );
        let config = ManagerConfig {
            talos_image_factory_url: Some("http://factory.internal:8080".into()),
            ..Default::default()
        };
        assert_eq!(
            config.default_image_factory_url(),
            "http://factory.internal:8080"
        );
    }
}
