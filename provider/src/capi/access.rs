//! Reads, watches and deletes of Cluster API core objects in the version
//! the management cluster serves ([`CapiGeneration`]). Tenantry works with
//! the v1beta2 types; objects served as v1beta1 are converted on the way in
//! ([`super::convert`]).

use std::fmt::Debug;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::convert;
use super::generation::{CapiGeneration, CapiKind};
use super::{Cluster, Machine};
use crate::reconciler::ManagerConfig;
use tenantry_api::generated::capi::machine_deployment::MachineDeployment;

/// A Cluster API core kind tenantry reads as its v1beta2 type.
pub trait CapiObject:
    kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + DeserializeOwned
    + Clone
    + Debug
    + Send
    + Sync
    + 'static
{
    const KIND: CapiKind;
    /// The object served as v1beta1, in the v1beta2 shape.
    fn from_v1beta1(object: Value) -> Value;
}

impl CapiObject for Machine {
    const KIND: CapiKind = CapiKind::Machine;
    fn from_v1beta1(object: Value) -> Value {
        convert::machine(object)
    }
}

impl CapiObject for Cluster {
    const KIND: CapiKind = CapiKind::Cluster;
    fn from_v1beta1(object: Value) -> Value {
        convert::cluster(object)
    }
}

impl CapiObject for MachineDeployment {
    const KIND: CapiKind = CapiKind::MachineDeployment;
    fn from_v1beta1(object: Value) -> Value {
        convert::machine_deployment(object)
    }
}

/// A watch of a Cluster API kind, as [`crate::reconciler::cache_watch`]
/// yields it.
pub type CapiWatch<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The objects of `kind` in `namespace` (every namespace when `None`), in
/// the served version, untyped.
pub fn dynamic_api(
    client: &kube::Client,
    generation: CapiGeneration,
    kind: CapiKind,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let resource = generation.resource(kind);
    match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// The object as its v1beta2 type.
pub fn decode<K: CapiObject>(
    generation: CapiGeneration,
    object: DynamicObject,
) -> Result<K, serde_json::Error> {
    let value = serde_json::to_value(object)?;
    let value = match generation {
        CapiGeneration::V1beta1 => K::from_v1beta1(value),
        CapiGeneration::V1beta2 => value,
    };
    serde_json::from_value(value)
}

/// Reads `namespace/name`, if it exists.
pub async fn get<K: CapiObject>(
    client: &kube::Client,
    generation: CapiGeneration,
    namespace: &str,
    name: &str,
) -> kube::Result<Option<K>> {
    if generation == CapiGeneration::V1beta2 {
        return Api::<K>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await;
    }
    dynamic_api(client, generation, K::KIND, Some(namespace))
        .get_opt(name)
        .await?
        .map(|object| decode(generation, object).map_err(kube::Error::SerdeError))
        .transpose()
}

/// Lists the objects in `namespace` that `params` selects.
pub async fn list<K: CapiObject>(
    client: &kube::Client,
    generation: CapiGeneration,
    namespace: &str,
    params: &ListParams,
) -> kube::Result<Vec<K>> {
    if generation == CapiGeneration::V1beta2 {
        return Ok(Api::<K>::namespaced(client.clone(), namespace)
            .list(params)
            .await?
            .items);
    }
    dynamic_api(client, generation, K::KIND, Some(namespace))
        .list(params)
        .await?
        .items
        .into_iter()
        .map(|object| decode(generation, object).map_err(kube::Error::SerdeError))
        .collect()
}

/// The names of the objects of `kind` in `namespace` that `params` selects.
pub async fn names(
    client: &kube::Client,
    generation: CapiGeneration,
    kind: CapiKind,
    namespace: &str,
    params: &ListParams,
) -> kube::Result<Vec<String>> {
    Ok(dynamic_api(client, generation, kind, Some(namespace))
        .list_metadata(params)
        .await?
        .items
        .into_iter()
        .filter_map(|object| object.metadata.name)
        .collect())
}

/// Deletes `namespace/name`.
pub async fn delete(
    client: &kube::Client,
    generation: CapiGeneration,
    kind: CapiKind,
    namespace: &str,
    name: &str,
    params: &DeleteParams,
) -> kube::Result<()> {
    dynamic_api(client, generation, kind, Some(namespace))
        .delete(name, params)
        .await
        .map(|_| ())
}

/// A cache of `K` fed by a watch in the served version, with the watch
/// ([`crate::reconciler::cache_watch`], converting v1beta1 objects).
pub fn cache_watch<K: CapiObject>(
    client: &kube::Client,
    generation: CapiGeneration,
    config: &ManagerConfig,
    watcher_config: watcher::Config,
) -> (Store<K>, CapiWatch<K>) {
    use kube::runtime::{WatchStreamExt, reflector};
    if generation == CapiGeneration::V1beta2 {
        let (store, stream) =
            crate::reconciler::cache_watch(config.api::<K>(client), watcher_config);
        return (store, stream.boxed());
    }
    let api = dynamic_api(client, generation, K::KIND, config.namespace.as_deref());
    let (store, writer) = reflector::store();
    let stream = watcher(api, watcher_config)
        .backoff(crate::reconciler::watch_backoff())
        .map(move |event| event.and_then(|event| decode_event::<K>(generation, event)))
        .modify(crate::reconciler::slim_for_cache)
        .reflect(writer)
        .touched_objects()
        .boxed();
    (store, stream)
}

/// A watch of `K` in the version `ctx`'s manager reads, keeping no cache:
/// what a controller's `watches` would be, converting v1beta1 objects.
pub fn watch<K: CapiObject>(ctx: &crate::reconciler::Context) -> CapiWatch<K> {
    use kube::runtime::WatchStreamExt;
    let (client, config, generation) = (&ctx.client, &ctx.config, ctx.capi);
    if generation == CapiGeneration::V1beta2 {
        return watcher(config.api::<K>(client), config.watcher_config())
            .backoff(crate::reconciler::watch_backoff())
            .touched_objects()
            .boxed();
    }
    let api = dynamic_api(client, generation, K::KIND, config.namespace.as_deref());
    watcher(api, config.watcher_config())
        .backoff(crate::reconciler::watch_backoff())
        .map(move |event| event.and_then(|event| decode_event::<K>(generation, event)))
        .touched_objects()
        .boxed()
}

/// A watch event about an untyped object as one about `K`. An object that
/// does not decode fails the watch, as a typed watch's would.
fn decode_event<K: CapiObject>(
    generation: CapiGeneration,
    event: watcher::Event<DynamicObject>,
) -> Result<watcher::Event<K>, watcher::Error> {
    let decode = |object| {
        decode::<K>(generation, object)
            .map_err(|error| watcher::Error::WatchFailed(kube::Error::SerdeError(error)))
    };
    Ok(match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(decode(object)?),
        watcher::Event::Delete(object) => watcher::Event::Delete(decode(object)?),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(decode(object)?),
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}
