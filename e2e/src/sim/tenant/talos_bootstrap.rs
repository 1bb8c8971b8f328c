//! CABPT, the Cluster API bootstrap provider for Talos
//! (`bootstrap.cluster.x-k8s.io`, siderolabs/cluster-api-bootstrap-provider-talos),
//! for `TalosConfig` objects whose machine config is given whole
//! (`spec.generateType: none`), as tenantry's pools render them.
//!
//! The real CABPT (v0.6.12, `hack/upstream/cabpt`) runs in the pool tests
//! and `tests/cabpt.rs`; this simulator still serves the sandbox and the
//! deployed-manager tests until they move to it. It does its controller's
//! part, copied from `controllers/talosconfig_controller.go`
//! and `controllers/secrets.go` of v0.7.0-alpha.2 (e21a01e, the CRDs in
//! `fixtures/upstream/cabpt`):
//!
//! - **Which objects.** TalosConfigs (the storage and v1beta2-contract
//!   version `v1beta1`) owned by a CAPI `Machine` (an owner reference of
//!   kind `Machine` in `cluster.x-k8s.io`); the Machine is read at
//!   `v1beta2` and its `spec.clusterName` names the Cluster. Nothing
//!   happens without such an owner, without the Machine or the Cluster, or
//!   while the Cluster (`spec.paused`) or the TalosConfig
//!   (`cluster.x-k8s.io/paused`) is paused.
//! - **When.** Once the Cluster reports
//!   `status.initialization.infrastructureProvisioned`; until then
//!   `DataSecretAvailable=False` (reason `NotAvailable`, "Waiting for the
//!   cluster infrastructure to be ready"). CABPT does not wait for the
//!   control plane: worker Machines wait for it in CAPI (the MachineSet's
//!   `ControlPlaneIsStable` preflight check, before any Machine exists).
//! - **The data Secret**: `<machine>-bootstrap-data` in the TalosConfig's
//!   namespace (named after the owning Machine, not the TalosConfig), label
//!   `cluster.x-k8s.io/cluster-name`, controller reference to the
//!   TalosConfig, key `value` only (CABPT sets no `format` key and no Secret
//!   type, so it is `Opaque`). Created once; an existing Secret of that name
//!   is used as it is.
//! - **Status**, the v1beta2 bootstrap contract the CRD declares (label
//!   `cluster.x-k8s.io/v1beta2: v1beta1`): `dataSecretName`,
//!   `initialization.dataSecretCreated: true`, `observedGeneration`,
//!   conditions `Ready` (summary) and `DataSecretAvailable` (reasons
//!   `Available`, `NotAvailable`, `InternalError`), and the same two as
//!   v1beta1 conditions under `deprecated.v1beta.conditions` (sic: CABPT's
//!   JSON name), reasons `WaitingForClusterInfrastructure` and
//!   `DataSecretGenerationFailed`. `v1beta1` has no `status.ready` (that is
//!   the v1beta1 contract's `v1alpha3` field). A config already
//!   `dataSecretCreated` is left alone; a Machine that already names its
//!   bootstrap Secret (`spec.bootstrap.dataSecretName`, after a `clusterctl
//!   move`) gets it copied into status without a new Secret.
//! - **Failures** (`DataSecretAvailable=False`, `InternalError`, "Data
//!   secret generation failed: …"): `generateType: none` with empty `data`
//!   (CABPT's message), `data` that is not YAML, and what the simulator
//!   does not do: `generateType` `controlplane`, `worker` or `init`
//!   (generating a config needs Talos' machinery) and `configPatches` or
//!   `strategicPatches` (Talos' config patcher). Tried again every poll, as
//!   CABPT requeues on error.
//!
//! Left out: generating configs and everything only that path reads
//! (`talosVersion`, `hostname`, the `<cluster>-talos` secrets bundle, the
//! `<cluster>-talosconfig` client config Secret and the
//! `ClientConfigAvailable` condition), CABPT's re-encoding of the user's
//! config through Talos' config loader (the Secret holds `spec.data`
//! verbatim; CABPT drops comments and rejects configs Talos cannot load),
//! the `<cluster>-ca` Secret CABPT writes when the config carries the
//! cluster CA key, the `#!talos` prefix for Packet machines, MachinePool
//! owners, and the conversion webhook between `v1alpha3` and `v1beta1`
//! (the CRDs are installed without it: use `v1beta1`).
//!
//! Fault: [`TalosBootstrapSimulator::hold`] keeps a TalosConfig as if CABPT
//! had not got to it yet (down, or behind in its queue): no Secret, status
//! untouched, so it stays unready until [`TalosBootstrapSimulator::release`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::manifests;

/// The kind this simulator serves.
pub const TALOS_CONFIG_KIND: &str = "TalosConfig";
const GROUP: &str = "bootstrap.cluster.x-k8s.io";
/// The version CABPT stores and implements the v1beta2 contract with.
const VERSION: &str = "v1beta1";
const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
const FIELD_MANAGER: &str = "sim-cabpt";
/// How often the simulator looks at TalosConfigs.
const POLL: Duration = Duration::from_millis(500);

/// CABPT's contract labels (`config/crd/kustomization.yaml`
/// `commonLabels`): which of its versions implements each CAPI contract.
const CONTRACT_LABELS: &[(&str, &str)] = &[
    ("cluster.x-k8s.io/v1alpha3", "v1alpha3"),
    ("cluster.x-k8s.io/v1alpha4", "v1alpha3"),
    ("cluster.x-k8s.io/v1beta1", "v1alpha3"),
    ("cluster.x-k8s.io/v1beta2", "v1beta1"),
];

fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, TALOS_CONFIG_KIND),
        "talosconfigs",
    )
}

fn capi_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// The TalosConfig and TalosConfigTemplate CRDs.
pub fn crd_paths() -> Vec<PathBuf> {
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream/cabpt/crds");
    vec![
        crds.join("bootstrap.cluster.x-k8s.io_talosconfigs.yaml"),
        crds.join("bootstrap.cluster.x-k8s.io_talosconfigtemplates.yaml"),
    ]
}

/// Installs the TalosConfig and TalosConfigTemplate CRDs with the contract
/// labels CABPT's release adds, so CAPI resolves a `bootstrap.configRef`
/// of `apiGroup: bootstrap.cluster.x-k8s.io` to `v1beta1`, and the labels
/// `clusterctl init --bootstrap talos` adds, so `clusterctl move` takes
/// TalosConfigs along.
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let mut crds = Vec::new();
    for path in crd_paths() {
        crds.extend(manifests::crds_of(manifests::read_documents(&path)?)?);
    }
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        for (key, value) in CONTRACT_LABELS {
            labels.insert((*key).into(), (*value).into());
        }
        labels.insert("clusterctl.cluster.x-k8s.io".into(), String::new());
        labels.insert("cluster.x-k8s.io/provider".into(), "bootstrap-talos".into());
    }
    manifests::apply_crds(client, crds).await
}

/// A running simulator. Dropping it stops its loop.
pub struct TalosBootstrapSimulator {
    held: Arc<Mutex<BTreeSet<String>>>,
    task: JoinHandle<()>,
}

impl TalosBootstrapSimulator {
    /// Installs the CRDs and starts serving the TalosConfigs of the
    /// management cluster behind `client`.
    pub async fn start(client: kube::Client) -> anyhow::Result<Self> {
        install_crds(&client)
            .await
            .context("install the TalosConfig and TalosConfigTemplate CRDs")?;
        let held: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let task = tokio::spawn(run(client, held.clone()));
        Ok(Self { held, task })
    }

    /// Leaves the TalosConfig `namespace/name` alone, as if CABPT had not
    /// reconciled it yet: no data Secret, status untouched (it stays
    /// unready). Takes effect from the next poll; a config already rendered
    /// stays rendered.
    pub fn hold(&self, namespace: &str, name: &str) {
        lock(&self.held).insert(format!("{namespace}/{name}"));
    }

    /// Serves a held TalosConfig again.
    pub fn release(&self, namespace: &str, name: &str) {
        lock(&self.held).remove(&format!("{namespace}/{name}"));
    }

    /// Stops the loop.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for TalosBootstrapSimulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().expect("Talos bootstrap simulator lock")
}

async fn run(client: kube::Client, held: Arc<Mutex<BTreeSet<String>>>) {
    loop {
        if let Err(error) = reconcile_all(&client, &held).await {
            tracing::debug!(error = format!("{error:#}"), "Talos bootstrap simulator");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn reconcile_all(
    client: &kube::Client,
    held: &Mutex<BTreeSet<String>>,
) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    for config in api.list(&ListParams::default()).await?.items {
        let namespace = config.metadata.namespace.clone().unwrap_or_default();
        let name = config.metadata.name.clone().unwrap_or_default();
        if lock(held).contains(&format!("{namespace}/{name}")) {
            continue;
        }
        if let Err(error) = reconcile(client, &config).await {
            tracing::debug!(
                %namespace, talosconfig = %name, error = format!("{error:#}"),
                "TalosConfig not reconciled"
            );
        }
    }
    Ok(())
}

/// The owning Machine's name, as CABPT's `GetConfigOwner` finds it: an
/// owner reference of kind `Machine` in the `cluster.x-k8s.io` group,
/// whatever its version.
fn owner_machine(config: &DynamicObject) -> Option<String> {
    config
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| {
            o.kind == "Machine"
                && o.api_version.split('/').next() == Some("cluster.x-k8s.io")
                && o.api_version.contains('/')
        })
        .map(|o| o.name.clone())
}

/// Where a TalosConfig stands, for its status.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// The Cluster's infrastructure is not provisioned yet.
    WaitingForInfrastructure,
    /// The data Secret exists (written now, earlier, or by someone CABPT
    /// trusts: the Machine's `spec.bootstrap.dataSecretName`).
    Created { secret_name: String },
    /// Rendering failed; tried again next poll.
    Failed { message: String },
}

async fn reconcile(client: &kube::Client, config: &DynamicObject) -> anyhow::Result<()> {
    if config.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let namespace = config.metadata.namespace.clone().unwrap_or_default();
    let name = config.metadata.name.clone().unwrap_or_default();
    let Some(machine_name) = owner_machine(config) else {
        tracing::debug!(%namespace, talosconfig = %name, "waiting for an owning Machine");
        return Ok(());
    };
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &capi_resource("Machine", "machines"),
    );
    // CABPT reports a missing owner as an error and retries.
    let machine = machines
        .get(&machine_name)
        .await
        .with_context(|| format!("get the owning Machine {machine_name}"))?;
    let cluster_name = machine.data["spec"]["clusterName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if cluster_name.is_empty() {
        tracing::debug!(%namespace, talosconfig = %name, "the Machine does not belong to a cluster yet");
        return Ok(());
    }
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &capi_resource("Cluster", "clusters"),
    );
    let Some(cluster) = clusters.get_opt(&cluster_name).await? else {
        tracing::debug!(%namespace, talosconfig = %name, cluster = %cluster_name, "the Cluster does not exist yet");
        return Ok(());
    };
    let paused = |object: &DynamicObject| {
        object
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
    };
    if cluster.data["spec"]["paused"] == true || paused(&cluster) || paused(config) {
        return Ok(());
    }

    let status = &config.data["status"];
    let outcome = if status["initialization"]["dataSecretCreated"] == true {
        Outcome::Created {
            secret_name: status["dataSecretName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        }
    } else if cluster.data["status"]["initialization"]["infrastructureProvisioned"] != true {
        Outcome::WaitingForInfrastructure
    } else if let Some(secret_name) = machine.data["spec"]["bootstrap"]["dataSecretName"].as_str() {
        Outcome::Created {
            secret_name: secret_name.to_string(),
        }
    } else {
        match bootstrap_data(config) {
            Ok(data) => {
                let secret_name = format!("{machine_name}-bootstrap-data");
                write_bootstrap_data(client, config, &cluster_name, &secret_name, &data).await?;
                Outcome::Created { secret_name }
            }
            Err(message) => Outcome::Failed { message },
        }
    };

    let desired = desired_status(config, &outcome);
    if !status_matches(status, &desired) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &api_resource());
        api.patch_status(
            &name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "status": desired })),
        )
        .await
        .context("patch TalosConfig status")?;
        match &outcome {
            Outcome::Created { secret_name } => tracing::info!(
                %namespace, talosconfig = %name, machine = %machine_name, secret = %secret_name,
                "bootstrap data available"
            ),
            Outcome::WaitingForInfrastructure => tracing::info!(
                %namespace, talosconfig = %name, cluster = %cluster_name,
                "waiting for the cluster infrastructure"
            ),
            Outcome::Failed { message } => tracing::info!(
                %namespace, talosconfig = %name, %message,
                "bootstrap data generation failed"
            ),
        }
    }
    Ok(())
}

/// The bootstrap data of a TalosConfig, or why the simulator cannot
/// render it.
fn bootstrap_data(config: &DynamicObject) -> Result<String, String> {
    let spec = &config.data["spec"];
    let generate_type = spec["generateType"].as_str().unwrap_or_default();
    match generate_type {
        "none" => {}
        "controlplane" | "worker" | "init" => {
            return Err(format!(
                "the Talos bootstrap simulator renders generateType none only; generateType \
                 {generate_type:?} needs Talos' config generator, which is not simulated"
            ));
        }
        other => return Err(format!("unknown generate type specified: {other:?}")),
    }
    let data = spec["data"].as_str().unwrap_or_default();
    if data.is_empty() {
        return Err("failed to specify config data with none generate type".into());
    }
    for field in ["configPatches", "strategicPatches"] {
        if spec[field].as_array().is_some_and(|p| !p.is_empty()) {
            return Err(format!(
                "the Talos bootstrap simulator does not apply {field} (CABPT applies them with \
                 Talos' config patcher)"
            ));
        }
    }
    use serde::Deserialize as _;
    for document in serde_norway::Deserializer::from_str(data) {
        match Value::deserialize(document) {
            Ok(Value::Object(_) | Value::Null) => {}
            Ok(_) => return Err("the machine config has a document that is not a mapping".into()),
            Err(error) => return Err(format!("the machine config is not YAML: {error}")),
        }
    }
    Ok(data.to_string())
}

/// Writes `<machine>-bootstrap-data` unless it exists, as CABPT's
/// `writeBootstrapData`.
async fn write_bootstrap_data(
    client: &kube::Client,
    config: &DynamicObject,
    cluster: &str,
    secret_name: &str,
    data: &str,
) -> anyhow::Result<()> {
    let namespace = config.metadata.namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    if secrets.get_opt(secret_name).await?.is_some() {
        return Ok(());
    }
    let secret: Secret =
        serde_json::from_value(bootstrap_secret(config, cluster, secret_name, data))?;
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("create Secret {secret_name}")),
    }
}

/// The data Secret as CABPT writes it: no type, key `value`, owned by the
/// TalosConfig.
fn bootstrap_secret(config: &DynamicObject, cluster: &str, secret_name: &str, data: &str) -> Value {
    json!({
        "metadata": {
            "name": secret_name,
            "namespace": config.metadata.namespace,
            "labels": { CLUSTER_NAME_LABEL: cluster },
            "ownerReferences": [{
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": TALOS_CONFIG_KIND,
                "name": config.metadata.name,
                "uid": config.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "stringData": { "value": data },
    })
}

/// The status CABPT writes for `outcome`.
fn desired_status(config: &DynamicObject, outcome: &Outcome) -> Value {
    let generation = config.metadata.generation.unwrap_or_default();
    let current = &config.data["status"];
    let (available, v1beta1): (Value, Value) = match outcome {
        Outcome::Created { .. } => (
            condition(
                current,
                "DataSecretAvailable",
                "True",
                "Available",
                "",
                generation,
            ),
            v1beta1_condition(current, "DataSecretAvailable", "True", None, ""),
        ),
        Outcome::WaitingForInfrastructure => (
            condition(
                current,
                "DataSecretAvailable",
                "False",
                "NotAvailable",
                "Waiting for the cluster infrastructure to be ready",
                generation,
            ),
            v1beta1_condition(
                current,
                "DataSecretAvailable",
                "False",
                Some(("WaitingForClusterInfrastructure", "Info")),
                "",
            ),
        ),
        Outcome::Failed { message } => (
            condition(
                current,
                "DataSecretAvailable",
                "False",
                "InternalError",
                &format!("Data secret generation failed: {message}"),
                generation,
            ),
            v1beta1_condition(
                current,
                "DataSecretAvailable",
                "False",
                Some(("DataSecretGenerationFailed", "Error")),
                message,
            ),
        ),
    };
    // CAPI's summaries: `Ready` from the one condition it summarises.
    let ready = if available["status"] == "True" {
        condition(current, "Ready", "True", "Ready", "", generation)
    } else {
        let message = format!(
            "* DataSecretAvailable: {}",
            available["message"].as_str().unwrap_or_default()
        );
        condition(current, "Ready", "False", "NotReady", &message, generation)
    };
    let mut v1beta1_ready = v1beta1.clone();
    v1beta1_ready["type"] = json!("Ready");
    v1beta1_ready["lastTransitionTime"] = json!(since(
        &current["deprecated"]["v1beta"]["conditions"],
        "Ready",
        v1beta1["status"].as_str().unwrap_or_default(),
    ));
    let mut status = json!({
        "conditions": [ready, available],
        "deprecated": { "v1beta": { "conditions": [v1beta1_ready, v1beta1] } },
    });
    match outcome {
        Outcome::Created { secret_name } => {
            status["dataSecretName"] = json!(secret_name);
            status["initialization"] = json!({ "dataSecretCreated": true });
            status["observedGeneration"] = json!(generation);
        }
        Outcome::WaitingForInfrastructure => status["observedGeneration"] = json!(generation),
        // CABPT patches `observedGeneration` only after a reconcile without
        // error.
        Outcome::Failed { .. } => {}
    }
    status
}

/// When the condition `type_` in `conditions` took `status`: its
/// `lastTransitionTime` if it has that status now, else now.
fn since(conditions: &Value, type_: &str, status: &str) -> String {
    conditions
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .filter(|c| c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .map(str::to_string)
        .unwrap_or_else(now)
}

/// A metav1 Condition (`status.conditions`).
fn condition(
    current: &Value,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: i64,
) -> Value {
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since(&current["conditions"], type_, status),
    })
}

/// A CAPI v1beta1 Condition (`status.deprecated.v1beta.conditions`): reason
/// and severity only when False, message only when not empty (the schema
/// wants them non-empty when present).
fn v1beta1_condition(
    current: &Value,
    type_: &str,
    status: &str,
    reason_and_severity: Option<(&str, &str)>,
    message: &str,
) -> Value {
    let mut condition = json!({
        "type": type_,
        "status": status,
        "lastTransitionTime": since(&current["deprecated"]["v1beta"]["conditions"], type_, status),
    });
    if let Some((reason, severity)) = reason_and_severity {
        condition["reason"] = json!(reason);
        condition["severity"] = json!(severity);
    }
    if !message.is_empty() {
        condition["message"] = json!(message);
    }
    condition
}

fn status_matches(current: &Value, desired: &Value) -> bool {
    desired
        .as_object()
        .is_some_and(|fields| fields.iter().all(|(k, v)| &current[k] == v))
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn talos_config(spec: Value) -> DynamicObject {
        let mut object = DynamicObject::new("demo-pool-0", &api_resource()).within("tenant-a");
        object.metadata.uid = Some("tc-uid".into());
        object.metadata.generation = Some(1);
        object.data = json!({ "spec": spec });
        object
    }

    const WORKER: &str = "version: v1alpha1\nmachine:\n  type: worker\ncluster:\n  controlPlane:\n    endpoint: https://kubernetes-demo.tenant-a.svc:6443\n";

    #[test]
    fn a_given_config_is_the_bootstrap_data_verbatim() {
        let config = talos_config(json!({ "generateType": "none", "data": WORKER }));
        assert_eq!(bootstrap_data(&config).as_deref(), Ok(WORKER));
        let secret = bootstrap_secret(&config, "kubernetes-demo", "m-0-bootstrap-data", WORKER);
        assert_eq!(secret["stringData"], json!({ "value": WORKER }));
        assert!(secret.get("type").is_none());
        assert_eq!(
            secret["metadata"]["labels"],
            json!({ "cluster.x-k8s.io/cluster-name": "kubernetes-demo" })
        );
        let owner = &secret["metadata"]["ownerReferences"][0];
        assert_eq!(owner["apiVersion"], "bootstrap.cluster.x-k8s.io/v1beta1");
        assert_eq!(owner["kind"], "TalosConfig");
        assert_eq!(owner["uid"], "tc-uid");
        assert_eq!(owner["controller"], true);
    }

    #[test]
    fn what_the_simulator_cannot_render_fails_with_a_reason() {
        for (spec, expect) in [
            (
                json!({ "generateType": "worker" }),
                "renders generateType none only",
            ),
            (
                json!({ "generateType": "controlplane" }),
                "renders generateType none only",
            ),
            (
                json!({ "generateType": "none" }),
                "failed to specify config data with none generate type",
            ),
            (
                json!({ "generateType": "none", "data": WORKER, "strategicPatches": ["machine: {}"] }),
                "does not apply strategicPatches",
            ),
            (
                json!({ "generateType": "none", "data": WORKER, "configPatches": [{ "op": "add", "path": "/x", "value": 1 }] }),
                "does not apply configPatches",
            ),
            (
                json!({ "generateType": "none", "data": "a: [b" }),
                "not YAML",
            ),
        ] {
            let message = bootstrap_data(&talos_config(spec.clone())).unwrap_err();
            assert!(message.contains(expect), "{spec}: {message}");
        }
        let config = talos_config(json!({ "generateType": "worker" }));
        let status = desired_status(
            &config,
            &Outcome::Failed {
                message: bootstrap_data(&config).unwrap_err(),
            },
        );
        let available = &status["conditions"][1];
        assert_eq!(available["type"], "DataSecretAvailable");
        assert_eq!(available["status"], "False");
        assert_eq!(available["reason"], "InternalError");
        assert!(
            available["message"]
                .as_str()
                .unwrap()
                .starts_with("Data secret generation failed: the Talos bootstrap simulator")
        );
        assert_eq!(status["conditions"][0]["type"], "Ready");
        assert_eq!(status["conditions"][0]["status"], "False");
        let v1beta1 = &status["deprecated"]["v1beta"]["conditions"][1];
        assert_eq!(v1beta1["reason"], "DataSecretGenerationFailed");
        assert_eq!(v1beta1["severity"], "Error");
        assert!(status.get("initialization").is_none());
        assert!(status.get("observedGeneration").is_none());
    }

    #[test]
    fn created_status_follows_the_v1beta2_contract_and_is_stable() {
        let mut config = talos_config(json!({ "generateType": "none", "data": WORKER }));
        let outcome = Outcome::Created {
            secret_name: "m-0-bootstrap-data".into(),
        };
        let status = desired_status(&config, &outcome);
        assert_eq!(status["dataSecretName"], "m-0-bootstrap-data");
        assert_eq!(
            status["initialization"],
            json!({ "dataSecretCreated": true })
        );
        assert_eq!(status["observedGeneration"], 1);
        assert!(status.get("ready").is_none(), "v1beta1 has no status.ready");
        for condition in status["conditions"].as_array().unwrap() {
            assert_eq!(condition["status"], "True");
        }
        let v1beta1 = status["deprecated"]["v1beta"]["conditions"]
            .as_array()
            .unwrap();
        assert!(v1beta1.iter().all(|c| c.get("reason").is_none()));
        config.data["status"] = status;
        assert!(status_matches(
            &config.data["status"],
            &desired_status(&config, &outcome)
        ));
    }

    #[test]
    fn waiting_for_infrastructure_says_so() {
        let config = talos_config(json!({ "generateType": "none", "data": WORKER }));
        let status = desired_status(&config, &Outcome::WaitingForInfrastructure);
        assert_eq!(status["conditions"][1]["reason"], "NotAvailable");
        assert_eq!(
            status["conditions"][1]["message"],
            "Waiting for the cluster infrastructure to be ready"
        );
        assert_eq!(
            status["conditions"][0]["message"],
            "* DataSecretAvailable: Waiting for the cluster infrastructure to be ready"
        );
        let v1beta1 = &status["deprecated"]["v1beta"]["conditions"][1];
        assert_eq!(v1beta1["reason"], "WaitingForClusterInfrastructure");
        assert_eq!(v1beta1["severity"], "Info");
        assert!(v1beta1.get("message").is_none());
        assert!(status.get("initialization").is_none());
    }

    #[test]
    fn only_machine_owners_count() {
        let mut config = talos_config(json!({}));
        assert_eq!(owner_machine(&config), None);
        config.metadata.owner_references = Some(
            serde_json::from_value(json!([
                { "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": "ms", "uid": "1" },
                { "apiVersion": "example.com/v1", "kind": "Machine", "name": "other", "uid": "2" },
                { "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m-0", "uid": "3" },
            ]))
            .unwrap(),
        );
        assert_eq!(owner_machine(&config).as_deref(), Some("m-0"));
    }
}
