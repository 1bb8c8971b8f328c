//! What all reconciles of one controller share: client, settings, the
//! event recorder and the backoff table.

use std::hash::Hash;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::backoff::Backoff;
use super::config::ManagerConfig;
use crate::capi::CapiGeneration;

/// Shared by all reconciles of one controller.
pub struct Context {
    pub client: kube::Client,
    pub config: ManagerConfig,
    /// The Cluster API generation the management cluster serves.
    pub capi: CapiGeneration,
    /// The KamajiControlPlane version, once its CRD was found (the tenant
    /// controllers write in it; see `tenant::served`).
    pub kamaji: tokio::sync::OnceCell<crate::tenant::served::KamajiApi>,
    name: String,
    recorder: Recorder,
    backoff: Backoff,
}

impl Context {
    pub fn new(
        client: kube::Client,
        config: ManagerConfig,
        capi: CapiGeneration,
        controller: &str,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: format!("tenantry-{controller}"),
            instance: config.instance.clone(),
        };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            capi,
            kamaji: tokio::sync::OnceCell::new(),
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

    /// The controller's name: its Events' reporter and its metrics' label.
    pub fn name(&self) -> &str {
        &self.name
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
