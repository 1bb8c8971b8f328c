//! A tenant's etcd, as the platform sees it: Cozystack's etcd-operator
//! (`EtcdCluster`, `etcd-operator.cozystack.io/v1alpha2`) and Kamaji's
//! `DataStore` controller (`kamaji.clastix.io/v1alpha1`, cluster-scoped).
//!
//! In production the operator runs one EtcdMember Pod per replica, mounting
//! the TLS Secrets `spec.tls` names, and reports the cluster `Available`
//! once a quorum of members is healthy; Kamaji validates a DataStore's TLS
//! (and basic-auth) references and marks it `status.ready`, without which
//! it reconciles no TenantControlPlane on it. No pods run here and each
//! tenant control plane has its own harness etcd (see
//! [`super::KamajiControlPlaneSimulator`]), so this simulator only plays
//! the status both controllers report, from what the objects reference:
//!
//! - **EtcdCluster**: `Available=True` (reason `QuorumHealthy`),
//!   `Progressing=False` (`Reconciled`) and `readyMembers = spec.replicas`
//!   once every Secret it references exists in its namespace: `spec.tls`
//!   `client.serverSecretRef`, `client.operatorClientSecretRef`,
//!   `peer.secretRef`, and with `auth.enabled` the
//!   `auth.rootCredentialsSecretRef`; in cert-manager mode the Secrets
//!   cert-manager would issue (`<cluster>-server-tls`,
//!   `<cluster>-operator-client-tls` with an operator client issuer,
//!   `<cluster>-peer-tls`), since cert-manager does not run here either.
//!   Before that `Available=False` with reason `WaitingForSecrets` (the
//!   simulator's own: a real member Pod would sit in `ContainerCreating`)
//!   and a message naming the missing Secrets, `Progressing=True`
//!   (`WaitingForSeed`), `readyMembers=0`. `spec.replicas: 0` pauses the
//!   cluster: `Available=False` reason `Paused`.
//! - **DataStore**: Kamaji's `kamaji.clastix.io/DataStoreValidation`
//!   condition and `status.ready`: every `secretReference` under
//!   `tlsConfig` (and `basicAuth`) must name a Secret that exists (inline
//!   `content` is fine); otherwise `False` with reason
//!   `TLSConfigurationValidationFailed` (`BasicAuthValidationFailed`) and
//!   Kamaji's message, e.g. `CA certificate is not valid, secret
//!   tenant-a/etcd-ca-tls is not found`. Like Kamaji it adds the finalizer
//!   `kamaji.clastix.io/TenantControlPlane` and lists in `status.usedBy` the
//!   KamajiControlPlanes whose `spec.dataStoreName` names it (their TCPs,
//!   which have the same names); a deleted DataStore keeps its finalizer
//!   (`DataStoreAllowedDeletion=False`, reason `DataStoreStillUsed`) until
//!   none is left.
//!
//! Faults: the annotation [`ETCD_FAULT_ANNOTATION`] on an EtcdCluster, or
//! [`EtcdSimulator::inject_fault`], holds it unavailable (see
//! [`EtcdFault`]) whatever its Secrets.
//!
//! Left out: members (EtcdMember objects, Pods, PVCs, Services, the PDB),
//! scaling one member at a time, version drift, snapshots and defrag,
//! `status.clusterID`/`selector`/`observed`, progress deadlines, etcd users
//! and roles per tenant, DataStore migration, and checking that a
//! referenced Secret holds the key (`keyPath`) or a valid certificate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::manifests;

const FIELD_MANAGER: &str = "sim-etcd-operator";
/// How often the simulator looks at EtcdClusters and DataStores.
const POLL: Duration = Duration::from_millis(500);

/// Holds an EtcdCluster unavailable while set: `quorum-lost` or
/// `cluster-unreachable` (see [`EtcdFault`]).
pub const ETCD_FAULT_ANNOTATION: &str = "sim.tenantry.dev/etcd-fault";

/// The finalizer Kamaji puts on a DataStore.
pub const DATA_STORE_FINALIZER: &str = "kamaji.clastix.io/TenantControlPlane";
const DATA_STORE_VALID: &str = "kamaji.clastix.io/DataStoreValidation";
const DATA_STORE_ALLOWED_DELETION: &str = "kamaji.clastix.io/DataStoreAllowedDeletion";

/// A fault that holds an EtcdCluster `Available=False`, with the reasons
/// the operator reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtcdFault {
    /// Fewer than a quorum of members are healthy (reason `QuorumLost`;
    /// `readyMembers` below the quorum). The operator never repairs this by
    /// itself.
    QuorumLost,
    /// The operator cannot reach the members (reason `ClusterUnreachable`).
    ClusterUnreachable,
}

impl EtcdFault {
    /// The annotation value that injects it.
    pub fn annotation_value(self) -> &'static str {
        match self {
            EtcdFault::QuorumLost => "quorum-lost",
            EtcdFault::ClusterUnreachable => "cluster-unreachable",
        }
    }

    fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "quorum-lost" => Some(EtcdFault::QuorumLost),
            "cluster-unreachable" => Some(EtcdFault::ClusterUnreachable),
            _ => None,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            EtcdFault::QuorumLost => "QuorumLost",
            EtcdFault::ClusterUnreachable => "ClusterUnreachable",
        }
    }
}

fn etcd_cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd-operator.cozystack.io", "v1alpha2", "EtcdCluster"),
        "etcdclusters",
    )
}

fn data_store_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kamaji.clastix.io", "v1alpha1", "DataStore"),
        "datastores",
    )
}

fn kamaji_control_plane_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "controlplane.cluster.x-k8s.io",
            "v1alpha2",
            super::KAMAJI_CONTROL_PLANE_KIND,
        ),
        "kamajicontrolplanes",
    )
}

/// Installs the EtcdCluster and DataStore CRDs (upstream copies in
/// `e2e/fixtures/upstream/`).
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream");
    manifests::install_crds(
        client,
        &[
            fixtures.join("etcd-operator/crds/etcd-operator.cozystack.io_etcdclusters.yaml"),
            fixtures.join("kamaji/crds/kamaji.clastix.io_datastores.yaml"),
        ],
    )
    .await
}

/// A running simulator. Dropping it stops its loop.
pub struct EtcdSimulator {
    faults: Arc<Mutex<BTreeMap<String, EtcdFault>>>,
    task: JoinHandle<()>,
}

impl EtcdSimulator {
    /// Installs the CRDs and starts reporting EtcdCluster and DataStore
    /// status in the management cluster behind `client`.
    pub async fn start(client: kube::Client) -> anyhow::Result<Self> {
        install_crds(&client)
            .await
            .context("install the EtcdCluster and DataStore CRDs")?;
        let faults: Arc<Mutex<BTreeMap<String, EtcdFault>>> = Arc::default();
        let task = tokio::spawn(run(client, faults.clone()));
        Ok(Self { faults, task })
    }

    /// Holds the EtcdCluster `namespace/name` unavailable until cleared.
    pub fn inject_fault(&self, namespace: &str, name: &str, fault: EtcdFault) {
        self.faults
            .lock()
            .expect("etcd faults lock")
            .insert(format!("{namespace}/{name}"), fault);
    }

    /// Clears a fault injected with [`EtcdSimulator::inject_fault`]
    /// (annotations stay).
    pub fn clear_fault(&self, namespace: &str, name: &str) {
        self.faults
            .lock()
            .expect("etcd faults lock")
            .remove(&format!("{namespace}/{name}"));
    }

    /// Stops the loop.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for EtcdSimulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(client: kube::Client, faults: Arc<Mutex<BTreeMap<String, EtcdFault>>>) {
    loop {
        if let Err(error) = reconcile_etcd_clusters(&client, &faults).await {
            tracing::debug!(error = format!("{error:#}"), "EtcdCluster simulator");
        }
        if let Err(error) = reconcile_data_stores(&client).await {
            tracing::debug!(error = format!("{error:#}"), "DataStore simulator");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn reconcile_etcd_clusters(
    client: &kube::Client,
    faults: &Mutex<BTreeMap<String, EtcdFault>>,
) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &etcd_cluster_resource());
    for cluster in api.list(&ListParams::default()).await?.items {
        if cluster.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
        let name = cluster.metadata.name.clone().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let mut missing = Vec::new();
        for secret in referenced_secrets(&name, &cluster.data["spec"]) {
            if secrets.get_opt(&secret).await?.is_none() {
                missing.push(secret);
            }
        }
        let fault = faults
            .lock()
            .expect("etcd faults lock")
            .get(&format!("{namespace}/{name}"))
            .copied()
            .or_else(|| annotation_fault(&cluster));
        let status = desired_etcd_status(&cluster, &missing, fault);
        if !status_matches(&cluster.data["status"], &status) {
            let before = availability(&cluster.data["status"]);
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &etcd_cluster_resource());
            api.patch_status(
                &name,
                &patch_params(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .with_context(|| format!("patch the status of EtcdCluster {namespace}/{name}"))?;
            let after = availability(&status);
            if before != after {
                tracing::info!(%namespace, etcd_cluster = %name, available = ?after, "EtcdCluster availability changed");
            }
        }
    }
    Ok(())
}

fn annotation_fault(object: &DynamicObject) -> Option<EtcdFault> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(ETCD_FAULT_ANNOTATION)
        .and_then(|value| EtcdFault::parse(value))
}

/// `(status, reason)` of the `Available` condition.
fn availability(status: &Value) -> Option<(String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// The Secrets an EtcdCluster's members mount, in its namespace.
pub fn referenced_secrets(cluster: &str, spec: &Value) -> Vec<String> {
    let mut names = BTreeSet::new();
    let mut add = |name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            names.insert(name.to_string());
        }
    };
    let client = &spec["tls"]["client"];
    add(client["serverSecretRef"]["name"].as_str());
    add(client["operatorClientSecretRef"]["name"].as_str());
    if client["certManager"].is_object() {
        add(Some(&format!("{cluster}-server-tls")));
        if client["certManager"]["operatorClientIssuerRef"].is_object() {
            add(Some(&format!("{cluster}-operator-client-tls")));
        }
    }
    let peer = &spec["tls"]["peer"];
    add(peer["secretRef"]["name"].as_str());
    if peer["certManager"].is_object() {
        add(Some(&format!("{cluster}-peer-tls")));
    }
    if spec["auth"]["enabled"] == true {
        add(spec["auth"]["rootCredentialsSecretRef"]["name"].as_str());
    }
    names.into_iter().collect()
}

/// An EtcdCluster's status, from the Secrets missing and the fault in force.
fn desired_etcd_status(
    cluster: &DynamicObject,
    missing: &[String],
    fault: Option<EtcdFault>,
) -> Value {
    let replicas = cluster.data["spec"]["replicas"].as_i64().unwrap_or(3);
    let generation = cluster.metadata.generation.unwrap_or_default();
    let current = &cluster.data["status"]["conditions"];
    let condition = |type_: &str, status: bool, reason: &str, message: &str| -> Value {
        condition(current, type_, status, reason, message, generation)
    };
    let (ready_members, available, progressing) = if replicas == 0 {
        (
            0,
            condition("Available", false, "Paused", "spec.replicas is 0"),
            condition("Progressing", false, "Reconciled", ""),
        )
    } else if let Some(fault) = fault {
        // Below the quorum: at most half the members answer.
        let ready = if fault == EtcdFault::QuorumLost {
            replicas / 2
        } else {
            0
        };
        (
            ready,
            condition(
                "Available",
                false,
                fault.reason(),
                &format!("injected fault {}", fault.annotation_value()),
            ),
            condition("Progressing", false, "Reconciled", ""),
        )
    } else if !missing.is_empty() {
        (
            0,
            condition(
                "Available",
                false,
                "WaitingForSecrets",
                &format!("waiting for Secret {} to exist", missing.join(", ")),
            ),
            condition("Progressing", true, "WaitingForSeed", ""),
        )
    } else {
        (
            replicas,
            condition("Available", true, "QuorumHealthy", ""),
            condition("Progressing", false, "Reconciled", ""),
        )
    };
    json!({
        "readyMembers": ready_members,
        "conditions": [available, progressing],
    })
}

async fn reconcile_data_stores(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &data_store_resource());
    let data_stores = api.list(&ListParams::default()).await?.items;
    if data_stores.is_empty() {
        return Ok(());
    }
    let users = data_store_users(client).await;
    for data_store in data_stores {
        let name = data_store.metadata.name.clone().unwrap_or_default();
        let used_by = users.get(&name).cloned().unwrap_or_default();
        let finalizers = data_store.metadata.finalizers.clone().unwrap_or_default();
        let has_finalizer = finalizers.iter().any(|f| f == DATA_STORE_FINALIZER);
        if data_store.metadata.deletion_timestamp.is_some() {
            if !has_finalizer {
                continue;
            }
            let status = json!({
                "usedBy": used_by,
                "conditions": [deletion_condition(&data_store, &used_by)],
            });
            if !status_matches(&data_store.data["status"], &status) {
                api.patch_status(
                    &name,
                    &patch_params(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .with_context(|| format!("patch the status of DataStore {name}"))?;
            }
            if used_by.is_empty() {
                let rest: Vec<&String> = finalizers
                    .iter()
                    .filter(|f| *f != DATA_STORE_FINALIZER)
                    .collect();
                api.patch(
                    &name,
                    &patch_params(),
                    &Patch::Merge(json!({ "metadata": { "finalizers": rest } })),
                )
                .await
                .with_context(|| format!("remove the finalizer of DataStore {name}"))?;
                tracing::info!(data_store = %name, "DataStore released");
            }
            continue;
        }
        if !has_finalizer {
            let mut all = finalizers.clone();
            all.push(DATA_STORE_FINALIZER.to_string());
            api.patch(
                &name,
                &patch_params(),
                &Patch::Merge(json!({ "metadata": { "finalizers": all } })),
            )
            .await
            .with_context(|| format!("add the finalizer of DataStore {name}"))?;
        }
        let mut found = BTreeSet::new();
        for (namespace, secret) in data_store_secret_refs(&data_store.data["spec"]) {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            if secrets.get_opt(&secret).await?.is_some() {
                found.insert((namespace, secret));
            }
        }
        let validation = validate_data_store(&data_store.data["spec"], |namespace, name| {
            found.contains(&(namespace.to_string(), name.to_string()))
        });
        let status = desired_data_store_status(&data_store, validation, &used_by);
        if !status_matches(&data_store.data["status"], &status) {
            let was_ready = data_store.data["status"]["ready"] == true;
            api.patch_status(
                &name,
                &patch_params(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .with_context(|| format!("patch the status of DataStore {name}"))?;
            if was_ready != (status["ready"] == true) {
                tracing::info!(data_store = %name, ready = %status["ready"], "DataStore readiness changed");
            }
        }
    }
    Ok(())
}

/// The KamajiControlPlanes using each DataStore, as `namespace/name`.
async fn data_store_users(client: &kube::Client) -> BTreeMap<String, Vec<String>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kamaji_control_plane_resource());
    // Without the KamajiControlPlane CRD nothing uses a DataStore.
    let Ok(list) = api.list(&ListParams::default()).await else {
        return BTreeMap::new();
    };
    let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for kcp in list.items {
        if let Some(data_store) = kcp.data["spec"]["dataStoreName"].as_str() {
            users
                .entry(data_store.to_string())
                .or_default()
                .push(format!(
                    "{}/{}",
                    kcp.metadata.namespace.as_deref().unwrap_or_default(),
                    kcp.metadata.name.as_deref().unwrap_or_default()
                ));
        }
    }
    for names in users.values_mut() {
        names.sort();
    }
    users
}

/// Every Secret a DataStore references, as `(namespace, name)`.
fn data_store_secret_refs(spec: &Value) -> Vec<(String, String)> {
    content_refs(spec)
        .into_iter()
        .filter_map(|(_, reference)| {
            let secret = &reference["secretReference"];
            Some((
                secret["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())?
                    .to_string(),
                secret["name"]
                    .as_str()
                    .filter(|n| !n.is_empty())?
                    .to_string(),
            ))
        })
        .collect()
}

/// The ContentRefs of a DataStore with what Kamaji calls them in its
/// messages, in the order Kamaji validates them.
fn content_refs(spec: &Value) -> Vec<(&'static str, &Value)> {
    let tls = &spec["tlsConfig"];
    let auth = &spec["basicAuth"];
    [
        ("basic-auth password", &auth["password"]),
        ("basic-auth username", &auth["username"]),
        (
            "CA certificate",
            &tls["certificateAuthority"]["certificate"],
        ),
        ("CA private key", &tls["certificateAuthority"]["privateKey"]),
        (
            "client certificate",
            &tls["clientCertificate"]["certificate"],
        ),
        (
            "client private key",
            &tls["clientCertificate"]["privateKey"],
        ),
    ]
    .into_iter()
    .filter(|(_, reference)| reference.is_object())
    .collect()
}

/// Kamaji's DataStore validation: `Err((reason, message))` when it fails.
fn validate_data_store(
    spec: &Value,
    secret_exists: impl Fn(&str, &str) -> bool,
) -> Result<(), (&'static str, String)> {
    let check = |what: &str, reference: &Value| -> Result<(), String> {
        if reference["content"]
            .as_str()
            .is_some_and(|content| !content.is_empty())
        {
            return Ok(());
        }
        let secret = &reference["secretReference"];
        if !secret.is_object() {
            return Err(format!(
                "{what} is not valid, the Secret reference is mandatory when bare content is not specified"
            ));
        }
        let name = secret["name"].as_str().unwrap_or_default();
        let namespace = secret["namespace"].as_str().unwrap_or_default();
        if name.is_empty() {
            return Err(format!(
                "{what} is not valid, the Secret reference name is mandatory"
            ));
        }
        if namespace.is_empty() {
            return Err(format!(
                "{what} is not valid, the Secret reference namespace is mandatory"
            ));
        }
        if !secret_exists(namespace, name) {
            return Err(format!(
                "{what} is not valid, secret {namespace}/{name} is not found"
            ));
        }
        Ok(())
    };
    let auth = &spec["basicAuth"];
    if auth.is_object() {
        for (what, reference) in [
            ("basic-auth password", &auth["password"]),
            ("basic-auth username", &auth["username"]),
        ] {
            check(what, reference).map_err(|m| ("BasicAuthValidationFailed", m))?;
        }
    }
    let tls = &spec["tlsConfig"];
    let is_etcd = spec["driver"] == "etcd";
    if !tls.is_object() && !is_etcd {
        return Ok(());
    }
    let failed = |m: String| ("TLSConfigurationValidationFailed", m);
    check(
        "CA certificate",
        &tls["certificateAuthority"]["certificate"],
    )
    .map_err(failed)?;
    if is_etcd {
        if !tls["certificateAuthority"]["privateKey"].is_object() {
            return Err(failed(
                "CA private key is required when using the etcd driver".into(),
            ));
        }
        if !tls["clientCertificate"].is_object() {
            return Err(failed(
                "client certificate is required when using the etcd driver".into(),
            ));
        }
    }
    for (what, reference) in content_refs(spec)
        .into_iter()
        .filter(|(what, _)| !what.starts_with("basic-auth") && *what != "CA certificate")
    {
        check(what, reference).map_err(failed)?;
    }
    Ok(())
}

fn desired_data_store_status(
    data_store: &DynamicObject,
    validation: Result<(), (&'static str, String)>,
    used_by: &[String],
) -> Value {
    let generation = data_store.metadata.generation.unwrap_or_default();
    let current = &data_store.data["status"]["conditions"];
    let (ready, valid) = match validation {
        Ok(()) => (
            true,
            condition(
                current,
                DATA_STORE_VALID,
                true,
                "DataStoreIsValid",
                "",
                generation,
            ),
        ),
        Err((reason, message)) => (
            false,
            condition(
                current,
                DATA_STORE_VALID,
                false,
                reason,
                &message,
                generation,
            ),
        ),
    };
    json!({
        "ready": ready,
        "observedGeneration": generation,
        "usedBy": used_by,
        "conditions": [valid],
    })
}

fn deletion_condition(data_store: &DynamicObject, used_by: &[String]) -> Value {
    let generation = data_store.metadata.generation.unwrap_or_default();
    let current = &data_store.data["status"]["conditions"];
    if used_by.is_empty() {
        condition(
            current,
            DATA_STORE_ALLOWED_DELETION,
            true,
            "DataStoreUnused",
            "",
            generation,
        )
    } else {
        condition(
            current,
            DATA_STORE_ALLOWED_DELETION,
            false,
            "DataStoreStillUsed",
            "The DataStore is still used and referenced by one (or more) TenantControlPlane objects.",
            generation,
        )
    }
}

/// A metav1 Condition, keeping `lastTransitionTime` from the current one
/// while the status does not change.
fn condition(
    current: &Value,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: i64,
) -> Value {
    let status = if status { "True" } else { "False" };
    let since = current
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .filter(|c| c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    })
}

fn status_matches(current: &Value, desired: &Value) -> bool {
    desired
        .as_object()
        .is_some_and(|fields| fields.iter().all(|(k, v)| &current[k] == v))
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd_cluster(spec: Value) -> DynamicObject {
        let mut object = DynamicObject::new("etcd", &etcd_cluster_resource()).within("tenant-a");
        object.data = json!({ "spec": spec });
        object
    }

    fn available(status: &Value) -> (String, String, String) {
        let c = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Available")
            .unwrap();
        (
            c["status"].as_str().unwrap().into(),
            c["reason"].as_str().unwrap().into(),
            c["message"].as_str().unwrap().into(),
        )
    }

    fn cozystack_spec() -> Value {
        json!({
            "replicas": 3,
            "version": "3.6.16",
            "tls": {
                "client": {
                    "serverSecretRef": { "name": "etcd-server-tls" },
                    "operatorClientSecretRef": { "name": "etcd-client-tls" },
                },
                "peer": { "secretRef": { "name": "etcd-peer-tls" } },
            },
        })
    }

    #[test]
    fn an_etcd_cluster_references_its_tls_secrets() {
        assert_eq!(
            referenced_secrets("etcd", &cozystack_spec()),
            ["etcd-client-tls", "etcd-peer-tls", "etcd-server-tls"]
        );
        let cert_manager = json!({
            "tls": {
                "client": { "certManager": {
                    "serverIssuerRef": { "name": "ca" },
                    "operatorClientIssuerRef": { "name": "ca" },
                } },
                "peer": { "certManager": { "issuerRef": { "name": "ca" } } },
            },
            "auth": { "enabled": true, "rootCredentialsSecretRef": { "name": "root" } },
        });
        assert_eq!(
            referenced_secrets("etcd", &cert_manager),
            [
                "etcd-operator-client-tls",
                "etcd-peer-tls",
                "etcd-server-tls",
                "root"
            ]
        );
        assert!(referenced_secrets("etcd", &json!({ "version": "3.6.16" })).is_empty());
    }

    #[test]
    fn an_etcd_cluster_is_available_once_its_secrets_exist() {
        let cluster = etcd_cluster(cozystack_spec());
        let waiting = desired_etcd_status(&cluster, &["etcd-peer-tls".into()], None);
        let (status, reason, message) = available(&waiting);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "WaitingForSecrets")
        );
        assert!(message.contains("etcd-peer-tls"), "{message}");
        assert_eq!(waiting["readyMembers"], 0);

        let healthy = desired_etcd_status(&cluster, &[], None);
        assert_eq!(available(&healthy).0.as_str(), "True", "{healthy}");
        assert_eq!(available(&healthy).1, "QuorumHealthy");
        assert_eq!(healthy["readyMembers"], 3);
    }

    #[test]
    fn a_fault_holds_an_etcd_cluster_unavailable() {
        let mut cluster = etcd_cluster(cozystack_spec());
        cluster.metadata.annotations = Some(BTreeMap::from([(
            ETCD_FAULT_ANNOTATION.to_string(),
            "quorum-lost".to_string(),
        )]));
        let fault = annotation_fault(&cluster);
        assert_eq!(fault, Some(EtcdFault::QuorumLost));
        let status = desired_etcd_status(&cluster, &[], fault);
        assert_eq!(available(&status).1, "QuorumLost");
        assert_eq!(status["readyMembers"], 1);

        let status = desired_etcd_status(&cluster, &[], Some(EtcdFault::ClusterUnreachable));
        assert_eq!(available(&status).1, "ClusterUnreachable");
    }

    #[test]
    fn zero_replicas_pause_an_etcd_cluster() {
        let mut spec = cozystack_spec();
        spec["replicas"] = json!(0);
        let status = desired_etcd_status(&etcd_cluster(spec), &[], None);
        assert_eq!(available(&status).1, "Paused");
    }

    #[test]
    fn etcd_status_is_stable_once_written() {
        let mut cluster = etcd_cluster(cozystack_spec());
        let first = desired_etcd_status(&cluster, &[], None);
        cluster.data["status"] = first;
        assert!(status_matches(
            &cluster.data["status"],
            &desired_etcd_status(&cluster, &[], None)
        ));
    }

    /// The DataStore Cozystack's etcd chart renders.
    fn cozystack_data_store() -> Value {
        let secret = |name: &str, key: &str| json!({ "secretReference": { "name": name, "namespace": "tenant-a", "keyPath": key } });
        json!({
            "driver": "etcd",
            "endpoints": ["etcd.tenant-a.svc:2379"],
            "tlsConfig": {
                "certificateAuthority": {
                    "certificate": secret("etcd-ca-tls", "tls.crt"),
                    "privateKey": secret("etcd-ca-tls", "tls.key"),
                },
                "clientCertificate": {
                    "certificate": secret("etcd-client-tls", "tls.crt"),
                    "privateKey": secret("etcd-client-tls", "tls.key"),
                },
            },
        })
    }

    #[test]
    fn a_data_store_is_ready_once_every_referenced_secret_exists() {
        let spec = cozystack_data_store();
        assert_eq!(
            data_store_secret_refs(&spec),
            [
                ("tenant-a".to_string(), "etcd-ca-tls".to_string()),
                ("tenant-a".to_string(), "etcd-ca-tls".to_string()),
                ("tenant-a".to_string(), "etcd-client-tls".to_string()),
                ("tenant-a".to_string(), "etcd-client-tls".to_string()),
            ]
        );
        let (reason, message) =
            validate_data_store(&spec, |_, name| name == "etcd-ca-tls").unwrap_err();
        assert_eq!(reason, "TLSConfigurationValidationFailed");
        assert_eq!(
            message,
            "client certificate is not valid, secret tenant-a/etcd-client-tls is not found"
        );
        let (_, message) = validate_data_store(&spec, |_, _| false).unwrap_err();
        assert_eq!(
            message,
            "CA certificate is not valid, secret tenant-a/etcd-ca-tls is not found"
        );
        assert_eq!(validate_data_store(&spec, |_, _| true), Ok(()));

        let data_store = DynamicObject::new("tenant-a", &data_store_resource());
        let status =
            desired_data_store_status(&data_store, Ok(()), &["tenant-a/kubernetes-a".into()]);
        assert_eq!(status["ready"], true);
        assert_eq!(status["usedBy"], json!(["tenant-a/kubernetes-a"]));
        assert_eq!(status["conditions"][0]["type"], DATA_STORE_VALID);
        assert_eq!(status["conditions"][0]["reason"], "DataStoreIsValid");
    }

    #[test]
    fn inline_content_needs_no_secret() {
        let spec = json!({
            "driver": "etcd",
            "endpoints": ["etcd:2379"],
            "tlsConfig": {
                "certificateAuthority": { "certificate": { "content": "Y2E=" }, "privateKey": { "content": "a2V5" } },
                "clientCertificate": { "certificate": { "content": "Y2E=" }, "privateKey": { "content": "a2V5" } },
            },
        });
        assert!(data_store_secret_refs(&spec).is_empty());
        assert_eq!(validate_data_store(&spec, |_, _| false), Ok(()));
        let mut no_key = spec.clone();
        no_key["tlsConfig"]["certificateAuthority"]
            .as_object_mut()
            .unwrap()
            .remove("privateKey");
        assert_eq!(
            validate_data_store(&no_key, |_, _| false).unwrap_err().1,
            "CA private key is required when using the etcd driver"
        );
    }

    #[test]
    fn a_used_data_store_may_not_go() {
        let data_store = DynamicObject::new("tenant-a", &data_store_resource());
        let held = deletion_condition(&data_store, &["tenant-a/kubernetes-a".into()]);
        assert_eq!(held["status"], "False");
        assert_eq!(held["reason"], "DataStoreStillUsed");
        assert_eq!(
            deletion_condition(&data_store, &[])["reason"],
            "DataStoreUnused"
        );
    }
}
