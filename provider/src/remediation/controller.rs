//! Wiring of the two remediation controllers (KubevirtRemediation,
//! ProxmoxRemediation): what they watch and how errors are retried. One
//! reconcile (`reconcile.rs`) serves both kinds.

use std::fmt::Debug;
use std::sync::Arc;

use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenantry_api::remediation::{
    KubevirtRemediation, ProxmoxRemediation, RemediationStatus, RemediationStrategy,
};

use super::reconcile::{self, Error};
use crate::capi::{Cluster, Machine};
use crate::kubevirt::infra::InfraClients;
use crate::proxmox::credentials::ClientCache;
use crate::reconciler::{self, Context};

/// Where the VMs of a remediation kind run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Substrate {
    Kubevirt,
    Proxmox,
}

impl Substrate {
    /// The infrastructure machine kind whose VM this substrate restarts.
    pub fn machine_kind(self) -> &'static str {
        match self {
            Substrate::Kubevirt => "KubevirtMachine",
            Substrate::Proxmox => "ProxmoxMachine",
        }
    }
}

/// What the reconcile needs of a remediation kind.
pub trait RemediationObject:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Debug
    + DeserializeOwned
    + Serialize
    + Send
    + Sync
    + 'static
{
    const SUBSTRATE: Substrate;
    fn strategy(&self) -> &RemediationStrategy;
    fn remediation_status(&self) -> Option<&RemediationStatus>;
}

impl RemediationObject for KubevirtRemediation {
    const SUBSTRATE: Substrate = Substrate::Kubevirt;
    fn strategy(&self) -> &RemediationStrategy {
        &self.spec.strategy
    }
    fn remediation_status(&self) -> Option<&RemediationStatus> {
        self.status.as_ref()
    }
}

impl RemediationObject for ProxmoxRemediation {
    const SUBSTRATE: Substrate = Substrate::Proxmox;
    fn strategy(&self) -> &RemediationStrategy {
        &self.spec.strategy
    }
    fn remediation_status(&self) -> Option<&RemediationStatus> {
        self.status.as_ref()
    }
}

/// What remediation reconciles share.
pub struct RemediationContext {
    pub base: Arc<Context>,
    /// Clients of external KubeVirt infrastructure clusters.
    pub infra: InfraClients,
    /// PVE clients by credentials Secret.
    pub pve: ClientCache,
}

impl AsRef<Context> for RemediationContext {
    fn as_ref(&self) -> &Context {
        &self.base
    }
}

/// Runs the KubevirtRemediation controller until shutdown.
pub async fn run_kubevirt(base: Arc<Context>) {
    run::<KubevirtRemediation>(base).await
}

/// Runs the ProxmoxRemediation controller until shutdown.
pub async fn run_proxmox(base: Arc<Context>) {
    run::<ProxmoxRemediation>(base).await
}

async fn run<K: RemediationObject>(base: Arc<Context>) {
    let client = base.client.clone();
    let config = base.config.clone();
    let remediations: Api<K> = config.api(&client);
    let ctx = Arc::new(RemediationContext {
        base,
        infra: InfraClients::default(),
        pve: ClientCache::default(),
    });
    let controller = Controller::new(remediations, config.watcher_config())
        .trigger_backoff(crate::reconciler::trigger_backoff())
        .with_config(config.controller_config());
    let store = controller.store();
    ctx.base.track_cache(store.clone());
    let controller = controller
        // A remediation is named after its Machine: the Machine's health
        // and deletion wake it up.
        .watches_stream(
            crate::capi::access::watch::<Machine>(&ctx.base),
            |machine| {
                (machine.spec.infrastructure_ref.kind == K::SUBSTRATE.machine_kind()).then(|| {
                    ObjectRef::new(machine.metadata.name.as_deref().unwrap_or_default())
                        .within(machine.metadata.namespace.as_deref().unwrap_or_default())
                })
            },
        )
        // Unpausing a Cluster concerns all of its remediations.
        .watches_stream(
            crate::capi::access::watch::<Cluster>(&ctx.base),
            move |cluster| {
                let name = cluster.metadata.name.clone().unwrap_or_default();
                let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
                store
                    .state()
                    .into_iter()
                    .filter(|r| {
                        r.meta().namespace.as_deref() == Some(namespace.as_str())
                            && crate::capi::owner::cluster_name(r.meta()) == Some(name.as_str())
                    })
                    .map(|r| ObjectRef::from_obj(r.as_ref()))
                    .collect::<Vec<_>>()
            },
        );
    reconciler::run(controller, reconcile_remediation::<K>, ctx).await;
}

async fn reconcile_remediation<K: RemediationObject>(
    remediation: Arc<K>,
    ctx: Arc<RemediationContext>,
) -> Result<Action, Error> {
    use tracing::Instrument;
    let key = reconciler::object_key(remediation.as_ref());
    let span = tracing::info_span!(
        "reconcile",
        kind = %K::kind(&()),
        namespace = remediation.meta().namespace.as_deref().unwrap_or_default(),
        name = remediation.meta().name.as_deref().unwrap_or_default()
    );
    let result = reconcile::reconcile::<K>(remediation, &ctx)
        .instrument(span)
        .await;
    if result.is_ok() {
        ctx.base.backoff().succeeded(&key);
    }
    result
}
