//! The KubeVirt world of the chaos scenarios: the benchmark's, but with
//! KubeVirt's own virt-api and virt-controller in the loop (the simulator
//! plays the kubelet, virt-handler and CDI), tenantry as [`Replicas`], and
//! machines that also get a blank DataVolume (so that a machine has a disk
//! to leave behind), counted through the objects KubeVirt and CDI keep.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};
use tenantry_api::kubevirt::KUBEVIRT_MACHINE_FINALIZER;
use tenantry_provider::kubevirt::render::MACHINE_NAME_LABEL;

use super::audit::AuditLog;
use super::lab::ManagerSetup;
use super::lab::{self, Lab, list, names, some_of};
use super::{ChaosConfig, Outcome, Replicas};
use crate::bench::kubevirt::{self as world, World};
use crate::bench::{BenchConfig, NAMESPACE, Provider, resource};
use crate::control_plane::ControlPlane;
use crate::sim::kubevirt::KubevirtSimConfig;

/// The label virt-controller puts on the launcher pods it makes.
const LAUNCHER_LABEL: &str = "kubevirt.io=virt-launcher";
/// The Cluster API version the machines' owners are written in.
const CAPI_VERSION: &str = "v1beta2";
/// How long deleted objects get to go before they count as left behind:
/// the garbage collector removes a DataVolume's PVC after the DataVolume,
/// and finds one whose DataVolume was gone before it (created from a stale
/// cache, as CDI may) only on a later pass.
const GRACE: Duration = Duration::from_secs(60);

fn virtual_machine_instances() -> kube::api::ApiResource {
    resource(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
        "virtualmachineinstances",
    )
}

fn data_volumes() -> kube::api::ApiResource {
    resource("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes")
}

/// Paced like a small, quick cluster (100 ms steps) rather than the
/// benchmark's instant one, so that a kill or a restart lands while
/// KubeVirt is still at work.
fn sim_config() -> KubevirtSimConfig {
    KubevirtSimConfig {
        ip_pool: "10.128.0.0/12".into(),
        shutdown_grace: Duration::from_millis(200),
        ..KubevirtSimConfig::fast()
    }
}

/// The benchmark's machine with a second disk: a blank DataVolume from the
/// VM's `dataVolumeTemplates` (tenantry names it `<machine>-data`).
fn machine_spec() -> Value {
    let mut spec = world::machine_spec();
    let vm = &mut spec["virtualMachineTemplate"]["spec"];
    vm["dataVolumeTemplates"] = json!([{
        "metadata": { "name": "data" },
        "spec": {
            "source": { "blank": {} },
            "storage": { "resources": { "requests": { "storage": "1Gi" } } }
        }
    }]);
    let guest = &mut vm["template"]["spec"];
    if let Some(disks) = guest["domain"]["devices"]["disks"].as_array_mut() {
        disks.push(json!({ "name": "data", "disk": { "bus": "virtio" } }));
    }
    if let Some(volumes) = guest["volumes"].as_array_mut() {
        volumes.push(json!({ "name": "data", "dataVolume": { "name": "data" } }));
    }
    spec
}

/// The KubeVirt world with tenantry running as replicas.
pub(crate) struct KubevirtLab {
    world: World<Replicas>,
    bench: BenchConfig,
    audit: Option<AuditLog>,
    made: VirtualMachinesMade,
}

/// Every VirtualMachine the world ever had, by UID, seen through a watch
/// that starts before the first machine. With names fixed per machine, a VM
/// made twice is one deleted and made again: a second UID. (The audit log
/// cannot tell: a create whose client was killed mid-request is logged as
/// failed, yet etcd may have committed it.)
struct VirtualMachinesMade {
    uids: Arc<Mutex<HashSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl VirtualMachinesMade {
    async fn watch(api: Api<DynamicObject>) -> anyhow::Result<Self> {
        let uids = Arc::new(Mutex::new(HashSet::new()));
        let (listed, mut first_list) = tokio::sync::oneshot::channel::<()>();
        let seen = uids.clone();
        let task = tokio::spawn(async move {
            let mut listed = Some(listed);
            let events = watcher(api, watcher::Config::default()).default_backoff();
            futures::pin_mut!(events);
            loop {
                match events.try_next().await {
                    Ok(Some(event)) => match &event {
                        watcher::Event::Apply(vm) | watcher::Event::InitApply(vm) => {
                            if let Some(uid) = &vm.metadata.uid {
                                seen.lock().expect("uids").insert(uid.clone());
                            }
                        }
                        watcher::Event::InitDone => {
                            if let Some(listed) = listed.take() {
                                let _ = listed.send(());
                            }
                        }
                        _ => {}
                    },
                    Ok(None) => break,
                    Err(error) => tracing::debug!(%error, "VirtualMachine watch"),
                }
            }
        });
        // The watch counts from its first list on, so wait for that.
        tokio::time::timeout(Duration::from_secs(60), &mut first_list)
            .await
            .context("the VirtualMachine watch did not list within a minute")?
            .context("the VirtualMachine watch ended before its first list")?;
        Ok(Self { uids, task })
    }

    fn count(&self) -> usize {
        self.uids.lock().expect("uids").len()
    }
}

impl Drop for VirtualMachinesMade {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KubevirtLab {
    /// A fresh world named `name` with `replicas` tenantry processes, and
    /// the Cluster with its KubevirtCluster ready.
    pub(crate) async fn start(
        config: &ChaosConfig,
        name: &str,
        setup: &ManagerSetup,
    ) -> anyhow::Result<Self> {
        let bench = config.bench()?;
        let (audit, apiserver_args) = setup.audit_log()?;
        let staged = world::stage(
            &bench,
            Provider::Tenantry,
            false,
            name,
            apiserver_args,
            world::Kubevirt::Real,
            sim_config(),
        )
        .await?;
        let running = setup
            .start_replicas(bench.binaries.clone(), &staged.control_plane, NAMESPACE)
            .await?;
        let world = staged.with_provider(running);
        world::create_cluster(&world, CAPI_VERSION, false, &bench)
            .await
            .with_context(|| world.provider.log_tails(20))?;
        let made = VirtualMachinesMade::watch(world.api(&world::virtual_machines())).await?;
        Ok(Self {
            world,
            bench,
            audit,
            made,
        })
    }
}

impl Lab for KubevirtLab {
    fn control_plane(&self) -> &ControlPlane {
        &self.world.control_plane
    }

    fn replicas_and_control_plane(&mut self) -> (&mut Replicas, &mut ControlPlane) {
        (&mut self.world.provider, &mut self.world.control_plane)
    }

    fn vms_made(&self) -> (&'static str, usize) {
        ("VirtualMachines made (distinct UIDs)", self.made.count())
    }

    fn audit(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    async fn create_machines(&self, machines: usize) -> anyhow::Result<()> {
        let requested = Arc::new(Mutex::new(HashMap::new()));
        world::create_machines(
            &self.world,
            CAPI_VERSION,
            machines,
            &machine_spec(),
            &self.bench,
            &requested,
        )
        .await
    }

    fn machine_resource() -> ApiResource {
        world::kubevirt_machines()
    }

    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        self.world.api(resource)
    }

    async fn count_provisioned(
        &self,
        expected: usize,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()> {
        let machines = self.machines().await?;
        let machine_names = names(&machines);
        let provisioned = lab::count_machines(&machines, expected, outcome);

        // A VM is the machine's when it carries its name or its label.
        let vms = list(&self.world.api(&world::virtual_machines())).await?;
        outcome.count("VirtualMachines", vms.len());
        let mut per_machine: BTreeMap<&str, usize> =
            machine_names.iter().map(|n| (n.as_str(), 0)).collect();
        let mut orphans = Vec::new();
        for vm in &vms {
            let name = vm.metadata.name.clone().unwrap_or_default();
            let label = vm
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MACHINE_NAME_LABEL))
                .cloned();
            let owner = [Some(name.clone()), label]
                .into_iter()
                .flatten()
                .find(|candidate| per_machine.contains_key(candidate.as_str()));
            match owner.and_then(|o| per_machine.get_mut(o.as_str())) {
                Some(count) => *count += 1,
                None => orphans.push(name),
            }
        }
        let missing: Vec<String> = per_machine
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(m, _)| m.to_string())
            .collect();
        let duplicated: Vec<String> = per_machine
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(m, n)| format!("{m} ({n} VMs)"))
            .collect();
        let one_each = per_machine.values().filter(|n| **n == 1).count();
        outcome.exactly("machines with exactly one VM", one_each, expected);
        outcome.none("machines without a VM", &missing);
        outcome.zero(
            "duplicate VMs",
            per_machine.values().map(|n| n.saturating_sub(1)).sum(),
            || some_of(&duplicated, 5),
        );
        outcome.none("orphaned VMs", &orphans);

        let instances = list(&self.world.api(&virtual_machine_instances())).await?;
        outcome.exactly("VirtualMachineInstances", instances.len(), expected);
        let mut phases = BTreeMap::<String, usize>::new();
        for instance in &instances {
            let phase = instance.data["status"]["phase"].as_str().unwrap_or("-");
            let ready = instance.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let key = format!("{phase}{}", if ready { " (Ready)" } else { "" });
            *phases.entry(key).or_default() += 1;
        }
        outcome.note(format!("VirtualMachineInstance phases: {phases:?}"));
        if provisioned < expected {
            outcome.note(format!(
                "machines not provisioned say: {}",
                lab::ready_reasons(&machines)
            ));
        }

        let expected_volumes: Vec<String> =
            machine_names.iter().map(|m| format!("{m}-data")).collect();
        let volumes = names(&list(&self.world.api(&data_volumes())).await?);
        outcome.exactly("DataVolumes", volumes.len(), expected);
        let stray: Vec<String> = volumes
            .iter()
            .filter(|v| !expected_volumes.contains(v))
            .cloned()
            .collect();
        outcome.none("orphaned DataVolumes", &stray);

        let secrets = self.userdata_secrets().await?;
        outcome.exactly("userdata Secrets", secrets.len(), expected);
        let stray: Vec<String> = secrets
            .iter()
            .filter(|s| {
                !machine_names.iter().any(|m| {
                    **s == tenantry_provider::kubevirt::machine::act::userdata_secret_name(m)
                })
            })
            .cloned()
            .collect();
        outcome.none("orphaned userdata Secrets", &stray);
        Ok(())
    }

    async fn count_leftovers(&self, outcome: &mut Outcome) -> anyhow::Result<()> {
        #[derive(Default)]
        struct Left {
            machines: Vec<String>,
            finalized: usize,
            vms: Vec<String>,
            instances: Vec<String>,
            volumes: Vec<String>,
            claims: Vec<String>,
            secrets: Vec<String>,
            launchers: Vec<String>,
        }
        let settling = Instant::now();
        let left = lab::settle(GRACE, || async {
            let machines = self.machines().await?;
            let left = Left {
                finalized: lab::holding(&machines, KUBEVIRT_MACHINE_FINALIZER),
                machines: names(&machines),
                vms: names(&list(&self.world.api(&world::virtual_machines())).await?),
                instances: names(&list(&self.world.api(&virtual_machine_instances())).await?),
                volumes: names(&list(&self.world.api(&data_volumes())).await?),
                claims: Api::<PersistentVolumeClaim>::namespaced(
                    self.world.client.clone(),
                    NAMESPACE,
                )
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|c| describe_claim(&c))
                .collect(),
                secrets: self.userdata_secrets().await?,
                launchers: self.labelled::<Pod>(LAUNCHER_LABEL).await?,
            };
            let clean = left.machines.is_empty()
                && left.vms.is_empty()
                && left.instances.is_empty()
                && left.volumes.is_empty()
                && left.claims.is_empty()
                && left.secrets.is_empty()
                && left.launchers.is_empty();
            Ok((left, clean))
        })
        .await?;
        outcome.count(
            "seconds until nothing was left",
            format!("{:.0}", settling.elapsed().as_secs_f64()),
        );
        lab::count_machines_left(outcome, &left.machines, left.finalized);
        outcome.none("VirtualMachines left", &left.vms);
        outcome.none("VirtualMachineInstances left", &left.instances);
        outcome.none("DataVolumes left", &left.volumes);
        outcome.none("PersistentVolumeClaims left", &left.claims);
        outcome.none("userdata Secrets left", &left.secrets);
        outcome.none("virt-launcher Pods left", &left.launchers);
        Ok(())
    }

    fn log_paths(&self) -> Vec<std::path::PathBuf> {
        let mut paths = self.world.provider.log_paths();
        let dir = self.world.control_plane.dir();
        paths.push(dir.join("kube-apiserver.log"));
        paths.push(dir.join("virt-controller/virt-controller.log"));
        paths.push(dir.join("virt-api/virt-api.log"));
        paths
    }

    fn log_tails(&self) -> String {
        let mut tails = self.world.provider.log_tails(30);
        if let Some(controller) = self.world.sim.virt_controller_log(20) {
            tails.push_str("\n---- virt-controller ----\n");
            tails.push_str(&controller);
        }
        tails
    }
}

/// A PersistentVolumeClaim's name, owner and whether it is being deleted
/// (and by what it is held), for a failure message.
fn describe_claim(claim: &PersistentVolumeClaim) -> String {
    let meta = &claim.metadata;
    let owners: Vec<String> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|o| format!("{} {}", o.kind, o.name))
        .collect();
    let deleting = match (&meta.deletion_timestamp, &meta.finalizers) {
        (Some(_), Some(finalizers)) => format!(", deleting, held by {}", finalizers.join(" ")),
        (Some(_), None) => ", deleting".to_string(),
        (None, _) => String::new(),
    };
    format!(
        "{} (owner {}{deleting})",
        meta.name.clone().unwrap_or_default(),
        if owners.is_empty() {
            "none".to_string()
        } else {
            owners.join(", ")
        }
    )
}

impl KubevirtLab {
    /// The Secrets tenantry wrote for machines (labelled with the machine's
    /// name, as CAPK labels them).
    async fn userdata_secrets(&self) -> anyhow::Result<Vec<String>> {
        self.labelled::<Secret>(MACHINE_NAME_LABEL).await
    }

    /// The names of the world's objects of kind `K` that match `selector`.
    async fn labelled<K>(&self, selector: &str) -> anyhow::Result<Vec<String>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Ok(Api::<K>::namespaced(self.world.client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(selector))
            .await?
            .items
            .into_iter()
            .map(|object| object.meta().name.clone().unwrap_or_default())
            .collect())
    }
}
