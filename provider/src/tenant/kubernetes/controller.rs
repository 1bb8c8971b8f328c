//! Wiring of the `Kubernetes` controller: the object itself, and what it
//! waits on (its KamajiControlPlane, the namespace's EtcdCluster) so that
//! status follows them. The admin kubeconfig Secret is not watched (that
//! would cache every Secret of the management cluster): a cluster that is
//! not Ready yet is looked at again every few seconds anyway.

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use tenantry_api::tenant::{KUBERNETES_FINALIZER, Kubernetes};

use super::act;
use super::reconcile::{self, Error};
use super::render;
use crate::reconciler::{self, Context};
use crate::tenant::served::{KamajiApi, kamaji_control_plane_resource};

/// Runs the controller until shutdown.
pub async fn run(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let objects: Api<Kubernetes> = config.api(&client);
    let controller = Controller::new(objects, config.watcher_config())
        .trigger_backoff(crate::reconciler::trigger_backoff())
        .with_config(config.controller_config());
    let store = controller.store();
    base.track_cache(store.clone());
    crate::metrics::global().stores.kubernetes(store.clone());
    let namespaced_store = store.clone();
    // Every Kubernetes object of a namespace: the namespace's etcd serves
    // them all.
    let in_namespace = move |namespace: Option<String>| {
        namespaced_store
            .state()
            .into_iter()
            .filter(|k| k.metadata.namespace == namespace)
            .map(|k| ObjectRef::from_obj(k.as_ref()))
            .collect::<Vec<_>>()
    };
    // The object a `kubernetes-<name>` belongs to, by label.
    let by_label = |meta: &kube::api::ObjectMeta| {
        let name = meta.labels.as_ref()?.get(render::KUBERNETES_LABEL)?;
        Some(
            ObjectRef::<Kubernetes>::new(name)
                .within(meta.namespace.as_deref().unwrap_or_default()),
        )
    };
    let mut controller = controller;
    // kube's watches_with retries a failing watch at once, without backoff:
    // a kind whose CRD is missing (Kamaji or etcd-operator not installed
    // yet) would be listed in a tight loop. Such kinds are not watched;
    // reconciles then poll them (every few seconds until Ready).
    if let Ok(Some(kamaji)) = KamajiApi::discover(&client).await {
        let resource = kamaji_control_plane_resource(kamaji);
        let kcps: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        controller = controller.watches_with(
            kcps,
            resource,
            crate::reconciler::watch_config().labels(render::KUBERNETES_LABEL),
            move |kcp| by_label(&kcp.metadata),
        );
    } else {
        tracing::info!(
            "KamajiControlPlane CRD not installed: the Kubernetes controller polls instead of watching"
        );
    }
    if crd_installed(&client, "etcdclusters.etcd-operator.cozystack.io").await {
        let etcds: Api<DynamicObject> =
            Api::all_with(client.clone(), &act::etcd_cluster_resource());
        controller = controller.watches_with(
            etcds,
            act::etcd_cluster_resource(),
            crate::reconciler::watch_config(),
            move |etcd| in_namespace(etcd.metadata.namespace.clone()),
        );
    } else {
        tracing::info!(
            "EtcdCluster CRD not installed: the Kubernetes controller polls instead of watching"
        );
    }
    reconciler::run(controller, reconcile_kubernetes, base).await;
}

async fn reconcile_kubernetes(object: Arc<Kubernetes>, ctx: Arc<Context>) -> Result<Action, Error> {
    reconciler::reconcile_with_finalizer(&ctx, object, KUBERNETES_FINALIZER, |event| async {
        match event {
            Finalizer::Apply(object) => reconcile::apply(object, &ctx).await,
            Finalizer::Cleanup(object) => reconcile::cleanup(object, &ctx).await,
        }
    })
    .await
}

async fn crd_installed(client: &kube::Client, name: &str) -> bool {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .is_some()
}
