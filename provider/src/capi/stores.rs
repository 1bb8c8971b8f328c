//! Reads of CAPI objects from the stores of a controller's own watches, with
//! a GET when the store does not have the object (not listed yet, created a
//! moment ago, or outside the watch's label filter). Both machine
//! controllers read their owner Machine and Cluster this way: those reads
//! were most of the apiserver requests per machine (`docs/performance.md`).

use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use super::access::{self, CapiWatch};
use super::owner;
use super::pause::{PausedBy, paused_by};
use super::{CapiGeneration, Cluster, Machine};

/// Whether a store has listed once (it answers for "absent" only then).
pub fn is_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

/// A copy of the object `namespace/name` the store holds, if any.
pub fn lookup<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .get(&ObjectRef::new(name).within(namespace))
        .map(|object| (*object).clone())
}

/// The Machines and Clusters a controller watches.
#[derive(Clone)]
pub struct CapiStores {
    pub machines: Store<Machine>,
    pub clusters: Store<Cluster>,
    /// The version the watches read, and reads on a cache miss use.
    pub generation: CapiGeneration,
}

impl CapiStores {
    /// The stores of a machine controller's Machine and Cluster watches,
    /// with the watches (the controller maps their objects to machines).
    pub fn watch(
        client: &kube::Client,
        config: &crate::reconciler::ManagerConfig,
        generation: CapiGeneration,
    ) -> (CapiStores, CapiWatch<Machine>, CapiWatch<Cluster>) {
        let (machines, machine_watch) =
            access::cache_watch(client, generation, config, config.watcher_config());
        let (clusters, cluster_watch) =
            access::cache_watch(client, generation, config, config.watcher_config());
        (
            CapiStores {
                machines,
                clusters,
                generation,
            },
            machine_watch,
            cluster_watch,
        )
    }

    /// The Machine owning `meta`'s object, if any.
    pub async fn owner_machine(
        &self,
        client: &kube::Client,
        meta: &ObjectMeta,
    ) -> kube::Result<Option<Machine>> {
        let (Some(owner), Some(namespace)) =
            (owner::machine_owner(meta), meta.namespace.as_deref())
        else {
            return Ok(None);
        };
        if let Some(machine) = lookup(&self.machines, namespace, &owner.name) {
            return Ok(Some(machine));
        }
        owner::get_owner_machine(client, self.generation, meta).await
    }

    /// The Cluster `name` in `namespace`, if it exists.
    pub async fn cluster(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<Cluster>> {
        if let Some(cluster) = lookup(&self.clusters, namespace, name) {
            return Ok(Some(cluster));
        }
        owner::get_cluster(client, self.generation, namespace, name).await
    }
}

/// The owners an infrastructure machine needs before it may act.
#[derive(Clone, Debug)]
pub struct Owners {
    pub cluster_name: String,
    pub cluster: Cluster,
    pub owner_machine: Machine,
}

/// Why an infrastructure machine may not act yet, in the order the contract
/// checks: pause first (so a paused cluster's new machines say so before
/// Cluster API adopts them), then the owner Machine, its Cluster, and the
/// Cluster's infrastructure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotYet {
    Paused(PausedBy),
    NoOwnerMachine,
    NoCluster { name: String },
    InfrastructureNotProvisioned { name: String },
}

/// The reasons a substrate's machines report while they wait for their
/// owners (each substrate names them in its own `Reason` enum).
pub trait OwnerWaits: Copy {
    const OWNER_MACHINE: Self;
    const CLUSTER: Self;
    const CLUSTER_INFRASTRUCTURE: Self;
}

impl NotYet {
    /// The reason a machine reports while it waits (pause is not a wait:
    /// it is reported on `Paused`).
    pub fn reason<R: OwnerWaits>(&self) -> R {
        match self {
            NotYet::NoOwnerMachine | NotYet::Paused(_) => R::OWNER_MACHINE,
            NotYet::NoCluster { .. } => R::CLUSTER,
            NotYet::InfrastructureNotProvisioned { .. } => R::CLUSTER_INFRASTRUCTURE,
        }
    }

    /// What a machine of `kind` (e.g. `ProxmoxMachine`) says while it waits.
    pub fn message(&self, kind: &str) -> String {
        match self {
            NotYet::Paused(PausedBy::Cluster) => "Cluster spec.paused is set".into(),
            NotYet::Paused(PausedBy::Annotation) => format!("the {kind} is paused"),
            NotYet::NoOwnerMachine => format!("no Machine owns this {kind} yet"),
            NotYet::NoCluster { name } => format!("Cluster {name} does not exist"),
            NotYet::InfrastructureNotProvisioned { name } => {
                format!("Cluster {name} infrastructure is not provisioned yet")
            }
        }
    }

    /// When to look again without an event: never for what a watch brings
    /// (the owner Machine), after `resync` for the Cluster, which the
    /// machine controllers watch only in part.
    pub fn retry(&self, resync: Duration) -> Option<Duration> {
        match self {
            NotYet::Paused(_) | NotYet::NoOwnerMachine => None,
            NotYet::NoCluster { .. } | NotYet::InfrastructureNotProvisioned { .. } => Some(resync),
        }
    }
}

impl CapiStores {
    /// The Cluster `meta`'s object belongs to by CAPI's cluster-name label:
    /// the name, and the Cluster if it exists.
    pub async fn labelled_cluster(
        &self,
        client: &kube::Client,
        namespace: &str,
        meta: &ObjectMeta,
    ) -> kube::Result<(Option<String>, Option<Cluster>)> {
        let name = owner::cluster_name(meta).map(str::to_string);
        let cluster = match &name {
            Some(name) => self.cluster(client, namespace, name).await?,
            None => None,
        };
        Ok((name, cluster))
    }

    /// The owner Machine and Cluster of the infrastructure machine `meta`,
    /// or what it still waits for. The Cluster named by the machine's label
    /// is read first, so pause holds even without an owner Machine.
    pub async fn owners(
        &self,
        client: &kube::Client,
        namespace: &str,
        meta: &ObjectMeta,
    ) -> kube::Result<Result<Owners, NotYet>> {
        let (labelled_cluster, mut cluster) =
            self.labelled_cluster(client, namespace, meta).await?;
        if let Some(by) = paused_by(cluster.as_ref(), meta) {
            return Ok(Err(NotYet::Paused(by)));
        }
        let Some(owner_machine) = self.owner_machine(client, meta).await? else {
            return Ok(Err(NotYet::NoOwnerMachine));
        };
        let cluster_name =
            labelled_cluster.unwrap_or_else(|| owner_machine.spec.cluster_name.clone());
        if cluster.is_none() {
            cluster = self.cluster(client, namespace, &cluster_name).await?;
            if let Some(by) = paused_by(cluster.as_ref(), meta) {
                return Ok(Err(NotYet::Paused(by)));
            }
        }
        let Some(cluster) = cluster else {
            return Ok(Err(NotYet::NoCluster { name: cluster_name }));
        };
        if !owner::infrastructure_provisioned(&cluster) {
            return Ok(Err(NotYet::InfrastructureNotProvisioned {
                name: cluster_name,
            }));
        }
        Ok(Ok(Owners {
            cluster_name,
            cluster,
            owner_machine,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wait_says_what_is_missing_and_when_to_look_again() {
        let resync = Duration::from_secs(60);
        let cases = [
            (
                NotYet::NoOwnerMachine,
                "no Machine owns this ProxmoxMachine yet",
                None,
            ),
            (
                NotYet::NoCluster {
                    name: "demo".into(),
                },
                "Cluster demo does not exist",
                Some(resync),
            ),
            (
                NotYet::InfrastructureNotProvisioned {
                    name: "demo".into(),
                },
                "Cluster demo infrastructure is not provisioned yet",
                Some(resync),
            ),
            (
                NotYet::Paused(PausedBy::Cluster),
                "Cluster spec.paused is set",
                None,
            ),
        ];
        for (not_yet, message, retry) in cases {
            assert_eq!(not_yet.message("ProxmoxMachine"), message);
            assert_eq!(not_yet.retry(resync), retry, "{not_yet:?}");
        }
    }
}
