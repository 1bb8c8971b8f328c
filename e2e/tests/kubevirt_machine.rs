//! KubevirtCluster and KubevirtMachine end to end: the real kube-apiserver,
//! the real Cluster API core manager, tenantry's reconcilers in-process and
//! the KubeVirt/CDI simulator. Everything asserted is what a user would look
//! at: object status and conditions, and what exists in the "substrate".

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tenantry_api::contract::PAUSED_ANNOTATION;
use tenantry_api::generated::capi::cluster::Cluster;
use tenantry_api::generated::capi::machine::Machine;
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{KubevirtCluster, KubevirtMachine};
use tenantry_e2e::fixtures::{self, KUBEVIRT_API_VERSION, NamespacedKind, names};
use tenantry_e2e::sim::kubevirt::{
    BOOTSTRAP_SENTINEL, DEFAULT_SCHEMATIC, Fault, FaultTarget, ImageFactory, ImageFactoryConfig,
    KubevirtSimConfig, KubevirtSimulator, SshGuestConfig,
};
use tenantry_e2e::{Kubevirt, WorldBuilder, wait};

const DEADLINE: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "default";
const TALOS_VERSION: &str = "v1.13.0";
const MACHINE_LABEL: &str = "capk.cluster.x-k8s.io/kubevirt-machine-name";

/// A management cluster with CAPI core, KubeVirt (its own virt-api and
/// virt-controller, the simulator for the rest), an image factory and
/// tenantry.
struct World {
    inner: tenantry_e2e::World,
}

impl World {
    async fn start() -> Self {
        Self::start_from(Self::builder(KubevirtSimConfig::fast())).await
    }

    /// Guests that run an SSH server on port 22 of a loopback address, for
    /// the ssh bootstrap check (binding port 22 needs root).
    async fn start_with_ssh_guests(guests: SshGuestConfig) -> Self {
        Self::start_from(Self::ssh_guests(guests)).await
    }

    fn ssh_guests(guests: SshGuestConfig) -> WorldBuilder {
        Self::builder(KubevirtSimConfig::fast().with_ssh_guests(guests))
    }

    fn builder(sim_config: KubevirtSimConfig) -> WorldBuilder {
        tenantry_e2e::World::builder("management")
            .cluster_api()
            .kubevirt(Kubevirt::Real, sim_config)
            .image_factory(ImageFactoryConfig {
                versions: vec![TALOS_VERSION.into()],
                ..Default::default()
            })
            .tenantry()
    }

    async fn start_from(builder: WorldBuilder) -> Self {
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

    fn sim(&self) -> &KubevirtSimulator {
        self.inner.kubevirt()
    }

    fn factory(&self) -> &ImageFactory {
        self.inner.factory()
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        self.inner.fail(error)
    }

    async fn get<K: NamespacedKind>(&self, name: &str) -> K {
        self.api::<K>()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get {} {name}: {e}", K::kind(&())))
    }

    async fn get_opt<K: NamespacedKind>(&self, name: &str) -> Option<K> {
        self.api::<K>()
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("get {} {name}: {e}", K::kind(&())))
    }

    async fn create(&self, document: Value) {
        self.inner.create(NAMESPACE, document).await;
    }

    /// A CAPI Cluster with a KubevirtCluster, as CAPK's templates make them.
    async fn create_cluster(&self, name: &str, kubevirt_cluster_spec: Value) {
        self.create(fixtures::kubevirt_cluster(name, kubevirt_cluster_spec))
            .await;
        self.create(fixtures::cluster(name, "KubevirtCluster"))
            .await;
    }

    /// [`Self::create_cluster`] with the default spec, once provisioned.
    async fn create_provisioned_cluster(&self, name: &str) -> KubevirtCluster {
        self.create_cluster(name, json!({})).await;
        self.wait_cluster_provisioned(name).await
    }

    /// A worker: its bootstrap data Secret, KubevirtMachine and Machine.
    async fn create_worker(&self, cluster: &str, name: &str, machine_spec: Value) {
        self.create_worker_with_data(cluster, name, machine_spec, &talos_worker_config(cluster))
            .await;
    }

    /// A worker booting Talos from the local factory.
    async fn create_talos_worker(&self, cluster: &str, name: &str) {
        self.create_worker(cluster, name, self.talos_machine_spec(TALOS_VERSION))
            .await;
    }

    /// A worker with the given bootstrap data.
    async fn create_worker_with_data(
        &self,
        cluster: &str,
        name: &str,
        machine_spec: Value,
        data: &str,
    ) {
        self.create_worker_annotated(cluster, name, machine_spec, data, json!({}))
            .await;
    }

    /// A worker whose KubevirtMachine carries `annotations` from its
    /// creation on.
    async fn create_worker_annotated(
        &self,
        cluster: &str,
        name: &str,
        machine_spec: Value,
        data: &str,
        annotations: Value,
    ) {
        let mut documents = fixtures::worker(
            KUBEVIRT_API_VERSION,
            "KubevirtMachine",
            cluster,
            name,
            machine_spec,
            json!({ "value": data, "format": "cloud-config" }),
        );
        // The KubevirtMachine, between its bootstrap Secret and Machine.
        documents[1]["metadata"]["annotations"] = annotations;
        for document in documents {
            self.create(document).await;
        }
    }

    /// Deletes the CAPI Machine `name`, as scaling down does.
    async fn delete_machine(&self, name: &str) {
        self.api::<Machine>()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete Machine");
    }

    /// Sets the Cluster's `spec.paused`.
    async fn pause_cluster(&self, name: &str, paused: bool) {
        self.api::<Cluster>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "paused": paused } })),
            )
            .await
            .expect("pause or unpause Cluster");
    }

    /// A KubevirtMachine spec with a Talos boot disk from the local factory.
    fn talos_machine_spec(&self, talos_version: &str) -> Value {
        fixtures::talos_machine_spec(self.factory().base_url(), talos_version)
    }

    /// A KubevirtMachine spec for a cloud-init image (a container disk, as
    /// CAPK's kubeadm templates use) with the default, ssh, bootstrap check.
    fn cloud_init_machine_spec(&self) -> Value {
        json!({
            "virtualMachineTemplate": { "spec": {
                "runStrategy": "Always",
                "template": { "spec": {
                    "domain": {
                        "cpu": { "cores": 2 },
                        "memory": { "guest": "4Gi" },
                        "devices": {
                            "disks": [{ "name": "containervolume", "disk": { "bus": "virtio" } }],
                            "interfaces": [{ "name": "default", "bridge": {} }]
                        }
                    },
                    "networks": [{ "name": "default", "pod": {} }],
                    "volumes": [{ "name": "containervolume", "containerDisk": { "image": "quay.io/capk/ubuntu-2404-container-disk:v1.34.1" } }]
                }}
            }}
        })
    }

    /// Waits until the simulated guest of `name` runs its SSH server, and
    /// fails with the guest's log if it cannot (port 22 needs root).
    async fn wait_guest_sshd(&self, name: &str) {
        let sim = self.sim();
        let outcome = wait::until(
            format!("the guest of {name} to run sshd"),
            DEADLINE,
            || async move {
                let log = sim.guest_log(NAMESPACE, name);
                if log.iter().any(|l| l.contains("sshd: listening on")) {
                    return Ok(Some(Ok(())));
                }
                if let Some(failure) = log.iter().find(|l| {
                    l.contains("sshd: cannot listen")
                        || l.contains("sshd: the VMI has no")
                        || l.contains("no sshd")
                }) {
                    return Ok(Some(Err(failure.clone())));
                }
                Ok(None)
            },
        )
        .await
        .unwrap_or_else(|e| self.fail_with_guest(name, e));
        if let Err(failure) = outcome {
            panic!(
                "the simulated guest of {name} has no SSH server, so the ssh bootstrap check cannot run \
                 (these tests bind port 22 on loopback addresses and must run as root): {failure}\n---- guest log ----\n{}",
                sim.guest_log(NAMESPACE, name).join("\n")
            );
        }
    }

    fn fail_with_guest(&self, name: &str, error: anyhow::Error) -> ! {
        panic!(
            "{error:#}\n---- guest log of {name} ----\n{}{}",
            self.sim().guest_log(NAMESPACE, name).join("\n"),
            self.inner.diagnostics()
        )
    }

    /// Waits for the KubevirtMachine `name` to satisfy `predicate`; fails
    /// with its guest's log (the ssh check's side of the story) too.
    async fn wait_machine(
        &self,
        name: &str,
        what: &str,
        predicate: impl Fn(&KubevirtMachine) -> bool,
    ) -> KubevirtMachine {
        fixtures::wait_for_object(
            &self.api(),
            name,
            format!("KubevirtMachine {name}: {what}"),
            DEADLINE,
            |m| predicate(&m).then_some(m),
        )
        .await
        .unwrap_or_else(|e| self.fail_with_guest(name, e))
    }

    async fn wait_cluster_provisioned(&self, name: &str) -> KubevirtCluster {
        fixtures::wait_for_object(
            &self.api::<Cluster>(),
            name,
            format!("Cluster {name} infrastructure provisioned"),
            DEADLINE,
            |cluster| {
                let provisioned = cluster
                    .status
                    .as_ref()
                    .and_then(|s| s.initialization.as_ref())
                    .and_then(|i| i.infrastructure_provisioned)
                    == Some(true);
                provisioned.then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(e));
        self.api::<KubevirtCluster>()
            .get(name)
            .await
            .expect("KubevirtCluster")
    }

    /// Waits until nothing of the machine is left: KubevirtMachine, VM, VMI,
    /// DataVolumes, PVCs, userdata Secret.
    async fn wait_all_gone(&self, names: &[String]) {
        let client = self.client();
        wait::until(
            format!("machines {names:?} and all their objects to be gone"),
            DEADLINE,
            || {
                let client = client.clone();
                async move {
                    let left = leftovers(&client, names).await?;
                    Ok(left.is_empty().then_some(()).or_else(|| {
                        tracing::debug!(?left, "still present");
                        None
                    }))
                }
            },
        )
        .await
        .unwrap_or_else(|e| self.fail(e));
    }
}

/// Everything of the given machines that still exists, by kind and name.
async fn leftovers(client: &kube::Client, machines: &[String]) -> anyhow::Result<Vec<String>> {
    fn api<K: NamespacedKind>(client: &kube::Client) -> Api<K> {
        Api::namespaced(client.clone(), NAMESPACE)
    }
    let found = [
        (
            "KubevirtMachine",
            names(&api::<KubevirtMachine>(client)).await?,
        ),
        (
            "VirtualMachine",
            names(&api::<VirtualMachine>(client)).await?,
        ),
        (
            "VirtualMachineInstance",
            names(&api::<VirtualMachineInstance>(client)).await?,
        ),
        ("DataVolume", names(&api::<DataVolume>(client)).await?),
        (
            "PersistentVolumeClaim",
            names(&api::<PersistentVolumeClaim>(client)).await?,
        ),
        (
            "Secret",
            names(&api::<Secret>(client))
                .await?
                .into_iter()
                .filter(|n| n.ends_with("-userdata"))
                .collect(),
        ),
    ];
    Ok(found
        .into_iter()
        .flat_map(|(kind, items)| {
            items
                .into_iter()
                .filter(|n| machines.iter().any(|m| n.starts_with(m.as_str())))
                .map(move |n| format!("{kind} {n}"))
        })
        .collect())
}

/// Kubeadm join data shaped as CABPK writes it: cloud-init's jinja marker,
/// the join configuration, and the command that writes CAPI's sentinel.
fn kubeadm_join_config() -> String {
    format!(
        r#"## template: jinja
#cloud-config

write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      apiVersion: kubeadm.k8s.io/v1beta4
      kind: JoinConfiguration
      discovery:
        bootstrapToken:
          apiServerEndpoint: 10.95.0.1:6443
          token: abcdef.0123456789abcdef
          unsafeSkipCAVerification: true
      nodeRegistration:
        name: '{{{{ ds.meta_data.local_hostname }}}}'
-   path: /run/cluster-api/placeholder
    owner: root:root
    permissions: '0640'
    content: "This placeholder file is used to create the /run/cluster-api sub directory"
runcmd:
  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > {BOOTSTRAP_SENTINEL}
"#
    )
}

/// The lines of a PEM private key that are unique to it (the first line of
/// every OpenSSH key starts alike).
fn private_key_lines(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----"))
        .skip(1)
        .map(str::to_string)
        .filter(|l| l.len() > 16)
        .collect()
}

fn talos_worker_config(cluster: &str) -> String {
    fixtures::talos_worker_config(
        "test-token",
        &format!("https://kubernetes-{cluster}.{NAMESPACE}.svc:6443"),
    )
}

fn condition<'a>(machine: &'a KubevirtMachine, type_: &str) -> Option<&'a Condition> {
    fixtures::condition(&machine.status.as_ref()?.conditions, type_)
}

/// The label or annotation `key` of `entries`.
fn entry<'a>(entries: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    entries.as_ref()?.get(key).map(String::as_str)
}

fn is_provisioned(machine: &KubevirtMachine) -> bool {
    machine
        .status
        .as_ref()
        .is_some_and(|s| fixtures::provisioned(&s.initialization))
        && condition(machine, "Ready").is_some_and(|c| c.status == "True")
}

#[tokio::test]
async fn machine_is_provisioned_through_capi_and_deletion_waits_for_the_vm() {
    let world = World::start().await;
    let kubevirt_cluster = world.create_provisioned_cluster("demo").await;

    // The control-plane Service exists and gave the cluster its endpoint.
    let service = world.get::<Service>("demo-lb").await;
    let spec = service.spec.expect("service spec");
    assert_eq!(spec.ports.unwrap()[0].port, 6443);
    let endpoint = kubevirt_cluster
        .spec
        .control_plane_endpoint
        .expect("endpoint");
    assert_eq!(Some(endpoint.host), spec.cluster_ip);
    assert_eq!(endpoint.port, 6443);

    // The simulated guest takes 5 s to shut down, so deletion is observable.
    let mut spec = world.talos_machine_spec(TALOS_VERSION);
    spec["virtualMachineTemplate"]["metadata"] =
        json!({ "annotations": { "sim.tenantry.dev/shutdown-grace": "5s" } });
    world.create_worker("demo", "demo-worker-1", spec).await;
    let machine = world
        .wait_machine("demo-worker-1", "provisioned", is_provisioned)
        .await;
    assert_eq!(
        machine.spec.provider_id.as_deref(),
        Some("kubevirt://demo-worker-1")
    );
    let status = machine.status.clone().unwrap();
    assert!(status.ready);
    let addresses = status.addresses.unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| format!("{:?}", a.type_) == "InternalIP"),
        "{addresses:?}"
    );

    // CAPI saw it: the Machine took over providerID and infrastructure state.
    let machines: Api<Machine> = world.api();
    let capi_machine = wait::until(
        "CAPI Machine to see its infrastructure provisioned",
        DEADLINE,
        || {
            let machines = machines.clone();
            async move {
                let m = machines.get("demo-worker-1").await?;
                let provisioned = m
                    .status
                    .as_ref()
                    .and_then(|s| s.initialization.as_ref())
                    .and_then(|i| i.infrastructure_provisioned)
                    == Some(true);
                Ok(provisioned.then_some(m))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    assert_eq!(
        capi_machine.spec.provider_id.as_deref(),
        Some("kubevirt://demo-worker-1")
    );

    // The VM: named after the machine, its own Talos disk from the factory.
    let vm = world.get::<VirtualMachine>("demo-worker-1").await;
    let vm = serde_json::to_value(vm).unwrap();
    let dv = &vm["spec"]["dataVolumeTemplates"][0];
    assert_eq!(dv["metadata"]["name"], "demo-worker-1-talos-boot");
    let url = world
        .factory()
        .image_url(DEFAULT_SCHEMATIC, TALOS_VERSION, "openstack-amd64.raw.xz");
    assert_eq!(dv["spec"]["source"]["http"]["url"], url);
    assert_eq!(vm["spec"]["template"]["spec"]["hostname"], "demo-worker-1");
    assert!(
        world.factory().requests() >= 1,
        "CDI fetched the image from the factory"
    );
    let userdata = world.get::<Secret>("demo-worker-1-userdata").await;
    assert_eq!(
        String::from_utf8_lossy(&userdata.data.unwrap()["userdata"].0),
        talos_worker_config("demo")
    );

    // Deleting the CAPI Machine deletes everything, and the KubevirtMachine
    // stays (with its finalizer, saying why) while the VM shuts down: the
    // guest takes its time until the test has seen that.
    let slow_shutdown = world.sim().faults().inject(
        FaultTarget::named(NAMESPACE, "demo-worker-1"),
        Fault::SlowShutdown(Duration::from_secs(3600)),
    );
    world.delete_machine("demo-worker-1").await;
    let vmis: Api<VirtualMachineInstance> = world.api();
    let machines: Api<KubevirtMachine> = world.api();
    wait::until(
        "the KubevirtMachine to wait for the shutting-down VM",
        DEADLINE,
        || {
            let (vmis, machines) = (vmis.clone(), machines.clone());
            async move {
                let vmi = vmis.get_opt("demo-worker-1").await?;
                let machine = machines.get_opt("demo-worker-1").await?;
                let shutting_down = vmi.is_some_and(|v| v.metadata.deletion_timestamp.is_some());
                let waiting = machine.is_some_and(|m| {
                    m.metadata.deletion_timestamp.is_some()
                        && condition(&m, "Ready").is_some_and(|c| c.reason == "Deleting")
                });
                Ok((shutting_down && waiting).then_some(()))
            }
        },
    )
    .await
    .unwrap_or_else(|e| world.fail(e));
    world.sim().faults().clear(slow_shutdown);
    world.wait_all_gone(&["demo-worker-1".to_string()]).await;
}

#[tokio::test]
async fn import_404_is_reported_and_deletion_leaves_nothing() {
    let world = World::start().await;
    world.create_provisioned_cluster("demo").await;
    world
        .create_worker("demo", "demo-bad-image", world.talos_machine_spec("v9.9.9"))
        .await;
    let machine = world
        .wait_machine("demo-bad-image", "reporting the failed import", |m| {
            condition(m, "Ready").is_some_and(|c| c.reason == "DataVolumeImportFailed")
        })
        .await;
    let ready = condition(&machine, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("got 404"), "{}", ready.message);
    assert!(
        ready.message.contains("demo-bad-image-talos-boot"),
        "{}",
        ready.message
    );
    assert!(
        world
            .get_opt::<VirtualMachineInstance>("demo-bad-image")
            .await
            .is_none()
    );

    world.delete_machine("demo-bad-image").await;
    world.wait_all_gone(&["demo-bad-image".to_string()]).await;
}

#[tokio::test]
async fn a_vm_that_never_becomes_ready_says_why() {
    let world = World::start().await;
    world.create_provisioned_cluster("demo").await;
    world.sim().faults().inject(
        FaultTarget::named(NAMESPACE, "demo-stuck"),
        Fault::Unschedulable(Some(
            "0/3 nodes are available: 3 Insufficient memory".into(),
        )),
    );
    world.create_talos_worker("demo", "demo-stuck").await;
    let machine = world
        .wait_machine("demo-stuck", "reporting the scheduling failure", |m| {
            condition(m, "Ready").is_some_and(|c| c.reason == "Unschedulable")
        })
        .await;
    let ready = condition(&machine, "Ready").unwrap();
    assert!(
        ready.message.contains("Insufficient memory"),
        "{}",
        ready.message
    );
    assert!(!is_provisioned(&machine));
    let vm_provisioned = condition(&machine, "VMProvisioned").unwrap();
    assert_eq!(vm_provisioned.reason, "Unschedulable");
}

#[tokio::test]
async fn paused_cluster_gets_no_vm_until_unpaused() {
    // Cluster API's Machine controller does not look at a Machine again when
    // its Cluster is unpaused (v1.14 watches Clusters only for the control
    // plane's initialization), so a Machine made while its Cluster was
    // paused waits for CAPI's resync before it owns its infrastructure. The
    // worker is therefore made with the object's own pause, which CAPI's
    // Machine controller does not share: CAPI adopts it, tenantry holds it.
    let world = World::start().await;
    world.create_provisioned_cluster("demo").await;
    world
        .create_worker_annotated(
            "demo",
            "demo-paused",
            world.talos_machine_spec(TALOS_VERSION),
            &talos_worker_config("demo"),
            json!({ PAUSED_ANNOTATION: "" }),
        )
        .await;
    let owned_and_paused = |m: &KubevirtMachine| {
        m.metadata
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| r.kind == "Machine"))
            && condition(m, "Paused")
                .is_some_and(|c| c.status == "True" && c.message.contains(PAUSED_ANNOTATION))
    };
    let machine = world
        .wait_machine(
            "demo-paused",
            "owned by its Machine and paused",
            owned_and_paused,
        )
        .await;
    assert_eq!(condition(&machine, "Paused").unwrap().reason, "Paused");

    // Pause the Cluster, then lift the object's pause: the Cluster's pause
    // alone holds the machine now.
    world.pause_cluster("demo", true).await;
    world
        .api::<KubevirtMachine>()
        .patch(
            "demo-paused",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { PAUSED_ANNOTATION: null } } })),
        )
        .await
        .expect("lift the KubevirtMachine's pause");
    let machine = world
        .wait_machine("demo-paused", "paused by its Cluster", |m| {
            condition(m, "Paused")
                .is_some_and(|c| c.status == "True" && c.message.contains("Cluster spec.paused"))
        })
        .await;
    // Paused means no write but the Paused condition: no VM was created.
    assert!(
        world
            .get_opt::<VirtualMachine>("demo-paused")
            .await
            .is_none()
    );
    assert!(condition(&machine, "VMProvisioned").is_none());

    world.pause_cluster("demo", false).await;
    let machine = world
        .wait_machine("demo-paused", "provisioned after unpause", is_provisioned)
        .await;
    assert_eq!(condition(&machine, "Paused").unwrap().status, "False");
}

#[tokio::test]
async fn manager_restart_mid_provisioning_creates_no_second_vm() {
    let mut world = World::start().await;
    world.create_provisioned_cluster("demo").await;
    world.sim().faults().inject(
        FaultTarget::any(),
        Fault::SlowImport(Duration::from_secs(4)),
    );
    world.create_talos_worker("demo", "demo-restart").await;
    let vms: Api<VirtualMachine> = world.api();
    let first = wait::until("the VM to be created", DEADLINE, || {
        let vms = vms.clone();
        async move { Ok(vms.get_opt("demo-restart").await?) }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    // Crash mid-import, start a fresh manager.
    world.inner.tenantry_mut().restart();
    world
        .wait_machine(
            "demo-restart",
            "provisioned after the restart",
            is_provisioned,
        )
        .await;
    let all: Vec<VirtualMachine> = vms
        .list(&ListParams::default().labels(&format!("{MACHINE_LABEL}=demo-restart")))
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), 1, "exactly one VM");
    assert_eq!(
        all[0].metadata.uid, first.metadata.uid,
        "the VM from before the restart"
    );
}

#[tokio::test]
async fn deleting_twenty_machines_mid_provisioning_leaves_nothing() {
    let world = World::start().await;
    world.create_provisioned_cluster("demo").await;
    world.sim().faults().inject(
        FaultTarget::any(),
        Fault::SlowImport(Duration::from_secs(3)),
    );
    let names: Vec<String> = (0..20).map(|i| format!("demo-many-{i:02}")).collect();
    for name in &names {
        world.create_talos_worker("demo", name).await;
    }
    // Wait until every VM exists (mid-provisioning: imports still running).
    let vms: Api<VirtualMachine> = world.api();
    wait::until("all 20 VMs to exist", DEADLINE, || {
        let vms = vms.clone();
        async move {
            let count = vms
                .list(&ListParams::default().labels(MACHINE_LABEL))
                .await?
                .items
                .len();
            Ok((count == 20).then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    for name in &names {
        world.delete_machine(name).await;
    }
    world.wait_all_gone(&names).await;
    let finalizers_left = world
        .api::<KubevirtMachine>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(finalizers_left, 0);
}

#[tokio::test]
async fn externally_managed_cluster_is_seen_as_provisioned_under_the_v1beta2_contract() {
    let world = World::start().await;
    // As the Kamaji control plane provider leaves it: managed-by annotation,
    // endpoint in spec, v1beta1 `status.ready`.
    world.create(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "KubevirtCluster",
        "metadata": { "name": "kamaji", "namespace": NAMESPACE, "annotations": { "cluster.x-k8s.io/managed-by": "kamaji" } },
        "spec": { "controlPlaneEndpoint": { "host": "kubernetes-kamaji.default.svc", "port": 6443 } }
    }))
    .await;
    world.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": "kamaji", "namespace": NAMESPACE },
        "spec": { "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": "kamaji" } }
    }))
    .await;
    world
        .api::<KubevirtCluster>()
        .patch_status(
            "kamaji",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "ready": true } })),
        )
        .await
        .expect("the external manager marks it ready");
    let kubevirt_cluster = world.wait_cluster_provisioned("kamaji").await;
    // Tenantry wrote only the mirrored field: no finalizer, no Service.
    assert!(
        kubevirt_cluster.metadata.finalizers.is_none(),
        "{:?}",
        kubevirt_cluster.metadata.finalizers
    );
    assert!(world.get_opt::<Service>("kamaji-lb").await.is_none());
    let status = kubevirt_cluster.status.unwrap();
    assert_eq!(status.initialization.unwrap().provisioned, Some(true));
    assert!(status.conditions.is_none());
}

/// The infrastructure cluster: a second control plane with its own KubeVirt
/// (the simulator alone), without tenantry's CRDs.
async fn start_infra_cluster() -> tenantry_e2e::World {
    tenantry_e2e::World::builder("infra")
        .without_tenantry_crds()
        .kubevirt(Kubevirt::Simulated, KubevirtSimConfig::fast())
        .start()
        .await
}

/// A cluster `name` whose VMs run in the infrastructure cluster, reached
/// with `kubeconfig` in its namespace `vms` (the Secret
/// `infraClusterSecretRef` names); returns once it is provisioned.
async fn create_external_cluster(world: &World, name: &str, kubeconfig: &str) {
    world
        .create(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "infra-kubeconfig", "namespace": NAMESPACE },
            "stringData": { "kubeconfig": kubeconfig, "namespace": "vms" }
        }))
        .await;
    world
        .create_cluster(name, json!({ "infraClusterSecretRef": { "apiVersion": "v1", "kind": "Secret", "name": "infra-kubeconfig", "namespace": NAMESPACE } }))
        .await;
    world.wait_cluster_provisioned(name).await;
}

#[tokio::test]
async fn vms_run_in_an_external_infrastructure_cluster() {
    let world = World::start().await;
    let infra = start_infra_cluster().await;
    infra.create_namespace("vms").await;
    let kubeconfig = std::fs::read_to_string(infra.control_plane().kubeconfig_path()).unwrap();
    create_external_cluster(&world, "ext", &kubeconfig).await;
    let infra_services: Api<Service> = Api::namespaced(infra.client(), "vms");
    assert!(
        infra_services.get_opt("ext-lb").await.unwrap().is_some(),
        "Service in the infrastructure cluster"
    );

    world.create_talos_worker("ext", "ext-worker").await;
    let machine = world
        .wait_machine(
            "ext-worker",
            "provisioned in the infrastructure cluster",
            is_provisioned,
        )
        .await;
    // The reference was copied onto the machine, so deletion needs no cluster.
    assert_eq!(
        machine
            .spec
            .infra_cluster_secret_ref
            .as_ref()
            .and_then(|r| r.name.as_deref()),
        Some("infra-kubeconfig")
    );
    let infra_vms: Api<VirtualMachine> = Api::namespaced(infra.client(), "vms");
    assert!(infra_vms.get_opt("ext-worker").await.unwrap().is_some());
    assert!(
        world
            .get_opt::<VirtualMachine>("ext-worker")
            .await
            .is_none(),
        "nothing in management"
    );

    world.delete_machine("ext-worker").await;
    wait::until("the machine and its VM to be gone", DEADLINE, || {
        let (machines, infra_vms) = (world.api::<KubevirtMachine>(), infra_vms.clone());
        async move {
            let gone = machines.get_opt("ext-worker").await?.is_none()
                && infra_vms.get_opt("ext-worker").await?.is_none();
            Ok(gone.then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| world.fail(e));
    let infra_secrets: Api<Secret> = Api::namespaced(infra.client(), "vms");
    assert!(
        infra_secrets
            .get_opt("ext-worker-userdata")
            .await
            .unwrap()
            .is_none()
    );
}

/// An infrastructure cluster that refuses a request (here its RBAC does not
/// yet let tenantry write Secrets) makes the machine say so on Ready, naming
/// the refusal, instead of backing off in silence; once the access is
/// granted it provisions without a restart.
#[tokio::test]
async fn a_refusing_infrastructure_cluster_is_named_on_the_machine_until_it_recovers() {
    let world = World::start().await;
    let infra = start_infra_cluster().await;
    infra.create_namespace("vms").await;
    // Everything tenantry needs in the infrastructure namespace but Secrets.
    let rules_without_secrets = json!([
        { "apiGroups": [""], "resources": ["services"], "verbs": ["*"] },
        { "apiGroups": ["kubevirt.io"], "resources": ["virtualmachines", "virtualmachineinstances"], "verbs": ["*"] },
        { "apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["*"] }
    ]);
    infra
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": { "name": "tenantry", "namespace": "vms" },
                "rules": rules_without_secrets
            }),
        )
        .await;
    infra
        .create(
            NAMESPACE,
            json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": "tenantry", "namespace": "vms" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenantry" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenantry-infra" }]
        }),
        )
        .await;
    let kubeconfig = std::fs::read_to_string(
        infra
            .control_plane()
            .user_kubeconfig("tenantry-infra", &[])
            .expect("infra user kubeconfig"),
    )
    .unwrap();
    create_external_cluster(&world, "refusing", &kubeconfig).await;
    world
        .create_talos_worker("refusing", "refusing-worker")
        .await;

    let machine = world
        .wait_machine(
            "refusing-worker",
            "Ready=False naming the infrastructure cluster's refusal",
            |machine| {
                condition(machine, "Ready").is_some_and(|ready| {
                    ready.status == "False" && ready.reason == "InfraClusterAPIError"
                })
            },
        )
        .await;
    let ready = condition(&machine, "Ready").unwrap();
    assert!(
        ready.message.contains("forbidden") && ready.message.contains("secrets"),
        "the message names what was refused: {}",
        ready.message
    );
    assert!(!is_provisioned(&machine));

    // Grant Secrets: the machine provisions on its own.
    let mut rules = rules_without_secrets.as_array().unwrap().clone();
    rules.push(json!({ "apiGroups": [""], "resources": ["secrets"], "verbs": ["*"] }));
    Api::<Role>::namespaced(infra.client(), "vms")
        .patch(
            "tenantry",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": rules })),
        )
        .await
        .expect("grant Secrets");
    let machine = world
        .wait_machine(
            "refusing-worker",
            "provisioned once Secrets are granted",
            is_provisioned,
        )
        .await;
    assert_eq!(condition(&machine, "Ready").unwrap().status, "True");
    let infra_vms: Api<VirtualMachine> = Api::namespaced(infra.client(), "vms");
    assert!(
        infra_vms
            .get_opt("refusing-worker")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn ssh_check_provisions_a_kubeadm_machine_only_once_its_sentinel_appears() {
    // Captured from before tenantry starts, to check no secret is logged.
    let world = World::start_from(
        World::ssh_guests(SshGuestConfig {
            bootstrap_duration: Duration::from_secs(4),
            ..Default::default()
        })
        .capture_logs(),
    )
    .await;
    let kubevirt_cluster = world.create_provisioned_cluster("demo").await;

    // The cluster's key pair, as CAPK keeps it.
    let keys_secret = kubevirt_cluster
        .spec
        .ssh_keys
        .as_ref()
        .and_then(|k| k.data_secret_name.clone());
    assert_eq!(keys_secret.as_deref(), Some("demo-ssh-keys"));
    let secret = world.get::<Secret>("demo-ssh-keys").await;
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    let owner = &secret.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("KubevirtCluster", "demo")
    );
    let data = secret.data.clone().unwrap_or_default();
    let private_key = String::from_utf8(data["key"].0.clone()).unwrap();
    let public_key = String::from_utf8(data["pub"].0.clone()).unwrap();
    assert!(
        private_key.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"),
        "an OpenSSH private key"
    );
    assert!(public_key.starts_with("ssh-ed25519 AAAA"), "{public_key}");

    world
        .create_worker_with_data(
            "demo",
            "demo-kubeadm",
            world.cloud_init_machine_spec(),
            &kubeadm_join_config(),
        )
        .await;
    world.wait_guest_sshd("demo-kubeadm").await;

    // The VM is ready before bootstrap ends: the machine waits for the sentinel.
    let waiting = world
        .wait_machine("demo-kubeadm", "waiting for the bootstrap sentinel", |m| {
            condition(m, "BootstrapExecSucceeded")
                .is_some_and(|c| c.reason == "WaitingForBootstrapSentinel")
        })
        .await;
    assert!(
        !is_provisioned(&waiting),
        "not provisioned before the sentinel exists"
    );
    assert_eq!(condition(&waiting, "VMProvisioned").unwrap().status, "True");
    let bootstrap = condition(&waiting, "BootstrapExecSucceeded").unwrap();
    assert_eq!(bootstrap.status, "False");
    assert!(
        bootstrap.message.contains(BOOTSTRAP_SENTINEL),
        "{}",
        bootstrap.message
    );
    assert_eq!(
        condition(&waiting, "Ready").unwrap().reason,
        "WaitingForBootstrapSentinel"
    );
    assert!(waiting.spec.provider_id.is_none());

    let machine = world
        .wait_machine(
            "demo-kubeadm",
            "provisioned once the sentinel says success",
            is_provisioned,
        )
        .await;
    let bootstrap = condition(&machine, "BootstrapExecSucceeded").unwrap();
    assert_eq!(
        (bootstrap.status.as_str(), bootstrap.reason.as_str()),
        ("True", "BootstrapSentinelFound")
    );
    assert_eq!(
        machine.spec.provider_id.as_deref(),
        Some("kubevirt://demo-kubeadm")
    );
    // The VM records the data's format, which keeps the check on ssh
    // without reading the bootstrap-data Secret once the VM exists.
    let vm = world.get::<VirtualMachine>("demo-kubeadm").await;
    assert_eq!(
        vm.annotations()
            .get("infrastructure.tenantry.dev/bootstrap-format")
            .map(String::as_str),
        Some("cloud-config")
    );
    let guest_log = world.sim().guest_log(NAMESPACE, "demo-kubeadm").join("\n");
    assert!(
        guest_log.contains("sshd: Accepted publickey for capk"),
        "{guest_log}"
    );
    assert!(
        guest_log.contains(&format!("ran \"cat {BOOTSTRAP_SENTINEL}\": exit 1")),
        "checked before bootstrap ended:\n{guest_log}"
    );
    assert!(
        guest_log.contains(&format!("ran \"cat {BOOTSTRAP_SENTINEL}\": exit 0")),
        "{guest_log}"
    );

    // The guest got user capk with the cluster's public key, and kept the
    // data's jinja marker and default user.
    let userdata = world.get::<Secret>("demo-kubeadm-userdata").await;
    let userdata = String::from_utf8(userdata.data.unwrap()["userdata"].0.clone()).unwrap();
    assert!(
        userdata.starts_with("## template: jinja\n#cloud-config\n"),
        "{userdata}"
    );
    assert!(
        userdata.contains("name: capk") && userdata.contains(public_key.trim()),
        "{userdata}"
    );
    assert!(userdata.contains("- default"), "{userdata}");

    // The private key is nowhere but in its Secret.
    let mut places = vec![
        (
            "KubevirtMachine",
            serde_json::to_string(
                &world
                    .api::<KubevirtMachine>()
                    .get("demo-kubeadm")
                    .await
                    .unwrap(),
            )
            .unwrap(),
        ),
        (
            "KubevirtCluster",
            serde_json::to_string(&world.api::<KubevirtCluster>().get("demo").await.unwrap())
                .unwrap(),
        ),
        (
            "Cluster",
            serde_json::to_string(&world.api::<Cluster>().get("demo").await.unwrap()).unwrap(),
        ),
        (
            "Machine",
            serde_json::to_string(&world.api::<Machine>().get("demo-kubeadm").await.unwrap())
                .unwrap(),
        ),
        ("userdata", userdata.clone()),
        ("guest log", guest_log.clone()),
    ];
    let core_events: Api<k8s_openapi::api::core::v1::Event> = world.api();
    let events: Api<k8s_openapi::api::events::v1::Event> = world.api();
    places.push((
        "core events",
        serde_json::to_string(
            &core_events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items,
        )
        .unwrap(),
    ));
    places.push((
        "events",
        serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap(),
    ));
    places.push(("logs", tenantry_e2e::logs::captured()));
    let secret_lines = private_key_lines(&private_key);
    assert!(!secret_lines.is_empty());
    for (place, text) in &places {
        for line in &secret_lines {
            assert!(
                !text.contains(line.as_str()),
                "the private key appears in the {place}"
            );
        }
    }
    let logged = &places.last().unwrap().1;
    assert!(
        logged.contains("bootstrap sentinel says success"),
        "the check logged (so the log capture works)"
    );
}

#[tokio::test]
async fn ssh_check_keeps_a_machine_whose_sentinel_never_appears_not_ready() {
    let world = World::start_with_ssh_guests(SshGuestConfig {
        bootstrap_duration: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    world.create_provisioned_cluster("demo").await;
    // As when `kubeadm join` fails: the command never gets to `echo success`.
    world.sim().faults().inject(
        FaultTarget::named(NAMESPACE, "demo-no-join"),
        Fault::BootstrapSentinelAbsent,
    );
    world
        .create_worker_with_data(
            "demo",
            "demo-no-join",
            world.cloud_init_machine_spec(),
            &kubeadm_join_config(),
        )
        .await;
    world.wait_guest_sshd("demo-no-join").await;
    world
        .wait_machine("demo-no-join", "waiting for the bootstrap sentinel", |m| {
            condition(m, "BootstrapExecSucceeded")
                .is_some_and(|c| c.reason == "WaitingForBootstrapSentinel")
        })
        .await;

    // Several checks later (long after bootstrap would have ended), still waiting.
    let sim = world.sim();
    let checks = |log: &[String]| {
        log.iter()
            .filter(|l| l.contains(&format!("ran \"cat {BOOTSTRAP_SENTINEL}\"")))
            .count()
    };
    wait::until("the check to have read the sentinel three times", DEADLINE, || async move {
        Ok((checks(&sim.guest_log(NAMESPACE, "demo-no-join")) >= 3).then_some(()))
    })
    .await
    .unwrap_or_else(|e| world.fail_with_guest("demo-no-join", e));
    let machine = world.get::<KubevirtMachine>("demo-no-join").await;
    assert!(!is_provisioned(&machine));
    assert!(machine.spec.provider_id.is_none());
    let ready = condition(&machine, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "WaitingForBootstrapSentinel")
    );
    assert_eq!(
        condition(&machine, "VMProvisioned").unwrap().status,
        "True",
        "the VM itself is fine"
    );
    let machines: Api<Machine> = world.api();
    let capi_machine = machines.get("demo-no-join").await.unwrap();
    let infrastructure_provisioned = capi_machine
        .status
        .and_then(|s| s.initialization)
        .and_then(|i| i.infrastructure_provisioned);
    assert_ne!(
        infrastructure_provisioned,
        Some(true),
        "CAPI does not see it provisioned"
    );
}

/// Platforms put Multus networks, live-migration and CDI settings in the
/// embedded metadata of CAPK-shaped templates; the CRD must keep them and
/// the VM, the VMI and the DataVolume must carry them.
#[tokio::test]
async fn nested_template_metadata_reaches_the_vm_the_vmi_and_the_data_volume() {
    let world = World::start().await;
    world.create_provisioned_cluster("meta").await;

    let vmi_metadata = json!({
        "labels": { "example.com/tier": "gold" },
        "annotations": { "k8s.v1.cni.cncf.io/networks": "default/storage-net" }
    });
    let dv_metadata = json!({
        "name": "scratch",
        "labels": { "example.com/disk": "scratch" },
        "annotations": { "cdi.kubevirt.io/storage.bind.immediate.requested": "true" }
    });
    let mut machine_spec = world.talos_machine_spec(TALOS_VERSION);
    let vm_spec = &mut machine_spec["virtualMachineTemplate"]["spec"];
    vm_spec["template"]["metadata"] = vmi_metadata.clone();
    vm_spec["dataVolumeTemplates"] = json!([{
        "metadata": dv_metadata,
        "spec": {
            "source": { "blank": {} },
            "storage": { "resources": { "requests": { "storage": "1Gi" } } }
        }
    }]);
    // KubeVirt refuses a DataVolume template no volume uses.
    let guest = &mut vm_spec["template"]["spec"];
    guest["domain"]["devices"]["disks"] =
        json!([{ "name": "scratch", "disk": { "bus": "virtio" } }]);
    guest["volumes"] = json!([{ "name": "scratch", "dataVolume": { "name": "scratch" } }]);

    // The template keeps the fields as stored (the CRD used to prune them).
    world
        .create(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachineTemplate",
            "metadata": { "name": "meta-workers", "namespace": NAMESPACE },
            "spec": { "template": { "spec": machine_spec.clone() } }
        }))
        .await;
    let templates = Api::<kube::api::DynamicObject>::namespaced_with(
        world.client(),
        NAMESPACE,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            "KubevirtMachineTemplate",
        )),
    );
    let stored = templates.get("meta-workers").await.expect("template");
    let stored_vm = &stored.data["spec"]["template"]["spec"]["virtualMachineTemplate"]["spec"];
    assert_eq!(stored_vm["template"]["metadata"], vmi_metadata);
    assert_eq!(
        stored_vm["dataVolumeTemplates"][0]["metadata"]["annotations"],
        json!({ "cdi.kubevirt.io/storage.bind.immediate.requested": "true" })
    );

    world
        .create_worker("meta", "meta-worker-1", machine_spec)
        .await;
    world
        .wait_machine("meta-worker-1", "provisioned", is_provisioned)
        .await;

    let vm = world.get::<VirtualMachine>("meta-worker-1").await;
    let vm = serde_json::to_value(vm).unwrap();
    assert_eq!(
        vm["spec"]["template"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"],
        "default/storage-net"
    );
    let vmi = world.get::<VirtualMachineInstance>("meta-worker-1").await;
    assert_eq!(
        entry(&vmi.metadata.labels, "example.com/tier"),
        Some("gold")
    );
    assert_eq!(
        entry(&vmi.metadata.annotations, "k8s.v1.cni.cncf.io/networks"),
        Some("default/storage-net")
    );
    let dv = world.get::<DataVolume>("meta-worker-1-scratch").await;
    assert_eq!(
        entry(&dv.metadata.labels, "example.com/disk"),
        Some("scratch")
    );
    assert_eq!(
        entry(
            &dv.metadata.annotations,
            "cdi.kubevirt.io/storage.bind.immediate.requested"
        ),
        Some("true")
    );
}
