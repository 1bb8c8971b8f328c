//! Status written with server-side apply, and only when it changed.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The field manager of every write tenantry makes.
pub const FIELD_MANAGER: &str = "tenantry";

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

#[cfg(test)]
mod tests {
    use super::*;
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
}
