//! What many e2e tests make and wait for alike: the Cluster API objects of a
//! workload cluster as a user or a MachineSet writes them, the KubeVirt and
//! Proxmox infrastructure objects behind them, and waits on one object.
//!
//! Manifests carry no namespace: [`crate::World::create`] puts them in the
//! one it is given.

use std::fmt::{Debug, Display};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use tenantry_api::contract::MachineInitialization;

use crate::pve_lab::PveLab;
use crate::sim::kubevirt::DEFAULT_SCHEMATIC;
use crate::sim::proxmox::ApiToken;
use crate::wait;

pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const KUBEVIRT_API_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";
pub const PROXMOX_API_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha2";

/// Where a test's workers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Substrate {
    Kubevirt,
    Proxmox,
}

/// The bounds of a namespaced kind a test reads through [`Api`], spelled
/// once (every `Api::namespaced` accessor needs all of them).
pub trait NamespacedKind:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug
{
}

impl<K> NamespacedKind for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
{
}

/// A Cluster API core kind of the v1beta2 contract.
pub fn capi(kind: &str, plural: &str) -> ApiResource {
    crate::bench::capi("v1beta2", kind, plural)
}

/// A CAPI Cluster whose infrastructure is the `infrastructure_kind` object
/// of the same name.
pub fn cluster(name: &str, infrastructure_kind: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": name },
        "spec": {
            "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] }, "services": { "cidrBlocks": ["10.95.0.0/16"] } },
            "infrastructureRef": { "apiGroup": INFRASTRUCTURE_GROUP, "kind": infrastructure_kind, "name": name }
        }
    })
}

/// A worker Machine of `cluster` as a MachineSet makes one: bootstrapped
/// from the Secret `bootstrap_secret`, its infrastructure the
/// `infrastructure_kind` object of the same name.
pub fn machine(
    name: &str,
    cluster: &str,
    infrastructure_kind: &str,
    bootstrap_secret: &str,
) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": { "name": name, "labels": { "cluster.x-k8s.io/cluster-name": cluster } },
        "spec": {
            "clusterName": cluster,
            "bootstrap": { "dataSecretName": bootstrap_secret },
            "infrastructureRef": { "apiGroup": INFRASTRUCTURE_GROUP, "kind": infrastructure_kind, "name": name }
        }
    })
}

/// The infrastructure machine of a worker, labelled with its cluster from
/// its creation on, as a MachineSet does.
pub fn infrastructure_machine(
    api_version: &str,
    kind: &str,
    name: &str,
    cluster: &str,
    spec: Value,
) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": { "name": name, "labels": { "cluster.x-k8s.io/cluster-name": cluster } },
        "spec": spec,
    })
}

/// A worker of `cluster` as a MachineSet makes it, in the order it does:
/// the Secret `<name>-bootstrap` with `bootstrap_data` (its `stringData`),
/// the infrastructure machine `kind` with `spec`, and the Machine.
pub fn worker(
    api_version: &str,
    kind: &str,
    cluster: &str,
    name: &str,
    spec: Value,
    bootstrap_data: Value,
) -> [Value; 3] {
    let bootstrap = format!("{name}-bootstrap");
    [
        bootstrap_secret(&bootstrap, bootstrap_data),
        infrastructure_machine(api_version, kind, name, cluster, spec),
        machine(name, cluster, kind, &bootstrap),
    ]
}

/// Whether an infrastructure machine's `status.initialization` says it is
/// provisioned (the v1beta2 contract).
pub fn provisioned(initialization: &Option<MachineInitialization>) -> bool {
    initialization.as_ref().and_then(|i| i.provisioned) == Some(true)
}

/// A Secret holding bootstrap data, as a bootstrap provider writes it.
pub fn bootstrap_secret(name: &str, string_data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name },
        "stringData": string_data,
    })
}

/// A Talos worker config joining `endpoint`, trimmed to what the
/// simulators read; `token` tells one machine's data from another's.
pub fn talos_worker_config(token: &str, endpoint: &str) -> String {
    format!(
        "version: v1alpha1\ndebug: false\nmachine:\n  type: worker\n  token: {token}\ncluster:\n  controlPlane:\n    endpoint: {endpoint}\n"
    )
}

pub fn kubevirt_cluster(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": "KubevirtCluster",
        "metadata": { "name": name },
        "spec": spec,
    })
}

/// A KubevirtMachine spec booting Talos `talos_version` from a disk the
/// image factory at `factory_url` serves, without a bootstrap check.
pub fn talos_machine_spec(factory_url: &str, talos_version: &str) -> Value {
    json!({
        "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
        "bootDisk": {
            "imageFactoryURL": factory_url.trim_end_matches('/'),
            "schematicID": DEFAULT_SCHEMATIC,
            "talosVersion": talos_version,
            "diskSize": "20Gi",
            "storageClass": "replicated"
        },
        "virtualMachineTemplate": { "spec": {
            "runStrategy": "Always",
            "template": { "spec": {
                "domain": {
                    "cpu": { "cores": 2 },
                    "memory": { "guest": "4Gi" },
                    "devices": { "interfaces": [{ "name": "default", "bridge": {} }] }
                },
                "networks": [{ "name": "default", "pod": {} }]
            }}
        }}
    })
}

/// The Secret a ProxmoxCluster's `credentialsRef` names: the simulator's
/// URL and CA and a tenant's token.
pub fn pve_credentials(name: &str, pve: &PveLab, token: &ApiToken) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name },
        "stringData": {
            "url": pve.sim.url().as_str(),
            "token_id": token.id,
            "token_secret": token.secret,
            "root_ca": pve.sim.ca_pem(),
        }
    })
}

/// A ProxmoxCluster on the lab's nodes whose machines take
/// 10.10.<subnet>.10-60, with the credentials Secret `credentials`.
pub fn proxmox_cluster(name: &str, subnet: u8, credentials: &str) -> Value {
    json!({
        "apiVersion": PROXMOX_API_VERSION,
        "kind": "ProxmoxCluster",
        "metadata": { "name": name },
        "spec": {
            "controlPlaneEndpoint": { "host": "10.10.0.5", "port": 6443 },
            "ipv4Config": { "addresses": [format!("10.10.{subnet}.10-10.10.{subnet}.60")], "prefix": 24, "gateway": format!("10.10.{subnet}.1") },
            "dnsServers": ["10.10.0.53"],
            "allowedNodes": ["pve1", "pve2"],
            "credentialsRef": { "name": credentials },
        }
    })
}

/// The condition `type_` among `conditions`.
pub fn condition<'a>(conditions: &'a Option<Vec<Condition>>, type_: &str) -> Option<&'a Condition> {
    conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

/// Polls the object `name` until `select` picks a value from it; while
/// the object is absent, it is not there yet.
pub async fn wait_for_object<K, T>(
    api: &Api<K>,
    name: &str,
    what: impl Display,
    timeout: Duration,
    select: impl Fn(K) -> Option<T>,
) -> anyhow::Result<T>
where
    K: Clone + DeserializeOwned + Debug,
{
    let select = &select;
    wait::until(what, timeout, || async move {
        Ok(api.get_opt(name).await?.and_then(select))
    })
    .await
}

/// Polls until the object `name` is gone.
pub async fn wait_for_absence<K>(
    api: &Api<K>,
    name: &str,
    what: impl Display,
    timeout: Duration,
) -> anyhow::Result<()>
where
    K: Clone + DeserializeOwned + Debug,
{
    wait::until(what, timeout, || async move {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// The names of every object `api` lists.
pub async fn names<K>(api: &Api<K>) -> kube::Result<Vec<String>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|o| o.name_any())
        .collect())
}

/// The names of the `resource` objects in `namespace`; none if they cannot
/// be listed (a leftover check polls again).
pub async fn dynamic_names(
    client: &kube::Client,
    namespace: &str,
    resource: &ApiResource,
) -> Vec<String> {
    names(&Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        resource,
    ))
    .await
    .unwrap_or_default()
}
