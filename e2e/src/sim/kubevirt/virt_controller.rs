//! virt-controller's VirtualMachine controller: DataVolumes from
//! `dataVolumeTemplates`, a VMI per `spec.runStrategy`, and the VM status
//! (`printableStatus`, `ready`, `created`, conditions, start back-off) as
//! `pkg/virt-controller/watch/vm/vm.go` computes them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::resources::{
    Cond, Context, KUBEVIRT_API_VERSION, ReconcileResult, VM_CONTROLLER_FINALIZER, add, annotation,
    array_at, condition, condition_is, controller_of, controller_ref, dv_resource, error_requeue,
    has_finalizer, is_deleting, is_status, name_of, namespace_of, now, parse_time,
    remove_condition, requeue_in, set_condition, stable_hash, str_at, timestamp, to_value, uid_of,
    until, vm_resource, vmi_resource,
};

const LATEST_API_VERSION_ANNOTATION: &str = "kubevirt.io/latest-observed-api-version";
const STORAGE_API_VERSION_ANNOTATION: &str = "kubevirt.io/storage-observed-api-version";
const GENERATION_ANNOTATION: &str = "kubevirt.io/vm-generation";
pub(super) const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
const ALLOW_CLAIM_ADOPTION: &str = "cdi.kubevirt.io/allowClaimAdoption";
/// KubeVirt's `failedCreateReason`.
const FAILED_CREATE: &str = "FailedCreate";

pub(super) async fn run(context: Arc<Context>) {
    let client = context.client.clone();
    let controller = Controller::new_with(
        Api::<DynamicObject>::all_with(client.clone(), &vm_resource()),
        watcher::Config::default(),
        vm_resource(),
    )
    .owns_with(
        Api::<DynamicObject>::all_with(client.clone(), &vmi_resource()),
        vmi_resource(),
        watcher::Config::default(),
    )
    .owns_with(
        Api::<DynamicObject>::all_with(client, &dv_resource()),
        dv_resource(),
        watcher::Config::default(),
    )
    .with_config(ControllerConfig::default().concurrency(8))
    .reconcile_all_on(context.faults.changes());
    super::drive(
        "virt-controller",
        controller.run(reconcile, |_, _, _| error_requeue(), context),
    )
    .await;
}

/// The run strategy of a VM (`VirtualMachine.RunStrategy()`): the legacy
/// `spec.running` maps to Always/Halted, neither means Halted.
pub(super) fn run_strategy(vm: &Value) -> Result<String, String> {
    let running = vm.pointer("/spec/running").and_then(Value::as_bool);
    let strategy = str_at(vm, "/spec/runStrategy");
    match (running, strategy) {
        (Some(_), Some(_)) => Err("running and runstrategy are mutually exclusive".into()),
        (Some(true), None) => Ok("Always".into()),
        (Some(false), None) | (None, None) => Ok("Halted".into()),
        (None, Some(strategy)) => Ok(strategy.into()),
    }
}

fn phase(vmi: &Value) -> &str {
    str_at(vmi, "/status/phase").unwrap_or("")
}

pub(super) fn is_final(vmi: &Value) -> bool {
    matches!(phase(vmi), "Failed" | "Succeeded")
}

fn was_running(vmi: &Value) -> bool {
    array_at(vmi, "/status/phaseTransitionTimestamps")
        .iter()
        .any(|t| t["phase"] == "Running")
}

fn first_request(vm: &Value) -> Option<&Value> {
    array_at(vm, "/status/stateChangeRequests").first()
}

fn has_start_request(vm: &Value) -> bool {
    first_request(vm).is_some_and(|r| r["action"] == "Start")
}

fn has_stop_request_for(vm: &Value, vmi: &Value) -> bool {
    first_request(vm).is_some_and(|r| {
        r["action"] == "Stop" && r.get("uid").is_some() && r["uid"] == vmi["metadata"]["uid"]
    })
}

/// What the run strategy asks for, given the current VMI.
#[derive(Debug, PartialEq)]
enum RunAction {
    Nothing,
    Start,
    Stop,
    /// RerunOnFailure after a failure: delete, and queue a start request so
    /// the next VMI starts.
    StopAndRequestStart,
}

/// `syncRunStrategy` without the side effects.
fn decide_run(strategy: &str, vm: &Value, vmi: Option<&Value>) -> RunAction {
    let deleting = |vmi: &Value| vmi.pointer("/metadata/deletionTimestamp").is_some();
    match (strategy, vmi) {
        ("Always", Some(vmi)) => {
            if (has_stop_request_for(vm, vmi) || is_final(vmi)) && !deleting(vmi) {
                RunAction::Stop
            } else {
                RunAction::Nothing
            }
        }
        ("Always", None) => RunAction::Start,
        ("RerunOnFailure", Some(vmi)) => {
            let failed = phase(vmi) == "Failed";
            let stop = has_stop_request_for(vm, vmi) || failed || phase(vmi) == "Succeeded";
            match (stop && !deleting(vmi), failed) {
                (true, true) => RunAction::StopAndRequestStart,
                (true, false) => RunAction::Stop,
                (false, _) => RunAction::Nothing,
            }
        }
        ("RerunOnFailure", None) => {
            // Started on an explicit request, or when the strategy has just
            // been switched to RerunOnFailure (status.runStrategy lags).
            if has_start_request(vm) || str_at(vm, "/status/runStrategy") != Some("RerunOnFailure")
            {
                RunAction::Start
            } else {
                RunAction::Nothing
            }
        }
        ("Manual", Some(vmi)) if has_stop_request_for(vm, vmi) && !deleting(vmi) => RunAction::Stop,
        ("Manual", None) if has_start_request(vm) => RunAction::Start,
        ("Halted", Some(vmi)) if !deleting(vmi) => RunAction::Stop,
        // Once: start when there is no VMI; a final VMI stays (not deleted),
        // which is what keeps it from starting again.
        ("Once", None) => RunAction::Start,
        _ => RunAction::Nothing,
    }
}

/// Seconds left in the start back-off (`startFailureBackoffTimeLeft`).
fn start_backoff_left(vm: &Value) -> Duration {
    vm.pointer("/status/startFailure/retryAfterTimestamp")
        .and_then(parse_time)
        .map(until)
        .unwrap_or_default()
}

/// `calculateStartBackoffTime`: interval × failures² plus jitter of up to
/// half, capped at 30 intervals (upstream: 10s and 300s).
fn start_backoff(failures: u64, base: Duration, uid: &str) -> Duration {
    let delay = base.saturating_mul(u32::try_from(failures.max(1).pow(2)).unwrap_or(u32::MAX));
    let jitter = delay.mul_f64((stable_hash(uid) % 500) as f64 / 1000.0);
    (delay + jitter).min(base * 30)
}

/// The VM status `updateStatus` would write.
fn desired_status(
    vm: &Value,
    vmi: Option<&Value>,
    dvs: &[Value],
    strategy: &Result<String, String>,
    sync_error: Option<&(String, String)>,
    backoff_base: Duration,
) -> Value {
    let mut status = vm["status"].as_object().cloned().unwrap_or_default();
    let created = vmi.is_some();
    status.insert("created".into(), json!(created));
    let vmi_conditions = vmi
        .map(|v| array_at(v, "/status/conditions").to_vec())
        .unwrap_or_default();
    status.insert(
        "ready".into(),
        json!(condition_is(&vmi_conditions, "Ready", "True")),
    );
    let strategy_name = strategy.clone().unwrap_or_default();
    // status.runStrategy is first written when a VMI is created, so a VM can
    // tell whether it ever started (RerunOnFailure relies on it).
    if status.get("runStrategy").is_some_and(|s| s != "") || created {
        status.insert("runStrategy".into(), json!(strategy_name));
    }
    if let Some(vmi) = vmi
        && let Some(generation) = vmi
            .pointer(&format!(
                "/metadata/annotations/{}",
                GENERATION_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .and_then(|g| g.parse::<i64>().ok())
    {
        status.insert("observedGeneration".into(), json!(generation));
        status.insert(
            "desiredGeneration".into(),
            vm["metadata"]["generation"].clone(),
        );
    }

    // Start failures: cleared once a VMI of this VM ran, counted once per
    // VMI that failed without ever running.
    let restarting = matches!(strategy_name.as_str(), "Always" | "RerunOnFailure" | "Once");
    if vmi.is_some_and(was_running) || !restarting {
        status.remove("startFailure");
    } else if let Some(vmi) = vmi.filter(|v| is_final(v) && !was_running(v)) {
        let uid = vmi["metadata"]["uid"].as_str().unwrap_or_default();
        let previous = status.get("startFailure").cloned().unwrap_or(Value::Null);
        if previous["lastFailedVMIUID"] != uid {
            let count = previous["consecutiveFailCount"].as_u64().unwrap_or(0) + 1;
            let retry_after = add(now(), start_backoff(count, backoff_base, uid));
            status.insert(
                "startFailure".into(),
                json!({
                    "consecutiveFailCount": count,
                    "lastFailedVMIUID": uid,
                    "retryAfterTimestamp": timestamp(retry_after),
                }),
            );
        }
    }

    // Trim the first state change request once it has been acted on.
    let mut requests = array_at(vm, "/status/stateChangeRequests").to_vec();
    if let Some(first) = requests.first() {
        let trim = match first["action"].as_str() {
            Some("Stop") => {
                vmi.is_none_or(|v| first.get("uid").is_none_or(|u| *u != v["metadata"]["uid"]))
            }
            Some("Start") => vmi.is_some_and(|v| {
                v.pointer("/metadata/deletionTimestamp").is_none() && !is_final(v)
            }),
            _ => false,
        };
        if trim {
            requests.remove(0);
            status.insert("stateChangeRequests".into(), json!(requests));
        }
    }

    // Conditions: Ready from the VMI, Failure from the last sync error, and
    // every other VMI condition copied.
    let mut conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = match (vmi, condition(&vmi_conditions, "Ready")) {
        (None, _) => Cond::new("Ready", "False", "VMINotExists", "VMI does not exist"),
        (Some(_), None) => Cond::new(
            "Ready",
            "False",
            "VMIConditionMissing",
            "VMI is missing the Ready condition",
        ),
        (Some(_), Some(c)) => Cond::new(
            "Ready",
            if c["status"] == "True" {
                "True"
            } else if c["status"] == "False" {
                "False"
            } else {
                "Unknown"
            },
            c["reason"].as_str().unwrap_or(""),
            c["message"].as_str().unwrap_or(""),
        ),
    };
    set_condition(&mut conditions, &ready, "lastProbeTime");
    match sync_error {
        Some((reason, message)) => set_condition(
            &mut conditions,
            &Cond::new("Failure", "True", reason, message),
            "lastProbeTime",
        ),
        None => remove_condition(&mut conditions, "Failure"),
    }
    if vmi.is_some() {
        let ignored = ["Ready", "Failure", "RestartRequired"];
        for c in &vmi_conditions {
            let kind = c["type"].as_str().unwrap_or_default();
            if ignored.contains(&kind) {
                continue;
            }
            let mut copied = c.clone();
            if let Some(existing) = conditions.iter_mut().find(|e| e["type"] == kind) {
                *existing = copied.take();
            } else {
                conditions.push(copied);
            }
        }
        conditions.retain(|c| {
            let kind = c["type"].as_str().unwrap_or_default();
            ignored.contains(&kind) || condition(&vmi_conditions, kind).is_some()
        });
    }
    status.insert("conditions".into(), json!(conditions));

    let with_status = {
        let mut vm = vm.clone();
        vm["status"] = Value::Object(status.clone());
        vm
    };
    status.insert(
        "printableStatus".into(),
        json!(printable_status(&with_status, vmi, dvs, &strategy_name)),
    );
    Value::Object(status)
}

/// `setPrintableStatus`: the first status whose test holds wins, in
/// KubeVirt's order.
fn printable_status(
    vm: &Value,
    vmi: Option<&Value>,
    dvs: &[Value],
    strategy: &str,
) -> &'static str {
    let vmi_conditions = vmi
        .map(|v| array_at(v, "/status/conditions"))
        .unwrap_or_default();
    let synchronized_reason = condition(vmi_conditions, "Synchronized")
        .filter(|c| c["status"] == "False")
        .and_then(|c| c["reason"].as_str());
    let vmi_deleting = vmi.is_some_and(|v| v.pointer("/metadata/deletionTimestamp").is_some());
    let migrating = vmi.is_some_and(|v| {
        v.pointer("/status/migrationState").is_some()
            && v.pointer("/status/migrationState/completed") != Some(&json!(true))
    });
    let dv_error = dvs.iter().any(|dv| {
        str_at(dv, "/status/phase") == Some("Failed")
            || condition(array_at(dv, "/status/conditions"), "Running").is_some_and(|c| {
                c["status"] == "False"
                    && (c["reason"] == "Error" || c["reason"] == "ImagePullFailed")
            })
    });
    let dv_provisioning = dvs.iter().any(|dv| {
        let phase = str_at(dv, "/status/phase").unwrap_or("");
        let bound = condition_is(array_at(dv, "/status/conditions"), "Bound", "True");
        !matches!(phase, "Succeeded" | "PendingPopulation")
            && (bound || phase != "WaitForFirstConsumer")
    });
    let start_failures = vm
        .pointer("/status/startFailure/consecutiveFailCount")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let vmi_phase = vmi.map(phase).unwrap_or("");

    if vm.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if vmi.is_some_and(|v| !is_final(v)) && vmi_deleting {
        "Stopping"
    } else if migrating {
        "Migrating"
    } else if vmi_phase == "Running" {
        "Running"
    } else if dv_error {
        "DataVolumeError"
    } else if condition(vmi_conditions, "PodScheduled")
        .is_some_and(|c| c["status"] == "False" && c["reason"] == "Unschedulable")
    {
        "ErrorUnschedulable"
    } else if dv_provisioning {
        "Provisioning"
    } else if synchronized_reason == Some("ErrImagePull") {
        "ErrImagePull"
    } else if synchronized_reason == Some("ImagePullBackOff") {
        "ImagePullBackOff"
    } else if vmi.is_some_and(|_| matches!(vmi_phase, "" | "Pending" | "Scheduling" | "Scheduled"))
    {
        "Starting"
    } else if vmi.is_none_or(is_final)
        && start_failures > 0
        && matches!(strategy, "Always" | "RerunOnFailure" | "Once")
    {
        "CrashLoopBackOff"
    } else if vmi.is_none_or(is_final) {
        "Stopped"
    } else {
        "Unknown"
    }
}

/// The VMI `SetupVMIFromVM` builds, with the defaults virt-controller adds
/// before creating it.
pub(super) fn desired_vmi(vm: &DynamicObject) -> Value {
    let template = &vm.data["spec"]["template"];
    let mut metadata = template["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    metadata.remove("generateName");
    metadata.remove("creationTimestamp");
    metadata.insert("name".into(), json!(name_of(vm)));
    metadata.insert("namespace".into(), json!(namespace_of(vm)));
    let mut annotations = metadata
        .get("annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    annotations.insert(
        GENERATION_ANNOTATION.into(),
        json!(vm.metadata.generation.unwrap_or(1).to_string()),
    );
    metadata.insert("annotations".into(), Value::Object(annotations));
    metadata.insert(
        "ownerReferences".into(),
        json!([controller_ref(KUBEVIRT_API_VERSION, "VirtualMachine", vm)]),
    );
    // So the VM controller sees every VMI before it goes away.
    metadata.insert("finalizers".into(), json!([VM_CONTROLLER_FINALIZER]));

    let mut spec = template["spec"].clone();
    if !spec.is_object() {
        spec = json!({});
    }
    if spec.pointer("/domain/devices").is_none() {
        spec["domain"]["devices"] = json!({});
    }
    // A stable firmware UUID derived from the name, as
    // setupStableFirmwareUUID does when none is given.
    if spec.pointer("/domain/firmware/uuid").is_none() {
        let hash = format!(
            "{:016x}{:016x}",
            stable_hash(name_of(vm)),
            stable_hash(&format!("{}-fw", name_of(vm)))
        );
        let uuid = format!(
            "{}-{}-{}-{}-{}",
            &hash[0..8],
            &hash[8..12],
            &hash[12..16],
            &hash[16..20],
            &hash[20..32]
        );
        if !spec["domain"]["firmware"].is_object() {
            spec["domain"]["firmware"] = json!({});
        }
        spec["domain"]["firmware"]["uuid"] = json!(uuid);
    }
    // SetDefaultNetworkInterface: a VMI without interfaces and networks gets
    // the pod network with masquerade, unless autoattachPodInterface=false.
    let no_interfaces = array_at(&spec, "/domain/devices/interfaces").is_empty();
    let no_networks = array_at(&spec, "/networks").is_empty();
    let autoattach = spec.pointer("/domain/devices/autoattachPodInterface") != Some(&json!(false));
    if no_interfaces && no_networks && autoattach {
        spec["domain"]["devices"]["interfaces"] = json!([{"name": "default", "masquerade": {}}]);
        spec["networks"] = json!([{"name": "default", "pod": {}}]);
    }
    // SetDefaultVolumeDisk: every volume without a disk gets one.
    let disks: BTreeSet<String> = array_at(&spec, "/domain/devices/disks")
        .iter()
        .filter_map(|d| d["name"].as_str().map(String::from))
        .collect();
    let missing: Vec<Value> = array_at(&spec, "/volumes")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .filter(|name| !disks.contains(*name))
        .map(|name| json!({"name": name}))
        .collect();
    if !missing.is_empty() {
        let mut all = array_at(&spec, "/domain/devices/disks").to_vec();
        all.extend(missing);
        spec["domain"]["devices"]["disks"] = json!(all);
    }

    json!({
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": "VirtualMachineInstance",
        "metadata": metadata,
        "spec": spec,
    })
}

/// A DataVolume from a template, as `CreateDataVolumeManifest` builds it:
/// named exactly like the template, owned by the VM.
fn desired_data_volume(vm: &DynamicObject, template: &Value) -> Value {
    let mut metadata = template["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    metadata.remove("creationTimestamp");
    metadata.insert("namespace".into(), json!(namespace_of(vm)));
    let mut labels = metadata
        .get("labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    labels.insert(CREATED_BY_LABEL.into(), json!(uid_of(vm)));
    metadata.insert("labels".into(), Value::Object(labels));
    let mut annotations = metadata
        .get("annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    annotations.insert(ALLOW_CLAIM_ADOPTION.into(), json!("true"));
    metadata.insert("annotations".into(), Value::Object(annotations));
    metadata.insert(
        "ownerReferences".into(),
        json!([controller_ref(KUBEVIRT_API_VERSION, "VirtualMachine", vm)]),
    );
    let mut spec = template["spec"].clone();
    if let Some(priority) = str_at(&vm.data, "/spec/template/spec/priorityClassName")
        && spec.get("priorityClassName").is_none()
    {
        spec["priorityClassName"] = json!(priority);
    }
    json!({
        "apiVersion": super::resources::CDI_API_VERSION,
        "kind": "DataVolume",
        "metadata": metadata,
        "spec": spec,
    })
}

/// Names of the DataVolumes a VM creates or uses.
fn data_volume_names(vm: &Value) -> BTreeSet<String> {
    let templates = array_at(vm, "/spec/dataVolumeTemplates")
        .iter()
        .filter_map(|t| str_at(t, "/metadata/name"));
    let volumes = array_at(vm, "/spec/template/spec/volumes")
        .iter()
        .filter_map(|v| str_at(v, "/dataVolume/name"));
    templates.chain(volumes).map(String::from).collect()
}

/// A merge patch that turns `old` into `new` at the top level (removed keys
/// become null).
pub(super) fn replace_patch(old: &Value, new: &Value) -> Value {
    let mut patch = new.as_object().cloned().unwrap_or_default();
    for key in old.as_object().into_iter().flat_map(|o| o.keys()) {
        patch.entry(key.clone()).or_insert(Value::Null);
    }
    Value::Object(patch)
}

async fn reconcile(vm: Arc<DynamicObject>, context: Arc<Context>) -> ReconcileResult {
    let namespace = namespace_of(&vm).to_string();
    let name = name_of(&vm).to_string();
    let client = &context.client;
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &vm_resource());
    let vmis: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &vmi_resource());
    let dvs_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &dv_resource());
    let params = PatchParams::apply(&context.manager("virt-controller"));
    let merge = PatchParams {
        field_manager: params.field_manager.clone(),
        ..PatchParams::default()
    };

    // The first write virt-controller does on any VM: record the API version
    // it has seen.
    let observed = annotation(&vm, LATEST_API_VERSION_ANNOTATION) == Some("v1")
        && annotation(&vm, STORAGE_API_VERSION_ANNOTATION) == Some("v1");
    if !observed && !is_deleting(&vm) {
        vms.patch(
            &name,
            &merge,
            &Patch::Merge(json!({"metadata": {"annotations": {
                LATEST_API_VERSION_ANNOTATION: "v1",
                STORAGE_API_VERSION_ANNOTATION: "v1",
            }}})),
        )
        .await?;
        return Ok(Action::await_change());
    }

    // Observe.
    let vmi = vmis.get_opt(&name).await?;
    let vmi =
        vmi.filter(|v| controller_of(v, "VirtualMachine").is_none_or(|uid| uid == uid_of(&vm)));
    let mut data_volumes = Vec::new();
    for dv_name in data_volume_names(&vm.data) {
        if let Some(dv) = dvs_api.get_opt(&dv_name).await? {
            data_volumes.push(dv);
        }
    }

    if is_deleting(&vm) {
        match &vmi {
            None => {
                if has_finalizer(&vm, VM_CONTROLLER_FINALIZER) {
                    remove_finalizer(&vms, &vm, VM_CONTROLLER_FINALIZER, &merge).await?;
                }
                return Ok(Action::await_change());
            }
            Some(vmi) if !is_deleting(vmi) => {
                vmis.delete(&name, &DeleteParams::default()).await?;
            }
            Some(_) => {}
        }
        update_status(&context, &vms, &vm, vmi.as_ref(), &data_volumes, None).await?;
        release_final_vmi(&vmis, vmi.as_ref(), &merge).await?;
        return Ok(Action::await_change());
    }
    if !has_finalizer(&vm, VM_CONTROLLER_FINALIZER) {
        let mut finalizers = vm.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(VM_CONTROLLER_FINALIZER.into());
        vms.patch(
            &name,
            &merge,
            &Patch::Merge(json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": vm.metadata.resource_version,
            }})),
        )
        .await?;
        return Ok(Action::await_change());
    }

    let strategy = run_strategy(&vm.data);
    let mut sync_error: Option<(String, String)> = None;
    let mut current_vmi = vmi.clone();
    let mut requeue = None;

    // DataVolumes first: virt-controller creates them up front and starts
    // the VMI only once they have been populated (no WaitForFirstConsumer
    // here, so every DataVolume must reach Succeeded).
    let mut volumes_ready = true;
    for template in array_at(&vm.data, "/spec/dataVolumeTemplates") {
        let Some(dv_name) = str_at(template, "/metadata/name") else {
            continue;
        };
        match data_volumes.iter().find(|dv| name_of(dv) == dv_name) {
            None => {
                volumes_ready = false;
                let desired: DynamicObject =
                    serde_json::from_value(desired_data_volume(&vm, template))
                        .context("build DataVolume")?;
                match dvs_api.create(&PostParams::default(), &desired).await {
                    Ok(created) => data_volumes.push(created),
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(error) => {
                        sync_error = Some((
                            FAILED_CREATE.into(),
                            format!(
                                "Error encountered while creating DataVolumes: failed to create DataVolume: {error}"
                            ),
                        ));
                    }
                }
            }
            Some(dv) => {
                let phase = str_at(&dv.data, "/status/phase").unwrap_or("");
                if !matches!(
                    phase,
                    "Succeeded" | "WaitForFirstConsumer" | "PendingPopulation"
                ) {
                    volumes_ready = false;
                }
            }
        }
    }

    let vm_value = to_value(&vm);
    let vmi_value = vmi.as_ref().map(to_value);
    let action = match &strategy {
        Err(message) => {
            sync_error = Some((FAILED_CREATE.into(), message.clone()));
            RunAction::Nothing
        }
        Ok(strategy) if volumes_ready || strategy == "Halted" => {
            decide_run(strategy, &vm_value, vmi_value.as_ref())
        }
        Ok(_) => RunAction::Nothing,
    };
    match action {
        RunAction::Nothing => {}
        RunAction::Start => {
            let left = start_backoff_left(&vm_value);
            if left > Duration::ZERO {
                requeue = Some(left);
            } else {
                let desired: DynamicObject =
                    serde_json::from_value(desired_vmi(&vm)).context("build VMI")?;
                match vmis.create(&PostParams::default(), &desired).await {
                    Ok(created) => current_vmi = Some(created),
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        requeue = Some(Duration::from_millis(200));
                    }
                    Err(error) => {
                        sync_error = Some((
                            FAILED_CREATE.into(),
                            format!("Failure while starting VMI: {error}"),
                        ));
                    }
                }
            }
        }
        RunAction::Stop | RunAction::StopAndRequestStart => {
            match vmis.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(error) if is_status(&error, 404) => {}
                Err(error) => return Err(error.into()),
            }
            if action == RunAction::StopAndRequestStart {
                let mut requests = array_at(&vm.data, "/status/stateChangeRequests").to_vec();
                requests.push(json!({"action": "Start"}));
                vms.patch_status(
                    &name,
                    &merge,
                    &Patch::Merge(json!({"status": {"stateChangeRequests": requests}})),
                )
                .await?;
                return Ok(Action::await_change());
            }
        }
    }

    let vm_now = update_status(
        &context,
        &vms,
        &vm,
        current_vmi.as_ref(),
        &data_volumes,
        sync_error.as_ref(),
    )
    .await?;

    release_final_vmi(&vmis, current_vmi.as_ref(), &merge).await?;
    if let Some(left) = Some(start_backoff_left(&vm_now)).filter(|d| !d.is_zero()) {
        requeue = Some(requeue.map_or(left, |r: Duration| r.min(left)));
    }
    Ok(match requeue {
        Some(after) => requeue_in(after),
        None if sync_error.is_some() => requeue_in(Duration::from_secs(2)),
        None => Action::await_change(),
    })
}

async fn update_status(
    context: &Context,
    vms: &Api<DynamicObject>,
    vm: &DynamicObject,
    vmi: Option<&DynamicObject>,
    data_volumes: &[DynamicObject],
    sync_error: Option<&(String, String)>,
) -> Result<Value, super::resources::ReconcileError> {
    let vm_value = to_value(vm);
    let referenced: BTreeSet<String> = array_at(&vm.data, "/spec/template/spec/volumes")
        .iter()
        .filter_map(|v| str_at(v, "/dataVolume/name"))
        .map(String::from)
        .collect();
    let dvs: Vec<Value> = data_volumes
        .iter()
        .filter(|dv| referenced.contains(name_of(dv)))
        .map(to_value)
        .collect();
    let vmi_value = vmi.map(to_value);
    let status = desired_status(
        &vm_value,
        vmi_value.as_ref(),
        &dvs,
        &run_strategy(&vm.data),
        sync_error,
        context.config.start_backoff_base,
    );
    let mut updated = vm_value.clone();
    if status != vm.data["status"] {
        let patch = json!({"status": replace_patch(&vm.data["status"], &status)});
        let params = PatchParams {
            field_manager: Some(context.manager("virt-controller")),
            ..PatchParams::default()
        };
        vms.patch_status(name_of(vm), &params, &Patch::Merge(patch))
            .await?;
        updated["status"] = status;
    }
    Ok(updated)
}

/// Once the VM status has recorded a final VMI, the VM controller lets it
/// go (as `updateStatus` does, whether or not the VM is being deleted).
async fn release_final_vmi(
    vmis: &Api<DynamicObject>,
    vmi: Option<&DynamicObject>,
    params: &PatchParams,
) -> Result<(), kube::Error> {
    match vmi {
        Some(vmi) if is_final(&vmi.data) && has_finalizer(vmi, VM_CONTROLLER_FINALIZER) => {
            remove_finalizer(vmis, vmi, VM_CONTROLLER_FINALIZER, params).await
        }
        _ => Ok(()),
    }
}

/// Removes one finalizer, guarded by the resourceVersion so a concurrent
/// change is not lost.
pub(super) async fn remove_finalizer(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    finalizer: &str,
    params: &PatchParams,
) -> Result<(), kube::Error> {
    let remaining: Vec<String> = object
        .metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    match api
        .patch(
            name_of(object),
            params,
            &Patch::Merge(json!({"metadata": {
                "finalizers": remaining,
                "resourceVersion": object.metadata.resource_version,
            }})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if is_status(&error, 404) => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": "vm", "generation": 1}, "spec": spec, "status": status})
    }

    fn vmi(phase: &str) -> Value {
        json!({"metadata": {"uid": "u1", "annotations": {GENERATION_ANNOTATION: "1"}},
               "status": {"phase": phase}})
    }

    #[test]
    fn run_strategies_follow_kubevirt() {
        assert_eq!(
            run_strategy(&json!({"spec": {"running": true}})),
            Ok("Always".into())
        );
        assert_eq!(run_strategy(&json!({"spec": {}})), Ok("Halted".into()));
        assert!(
            run_strategy(&json!({"spec": {"running": true, "runStrategy": "Always"}})).is_err()
        );

        let always = vm(json!({"runStrategy": "Always"}), json!({}));
        assert_eq!(decide_run("Always", &always, None), RunAction::Start);
        assert_eq!(
            decide_run("Always", &always, Some(&vmi("Running"))),
            RunAction::Nothing
        );
        assert_eq!(
            decide_run("Always", &always, Some(&vmi("Failed"))),
            RunAction::Stop
        );
        assert_eq!(decide_run("Halted", &always, None), RunAction::Nothing);
        assert_eq!(
            decide_run("Halted", &always, Some(&vmi("Running"))),
            RunAction::Stop
        );
        assert_eq!(
            decide_run("Once", &always, Some(&vmi("Succeeded"))),
            RunAction::Nothing
        );
        assert_eq!(decide_run("Once", &always, None), RunAction::Start);
        assert_eq!(decide_run("Manual", &always, None), RunAction::Nothing);
        let start = vm(
            json!({}),
            json!({"stateChangeRequests": [{"action": "Start"}]}),
        );
        assert_eq!(decide_run("Manual", &start, None), RunAction::Start);
        assert_eq!(
            decide_run("RerunOnFailure", &always, Some(&vmi("Failed"))),
            RunAction::StopAndRequestStart
        );
        assert_eq!(
            decide_run("RerunOnFailure", &always, Some(&vmi("Succeeded"))),
            RunAction::Stop
        );
        let ran = vm(json!({}), json!({"runStrategy": "RerunOnFailure"}));
        assert_eq!(decide_run("RerunOnFailure", &ran, None), RunAction::Nothing);
    }

    #[test]
    fn printable_status_follows_kubevirt_precedence() {
        let always = vm(json!({"runStrategy": "Always"}), json!({}));
        let status = |vmi: Option<&Value>, dvs: &[Value]| {
            desired_status(
                &always,
                vmi,
                dvs,
                &Ok("Always".into()),
                None,
                Duration::from_secs(1),
            )
        };
        assert_eq!(status(None, &[])["printableStatus"], "Stopped");
        assert_eq!(
            status(Some(&vmi("Scheduling")), &[])["printableStatus"],
            "Starting"
        );
        let mut running = vmi("Running");
        running["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        let s = status(Some(&running), &[]);
        assert_eq!(s["printableStatus"], "Running");
        assert_eq!(s["ready"], true);
        assert_eq!(s["created"], true);
        assert_eq!(s["runStrategy"], "Always");
        let importing = json!({"status": {"phase": "ImportInProgress",
            "conditions": [{"type": "Bound", "status": "True"}]}});
        assert_eq!(
            status(None, &[importing])["printableStatus"],
            "Provisioning"
        );
        let failing = json!({"status": {"phase": "ImportInProgress",
            "conditions": [{"type": "Running", "status": "False", "reason": "Error"}]}});
        assert_eq!(
            status(None, &[failing])["printableStatus"],
            "DataVolumeError"
        );
        let mut unschedulable = vmi("Scheduling");
        unschedulable["status"]["conditions"] =
            json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]);
        let s = status(Some(&unschedulable), &[]);
        assert_eq!(s["printableStatus"], "ErrorUnschedulable");
        assert!(condition(s["conditions"].as_array().unwrap(), "PodScheduled").is_some());
        let s = status(None, &[]);
        assert_eq!(
            condition(s["conditions"].as_array().unwrap(), "Ready").unwrap()["reason"],
            "VMINotExists"
        );
    }

    #[test]
    fn early_failures_start_the_back_off() {
        let always = vm(json!({"runStrategy": "Always"}), json!({}));
        let failed = vmi("Failed");
        let s = desired_status(
            &always,
            Some(&failed),
            &[],
            &Ok("Always".into()),
            None,
            Duration::from_secs(1),
        );
        assert_eq!(s["startFailure"]["consecutiveFailCount"], 1);
        assert_eq!(s["printableStatus"], "CrashLoopBackOff");
        let again = vm(json!({"runStrategy": "Always"}), s.clone());
        let s2 = desired_status(
            &again,
            Some(&failed),
            &[],
            &Ok("Always".into()),
            None,
            Duration::from_secs(1),
        );
        assert_eq!(
            s2["startFailure"]["consecutiveFailCount"], 1,
            "counted once per VMI"
        );
        let mut ran = vmi("Failed");
        ran["status"]["phaseTransitionTimestamps"] = json!([{"phase": "Running"}]);
        let s3 = desired_status(
            &again,
            Some(&ran),
            &[],
            &Ok("Always".into()),
            None,
            Duration::from_secs(1),
        );
        assert!(s3.get("startFailure").is_none());
    }

    #[test]
    fn vmi_gets_template_metadata_and_default_network() {
        let vm: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "w1", "namespace": "ns", "uid": "vm-uid", "generation": 3},
            "spec": {"template": {
                "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
                "spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {}}]}},
                         "volumes": [{"name": "root", "dataVolume": {"name": "w1-boot"}},
                                     {"name": "cloudinit", "cloudInitConfigDrive": {}}]}}},
        }))
        .unwrap();
        let vmi = desired_vmi(&vm);
        assert_eq!(vmi["metadata"]["name"], "w1");
        assert_eq!(vmi["metadata"]["labels"]["app"], "x");
        assert_eq!(vmi["metadata"]["annotations"]["a"], "b");
        assert_eq!(vmi["metadata"]["annotations"][GENERATION_ANNOTATION], "3");
        assert_eq!(vmi["metadata"]["ownerReferences"][0]["uid"], "vm-uid");
        assert_eq!(vmi["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(vmi["spec"]["networks"][0]["pod"], json!({}));
        assert_eq!(
            vmi["spec"]["domain"]["devices"]["interfaces"][0]["name"],
            "default"
        );
        assert_eq!(
            vmi["spec"]["domain"]["devices"]["disks"][1]["name"],
            "cloudinit"
        );
    }
}
