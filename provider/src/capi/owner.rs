//! Finding the Machine that owns an infrastructure machine and the Cluster it
//! belongs to.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::reflector::{ObjectRef, Store};
use tenantry_api::contract::CLUSTER_NAME_LABEL;

use super::{CapiGeneration, Cluster, Machine, access};

/// The API group of Cluster API core kinds.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// The owner reference to a CAPI Machine, whatever API version CAPI wrote.
pub fn machine_owner(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|owner| {
        owner.kind == "Machine" && owner.api_version.split('/').next() == Some(CAPI_GROUP)
    })
}

/// The name of the Cluster an object belongs to: CAPI's cluster-name label.
pub fn cluster_name(meta: &ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()?
        .get(CLUSTER_NAME_LABEL)
        .map(String::as_str)
}

/// The infrastructure machine of kind `K` a Machine points at, if it
/// points at one of that kind.
pub fn infrastructure_machine<K>(machine: &Machine) -> Option<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let reference = &machine.spec.infrastructure_ref;
    (reference.kind == K::kind(&())).then(|| {
        ObjectRef::new(&reference.name)
            .within(machine.metadata.namespace.as_deref().unwrap_or_default())
    })
}

/// The objects in `store` that belong to Cluster `namespace/cluster` (by
/// CAPI's cluster-name label): what a change of the Cluster concerns.
pub fn members_of<K>(store: &Store<K>, namespace: &str, cluster: &str) -> Vec<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .into_iter()
        .filter(|object| {
            object.meta().namespace.as_deref() == Some(namespace)
                && cluster_name(object.meta()) == Some(cluster)
        })
        .map(|object| ObjectRef::from_obj(object.as_ref()))
        .collect()
}

/// The cluster's members in `store` a change of `cluster` concerns
/// ([`members_of`]).
pub fn members_of_cluster<K>(store: &Store<K>, cluster: &Cluster) -> Vec<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    members_of(
        store,
        cluster.metadata.namespace.as_deref().unwrap_or_default(),
        cluster.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The name of the Cluster an infrastructure cluster belongs to: its
/// owner Cluster (set by CAPI), else CAPI's cluster-name label.
pub fn owning_cluster_name(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner| {
            owner.kind == "Cluster" && owner.api_version.split('/').next() == Some(CAPI_GROUP)
        })
        .map(|owner| owner.name.clone())
        .or_else(|| cluster_name(meta).map(str::to_string))
}

/// Reads the owner Machine, if the object has one and it still exists.
pub async fn get_owner_machine(
    client: &kube::Client,
    generation: CapiGeneration,
    meta: &ObjectMeta,
) -> kube::Result<Option<Machine>> {
    let (Some(owner), Some(namespace)) = (machine_owner(meta), meta.namespace.as_deref()) else {
        return Ok(None);
    };
    access::get(client, generation, namespace, &owner.name).await
}

/// Reads the Cluster by name, if it exists.
pub async fn get_cluster(
    client: &kube::Client,
    generation: CapiGeneration,
    namespace: &str,
    name: &str,
) -> kube::Result<Option<Cluster>> {
    access::get(client, generation, namespace, name).await
}

/// Whether the Cluster's infrastructure is provisioned (v1beta2 field).
pub fn infrastructure_provisioned(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned)
        .unwrap_or(false)
}

/// Whether the Cluster's control plane is initialized (v1beta2 field).
pub fn control_plane_initialized(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.control_plane_initialized)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            ..Default::default()
        }
    }

    #[test]
    fn machine_owner_accepts_any_capi_version_and_ignores_other_kinds() {
        let meta = ObjectMeta {
            owner_references: Some(vec![
                owner(
                    "infrastructure.cluster.x-k8s.io/v1alpha1",
                    "Machine",
                    "not-capi",
                ),
                owner("cluster.x-k8s.io/v1beta1", "MachineSet", "set"),
                owner("cluster.x-k8s.io/v1beta2", "Machine", "m-1"),
            ]),
            ..Default::default()
        };
        assert_eq!(machine_owner(&meta).map(|o| o.name.as_str()), Some("m-1"));
        assert!(machine_owner(&ObjectMeta::default()).is_none());
    }
}
