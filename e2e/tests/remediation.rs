//! Reboot-first remediation end to end: the real kube-apiserver, the real
//! Cluster API core manager, tenantry's reconcilers in-process and the
//! KubeVirt/CDI or Proxmox VE simulator. Remediation objects are created
//! exactly as CAPI's MachineHealthCheck creates them (from `spec.template`
//! of a remediation template, named after the Machine, owned by it, with
//! the cluster-name label and cloned-from annotations); what is asserted is
//! what a user sees: the remediation's status, conditions and events, the
//! Machine, and what happened in the substrate.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tenantry_api::generated::capi::machine::Machine;
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::KubevirtMachine;
use tenantry_api::proxmox::ProxmoxMachine;
use tenantry_api::remediation::{
    KubevirtRemediation, ProxmoxRemediation, RemediationPhase, RemediationStatus,
};
use tenantry_e2e::fixtures::{
    self, KUBEVIRT_API_VERSION, NamespacedKind, PROXMOX_API_VERSION as PVE_API_VERSION,
};
use tenantry_e2e::pve_lab::{TEMPLATE, TEMPLATE_NODE, lab_config};
use tenantry_e2e::sim::kubevirt::{ImageFactoryConfig, KubevirtSimConfig};
use tenantry_e2e::{Kubevirt, World, wait};

const DEADLINE: Duration = Duration::from_secs(180);
const NAMESPACE: &str = "default";
const TALOS_VERSION: &str = "v1.13.0";
const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// A finalizer the tests put on a Machine so that, once remediation
/// deletes it, it stays (with its deletionTimestamp) and so does the
/// remediation it owns, for the assertions.
const HOLD_FINALIZER: &str = "test.tenantry.dev/hold";

// ---------------------------------------------------------------- what the MHC does

/// Creates a remediation template of `kind` with the given strategy.
async fn create_template(
    client: &kube::Client,
    namespace: &str,
    api_version: &str,
    kind: &str,
    name: &str,
    strategy: Value,
) -> Value {
    let template = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "template": { "spec": { "strategy": strategy } } },
    });
    // As created, with the defaults the apiserver filled in.
    let created = tenantry_e2e::manifests::create_object(client, &template, namespace)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    serde_json::to_value(created).unwrap()
}

/// Creates the remediation of `machine` from `template` exactly as CAPI's
/// MachineHealthCheck does (`external.GenerateTemplate`): `spec.template`
/// of the template, kind without `Template`, named after the Machine in its
/// namespace, owned by it, labelled with its cluster, annotated with where
/// it was cloned from.
async fn create_remediation_as_mhc(client: &kube::Client, template: &Value, machine: &Machine) {
    let mut object = template["spec"]["template"].clone();
    let kind = template["kind"].as_str().unwrap();
    object["apiVersion"] = template["apiVersion"].clone();
    object["kind"] = json!(kind.trim_end_matches("Template"));
    object["metadata"] = json!({
        "name": machine.name_any(),
        "namespace": machine.namespace().unwrap(),
        "labels": { "cluster.x-k8s.io/cluster-name": machine.spec.cluster_name },
        "annotations": {
            "cluster.x-k8s.io/cloned-from-name": template["metadata"]["name"],
            "cluster.x-k8s.io/cloned-from-groupkind": format!("{kind}.{INFRA_GROUP}"),
        },
        "ownerReferences": [{
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "name": machine.name_any(),
            "uid": machine.uid().unwrap(),
        }],
    });
    create(client, &machine.namespace().unwrap(), object).await;
}

async fn create(client: &kube::Client, namespace: &str, document: Value) {
    tenantry_e2e::manifests::create_object(client, &document, namespace)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Keeps a Machine (and what it owns) around after it is deleted.
async fn hold(client: &kube::Client, namespace: &str, machine: &str) {
    Api::<Machine>::namespaced(client.clone(), namespace)
        .patch(
            machine,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": [HOLD_FINALIZER] } })),
        )
        .await
        .expect("hold the Machine");
}

fn remediated(status: &RemediationStatus) -> Option<&Condition> {
    fixtures::condition(&status.conditions, "Remediated")
}

/// Waits for a remediation status satisfying `predicate`, showing the last
/// status seen when it does not come.
async fn wait_status<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    status_of: impl Fn(&K) -> Option<RemediationStatus>,
    predicate: impl Fn(&RemediationStatus) -> bool,
) -> RemediationStatus
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let last = Mutex::new(None);
    wait::until(format!("remediation {name}: {what}"), DEADLINE, || {
        let (api, last, status_of, predicate) = (api.clone(), &last, &status_of, &predicate);
        async move {
            let status = api.get_opt(name).await?.and_then(|r| status_of(&r));
            *last.lock().unwrap() = status.clone();
            Ok(status.filter(|s| predicate(s)))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nlast status: {:?}", last.lock().unwrap()))
}

async fn events_of(client: &kube::Client, namespace: &str, object: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
        .collect()
}

async fn wait_machine_deleting(client: &kube::Client, namespace: &str, name: &str) -> Machine {
    fixtures::wait_for_object(
        &Api::<Machine>::namespaced(client.clone(), namespace),
        name,
        format!("Machine {name} to be deleted"),
        DEADLINE,
        |m| m.metadata.deletion_timestamp.is_some().then_some(m),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

// ---------------------------------------------------------------- KubeVirt

/// A management cluster with CAPI core, the KubeVirt simulator, an image
/// factory and tenantry, and one provisioned Talos worker.
struct KubevirtWorld {
    inner: World,
}

impl KubevirtWorld {
    async fn start() -> Self {
        Self::start_with(false).await
    }

    /// With tenantry's admission webhooks served and registered.
    async fn start_with_webhooks() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(webhooks: bool) -> Self {
        let builder = World::builder("management")
            .cluster_api()
            .kubevirt(Kubevirt::Simulated, KubevirtSimConfig::fast())
            .image_factory(ImageFactoryConfig {
                versions: vec![TALOS_VERSION.into()],
                ..Default::default()
            })
            .tenantry();
        let builder = if webhooks {
            builder.webhooks()
        } else {
            builder
        };
        Self {
            inner: builder.start().await,
        }
    }

    fn client(&self) -> kube::Client {
        self.inner.client()
    }

    fn api<K: NamespacedKind>(&self) -> Api<K> {
        self.inner.api(NAMESPACE)
    }

    fn fail(&self, name: &str, error: anyhow::Error) -> ! {
        panic!(
            "{error:#}\n---- guest log of {name} ----\n{}{}",
            self.inner.kubevirt().guest_log(NAMESPACE, name).join("\n"),
            self.inner.diagnostics()
        )
    }

    /// A Cluster and a worker Machine whose KubevirtMachine is provisioned
    /// (its VMI Ready on a Talos disk imported by CDI).
    async fn provisioned_worker(&self, cluster: &str, name: &str) -> Machine {
        let world = &self.inner;
        world
            .create(NAMESPACE, fixtures::kubevirt_cluster(cluster, json!({})))
            .await;
        world
            .create(NAMESPACE, fixtures::cluster(cluster, "KubevirtCluster"))
            .await;
        let data = fixtures::talos_worker_config(
            "test-token",
            &format!("https://kubernetes-{cluster}.{NAMESPACE}.svc:6443"),
        );
        for document in fixtures::worker(
            KUBEVIRT_API_VERSION,
            "KubevirtMachine",
            cluster,
            name,
            fixtures::talos_machine_spec(world.factory().base_url(), TALOS_VERSION),
            json!({ "value": data }),
        ) {
            world.create(NAMESPACE, document).await;
        }
        fixtures::wait_for_object(
            &self.api::<KubevirtMachine>(),
            name,
            format!("KubevirtMachine {name} provisioned"),
            DEADLINE,
            |m| {
                m.status
                    .is_some_and(|s| fixtures::provisioned(&s.initialization))
                    .then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(name, e));
        // The VMI runs, so a restart is observable.
        self.wait_vmi(name, |_| true).await;
        self.api::<Machine>().get(name).await.expect("Machine")
    }

    /// Waits for a running (not deleting) VMI satisfying `predicate`.
    async fn wait_vmi(
        &self,
        name: &str,
        predicate: impl Fn(&VirtualMachineInstance) -> bool,
    ) -> VirtualMachineInstance {
        let vmis: Api<VirtualMachineInstance> = self.api();
        wait::until(format!("a running VMI {name}"), DEADLINE, || {
            let (vmis, predicate) = (vmis.clone(), &predicate);
            async move {
                Ok(vmis.get_opt(name).await?.filter(|v| {
                    v.metadata.deletion_timestamp.is_none()
                        && v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && predicate(v)
                }))
            }
        })
        .await
        .unwrap_or_else(|e| self.fail(name, e))
    }

    /// The UID of the VMI `name` runs now.
    async fn vmi_uid(&self, name: &str) -> String {
        self.wait_vmi(name, |_| true).await.uid().unwrap()
    }

    async fn template(&self, name: &str, strategy: Value) -> Value {
        create_template(
            &self.client(),
            NAMESPACE,
            "infrastructure.cluster.x-k8s.io/v1alpha1",
            "KubevirtRemediationTemplate",
            name,
            strategy,
        )
        .await
    }

    /// UIDs of what must survive a restart: the VM, its DataVolumes and PVCs.
    async fn durable_uids(&self, name: &str) -> Vec<(String, String)> {
        let mut uids = vec![(
            format!("VirtualMachine {name}"),
            self.api::<VirtualMachine>()
                .get(name)
                .await
                .unwrap()
                .uid()
                .unwrap(),
        )];
        for dv in self
            .api::<DataVolume>()
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            if dv.name_any().starts_with(name) {
                uids.push((format!("DataVolume {}", dv.name_any()), dv.uid().unwrap()));
            }
        }
        for pvc in self
            .api::<PersistentVolumeClaim>()
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            if pvc.name_any().starts_with(name) {
                uids.push((format!("PVC {}", pvc.name_any()), pvc.uid().unwrap()));
            }
        }
        assert!(
            uids.iter().any(|(what, _)| what.starts_with("PVC")),
            "the worker has a PVC: {uids:?}"
        );
        uids
    }
}

fn kubevirt_status(remediation: &KubevirtRemediation) -> Option<RemediationStatus> {
    remediation.status.clone()
}

/// A restart deletes the VMI only: the VM recreates it (new UID) on the
/// same disks, the VM, DataVolume and PVC keep their UIDs, and the status
/// says one restart was made and it waits for the Machine; the template
/// cannot be changed. Deleting the
/// remediation (as the MachineHealthCheck does once the Machine is
/// healthy) ends it: the Machine stays.
#[tokio::test]
async fn kubevirt_restart_replaces_the_instance_and_keeps_the_vm_and_its_disks() {
    let world = KubevirtWorld::start_with_webhooks().await;
    let machine = world.provisioned_worker("demo", "demo-worker-1").await;
    let before = world.vmi_uid("demo-worker-1").await;
    let durable = world.durable_uids("demo-worker-1").await;

    let template = world.template("reboot", json!({})).await;
    // The apiserver filled in the defaults operators read with kubectl.
    assert_eq!(
        template["spec"]["template"]["spec"]["strategy"],
        json!({ "type": "Reboot", "retryLimit": 1, "timeout": "5m" })
    );
    // Templates are immutable, like tenantry's other templates.
    let refused = tenantry_e2e::manifests::apply_object(
        &world.client(),
        &json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtRemediationTemplate",
            "metadata": { "name": "reboot", "namespace": NAMESPACE },
            "spec": { "template": { "spec": { "strategy": { "retryLimit": 5 } } } },
        }),
        NAMESPACE,
    )
    .await
    .expect_err("a changed remediation template is refused");
    assert!(
        format!("{refused:#}").contains("spec.remediation.templateRef"),
        "{refused:#}"
    );
    create_remediation_as_mhc(&world.client(), &template, &machine).await;

    let remediations: Api<KubevirtRemediation> = world.api();
    let status = wait_status(
        &remediations,
        "demo-worker-1",
        "one restart, waiting",
        kubevirt_status,
        |s| s.phase == Some(RemediationPhase::Waiting),
    )
    .await;
    assert_eq!(status.retry_count, Some(1));
    assert!(status.last_remediated.is_some());
    assert_eq!(
        status.virtual_machine_instance_uid.as_deref(),
        Some(before.as_str())
    );
    let condition = remediated(&status).expect("Remediated condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "WaitingForNodeHealthy")
    );
    assert!(
        condition.message.contains("demo-worker-1") && condition.message.contains("5m"),
        "{condition:?}"
    );

    let after = world
        .wait_vmi("demo-worker-1", |v| {
            v.uid().as_deref() != Some(before.as_str())
        })
        .await;
    assert_ne!(after.uid().unwrap(), before, "the VMI was restarted");
    assert_eq!(
        world.durable_uids("demo-worker-1").await,
        durable,
        "the VM and its disks are the same objects"
    );
    let events = events_of(&world.client(), NAMESPACE, "demo-worker-1").await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("Rebooted")),
        "{events:?}"
    );

    // The MachineHealthCheck deletes the remediation once the Machine is
    // healthy; nothing is left to hold it and the Machine stays.
    remediations
        .delete("demo-worker-1", &DeleteParams::default())
        .await
        .expect("delete the remediation");
    fixtures::wait_for_absence(
        &remediations,
        "demo-worker-1",
        "the remediation to be gone",
        DEADLINE,
    )
    .await
    .unwrap();
    let machine = world.api::<Machine>().get("demo-worker-1").await.unwrap();
    assert!(machine.metadata.deletion_timestamp.is_none());
    let vmi = world.wait_vmi("demo-worker-1", |_| true).await;
    assert_eq!(
        vmi.uid(),
        after.uid(),
        "no restart after the remediation went"
    );
}

/// With retryLimit 2 and a 3s timeout, and the Machine never reported
/// healthy, two restarts happen, then the Machine is deleted, and the
/// remediation says so in its conditions and an Event.
#[tokio::test]
async fn kubevirt_machine_is_replaced_after_retries_are_exhausted() {
    let world = KubevirtWorld::start().await;
    let client = world.client();
    let machine = world.provisioned_worker("demo", "demo-worker-2").await;
    hold(&client, NAMESPACE, "demo-worker-2").await;
    let first = world.vmi_uid("demo-worker-2").await;
    let template = world
        .template("reboot-twice", json!({ "retryLimit": 2, "timeout": "3s" }))
        .await;
    create_remediation_as_mhc(&client, &template, &machine).await;

    // Every instance the VM runs meanwhile, to count restarts: sampled on
    // every poll, at least every 500 ms, while restarts are 3 s apart.
    let instances = Mutex::new(BTreeSet::from([first]));
    let last = Mutex::new(None);
    let remediations: Api<KubevirtRemediation> = world.api();
    let vmis: Api<VirtualMachineInstance> = world.api();
    let status = wait::until(
        "remediation demo-worker-2: retries exhausted, Machine replaced",
        DEADLINE,
        || {
            let (remediations, vmis, instances, last) = (&remediations, &vmis, &instances, &last);
            async move {
                if let Some(uid) = vmis.get_opt("demo-worker-2").await?.and_then(|v| v.uid()) {
                    instances.lock().unwrap().insert(uid);
                }
                let status = remediations
                    .get_opt("demo-worker-2")
                    .await?
                    .and_then(|r| r.status);
                *last.lock().unwrap() = status.clone();
                Ok(status.filter(|s| s.phase == Some(RemediationPhase::Replacing)))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nlast status: {:?}", last.lock().unwrap()));
    assert_eq!(status.retry_count, Some(2));
    let condition = remediated(&status).expect("Remediated condition");
    assert_eq!(condition.reason, "RetriesExhausted", "{condition:?}");
    assert!(
        condition
            .message
            .contains("Machine demo-worker-2 did not pass its health check within 3s after 2 restarts; deleted it"),
        "{condition:?}"
    );
    wait_machine_deleting(&client, NAMESPACE, "demo-worker-2").await;
    let events = events_of(&client, NAMESPACE, "demo-worker-2").await;
    let deleted = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("MachineDeleted"))
        .unwrap_or_else(|| panic!("no MachineDeleted event: {events:?}"));
    assert!(
        deleted
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("demo-worker-2"),
        "{deleted:?}"
    );
    let seen = instances.lock().unwrap().len();
    assert!(
        seen >= 3,
        "the first instance and one per restart: saw {seen}"
    );
}

/// Kills the manager and leaves what it would have left had it crashed
/// right after recording a restart of `instance`: the remediation of
/// `machine` as the MHC made it, the attempt recorded, no delete made. Then
/// starts a fresh manager and returns the status once it waits again.
async fn restart_after_recorded_crash(
    world: &mut KubevirtWorld,
    template: &Value,
    machine: &Machine,
    instance: &str,
    what: &str,
) -> RemediationStatus {
    let name = machine.name_any();
    let remediations: Api<KubevirtRemediation> = world.api();
    world.inner.tenantry_mut().kill();
    create_remediation_as_mhc(&world.client(), template, machine).await;
    let recorded = json!({ "status": {
        "phase": "Rebooting",
        "retryCount": 1,
        "lastRemediated": k8s_openapi::jiff::Timestamp::now().to_string(),
        "virtualMachineInstanceUID": instance,
    }});
    remediations
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(recorded))
        .await
        .expect("record the attempt");
    world.inner.tenantry_mut().restart();
    wait_status(&remediations, &name, what, kubevirt_status, |s| {
        s.phase == Some(RemediationPhase::Waiting)
    })
    .await
}

/// What a manager that crashed mid-restart leaves behind: the attempt
/// recorded (phase Rebooting, retryCount 1, the instance to delete), the
/// delete maybe not made. A restarted manager finishes that attempt (the
/// recorded instance is deleted, the count stays 1) and, when the recorded
/// instance was already replaced, leaves the new one alone.
#[tokio::test]
async fn a_restarted_manager_finishes_a_recorded_restart_and_never_repeats_it() {
    let mut world = KubevirtWorld::start().await;
    let machine = world.provisioned_worker("demo", "demo-worker-3").await;
    let first = world.vmi_uid("demo-worker-3").await;
    let template = world.template("reboot", json!({ "retryLimit": 3 })).await;
    let remediations: Api<KubevirtRemediation> = world.api();

    // The crash: an attempt recorded for the running instance, no delete.
    let status = restart_after_recorded_crash(
        &mut world,
        &template,
        &machine,
        &first,
        "the recorded restart finished",
    )
    .await;
    assert_eq!(
        status.retry_count,
        Some(1),
        "the same attempt, not a new one"
    );
    let second = world
        .wait_vmi("demo-worker-3", |v| {
            v.uid().as_deref() != Some(first.as_str())
        })
        .await
        .uid()
        .unwrap();

    // The crash after the delete: the recorded instance is already gone and
    // replaced. The new instance must survive the restarted manager.
    remediations
        .delete("demo-worker-3", &DeleteParams::default())
        .await
        .expect("delete the remediation");
    fixtures::wait_for_absence(
        &remediations,
        "demo-worker-3",
        "the remediation to be gone",
        DEADLINE,
    )
    .await
    .unwrap();
    let status = restart_after_recorded_crash(
        &mut world,
        &template,
        &machine,
        &first,
        "the recorded restart seen through",
    )
    .await;
    assert_eq!(status.retry_count, Some(1));
    let vmi = world.wait_vmi("demo-worker-3", |_| true).await;
    assert_eq!(
        vmi.uid().as_deref(),
        Some(second.as_str()),
        "the instance that replaced the recorded one was not deleted"
    );
    assert!(vmi.metadata.deletion_timestamp.is_none());
}

// ---------------------------------------------------------------- Proxmox VE

const TENANT: &str = "tenant-a";

/// A management cluster with CAPI core, the in-cluster IPAM provider, the
/// PVE simulator (a Talos template and tenantry's roles, as a platform
/// operator sets it up: [`tenantry_e2e::pve_lab`]) and tenantry.
struct ProxmoxWorld {
    inner: World,
}

impl ProxmoxWorld {
    async fn start() -> Self {
        let inner = World::builder("management")
            .cluster_api()
            .ipam()
            .pve(lab_config(&[TENANT]))
            .tenantry()
            .start()
            .await;
        Self { inner }
    }

    fn client(&self) -> kube::Client {
        self.inner.client()
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        self.inner.fail(error)
    }

    /// The tenant on the hypervisor (pool, storages, user and
    /// privilege-separated token granted what `docs/proxmox.md` lists), its
    /// namespace, credentials, ProxmoxCluster and Cluster, and one worker
    /// cloned into the tenant's pool and provisioned.
    async fn provisioned_worker(&self, name: &str) -> (Machine, ProxmoxMachine) {
        let world = &self.inner;
        let token = world.pve().tenant(TENANT, &[]).await;
        let client = self.client();
        world.create_namespace(TENANT).await;
        world
            .create(
                TENANT,
                fixtures::pve_credentials("pve-credentials", world.pve(), &token),
            )
            .await;
        world
            .create(
                TENANT,
                fixtures::proxmox_cluster("demo", 1, "pve-credentials"),
            )
            .await;
        world
            .create(TENANT, fixtures::cluster("demo", "ProxmoxCluster"))
            .await;
        let data = fixtures::talos_worker_config(
            &format!("t-{name}"),
            &format!("https://kubernetes-demo.{TENANT}.svc:6443"),
        );
        let spec = json!({
            "sourceNode": TEMPLATE_NODE, "templateID": TEMPLATE,
            "pool": TENANT, "full": true, "storage": format!("{TENANT}-disks"), "isoStorage": format!("{TENANT}-iso"),
            "numSockets": 1, "numCores": 2, "memoryMiB": 2048,
            "network": { "networkDevices": [{ "name": "net0", "bridge": "vmbr0", "model": "virtio" }] },
        });
        for document in fixtures::worker(
            PVE_API_VERSION,
            "ProxmoxMachine",
            "demo",
            name,
            spec,
            json!({ "value": data }),
        ) {
            world.create(TENANT, document).await;
        }
        let proxmox_machine = fixtures::wait_for_object(
            &Api::<ProxmoxMachine>::namespaced(client.clone(), TENANT),
            name,
            format!("ProxmoxMachine {name} provisioned"),
            DEADLINE,
            |m| {
                let provisioned = m
                    .status
                    .as_ref()
                    .is_some_and(|s| fixtures::provisioned(&s.initialization));
                (provisioned && m.spec.virtual_machine_id.is_some()).then_some(m)
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(e));
        let machine = Api::<Machine>::namespaced(client, TENANT)
            .get(name)
            .await
            .expect("Machine");
        (machine, proxmox_machine)
    }
}

/// A ProxmoxRemediation resets the VM through the PVE API, with the
/// tenant's pool-scoped token: the guest boots again (its boot counter
/// grows by one), the VM keeps its vmid, node and disks. The Machine never
/// turns healthy, so after the timeout, with retryLimit 1, the Machine is
/// deleted for replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxmox_reset_reboots_the_vm_in_place_then_replaces_the_machine() {
    let world = ProxmoxWorld::start().await;
    let client = world.client();
    let (machine, proxmox_machine) = world.provisioned_worker("worker-1").await;
    hold(&client, TENANT, "worker-1").await;
    let vmid = proxmox_machine.spec.virtual_machine_id.unwrap() as u32;
    let vm_of = |snapshot: &tenantry_e2e::sim::proxmox::ClusterSnapshot| {
        snapshot
            .vms
            .iter()
            .find(|vm| vm.vmid == vmid)
            .cloned()
            .expect("the machine's VM")
    };
    let before = vm_of(&world.inner.pve().sim.snapshot());
    let disks = |vm: &tenantry_e2e::sim::proxmox::VmSnapshot| {
        vm.config
            .iter()
            .filter(|(k, _)| {
                k.starts_with("scsi") || k.starts_with("virtio") || k.starts_with("sata")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };

    let template = create_template(
        &client,
        TENANT,
        PVE_API_VERSION,
        "ProxmoxRemediationTemplate",
        "reset-once",
        json!({ "retryLimit": 1, "timeout": "5s" }),
    )
    .await;
    create_remediation_as_mhc(&client, &template, &machine).await;

    let remediations: Api<ProxmoxRemediation> = Api::namespaced(client.clone(), TENANT);
    let waiting = wait_status(
        &remediations,
        "worker-1",
        "one reset, waiting",
        |r: &ProxmoxRemediation| r.status.clone(),
        |s| s.phase == Some(RemediationPhase::Waiting),
    )
    .await;
    assert_eq!(waiting.retry_count, Some(1));
    // The same VM, on the same node and disks, rebooted once. (Looked at
    // now: once the Machine is replaced, CAPI deletes the VM.)
    let after = vm_of(&world.inner.pve().sim.snapshot());
    assert_eq!(after.node, before.node);
    assert_eq!(disks(&after), disks(&before), "the same disks");
    assert_eq!(after.boots, before.boots + 1, "the guest booted once more");
    let upid = waiting.task_ref.clone().expect("the reset task's UPID");
    let snapshot = world.inner.pve().sim.snapshot();
    let task = snapshot
        .tasks
        .iter()
        .find(|t| t.upid == upid)
        .expect("the reset task on the hypervisor");
    assert_eq!(task.task_type, "qmreset");
    assert_eq!(task.id, vmid.to_string());
    assert!(
        task.user.starts_with(&format!("{TENANT}@pve!")),
        "made with the tenant's token: {}",
        task.user
    );

    let replacing = wait_status(
        &remediations,
        "worker-1",
        "retries exhausted, Machine replaced",
        |r: &ProxmoxRemediation| r.status.clone(),
        |s| s.phase == Some(RemediationPhase::Replacing),
    )
    .await;
    assert_eq!(replacing.retry_count, Some(1), "one reset, no more");
    let condition = remediated(&replacing).expect("Remediated condition");
    assert_eq!(condition.reason, "RetriesExhausted", "{condition:?}");
    assert!(
        condition.message.contains("Machine worker-1"),
        "{condition:?}"
    );
    wait_machine_deleting(&client, TENANT, "worker-1").await;
    let events = events_of(&client, TENANT, "worker-1").await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("MachineDeleted")),
        "{events:?}"
    );

    let resets = world
        .inner
        .pve()
        .sim
        .snapshot()
        .tasks
        .iter()
        .filter(|t| t.task_type == "qmreset" && t.id == vmid.to_string())
        .count();
    assert_eq!(resets, 1, "exactly one reset for retryLimit 1");
}
