//! The kube-scheduler's and the kubelet's part for virt-launcher pods, when
//! KubeVirt's own virt-controller makes them ([`super::KubevirtSimulator::start_with_kubevirt`]):
//! no container runs here, so this binds each launcher pod to a node and
//! writes the status a kubelet would — containers running, the `compute`
//! container ready once virt-handler (simulated) reports the domain up,
//! the pod ended once its VMI did — and finishes a launcher pod's deletion
//! (a kubelet confirms a pod is gone; none runs here).
//!
//! What virt-controller reads of a pod, per `pkg/virt-controller/watch/vmi`:
//! the `PodScheduled` condition (copied into the VMI when the pod cannot be
//! scheduled), the containers' waiting reasons (`ErrImagePull`,
//! `ImagePullBackOff` become the VMI's `Synchronized` condition), the pod
//! running with its `compute` container running (the VMI goes `Scheduled`
//! on the pod's node), the pod's `Ready` condition (the VMI's `Ready`).
//!
//! Faults: `Unschedulable` (the scheduler's verdict on the pod), `ImagePull`
//! (the first container disk's image never pulls), `HungGuest` (the compute
//! container never gets ready). Left out: probes, restarts, resources
//! accounting per node, the pod's IPs beyond the first.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::resources::{
    Context, ReconcileResult, add, controller_of, error_requeue, from_k8s, name_of, namespace_of,
    now, requeue_in, stable_hash, timestamp, uid_of, until, vm_resource, vmi_resource,
};
use super::virt_controller::CREATED_BY_LABEL;
use super::virt_handler::{DEFAULT_UNSCHEDULABLE, node_for};

/// The label virt-controller puts on launcher pods.
const LAUNCHER_SELECTOR: &str = "kubevirt.io=virt-launcher";
/// virt-handler's node label, and the one launcher pods select on.
const SCHEDULABLE_LABEL: &str = "kubevirt.io/schedulable";

/// The Nodes virt-controller expects the VMIs' nodes to be: a VMI on a node
/// it cannot find counts as on a dead node.
pub(super) async fn register_nodes(context: &Context) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(context.client.clone());
    for name in &context.config.nodes {
        let node: Node = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": {
                SCHEDULABLE_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/arch": crate::kubevirt_upstream::kubernetes_arch(),
            }},
        }))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": timestamp(now()),
                    "lastTransitionTime": timestamp(now()),
                }]}})),
            )
            .await?;
    }
    Ok(())
}

pub(super) async fn run(context: Arc<Context>) {
    let client = context.client.clone();
    let pods = watcher::Config::default().labels(LAUNCHER_SELECTOR);
    let controller = Controller::new_with(
        Api::<DynamicObject>::all_with(client.clone(), &vmi_resource()),
        watcher::Config::default(),
        vmi_resource(),
    )
    .owns(Api::<Pod>::all(client), pods)
    .with_config(ControllerConfig::default().concurrency(8))
    .reconcile_all_on(context.faults.changes());
    super::drive(
        "kubelet",
        controller.run(reconcile, |_, _, _| error_requeue(), context),
    )
    .await;
}

/// Finishes the deletion of launcher pods as a kubelet does once the
/// containers exit: virt-launcher exits when the guest has shut down (the
/// simulator's shutdown grace, or the VMI's fault), at the latest when the
/// pod's grace period ends; a pod whose VMI is gone goes at once.
pub(super) async fn run_pod_deletion(context: Arc<Context>) {
    let controller = Controller::new(
        Api::<Pod>::all(context.client.clone()),
        watcher::Config::default().labels(LAUNCHER_SELECTOR),
    )
    .with_config(ControllerConfig::default().concurrency(8))
    .reconcile_all_on(context.faults.changes());
    super::drive(
        "kubelet pod deletion",
        controller.run(end_pod, |_, _, _| error_requeue(), context),
    )
    .await;
}

async fn end_pod(pod: Arc<Pod>, context: Arc<Context>) -> ReconcileResult {
    let Some(deleted) = pod.metadata.deletion_timestamp.as_ref().map(from_k8s) else {
        return Ok(Action::await_change());
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let vmi_name = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "VirtualMachineInstance")
        .map(|o| o.name.clone());
    let vmi = match &vmi_name {
        Some(vmi_name) => {
            Api::<DynamicObject>::namespaced_with(
                context.client.clone(),
                &namespace,
                &vmi_resource(),
            )
            .get_opt(vmi_name)
            .await?
        }
        None => None,
    };
    if let Some(vmi) = &vmi {
        let vm = Api::<DynamicObject>::namespaced_with(
            context.client.clone(),
            &namespace,
            &vm_resource(),
        )
        .get_opt(name_of(vmi))
        .await?;
        let faults = context.faults.for_vmi(vmi, vm.as_ref());
        let grace = std::time::Duration::from_secs(
            pod.metadata
                .deletion_grace_period_seconds
                .unwrap_or(0)
                .max(0) as u64,
        );
        let shutdown = faults
            .shutdown_grace
            .unwrap_or(context.config.shutdown_grace)
            .min(grace);
        let requested = deleted - chrono::Duration::from_std(grace).unwrap_or_default();
        let done = add(requested, shutdown);
        let final_vmi = matches!(
            vmi.data["status"]["phase"].as_str(),
            Some("Failed" | "Succeeded") | None | Some("") | Some("Pending") | Some("Scheduling")
        );
        if !final_vmi && now() < done {
            return Ok(requeue_in(until(done)));
        }
    }
    let api: Api<Pod> = Api::namespaced(context.client.clone(), &namespace);
    match api
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(error) => return Err(error.into()),
    }
    Ok(Action::await_change())
}

async fn reconcile(vmi: Arc<DynamicObject>, context: Arc<Context>) -> ReconcileResult {
    let namespace = namespace_of(&vmi).to_string();
    let pods: Api<Pod> = Api::namespaced(context.client.clone(), &namespace);
    let selector = format!("{LAUNCHER_SELECTOR},{CREATED_BY_LABEL}={}", uid_of(&vmi));
    let vm = match controller_of(&vmi, "VirtualMachine") {
        Some(_) => {
            Api::<DynamicObject>::namespaced_with(
                context.client.clone(),
                &namespace,
                &vm_resource(),
            )
            .get_opt(name_of(&vmi))
            .await?
        }
        None => None,
    };
    let faults = context.faults.for_vmi(&vmi, vm.as_ref());
    let mut requeue: Option<std::time::Duration> = None;
    for pod in pods.list(&ListParams::default().labels(&selector)).await? {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let created = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(from_k8s)
            .unwrap_or_else(now);

        // The scheduler's part.
        if spec.node_name.is_none() {
            if let Some(message) = &faults.unschedulable {
                let message = message
                    .clone()
                    .unwrap_or_else(|| DEFAULT_UNSCHEDULABLE.into());
                pods.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": { "phase": "Pending", "conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": message, "lastTransitionTime": timestamp(now()),
                    }]}})),
                )
                .await?;
                continue;
            }
            let due = add(created, context.config.step);
            if now() < due {
                requeue = Some(until(due));
                continue;
            }
            let node = node_for(&context, &vmi, None);
            let binding = json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": { "name": name },
                "target": { "apiVersion": "v1", "kind": "Node", "name": node },
            });
            match pods
                .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => continue,
                Err(error) => return Err(error.into()),
            }
            requeue = Some(context.config.step);
            continue;
        }

        // The kubelet's part.
        let vmi_phase = vmi.data["status"]["phase"].as_str().unwrap_or("");
        let status = pod_status(&context, &vmi, &pod, vmi_phase, &faults, created);
        let current = serde_json::to_value(pod.status.clone().unwrap_or_default())
            .map_err(anyhow::Error::from)?;
        if !same_status(&current, &status) {
            let status = with_times(status, &current);
            pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
        }
        if let Some(after) = image_pull_requeue(&context, &faults, created) {
            requeue = Some(requeue.map_or(after, |r| r.min(after)));
        }
    }
    Ok(match requeue {
        Some(after) => requeue_in(after),
        None => Action::await_change(),
    })
}

/// When an image-pull fault turns `ErrImagePull` into `ImagePullBackOff`.
fn image_pull_requeue(
    context: &Context,
    faults: &super::faults::VmiFaults,
    created: chrono::DateTime<chrono::Utc>,
) -> Option<std::time::Duration> {
    faults.image_pull.as_ref()?;
    let back_off_at = add(created, context.config.image_pull_backoff);
    (now() < back_off_at).then(|| until(back_off_at))
}

/// The pod status a kubelet would report for a launcher pod of `vmi`.
fn pod_status(
    context: &Context,
    vmi: &DynamicObject,
    pod: &Pod,
    vmi_phase: &str,
    faults: &super::faults::VmiFaults,
    created: chrono::DateTime<chrono::Utc>,
) -> Value {
    let spec = pod.spec.clone().unwrap_or_default();
    let started = timestamp(created);
    // The pod network's address (the VMI's own come from the simulator's
    // pool, as with a bridge or Multus network).
    let hash = stable_hash(pod.metadata.uid.as_deref().unwrap_or_default()).to_be_bytes();
    let ip = format!("10.200.{}.{}", hash[0], hash[1].max(1));
    if matches!(vmi_phase, "Failed" | "Succeeded") {
        let code = if vmi_phase == "Failed" { 1 } else { 0 };
        let containers: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| {
                json!({
                    "name": c.name, "image": c.image, "imageID": "", "ready": false,
                    "restartCount": 0, "started": false,
                    "state": { "terminated": { "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }, "startedAt": started, "finishedAt": timestamp(now()) } },
                })
            })
            .collect();
        return json!({
            "phase": vmi_phase,
            "podIP": ip,
            "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Ready", "status": "False", "reason": "PodCompleted" },
            ],
            "containerStatuses": containers,
        });
    }
    if let Some(message) = &faults.image_pull {
        let image = vmi.data["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|v| v["containerDisk"]["image"].as_str())
            .unwrap_or("unknown")
            .to_string();
        let backing_off = now() >= add(created, context.config.image_pull_backoff);
        let (reason, message) = if backing_off {
            (
                "ImagePullBackOff",
                format!("Back-off pulling image \"{image}\""),
            )
        } else {
            ("ErrImagePull", message.clone().unwrap_or_else(|| {
                format!("rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": not found")
            }))
        };
        let containers: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| {
                let state = if c.name.starts_with("volume") {
                    json!({ "waiting": { "reason": reason, "message": message } })
                } else {
                    json!({ "waiting": { "reason": "PodInitializing" } })
                };
                json!({
                    "name": c.name, "image": c.image, "imageID": "", "ready": false,
                    "restartCount": 0, "started": false, "state": state,
                })
            })
            .collect();
        return json!({
            "phase": "Pending",
            "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Ready", "status": "False", "reason": "ContainersNotReady" },
            ],
            "containerStatuses": containers,
        });
    }
    // The compute container is ready once the domain runs (virt-launcher's
    // readiness follows the domain), unless the guest hangs.
    let domain_up = vmi_phase == "Running" && !faults.hung_guest;
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            let ready = c.name != "compute" || domain_up;
            json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": ready,
                "restartCount": 0, "started": true,
                "state": { "running": { "startedAt": started } },
            })
        })
        .collect();
    // Init containers ran to completion; sidecars (restartPolicy Always,
    // virt-launcher's `guest-console-log`) run beside the containers.
    let init_containers: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            let state = if sidecar {
                json!({ "running": { "startedAt": started } })
            } else {
                json!({ "terminated": { "exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started } })
            };
            json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": sidecar,
                "restartCount": 0, "started": sidecar, "state": state,
            })
        })
        .collect();
    let ready = if domain_up { "True" } else { "False" };
    let mut ready_condition = json!({ "type": "Ready", "status": ready });
    if !domain_up {
        ready_condition["reason"] = json!("ContainersNotReady");
        ready_condition["message"] = json!("containers with unready status: [compute]");
    }
    json!({
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{ "ip": ip }],
        "conditions": [
            { "type": "PodScheduled", "status": "True" },
            { "type": "Initialized", "status": "True" },
            { "type": "ContainersReady", "status": ready },
            ready_condition,
        ],
        "initContainerStatuses": init_containers,
        "containerStatuses": containers,
    })
}

/// Conditions as a kubelet writes them: each with its transition time
/// (kept from the pod's current condition of that type and status).
fn with_times(mut status: Value, current: &Value) -> Value {
    let now = timestamp(now());
    if let Some(conditions) = status["conditions"].as_array_mut() {
        for condition in conditions {
            let kept = current["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == condition["type"] && c["status"] == condition["status"])
                .and_then(|c| c["lastTransitionTime"].as_str().map(String::from));
            condition["lastTransitionTime"] = json!(kept.unwrap_or_else(|| now.clone()));
            condition["lastProbeTime"] = Value::Null;
        }
    }
    status
}

/// Whether `current` already says what `wanted` says (times aside).
fn same_status(current: &Value, wanted: &Value) -> bool {
    let brief = |status: &Value| -> Value {
        json!({
            "phase": status["phase"],
            "ready": status["conditions"].as_array().into_iter().flatten()
                .filter(|c| c["type"] == "Ready" || c["type"] == "PodScheduled")
                .map(|c| (c["type"].clone(), c["status"].clone(), c["reason"].clone()))
                .map(|(t, s, r)| json!([t, s, r]))
                .collect::<Vec<_>>(),
            "containers": status["containerStatuses"].as_array().into_iter().flatten()
                .map(|c| json!([c["name"], c["ready"], c["state"].as_object().and_then(|s| s.keys().next().cloned()), c["state"]["waiting"]["reason"]]))
                .collect::<Vec<_>>(),
        })
    };
    brief(current) == brief(wanted)
}
