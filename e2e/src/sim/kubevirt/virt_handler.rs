//! A VMI's life as virt-controller's VMI controller and virt-handler write
//! it: `Pending` → `Scheduling` (virt-launcher pod created) → `Scheduled`
//! (pod ready on a node) → `Running` (domain up), with the conditions, node
//! name, interfaces and guest info KubeVirt reports; `Failed`/`Succeeded` on
//! crash, eviction or shutdown; and deletion held back by the VMI's
//! finalizers while the guest shuts down.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::{Map, Value, json};

use super::annotations as keys;
use super::faults::VmiFaults;
use super::resources::{
    Cond, Context, KUBEVIRT_API_VERSION, NODE_NAME_LABEL, ReconcileResult, VM_CONTROLLER_FINALIZER,
    VMI_FINALIZER, add, annotation, array_at, condition, controller_of, controller_ref,
    dv_resource, error_requeue, from_k8s, is_deleting, migration_resource, name_of, namespace_of,
    now, parse_time, remove_condition, requeue_in, set_condition, stable_hash, str_at, to_value,
    uid_of, until, vm_resource, vmi_resource,
};
use super::virt_controller::replace_patch;

pub(super) const DEFAULT_UNSCHEDULABLE: &str = "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.";
/// Label and annotation virt-controller's evacuation controller puts on the
/// migrations it creates for a drained node.
pub(super) const EVACUATION_ANNOTATION: &str = "kubevirt.io/evacuationMigration";
pub(super) const MIGRATION_VMI_LABEL: &str = "kubevirt.io/vmi-name";

pub(super) async fn run(context: Arc<Context>) {
    let client = context.client.clone();
    let controller = Controller::new_with(
        Api::<DynamicObject>::all_with(client.clone(), &vmi_resource()),
        watcher::Config::default(),
        vmi_resource(),
    )
    // Faults on the VM apply to its VMI (same name).
    .watches_with(
        Api::<DynamicObject>::all_with(client.clone(), &vm_resource()),
        vm_resource(),
        watcher::Config::default(),
        |vm| {
            let namespace = vm.metadata.namespace.clone().unwrap_or_default();
            vm.metadata
                .name
                .map(|name| ObjectRef::new_with(&name, vmi_resource()).within(&namespace))
        },
    )
    // DataVolumesReady follows the DataVolumes a VMI uses.
    .watches_with(
        Api::<DynamicObject>::all_with(client, &dv_resource()),
        dv_resource(),
        watcher::Config::default(),
        |dv| {
            let namespace = dv.metadata.namespace.clone().unwrap_or_default();
            dv.metadata
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .filter(|o| o.kind == "VirtualMachine")
                .map(move |o| ObjectRef::new_with(&o.name, vmi_resource()).within(&namespace))
        },
    )
    .with_config(ControllerConfig::default().concurrency(8))
    .reconcile_all_on(context.faults.changes());
    super::drive(
        "virt-handler",
        controller.run(reconcile, |_, _, _| error_requeue(), context),
    )
    .await;
}

/// Phase transition timestamps carry milliseconds, so that steps shorter
/// than a second are paced correctly (Go's `metav1.Time` parses them too).
fn precise(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// What a reconcile changes on a VMI.
struct Update {
    status: Map<String, Value>,
    labels: Map<String, Value>,
    annotations: Map<String, Value>,
    finalizers: Vec<String>,
    requeue: Option<Duration>,
}

impl Update {
    fn phase(&self) -> &str {
        self.status
            .get("phase")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn set_phase(&mut self, phase: &str) {
        if self.phase() == phase {
            return;
        }
        self.status.insert("phase".into(), json!(phase));
        let mut stamps = self
            .status
            .get("phaseTransitionTimestamps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        stamps.push(json!({"phase": phase, "phaseTransitionTimestamp": precise(now())}));
        self.status
            .insert("phaseTransitionTimestamps".into(), json!(stamps));
    }

    /// When the current phase began.
    fn phase_since(&self, fallback: DateTime<Utc>) -> DateTime<Utc> {
        self.status
            .get("phaseTransitionTimestamps")
            .and_then(Value::as_array)
            .and_then(|s| s.last())
            .and_then(|s| parse_time(&s["phaseTransitionTimestamp"]))
            .unwrap_or(fallback)
    }

    fn conditions(&self) -> Vec<Value> {
        self.status
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    fn set(&mut self, cond: Cond) {
        let mut conditions = self.conditions();
        set_condition(&mut conditions, &cond, "lastProbeTime");
        self.status.insert("conditions".into(), json!(conditions));
    }

    fn unset(&mut self, kind: &str) {
        let mut conditions = self.conditions();
        remove_condition(&mut conditions, kind);
        self.status.insert("conditions".into(), json!(conditions));
    }

    fn remove_finalizer(&mut self, finalizer: &str) {
        self.finalizers.retain(|f| f != finalizer);
    }

    fn wait(&mut self, after: Duration) {
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }
}

fn ready(status: &'static str, reason: &str, message: &str) -> Cond {
    Cond::new("Ready", status, reason, message)
}

fn pod_terminating() -> Cond {
    ready(
        "False",
        "PodTerminating",
        "virt-launcher pod is terminating",
    )
}

fn guest_not_running() -> Cond {
    ready(
        "False",
        "GuestNotRunning",
        "Guest VM is not reported as running",
    )
}

fn container_disk_images(vmi: &Value) -> Vec<String> {
    array_at(vmi, "/spec/volumes")
        .iter()
        .filter_map(|v| str_at(v, "/containerDisk/image"))
        .map(String::from)
        .collect()
}

pub(super) fn node_for(context: &Context, vmi: &DynamicObject, avoid: Option<&str>) -> String {
    let nodes = &context.config.nodes;
    let start = (stable_hash(uid_of(vmi)) % nodes.len() as u64) as usize;
    (0..nodes.len())
        .map(|i| nodes[(start + i) % nodes.len()].clone())
        .find(|n| Some(n.as_str()) != avoid)
        .unwrap_or_else(|| nodes[start].clone())
}

/// A pod UID for `status.activePods`, stable per VMI and attempt.
pub(super) fn pod_uid(seed: &str) -> String {
    let hash = format!(
        "{:016x}{:016x}",
        stable_hash(seed),
        stable_hash(&format!("{seed}/pod"))
    );
    format!(
        "{}-{}-{}-{}-{}",
        &hash[0..8],
        &hash[8..12],
        &hash[12..16],
        &hash[16..20],
        &hash[20..32]
    )
}

/// `LiveMigratable` as virt-handler computes it for the cases here: every
/// PVC must be shared (ReadWriteMany).
async fn live_migratable(context: &Context, vmi: &DynamicObject) -> anyhow::Result<Cond> {
    let namespace = namespace_of(vmi);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), namespace);
    for volume in array_at(&vmi.data, "/spec/volumes") {
        let claim = str_at(volume, "/dataVolume/name")
            .or_else(|| str_at(volume, "/persistentVolumeClaim/claimName"));
        let Some(claim) = claim else { continue };
        let shared = pvcs
            .get_opt(claim)
            .await?
            .and_then(|pvc| pvc.spec)
            .and_then(|spec| spec.access_modes)
            .map(|modes| modes.iter().any(|m| m == "ReadWriteMany"));
        match shared {
            Some(true) => {}
            Some(false) => {
                return Ok(Cond::new(
                    "LiveMigratable",
                    "False",
                    "DisksNotLiveMigratable",
                    &format!(
                        "cannot migrate VMI: PVC {claim} is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
                    ),
                ));
            }
            None => {
                return Ok(Cond::new(
                    "LiveMigratable",
                    "False",
                    "DisksNotLiveMigratable",
                    &format!(
                        "cannot migrate VMI: Unable to determine if PVC {claim} is shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
                    ),
                ));
            }
        }
    }
    Ok(Cond::new("LiveMigratable", "True", "", ""))
}

/// `DataVolumesReady` from the Ready condition of every DataVolume the VMI
/// uses (`aggregateDataVolumesConditions`).
async fn data_volumes_ready(
    context: &Context,
    vmi: &DynamicObject,
) -> anyhow::Result<Option<Cond>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(context.client.clone(), namespace_of(vmi), &dv_resource());
    let mut any = false;
    let mut status = "True";
    for volume in array_at(&vmi.data, "/spec/volumes") {
        let Some(name) = str_at(volume, "/dataVolume/name") else {
            continue;
        };
        let Some(dv) = api.get_opt(name).await? else {
            continue;
        };
        any = true;
        let ready = condition(array_at(&dv.data, "/status/conditions"), "Ready")
            .and_then(|c| c["status"].as_str())
            .unwrap_or("Unknown");
        if ready == "False" {
            status = "False";
        } else if ready != "True" && status == "True" {
            status = "Unknown";
        }
    }
    Ok(any.then(|| {
        if status == "True" {
            Cond::new(
                "DataVolumesReady",
                "True",
                "AllDVsReady",
                "All of the VMI's DVs are bound and ready",
            )
        } else {
            Cond::new(
                "DataVolumesReady",
                status,
                "NotAllDVsReady",
                "Not all of the VMI's DVs are ready",
            )
        }
    }))
}

fn mac_for(vmi: &DynamicObject, interface: &str) -> String {
    let hash = stable_hash(&format!("{}/{interface}", uid_of(vmi)));
    let bytes = hash.to_be_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4]
    )
}

/// `status.interfaces`: one entry per interface of the VMI spec, each with
/// an address from the pool.
fn interfaces(context: &Context, vmi: &DynamicObject, agent: bool) -> anyhow::Result<Vec<Value>> {
    let mut result = Vec::new();
    for (index, interface) in array_at(&vmi.data, "/spec/domain/devices/interfaces")
        .iter()
        .enumerate()
    {
        let name = interface["name"].as_str().unwrap_or("default");
        // The first interface's address is where an SSH guest listens.
        let ip = if index == 0 && context.guests.enabled() {
            context.guests.claim_address(&context.ips)?
        } else {
            context.ips.allocate()?
        }
        .to_string();
        let mac = interface["macAddress"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| mac_for(vmi, name));
        let pod_interface = if index == 0 {
            "eth0".to_string()
        } else {
            format!("pod{:x}", stable_hash(name) & 0xfff_ffff)
        };
        result.push(json!({
            "name": name,
            "interfaceName": format!("eth{index}"),
            "ipAddress": ip,
            "ipAddresses": [ip],
            "mac": mac,
            "infoSource": if agent { "domain, guest-agent, multus-status" } else { "domain, multus-status" },
            "linkState": "up",
            "podInterfaceName": pod_interface,
            "queueCount": 1,
        }));
    }
    Ok(result)
}

async fn reconcile(vmi: Arc<DynamicObject>, context: Arc<Context>) -> ReconcileResult {
    let namespace = namespace_of(&vmi).to_string();
    let name = name_of(&vmi).to_string();
    let client = &context.client;
    let vmis: Api<DynamicObject> =
        Api::namespaced_with(context.handler.clone(), &namespace, &vmi_resource());
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &vm_resource());
    let owner_uid = controller_of(&vmi, "VirtualMachine").map(String::from);
    let vm = match &owner_uid {
        Some(uid) => vms.get_opt(&name).await?.filter(|vm| uid_of(vm) == uid),
        None => None,
    };
    let faults = context.faults.for_vmi(&vmi, vm.as_ref());
    let value = to_value(&vmi);
    let created = vmi
        .metadata
        .creation_timestamp
        .as_ref()
        .map(from_k8s)
        .unwrap_or_else(now);

    let mut update = Update {
        status: value["status"].as_object().cloned().unwrap_or_default(),
        labels: value["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default(),
        annotations: Map::new(),
        finalizers: vmi.metadata.finalizers.clone().unwrap_or_default(),
        requeue: None,
    };
    let before = (
        update.status.clone(),
        update.labels.clone(),
        update.finalizers.clone(),
    );
    step(
        &context,
        &vmi,
        &value,
        vm.as_ref(),
        &faults,
        created,
        &mut update,
    )
    .await?;

    let changed = before.0 != update.status
        || before.1 != update.labels
        || before.2 != update.finalizers
        || !update.annotations.is_empty();
    if changed && context.real_controller {
        // A whole-object update, as virt-handler writes: a merge patch would
        // drop the null timestamps virt-controller's conditions carry, and
        // its JSON patches test the conditions as it wrote them.
        let mut object = (*vmi).clone();
        object.data["status"] = json!(update.status);
        object.metadata.labels = Some(
            update
                .labels
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect(),
        );
        object.metadata.finalizers = Some(update.finalizers.clone());
        if let Some(annotations) = object.metadata.annotations.as_mut() {
            for (key, value) in &update.annotations {
                match value.as_str() {
                    Some(text) => {
                        annotations.insert(key.clone(), text.to_string());
                    }
                    None => {
                        annotations.remove(key);
                    }
                }
            }
        }
        let params = PostParams {
            field_manager: Some(context.manager("virt-handler")),
            ..PostParams::default()
        };
        match vmis.replace(&name, &params, &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            Err(error) => return Err(error.into()),
        }
    } else if changed {
        let mut metadata = json!({"resourceVersion": vmi.metadata.resource_version});
        if before.1 != update.labels {
            metadata["labels"] = json!(replace_patch(&json!(before.1), &json!(update.labels)));
        }
        if before.2 != update.finalizers {
            metadata["finalizers"] = json!(update.finalizers);
        }
        if !update.annotations.is_empty() {
            metadata["annotations"] = json!(update.annotations);
        }
        let patch = json!({
            "metadata": metadata,
            "status": replace_patch(&value["status"], &json!(update.status)),
        });
        let params = PatchParams {
            field_manager: Some(context.manager("virt-handler")),
            ..PatchParams::default()
        };
        match vmis.patch(&name, &params, &Patch::Merge(patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            Err(error) => return Err(error.into()),
        }
    }
    Ok(match update.requeue {
        Some(after) => requeue_in(after),
        None => Action::await_change(),
    })
}

/// Moves a VMI one step along its life.
async fn step(
    context: &Context,
    vmi: &DynamicObject,
    value: &Value,
    vm: Option<&DynamicObject>,
    faults: &VmiFaults,
    created: DateTime<Utc>,
    update: &mut Update,
) -> anyhow::Result<()> {
    let config = &context.config;
    let phase = update.phase().to_string();
    let since = update.phase_since(created);
    let step_due = add(since, config.step);

    // Final: the launcher pod is gone, so the VMI controller drops its
    // finalizer; without an owner VM nobody else will drop the VM
    // controller's.
    if matches!(phase.as_str(), "Failed" | "Succeeded") {
        context.guests.stop(vmi);
        if context.real_controller {
            // virt-controller drops the finalizers once the pod is gone.
            return Ok(());
        }
        update.remove_finalizer(VMI_FINALIZER);
        update.status.remove("launcherContainerImageVersion");
        if vm.is_none() {
            update.remove_finalizer(VM_CONTROLLER_FINALIZER);
        }
        return Ok(());
    }

    if let Some(deleted) = vmi.metadata.deletion_timestamp.as_ref().map(from_k8s) {
        // The guest is shutting down: sshd is among the first to go.
        context.guests.stop(vmi);
        match phase.as_str() {
            // virt-controller's: it deletes the pod and ends the VMI.
            "" | "Pending" | "Scheduling" if context.real_controller => {}
            // No guest yet: the launcher pod just goes.
            "" | "Pending" | "Scheduling" => {
                update.set(pod_terminating());
                update.set_phase("Failed");
            }
            _ => {
                let grace = faults.shutdown_grace.unwrap_or(config.shutdown_grace);
                update.set(pod_terminating());
                let done = add(deleted, grace);
                if now() >= done {
                    // A graceful ACPI shutdown ends in Succeeded.
                    update.set_phase("Succeeded");
                } else {
                    update.wait(until(done));
                }
            }
        }
        return Ok(());
    }

    // One-shot requests on the VMI itself.
    if annotation(vmi, keys::FAIL).is_some() {
        context.guests.stop(vmi);
        update.set(pod_terminating());
        update.set_phase("Failed");
        return Ok(());
    }
    if annotation(vmi, keys::SHUTDOWN).is_some()
        && matches!(phase.as_str(), "Scheduled" | "Running")
    {
        context.guests.stop(vmi);
        update.set(pod_terminating());
        update.set_phase("Succeeded");
        return Ok(());
    }

    match phase.as_str() {
        // virt-controller's, with the launcher pod bound and run by the
        // kubelet part (`kubelet.rs`).
        "" | "Pending" | "Scheduling" if context.real_controller => {}
        "" => {
            if !update.finalizers.iter().any(|f| f == VMI_FINALIZER) {
                update.finalizers.push(VMI_FINALIZER.into());
            }
            update.set(ready(
                "False",
                "PodNotExists",
                "virt-launcher pod has not yet been scheduled",
            ));
            if let Some(cond) = data_volumes_ready(context, vmi).await? {
                update.set(cond);
            }
            update.set_phase("Pending");
            update.wait(config.step);
        }
        "Pending" => {
            if let Some(cond) = data_volumes_ready(context, vmi).await? {
                update.set(cond);
            }
            if now() < step_due {
                update.wait(until(step_due));
                return Ok(());
            }
            update.set(guest_not_running());
            update.set_phase("Scheduling");
            update.wait(config.step);
        }
        "Scheduling" => {
            // The scheduler copies its verdict into the VMI as PodScheduled.
            if let Some(message) = &faults.unschedulable {
                update.set(Cond::new(
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    message.as_deref().unwrap_or(DEFAULT_UNSCHEDULABLE),
                ));
                return Ok(());
            }
            update.unset("PodScheduled");
            let images = container_disk_images(value);
            if let (Some(message), Some(image)) = (&faults.image_pull, images.first()) {
                let synchronized = condition(&update.conditions(), "Synchronized").cloned();
                let failing_since = synchronized
                    .as_ref()
                    .and_then(|c| parse_time(&c["lastTransitionTime"]))
                    .unwrap_or_else(now);
                let back_off_at = add(failing_since, config.image_pull_backoff);
                let was_back_off = synchronized
                    .as_ref()
                    .is_some_and(|c| c["reason"] == "ImagePullBackOff");
                if was_back_off || now() >= back_off_at {
                    update.set(Cond::new(
                        "Synchronized",
                        "False",
                        "ImagePullBackOff",
                        &format!("Back-off pulling image \"{image}\""),
                    ));
                } else {
                    let message = message.clone().unwrap_or_else(|| {
                        format!("rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": not found")
                    });
                    update.set(Cond::new("Synchronized", "False", "ErrImagePull", &message));
                    update.wait(until(back_off_at));
                }
                return Ok(());
            }
            if condition(&update.conditions(), "Synchronized")
                .is_some_and(|c| c["reason"] == "ErrImagePull" || c["reason"] == "ImagePullBackOff")
            {
                update.unset("Synchronized");
            }
            if now() < step_due {
                update.wait(until(step_due));
                return Ok(());
            }
            let node = node_for(context, vmi, None);
            let pod = pod_uid(uid_of(vmi));
            update
                .labels
                .insert(NODE_NAME_LABEL.into(), json!(node.clone()));
            update.status.insert("nodeName".into(), json!(node.clone()));
            update
                .status
                .insert("activePods".into(), json!({ pod: node }));
            update.status.insert("qosClass".into(), json!("Burstable"));
            update
                .status
                .insert("migrationTransport".into(), json!("Unix"));
            update.status.insert(
                "launcherContainerImageVersion".into(),
                json!(config.launcher_image),
            );
            update.set_phase("Scheduled");
            update.wait(config.step);
        }
        "Scheduled" => {
            if now() < step_due {
                update.wait(until(step_due));
                return Ok(());
            }
            if faults.fail_at_start {
                // virt-launcher exits before the domain starts.
                update.set(pod_terminating());
                update.set_phase("Failed");
                return Ok(());
            }
            let agent = config.guest_agent && !faults.hung_guest;
            update
                .status
                .insert("interfaces".into(), json!(interfaces(context, vmi, agent)?));
            let cpu = &value["spec"]["domain"]["cpu"];
            update.status.insert(
                "currentCPUTopology".into(),
                json!({
                    "cores": cpu["cores"].as_u64().unwrap_or(1),
                    "sockets": cpu["sockets"].as_u64().unwrap_or(1),
                    "threads": cpu["threads"].as_u64().unwrap_or(1),
                }),
            );
            update.set_phase("Running");
            running(context, vmi, faults, update).await?;
        }
        "Running" => {
            if update.status.get("interfaces").is_none() {
                let agent = config.guest_agent && !faults.hung_guest;
                update
                    .status
                    .insert("interfaces".into(), json!(interfaces(context, vmi, agent)?));
            }
            running(context, vmi, faults, update).await?;
            if annotation(vmi, keys::EVICT).is_some() {
                evict(context, vmi, update).await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// What virt-handler keeps reporting while the domain runs.
async fn running(
    context: &Context,
    vmi: &DynamicObject,
    faults: &VmiFaults,
    update: &mut Update,
) -> anyhow::Result<()> {
    let agent = context.config.guest_agent && !faults.hung_guest;
    update.set(live_migratable(context, vmi).await?);
    if agent {
        if condition(&update.conditions(), "AgentConnected").is_none() {
            update.set(Cond::new("AgentConnected", "True", "", ""));
        }
        update
            .status
            .insert("guestOSInfo".into(), context.config.guest_os.clone());
    } else {
        update.unset("AgentConnected");
        update.status.insert("guestOSInfo".into(), json!({}));
    }
    if context.real_controller {
        // virt-controller copies the pod's readiness into the VMI (the
        // kubelet part keeps a hung guest's compute container unready).
        if !faults.hung_guest {
            context
                .guests
                .ensure_running(&context.client, vmi, &update.status, faults)
                .await;
        }
    } else if faults.hung_guest {
        // The compute container's readiness never passes, so the pod (and
        // hence the VMI) is not Ready.
        update.set(ready(
            "False",
            "ContainersNotReady",
            "containers with unready status: [compute]",
        ));
    } else {
        update.set(ready("True", "", ""));
        // A booted guest: cloud-init's users and sshd (SSH guests only).
        context
            .guests
            .ensure_running(&context.client, vmi, &update.status, faults)
            .await;
    }
    Ok(())
}

/// A drain of the VMI's node, per its eviction strategy.
async fn evict(context: &Context, vmi: &DynamicObject, update: &mut Update) -> anyhow::Result<()> {
    // One-shot: the request annotation goes with this update.
    update.annotations.insert(keys::EVICT.into(), Value::Null);
    let strategy = str_at(&vmi.data, "/spec/evictionStrategy")
        .map(String::from)
        .unwrap_or_else(|| context.config.default_eviction_strategy.clone());
    let migratable =
        condition(&update.conditions(), "LiveMigratable").is_some_and(|c| c["status"] == "True");
    let node = update
        .status
        .get("nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mark_evacuation = |update: &mut Update| {
        update
            .status
            .insert("evacuationNodeName".into(), json!(node.clone()));
        // virt-controller's VMI controller reports the mark as a condition.
        update.set(Cond::new(
            "EvictionRequested",
            "True",
            "EvictionRequested",
            "VMI is marked for eviction",
        ));
    };
    match (strategy.as_str(), migratable) {
        ("External", _) | ("LiveMigrate", false) => mark_evacuation(update),
        ("LiveMigrate" | "LiveMigrateIfPossible", true) => {
            mark_evacuation(update);
            let migrations: Api<DynamicObject> = Api::namespaced_with(
                context.client.clone(),
                namespace_of(vmi),
                &migration_resource(),
            );
            let migration: DynamicObject = serde_json::from_value(json!({
                "apiVersion": KUBEVIRT_API_VERSION,
                "kind": "VirtualMachineInstanceMigration",
                "metadata": {
                    "name": format!("kubevirt-evacuation-{}", &pod_uid(&format!("{}/{node}", uid_of(vmi)))[..5]),
                    "namespace": namespace_of(vmi),
                    "labels": {MIGRATION_VMI_LABEL: name_of(vmi)},
                    "annotations": {EVACUATION_ANNOTATION: node},
                    "ownerReferences": [controller_ref(KUBEVIRT_API_VERSION, "VirtualMachineInstance", vmi)],
                },
                "spec": {"vmiName": name_of(vmi)},
            }))?;
            match migrations.create(&PostParams::default(), &migration).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(error) => return Err(error.into()),
            }
        }
        // Evicting the virt-launcher pod kills the guest.
        _ => {
            update.set(pod_terminating());
            update.set_phase("Failed");
        }
    }
    Ok(())
}

/// Moves a VMI to `target` as a completed live migration does.
pub(super) fn migrated_status(
    status: &Map<String, Value>,
    source: &str,
    target: &str,
    migration_uid: &str,
    started: &str,
) -> Map<String, Value> {
    let mut status = status.clone();
    let finished = now().to_rfc3339_opts(SecondsFormat::Secs, true);
    status.insert("nodeName".into(), json!(target));
    status.insert(
        "activePods".into(),
        json!({ pod_uid(&format!("{migration_uid}/target")): target }),
    );
    status.insert(
        "migrationState".into(),
        json!({
            "sourceNode": source,
            "targetNode": target,
            "migrationUid": migration_uid,
            "startTimestamp": started,
            "endTimestamp": finished,
            "completed": true,
            "mode": "PreCopy",
            "targetPod": format!("virt-launcher-{}", &pod_uid(migration_uid)[..5]),
        }),
    );
    status.insert("migrationMethod".into(), json!("LiveMigration"));
    status.remove("evacuationNodeName");
    let mut conditions: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    remove_condition(&mut conditions, "EvictionRequested");
    status.insert("conditions".into(), json!(conditions));
    status
}

pub(super) fn other_node(context: &Context, vmi: &DynamicObject, current: &str) -> String {
    node_for(context, vmi, Some(current))
}

/// Resources the migration controller needs from here.
pub(super) fn is_running(vmi: &DynamicObject) -> bool {
    str_at(&vmi.data, "/status/phase") == Some("Running") && !is_deleting(vmi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_transitions_are_recorded_once() {
        let mut update = Update {
            status: Map::new(),
            labels: Map::new(),
            annotations: Map::new(),
            finalizers: vec![],
            requeue: None,
        };
        update.set_phase("Pending");
        update.set_phase("Pending");
        update.set_phase("Scheduling");
        let stamps = update.status["phaseTransitionTimestamps"]
            .as_array()
            .unwrap();
        assert_eq!(stamps.len(), 2);
        assert_eq!(stamps[1]["phase"], "Scheduling");
        assert!(update.phase_since(now()) <= now());
    }

    #[test]
    fn migration_moves_the_vmi_and_clears_the_evacuation() {
        let mut status = Map::new();
        status.insert("nodeName".into(), json!("a"));
        status.insert("evacuationNodeName".into(), json!("a"));
        status.insert(
            "conditions".into(),
            json!([{"type": "EvictionRequested", "status": "True"}, {"type": "Ready", "status": "True"}]),
        );
        let moved = migrated_status(&status, "a", "b", "m-uid", "2026-01-01T00:00:00Z");
        assert_eq!(moved["nodeName"], "b");
        assert!(moved.get("evacuationNodeName").is_none());
        assert_eq!(moved["migrationState"]["completed"], true);
        assert_eq!(moved["conditions"].as_array().unwrap().len(), 1);
    }
}
