//! CDI's DataVolume controller and import controller: a PVC named like the
//! DataVolume (owned by it, bound after a step), an importer run per
//! DataVolume whose state is kept in the PVC's annotations exactly where CDI
//! keeps its importer pod's (`cdi.kubevirt.io/storage.pod.phase`,
//! `.../storage.condition.running*`, `.../storage.pod.restarts`), and the
//! DataVolume status derived from them as `updateStatus`/`updateConditions`
//! do: phases `Pending` → `ImportScheduled` → `ImportInProgress` →
//! `Succeeded` (or `Failed` for fatal errors), `progress`, `restartCount`,
//! and the `Bound`, `Ready` and `Running` conditions.
//!
//! Also the part of kube-controller-manager's pvc-protection controller the
//! harness does not run: a deleted PVC loses `kubernetes.io/pvc-protection`
//! (no pod uses it; no pods run here).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::SecondsFormat;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::imported;
use futures::future::BoxFuture;

use super::importer::{Limits, Outcome, Reporter, Source};
use super::resources::{
    CDI_API_VERSION, Cond, Context, ReconcileResult, add, array_at, controller_ref, dv_resource,
    error_requeue, from_k8s, is_deleting, is_status, name_of, namespace_of, now, parse_quantity,
    parse_time, requeue_in, set_condition, str_at, uid_of, until, vm_resource,
};
use super::virt_controller::replace_patch;

const ANN_POD_PHASE: &str = "cdi.kubevirt.io/storage.pod.phase";
const ANN_POD_RESTARTS: &str = "cdi.kubevirt.io/storage.pod.restarts";
const ANN_RUNNING: &str = "cdi.kubevirt.io/storage.condition.running";
const ANN_RUNNING_MESSAGE: &str = "cdi.kubevirt.io/storage.condition.running.message";
const ANN_RUNNING_REASON: &str = "cdi.kubevirt.io/storage.condition.running.reason";
const ANN_IMPORT_POD: &str = "cdi.kubevirt.io/storage.import.importPodName";
const ANN_SOURCE: &str = "cdi.kubevirt.io/storage.import.source";
const ANN_ENDPOINT: &str = "cdi.kubevirt.io/storage.import.endpoint";
const ANN_CONTENT_TYPE: &str = "cdi.kubevirt.io/storage.contentType";
const ANN_CREATED_FOR: &str = "cdi.kubevirt.io/createdForDataVolume";
const ANN_FATAL: &str = "cdi.kubevirt.io/storage.import.fatalError";
/// When the importer pod was scheduled / may restart: the simulator's own
/// bookkeeping, on the PVC so it survives a restart of the simulator.
const ANN_SCHEDULED_AT: &str = "sim.tenantry.dev/importer-scheduled-at";
const ANN_RETRY_AT: &str = "sim.tenantry.dev/importer-retry-at";
/// `PodRunningReason` in CDI.
const POD_RUNNING: &str = "Pod is running";
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// A size for `spec.storage` without one (CDI would infer it from the
/// source or a StorageProfile, which this simulator does not model).
const DEFAULT_SIZE: &str = "10Gi";

pub(super) async fn run(context: Arc<Context>) {
    let client = context.client.clone();
    let controller = Controller::new_with(
        Api::<DynamicObject>::all_with(client.clone(), &dv_resource()),
        watcher::Config::default(),
        dv_resource(),
    )
    .owns_with(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        (),
        watcher::Config::default(),
    )
    // Import faults may sit on the VM that owns the DataVolume.
    .watches_with(
        Api::<DynamicObject>::all_with(client, &vm_resource()),
        vm_resource(),
        watcher::Config::default(),
        |vm| {
            let namespace = vm.metadata.namespace.clone().unwrap_or_default();
            array_at(&vm.data, "/spec/dataVolumeTemplates")
                .iter()
                .filter_map(|t| str_at(t, "/metadata/name"))
                .map(|name| ObjectRef::new_with(name, dv_resource()).within(&namespace))
                .collect::<Vec<_>>()
        },
    )
    .with_config(ControllerConfig::default().concurrency(8))
    .reconcile_all_on(context.faults.changes());
    super::drive(
        "cdi-controller",
        controller.run(reconcile, |_, _, _| error_requeue(), context),
    )
    .await;
}

pub(super) async fn run_pvc_protection(context: Arc<Context>) {
    let controller = Controller::new(
        Api::<PersistentVolumeClaim>::all(context.client.clone()),
        watcher::Config::default(),
    );
    super::drive(
        "pvc-protection",
        controller.run(
            |pvc: Arc<PersistentVolumeClaim>, context: Arc<Context>| async move {
                let finalizers = pvc.metadata.finalizers.clone().unwrap_or_default();
                if pvc.metadata.deletion_timestamp.is_none()
                    || !finalizers.iter().any(|f| f == PVC_PROTECTION)
                {
                    return Ok::<_, super::resources::ReconcileError>(Action::await_change());
                }
                let api: Api<PersistentVolumeClaim> = Api::namespaced(
                    context.client.clone(),
                    pvc.metadata.namespace.as_deref().unwrap_or("default"),
                );
                let remaining: Vec<&String> =
                    finalizers.iter().filter(|f| *f != PVC_PROTECTION).collect();
                match api
                    .patch(
                        pvc.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {
                            "finalizers": remaining,
                            "resourceVersion": pvc.metadata.resource_version,
                        }})),
                    )
                    .await
                {
                    Ok(_) => Ok(Action::await_change()),
                    Err(error) if is_status(&error, 404) => Ok(Action::await_change()),
                    Err(error) => Err(error.into()),
                }
            },
            |_, _, _| error_requeue(),
            context,
        ),
    )
    .await;
}

/// What a DataVolume asks CDI to do.
#[derive(Debug, PartialEq)]
enum Plan {
    Import(Source),
    /// `spec.source.pvc`: clone `name` in `namespace`.
    Clone {
        namespace: String,
        name: String,
    },
    /// A source this simulator does not implement.
    Unsupported(String),
}

fn plan(dv: &DynamicObject) -> Plan {
    let source = &dv.data["spec"]["source"];
    if let Some(http) = source.get("http") {
        return Plan::Import(Source::Http {
            url: http["url"].as_str().unwrap_or_default().to_string(),
            checksum: http["checksum"].as_str().map(String::from),
        });
    }
    if source.get("blank").is_some() {
        return Plan::Import(Source::Blank);
    }
    if let Some(pvc) = source.get("pvc") {
        return Plan::Clone {
            namespace: pvc["namespace"]
                .as_str()
                .unwrap_or(namespace_of(dv))
                .to_string(),
            name: pvc["name"].as_str().unwrap_or_default().to_string(),
        };
    }
    if dv.data["spec"].get("sourceRef").is_some() {
        return Plan::Unsupported("sourceRef".into());
    }
    let kind = source
        .as_object()
        .and_then(|s| s.keys().next().cloned())
        .unwrap_or_else(|| "none".into());
    Plan::Unsupported(kind)
}

/// The PVC `spec` from `spec.pvc` or `spec.storage`.
fn claim_spec(dv: &DynamicObject) -> (Value, String) {
    let from = if dv.data["spec"]["pvc"].is_object() {
        &dv.data["spec"]["pvc"]
    } else {
        &dv.data["spec"]["storage"]
    };
    let mut spec = from.as_object().cloned().unwrap_or_default();
    if array_at(from, "/accessModes").is_empty() {
        spec.insert("accessModes".into(), json!(["ReadWriteOnce"]));
    }
    let size = str_at(from, "/resources/requests/storage")
        .unwrap_or(DEFAULT_SIZE)
        .to_string();
    spec.insert(
        "resources".into(),
        json!({"requests": {"storage": size.clone()}}),
    );
    spec.entry("volumeMode").or_insert(json!("Filesystem"));
    spec.remove("dataSource");
    spec.remove("dataSourceRef");
    spec.insert("volumeName".into(), json!(format!("pvc-{}", uid_of(dv))));
    (Value::Object(spec), size)
}

fn desired_pvc(dv: &DynamicObject, plan: &Plan) -> anyhow::Result<PersistentVolumeClaim> {
    let (spec, _) = claim_spec(dv);
    let mut annotations = BTreeMap::from([
        (ANN_CONTENT_TYPE.to_string(), "kubevirt".to_string()),
        (ANN_CREATED_FOR.to_string(), uid_of(dv).to_string()),
    ]);
    if let Plan::Import(source) = plan {
        let (kind, endpoint) = match source {
            Source::Http { url, .. } => ("http", url.as_str()),
            Source::Blank => ("none", ""),
            Source::Clone => ("none", ""),
        };
        annotations.insert(ANN_SOURCE.into(), kind.into());
        if !endpoint.is_empty() {
            annotations.insert(ANN_ENDPOINT.into(), endpoint.into());
        }
    }
    let pvc = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name_of(dv),
            "namespace": namespace_of(dv),
            "labels": {
                "app": "containerized-data-importer",
                "app.kubernetes.io/component": "storage",
                "app.kubernetes.io/managed-by": "cdi-controller",
            },
            "annotations": annotations,
            "ownerReferences": [controller_ref(CDI_API_VERSION, "DataVolume", dv)],
        },
        "spec": spec,
    });
    serde_json::from_value(pvc).context("build PVC")
}

fn pvc_annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Importer restarts back off like kubelet's CrashLoopBackOff.
fn retry_delay(restarts: u32, base: Duration, max: Duration) -> Duration {
    base.saturating_mul(1u32 << restarts.min(16).saturating_sub(1))
        .min(max)
}

async fn reconcile(dv: Arc<DynamicObject>, context: Arc<Context>) -> ReconcileResult {
    let namespace = namespace_of(&dv).to_string();
    let name = name_of(&dv).to_string();
    let uid = uid_of(&dv).to_string();
    let client = &context.client;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let dvs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &dv_resource());
    let merge = PatchParams {
        field_manager: Some(context.manager("cdi-controller")),
        ..PatchParams::default()
    };
    if is_deleting(&dv) {
        context.imports.collect(&uid);
        return Ok(Action::await_change());
    }
    let plan = plan(&dv);
    let is_clone = matches!(plan, Plan::Clone { .. });
    let mut requeue: Option<Duration> = None;
    let mut note: Option<(String, String)> = None;

    let mut pvc = pvcs.get_opt(&name).await?;
    // A PVC of an earlier DataVolume with the same name is on its way out.
    if let Some(existing) = &pvc
        && existing
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o.kind == "DataVolume" && o.uid != uid))
    {
        return Ok(requeue_in(Duration::from_millis(500)));
    }

    match (&plan, &pvc) {
        (Plan::Unsupported(kind), None) => {
            note = Some((
                "SimulatorUnsupportedSource".into(),
                format!("the KubeVirt simulator does not implement DataVolume source {kind:?}"),
            ));
        }
        (
            Plan::Clone {
                namespace: source_ns,
                name: source,
            },
            None,
        ) => {
            let sources: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), source_ns);
            if sources.get_opt(source).await?.is_none() {
                note = Some((
                    "CloneWithoutSource".into(),
                    format!("The source pvc {source} doesn't exist"),
                ));
                requeue = Some(Duration::from_secs(2));
            } else {
                pvc = Some(create_pvc(&pvcs, &dv, &plan).await?);
            }
        }
        (Plan::Import(_), None) => {
            pvc = Some(create_pvc(&pvcs, &dv, &plan).await?);
        }
        _ => {}
    }

    if let Some(claim) = pvc.clone() {
        pvc = Some(advance(&context, &pvcs, &dv, &plan, claim, &mut requeue).await?);
    }

    // Status, as CDI derives it from the PVC.
    let status = desired_status(&context, &dv, pvc.as_ref(), is_clone, note.as_ref());
    if status != dv.data["status"] {
        dvs.patch_status(
            &name,
            &merge,
            &Patch::Merge(json!({"status": replace_patch(&dv.data["status"], &status)})),
        )
        .await?;
    }
    Ok(requeue.map_or_else(Action::await_change, requeue_in))
}

async fn create_pvc(
    pvcs: &Api<PersistentVolumeClaim>,
    dv: &DynamicObject,
    plan: &Plan,
) -> anyhow::Result<PersistentVolumeClaim> {
    match pvcs
        .create(&PostParams::default(), &desired_pvc(dv, plan)?)
        .await
    {
        Ok(pvc) => Ok(pvc),
        Err(kube::Error::Api(e)) if e.code == 409 => pvcs
            .get(name_of(dv))
            .await
            .context("read the PVC that already exists"),
        Err(error) => Err(error).context("create PVC"),
    }
}

/// Moves the PVC and its importer one step; returns the PVC as written.
async fn advance(
    context: &Context,
    pvcs: &Api<PersistentVolumeClaim>,
    dv: &DynamicObject,
    plan: &Plan,
    pvc: PersistentVolumeClaim,
    requeue: &mut Option<Duration>,
) -> anyhow::Result<PersistentVolumeClaim> {
    let config = &context.config;
    let name = name_of(dv).to_string();
    let uid = uid_of(dv).to_string();
    let merge = PatchParams {
        field_manager: Some(context.manager("cdi-controller")),
        ..PatchParams::default()
    };
    let mut wait = |after: Duration| {
        *requeue = Some(requeue.map_or(after, |r: Duration| r.min(after)));
    };
    if pvc.metadata.deletion_timestamp.is_some() {
        return Ok(pvc);
    }
    // CDI adopts a PVC that was there first when the DataVolume allows it.
    if controller_of_pvc(&pvc).is_none() {
        let patched = pvcs
            .patch(
                &name,
                &merge,
                &Patch::Merge(json!({"metadata": {
                    "ownerReferences": [controller_ref(CDI_API_VERSION, "DataVolume", dv)],
                }})),
            )
            .await?;
        return Ok(patched);
    }

    // Binding: a provisioner would create a PV; here the claim just binds
    // after a step, with the requested size.
    let phase = pvc.status.as_ref().and_then(|s| s.phase.clone());
    if phase.as_deref() != Some("Bound") {
        let created = pvc
            .metadata
            .creation_timestamp
            .as_ref()
            .map(from_k8s)
            .unwrap_or_else(now);
        let due = add(created, config.step);
        if now() < due {
            wait(until(due));
            return Ok(pvc);
        }
        let spec = pvc.spec.clone().unwrap_or_default();
        let size = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| DEFAULT_SIZE.into());
        let patched = pvcs
            .patch_status(
                &name,
                &merge,
                &Patch::Merge(json!({"status": {
                    "phase": "Bound",
                    "accessModes": spec.access_modes.unwrap_or_default(),
                    "capacity": {"storage": size},
                }})),
            )
            .await?;
        wait(config.step);
        return Ok(patched);
    }

    // Guarded by the resourceVersion: the import task writes the same
    // annotations, and a stale read must not restart a finished import.
    let resource_version = pvc.metadata.resource_version.clone();
    let annotate = |values: Value| {
        let pvcs = pvcs.clone();
        let merge = merge.clone();
        let name = name.clone();
        let resource_version = resource_version.clone();
        async move {
            pvcs.patch(
                &name,
                &merge,
                &Patch::Merge(json!({"metadata": {
                    "annotations": values,
                    "resourceVersion": resource_version,
                }})),
            )
            .await
        }
    };
    let precise =
        |at: chrono::DateTime<chrono::Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);

    match pvc_annotation(&pvc, ANN_POD_PHASE) {
        // Bound and nothing scheduled yet: the import controller creates the
        // importer pod.
        None => {
            let patched = annotate(json!({
                ANN_POD_PHASE: "Pending",
                ANN_IMPORT_POD: format!("importer-{name}"),
                ANN_SCHEDULED_AT: precise(now()),
                ANN_POD_RESTARTS: "0",
            }))
            .await?;
            wait(config.step);
            Ok(patched)
        }
        Some("Pending") => {
            let due = pvc_annotation(&pvc, ANN_SCHEDULED_AT)
                .and_then(|t| parse_time(&json!(t)))
                .map(|t| add(t, config.step))
                .unwrap_or_else(now);
            if now() < due {
                wait(until(due));
                return Ok(pvc);
            }
            let patched = annotate(json!({
                ANN_POD_PHASE: "Running",
                ANN_RUNNING: "true",
                ANN_RUNNING_MESSAGE: "",
                ANN_RUNNING_REASON: POD_RUNNING,
            }))
            .await?;
            start_import(context, dv, plan, &patched).await?;
            Ok(patched)
        }
        Some("Running") => {
            match context.imports.progress(&uid) {
                Some((_, None)) => return Ok(pvc),
                // The task has put its outcome on the PVC already.
                Some((_, Some(_))) => context.imports.collect(&uid),
                None => {}
            }
            // No importer runs: a restart is due (after a failure), or the
            // simulator itself restarted mid-import.
            let retry_at = pvc_annotation(&pvc, ANN_RETRY_AT).and_then(|t| parse_time(&json!(t)));
            if let Some(at) = retry_at
                && now() < at
            {
                wait(until(at));
                return Ok(pvc);
            }
            let patched = annotate(json!({
                ANN_RUNNING: "true",
                ANN_RUNNING_MESSAGE: "",
                ANN_RUNNING_REASON: POD_RUNNING,
                ANN_RETRY_AT: null,
            }))
            .await?;
            start_import(context, dv, plan, &patched).await?;
            Ok(patched)
        }
        _ => Ok(pvc),
    }
}

/// Records an importer's progress on the DataVolume and its end on the
/// PVC, the way CDI's import controller copies them from the pod.
struct PvcReporter {
    client: kube::Client,
    namespace: String,
    name: String,
    manager: String,
    retry: Duration,
    retry_max: Duration,
}

impl Reporter for PvcReporter {
    fn progress(&self, percent: f64) -> BoxFuture<'static, bool> {
        let dvs: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &dv_resource());
        let name = self.name.clone();
        let params = PatchParams {
            field_manager: Some(self.manager.clone()),
            ..PatchParams::default()
        };
        Box::pin(async move {
            let patch = json!({"status": {"progress": format!("{percent:.2}%")}});
            match dvs.patch_status(&name, &params, &Patch::Merge(patch)).await {
                Ok(_) => true,
                Err(error) if is_status(&error, 404) => false,
                Err(error) => {
                    tracing::debug!(%error, dv = %name, "reporting import progress failed");
                    true
                }
            }
        })
    }

    fn finished(&self, outcome: Outcome) -> BoxFuture<'static, anyhow::Result<()>> {
        let pvcs: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let name = self.name.clone();
        let params = PatchParams {
            field_manager: Some(self.manager.clone()),
            ..PatchParams::default()
        };
        let (retry, retry_max) = (self.retry, self.retry_max);
        Box::pin(async move {
            // Nothing to record on a claim that is gone or going.
            let Some(pvc) = pvcs
                .get_opt(&name)
                .await?
                .filter(|pvc| pvc.metadata.deletion_timestamp.is_none())
            else {
                return Ok(());
            };
            let restarts: u32 = pvc_annotation(&pvc, ANN_POD_RESTARTS)
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let annotations = outcome_annotations(&outcome, restarts, retry, retry_max);
            match pvcs
                .patch(
                    &name,
                    &params,
                    &Patch::Merge(json!({"metadata": {
                        "annotations": annotations,
                        "resourceVersion": pvc.metadata.resource_version,
                    }})),
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(error) if is_status(&error, 404) => Ok(()),
                Err(error) => Err(error.into()),
            }
        })
    }
}

/// The PVC annotations CDI's import controller writes when the importer
/// pod ends this way.
fn outcome_annotations(
    outcome: &Outcome,
    restarts: u32,
    retry: Duration,
    retry_max: Duration,
) -> Value {
    let precise =
        |at: chrono::DateTime<chrono::Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
    match outcome {
        Outcome::Succeeded {
            size,
            sha256,
            compression,
        } => json!({
            ANN_POD_PHASE: "Succeeded",
            ANN_RUNNING: "false",
            ANN_RUNNING_MESSAGE: "Import Complete",
            ANN_RUNNING_REASON: "Completed",
            imported::SIZE: size.to_string(),
            imported::SHA256: sha256,
            imported::COMPRESSION: compression,
        }),
        Outcome::Failed {
            message,
            reason,
            fatal: true,
        } => json!({
            ANN_POD_PHASE: "Failed",
            ANN_FATAL: "true",
            ANN_RUNNING: "false",
            ANN_RUNNING_MESSAGE: message,
            ANN_RUNNING_REASON: reason,
        }),
        // The importer container exits with an error; kubelet restarts it
        // after a back-off and the pod stays Running.
        Outcome::Failed {
            message, reason, ..
        } => json!({
            ANN_RUNNING: "false",
            ANN_RUNNING_MESSAGE: message,
            ANN_RUNNING_REASON: reason,
            ANN_POD_RESTARTS: (restarts + 1).to_string(),
            ANN_RETRY_AT: precise(add(now(), retry_delay(restarts + 1, retry, retry_max))),
        }),
    }
}

fn controller_of_pvc(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

async fn start_import(
    context: &Context,
    dv: &DynamicObject,
    plan: &Plan,
    pvc: &PersistentVolumeClaim,
) -> anyhow::Result<()> {
    let source = match plan {
        Plan::Import(source) => source.clone(),
        Plan::Clone { .. } => Source::Clone,
        Plan::Unsupported(_) => return Ok(()),
    };
    // Import faults may sit on the VM that owns the DataVolume.
    let vm = match dv
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.iter().find(|o| o.kind == "VirtualMachine"))
    {
        Some(owner) => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(context.client.clone(), namespace_of(dv), &vm_resource());
            api.get_opt(&owner.name)
                .await?
                .filter(|vm| uid_of(vm) == owner.uid)
        }
        None => None,
    };
    let faults = context.faults.for_import(dv, vm.as_ref());
    let capacity = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| parse_quantity(&q.0));
    context.imports.start(
        uid_of(dv),
        PvcReporter {
            client: context.client.clone(),
            namespace: namespace_of(dv).to_string(),
            name: name_of(dv).to_string(),
            manager: context.manager("cdi-importer"),
            retry: context.config.import_retry,
            retry_max: context.config.import_retry_max,
        },
        source,
        Limits {
            capacity,
            min_duration: faults.min_duration,
            error: faults.error,
            fatal: faults.fatal,
        },
    );
    Ok(())
}

/// The DataVolume status CDI derives from its PVC.
fn desired_status(
    context: &Context,
    dv: &DynamicObject,
    pvc: Option<&PersistentVolumeClaim>,
    is_clone: bool,
    note: Option<&(String, String)>,
) -> Value {
    let mut status = dv.data["status"].as_object().cloned().unwrap_or_default();
    let (scheduled, in_progress) = if is_clone {
        ("CloneScheduled", "CloneInProgress")
    } else {
        ("ImportScheduled", "ImportInProgress")
    };
    let bound = pvc
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.phase.as_deref())
        == Some("Bound");
    let pod_phase = pvc.and_then(|p| pvc_annotation(p, ANN_POD_PHASE));
    let fatal = pvc.and_then(|p| pvc_annotation(p, ANN_FATAL)) == Some("true");
    let phase = match (pvc, bound, pod_phase) {
        (None, _, _) | (Some(_), false, _) => "Pending",
        (Some(_), true, None | Some("Pending")) => scheduled,
        (Some(_), true, Some("Succeeded")) => "Succeeded",
        (Some(_), true, Some("Failed")) if fatal => "Failed",
        (Some(_), true, _) => in_progress,
    };
    status.insert("phase".into(), json!(phase));
    if let Some(pvc) = pvc {
        status.insert(
            "claimName".into(),
            json!(pvc.metadata.name.clone().unwrap_or_default()),
        );
        if let Some(restarts) =
            pvc_annotation(pvc, ANN_POD_RESTARTS).and_then(|r| r.parse::<i64>().ok())
        {
            status.insert("restartCount".into(), json!(restarts));
        }
    }
    let progress = match phase {
        "Succeeded" => "100.0%".to_string(),
        _ => context
            .imports
            .progress(uid_of(dv))
            .and_then(|(percent, _)| percent)
            .map(|p| format!("{p:.2}%"))
            .or_else(|| {
                status
                    .get("progress")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .unwrap_or_else(|| "N/A".into()),
    };
    status.insert("progress".into(), json!(progress));

    let mut conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let name = name_of(dv);
    let bound_cond = match (pvc, bound) {
        (None, _) => Cond::new("Bound", "False", "NotFound", "No PVC found"),
        (Some(_), true) => Cond::new("Bound", "True", "Bound", &format!("PVC {name} Bound")),
        (Some(_), false) => Cond::new("Bound", "False", "Pending", &format!("PVC {name} Pending")),
    };
    set_condition(&mut conditions, &bound_cond, "lastHeartbeatTime");
    let ready = if phase == "Succeeded" {
        "True"
    } else {
        "False"
    };
    let running_annotation = pvc.and_then(|p| pvc_annotation(p, ANN_RUNNING));
    let ready_reason = if running_annotation == Some("true") {
        "TransferRunning"
    } else {
        ""
    };
    set_condition(
        &mut conditions,
        &Cond::new("Ready", ready, ready_reason, ""),
        "lastHeartbeatTime",
    );
    let running = match (pvc, note) {
        (_, Some((reason, message))) => Cond::new("Running", "False", reason, message),
        (None, None) => Cond::new("Running", "False", "", ""),
        (Some(pvc), None) => Cond::new(
            "Running",
            if running_annotation == Some("true") {
                "True"
            } else {
                "False"
            },
            pvc_annotation(pvc, ANN_RUNNING_REASON).unwrap_or(""),
            pvc_annotation(pvc, ANN_RUNNING_MESSAGE).unwrap_or(""),
        ),
    };
    set_condition(&mut conditions, &running, "lastHeartbeatTime");
    status.insert("conditions".into(), json!(conditions));
    Value::Object(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dv(spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": CDI_API_VERSION, "kind": "DataVolume",
            "metadata": {"name": "boot", "namespace": "ns", "uid": "dv-uid"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn sources_are_planned_like_cdi() {
        assert_eq!(
            plan(&dv(
                json!({"source": {"http": {"url": "http://x/y.raw.xz"}}})
            )),
            Plan::Import(Source::Http {
                url: "http://x/y.raw.xz".into(),
                checksum: None
            })
        );
        assert_eq!(
            plan(&dv(json!({"source": {"pvc": {"name": "golden"}}}))),
            Plan::Clone {
                namespace: "ns".into(),
                name: "golden".into()
            }
        );
        assert_eq!(
            plan(&dv(json!({"source": {"registry": {"url": "docker://x"}}}))),
            Plan::Unsupported("registry".into())
        );
        assert_eq!(
            plan(&dv(
                json!({"sourceRef": {"kind": "DataSource", "name": "x"}})
            )),
            Plan::Unsupported("sourceRef".into())
        );
    }

    #[test]
    fn claims_default_like_a_storage_profile_would() {
        let (spec, size) = claim_spec(&dv(
            json!({"storage": {"resources": {"requests": {"storage": "2Gi"}}}}),
        ));
        assert_eq!(size, "2Gi");
        assert_eq!(spec["accessModes"], json!(["ReadWriteOnce"]));
        assert_eq!(spec["volumeMode"], "Filesystem");
        let (spec, _) = claim_spec(&dv(
            json!({"pvc": {"accessModes": ["ReadWriteMany"], "volumeMode": "Block",
            "resources": {"requests": {"storage": "5Gi"}}, "storageClassName": "local"}}),
        ));
        assert_eq!(spec["accessModes"], json!(["ReadWriteMany"]));
        assert_eq!(spec["volumeMode"], "Block");
        assert_eq!(spec["storageClassName"], "local");
    }

    #[test]
    fn restarts_back_off_exponentially() {
        let base = Duration::from_secs(10);
        let max = Duration::from_secs(300);
        assert_eq!(retry_delay(1, base, max), Duration::from_secs(10));
        assert_eq!(retry_delay(2, base, max), Duration::from_secs(20));
        assert_eq!(retry_delay(3, base, max), Duration::from_secs(40));
        assert_eq!(retry_delay(10, base, max), max);
    }
}
