//! The machine-template controllers of both substrates: each template's
//! `status.capacity` and `status.nodeInfo` say what its nodes provide, for
//! the cluster autoscaler's scale from zero. Only what a node provides
//! differs by substrate ([`CapacityTemplate::desired_status`]).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use serde::de::DeserializeOwned;
use tenantry_api::contract::MachineTemplateStatus;

use crate::reconciler::{self, Context, ReconcileError};

/// How often a template is looked at again without a change (its status
/// depends on the template alone).
const RESYNC: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl ReconcileError for Error {}

/// A machine template kind whose status reports its nodes' capacity.
pub trait CapacityTemplate:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The status as last written.
    fn status(&self) -> Option<&MachineTemplateStatus>;
    /// What the nodes made from this template provide.
    fn desired_status(&self) -> MachineTemplateStatus;
}

/// Runs the controller of template kind `T` until shutdown.
pub async fn run<T: CapacityTemplate>(ctx: Arc<Context>) {
    let api: Api<T> = ctx.config.api(&ctx.client);
    let controller = Controller::new(api, ctx.config.watcher_config())
        .trigger_backoff(reconciler::trigger_backoff())
        .with_config(ctx.config.controller_config());
    ctx.track_cache(controller.store());
    reconciler::run(controller, reconcile::<T>, ctx).await;
}

async fn reconcile<T: CapacityTemplate>(
    template: Arc<T>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = template.meta().namespace.clone().unwrap_or_default();
    let api: Api<T> = Api::namespaced(ctx.client.clone(), &namespace);
    let desired = template.desired_status();
    reconciler::apply_status(&api, template.as_ref(), template.status(), &desired).await?;
    ctx.backoff()
        .succeeded(&reconciler::object_key(template.as_ref()));
    Ok(Action::requeue(RESYNC))
}
