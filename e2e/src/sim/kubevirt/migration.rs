//! virt-controller's migration controller, reduced to what a caller sees: a
//! `VirtualMachineInstanceMigration` walks `Pending` → `Scheduling` →
//! `Scheduled` → `PreparingTarget` → `TargetReady` → `Running` →
//! `Succeeded`, and the VMI ends up on another node with
//! `status.migrationState.completed` and no evacuation mark. A VMI that is
//! not `LiveMigratable` fails the migration (upstream's admission webhook
//! refuses it instead; there is no webhook here).

use std::sync::Arc;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::{Map, Value, json};

use super::resources::{
    Cond, Context, ReconcileResult, add, array_at, condition, error_requeue, migration_resource,
    name_of, namespace_of, now, parse_time, requeue_in, set_condition, str_at, timestamp, to_value,
    uid_of, until, vmi_resource,
};
use super::virt_controller::replace_patch;
use super::virt_handler::{is_running, migrated_status, other_node};

const PHASES: [&str; 7] = [
    "Pending",
    "Scheduling",
    "Scheduled",
    "PreparingTarget",
    "TargetReady",
    "Running",
    "Succeeded",
];

pub(super) async fn run(context: Arc<Context>) {
    let controller = Controller::new_with(
        Api::<DynamicObject>::all_with(context.client.clone(), &migration_resource()),
        watcher::Config::default(),
        migration_resource(),
    );
    super::drive(
        "migration-controller",
        controller.run(reconcile, |_, _, _| error_requeue(), context),
    )
    .await;
}

async fn reconcile(migration: Arc<DynamicObject>, context: Arc<Context>) -> ReconcileResult {
    let namespace = namespace_of(&migration).to_string();
    let migrations: Api<DynamicObject> =
        Api::namespaced_with(context.client.clone(), &namespace, &migration_resource());
    let vmis: Api<DynamicObject> =
        Api::namespaced_with(context.client.clone(), &namespace, &vmi_resource());
    let value = to_value(&migration);
    let phase = str_at(&value, "/status/phase").unwrap_or("").to_string();
    if matches!(phase.as_str(), "Succeeded" | "Failed")
        || migration.metadata.deletion_timestamp.is_some()
    {
        return Ok(Action::await_change());
    }
    let mut status = value["status"].as_object().cloned().unwrap_or_default();
    let vmi_name = str_at(&value, "/spec/vmiName").unwrap_or_default();
    let vmi = vmis.get_opt(vmi_name).await?;
    let since = array_at(&value, "/status/phaseTransitionTimestamps")
        .last()
        .and_then(|s| parse_time(&s["phaseTransitionTimestamp"]))
        .unwrap_or_else(now);
    let due = add(since, context.config.step);
    let mut requeue = None;

    let migratable = vmi.as_ref().and_then(|vmi| {
        condition(array_at(&vmi.data, "/status/conditions"), "LiveMigratable").cloned()
    });
    let next = match (&vmi, phase.as_str()) {
        (None, _) => Some("Failed"),
        (Some(vmi), _) if !is_running(vmi) => Some("Failed"),
        (Some(_), "") => {
            if migratable.as_ref().is_some_and(|c| c["status"] == "True") {
                Some("Pending")
            } else {
                Some("Failed")
            }
        }
        (Some(_), current) if now() < due => {
            requeue = Some(until(due));
            let _ = current;
            None
        }
        (Some(_), current) => PHASES
            .iter()
            .position(|p| *p == current)
            .and_then(|i| PHASES.get(i + 1).copied()),
    };
    let Some(next) = next else {
        return Ok(requeue.map_or_else(Action::await_change, requeue_in));
    };

    if next == "Failed" {
        let message = match (&vmi, &migratable) {
            (None, _) => format!("VMI {vmi_name} does not exist"),
            (Some(_), Some(c)) if c["status"] != "True" => format!(
                "Cannot migrate VMI, Reason: {}, Message: {}",
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            ),
            _ => format!("VMI {vmi_name} is not running"),
        };
        let mut conditions = array_at(&value, "/status/conditions").to_vec();
        set_condition(
            &mut conditions,
            &Cond::new("Failed", "True", "MigrationFailed", &message),
            "lastProbeTime",
        );
        status.insert("conditions".into(), json!(conditions));
    }

    if let Some(vmi) = &vmi {
        let vmi_status = vmi.data["status"].as_object().cloned().unwrap_or_default();
        let source = vmi_status
            .get("nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let started = status
            .get("migrationState")
            .and_then(|s| s["startTimestamp"].as_str())
            .map(String::from)
            .unwrap_or_else(|| timestamp(now()));
        let target = status
            .get("migrationState")
            .and_then(|s| s["targetNode"].as_str())
            .map(String::from)
            .unwrap_or_else(|| other_node(&context, vmi, &source));
        let new_vmi_status: Option<Map<String, Value>> = match next {
            // The VMI reports the migration while it runs, so the VM shows
            // `Migrating`.
            "Scheduling" => {
                let mut s = vmi_status.clone();
                s.insert(
                    "migrationState".into(),
                    json!({
                        "sourceNode": source,
                        "targetNode": target,
                        "migrationUid": uid_of(&migration),
                        "startTimestamp": started,
                        "mode": "PreCopy",
                    }),
                );
                Some(s)
            }
            "Succeeded" => Some(migrated_status(
                &vmi_status,
                &source,
                &target,
                uid_of(&migration),
                &started,
            )),
            _ => None,
        };
        if let Some(new_status) = new_vmi_status {
            let mut labels = vmi.metadata.labels.clone().unwrap_or_default();
            if let Some(node) = new_status.get("nodeName").and_then(Value::as_str) {
                labels.insert(super::resources::NODE_NAME_LABEL.into(), node.into());
            }
            vmis.patch(
                name_of(vmi),
                &PatchParams {
                    field_manager: Some(context.manager("virt-handler")),
                    ..PatchParams::default()
                },
                &Patch::Merge(json!({
                    "metadata": {"labels": labels, "resourceVersion": vmi.metadata.resource_version},
                    "status": replace_patch(&vmi.data["status"], &json!(new_status)),
                })),
            )
            .await?;
        }
        status.insert(
            "migrationState".into(),
            json!({
                "sourceNode": source,
                "targetNode": target,
                "migrationUid": uid_of(&migration),
                "startTimestamp": started,
                "completed": next == "Succeeded",
            }),
        );
    }

    status.insert("phase".into(), json!(next));
    let mut stamps = array_at(&value, "/status/phaseTransitionTimestamps").to_vec();
    stamps.push(json!({
        "phase": next,
        "phaseTransitionTimestamp": now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }));
    status.insert("phaseTransitionTimestamps".into(), json!(stamps));
    migrations
        .patch_status(
            name_of(&migration),
            &PatchParams {
                field_manager: Some(context.manager("virt-controller")),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    Ok(if next == "Succeeded" || next == "Failed" {
        Action::await_change()
    } else {
        requeue_in(context.config.step)
    })
}
