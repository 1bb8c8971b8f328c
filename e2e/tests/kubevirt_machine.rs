//! KubevirtCluster and KubevirtMachine end to end: the real kube-apiserver,
//! the real Cluster API core manager, tenantry's reconcilers in-process and
//! the KubeVirt/CDI simulator. Everything asserted is what a user would look
//! at: object status and conditions, and what exists in the "substrate".

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tenantry_api::contract::PAUSED_ANNOTATION;
use tenantry_api::generated::capi::cluster::Cluster;
use tenantry_api::generated::capi::machine::Machine;
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::{KubevirtCluster, KubevirtMachine};
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

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
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

    /// A CAPI Cluster with a KubevirtCluster, as CAPK's templates make them.
    async fn create_cluster(&self, name: &str, kubevirt_cluster_spec: Value) {
        create(
            &self.client(),
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "KubevirtCluster",
                "metadata": { "name": name, "namespace": NAMESPACE },
                "spec": kubevirt_cluster_spec,
            }),
        )
        .await;
        create(&self.client(), json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": { "name": name, "namespace": NAMESPACE },
            "spec": {
                "clusterNetwork": { "pods": { "cidrBlocks": ["10.243.0.0/16"] }, "services": { "cidrBlocks": ["10.95.0.0/16"] } },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtCluster", "name": name }
            }
        }))
        .await;
    }

    /// A worker: its bootstrap data Secret, KubevirtMachine and Machine.
    async fn create_worker(&self, cluster: &str, name: &str, machine_spec: Value) {
        self.create_worker_with_data(cluster, name, machine_spec, &talos_worker_config(cluster))
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
        let bootstrap = format!("{name}-bootstrap");
        create(
            &self.client(),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": bootstrap, "namespace": NAMESPACE },
                "stringData": { "value": data, "format": "cloud-config" }
            }),
        )
        .await;
        create(
            &self.client(),
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "KubevirtMachine",
                // Labelled with its cluster at creation, as a MachineSet does.
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": { "cluster.x-k8s.io/cluster-name": cluster },
                    "annotations": annotations,
                },
                "spec": machine_spec,
            }),
        )
        .await;
        create(&self.client(), json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "cluster.x-k8s.io/cluster-name": cluster } },
            "spec": {
                "clusterName": cluster,
                "bootstrap": { "dataSecretName": bootstrap },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KubevirtMachine", "name": name }
            }
        }))
        .await;
    }

    /// A KubevirtMachine spec with a Talos boot disk from the local factory.
    fn talos_machine_spec(&self, talos_version: &str) -> Value {
        json!({
            "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
            "bootDisk": {
                "imageFactoryURL": self.factory().base_url().trim_end_matches('/'),
                "schematicID": DEFAULT_SCHEMATIC,
                "talosVersion": talos_version,
                "diskSize": "20Gi",
                "storageClass": "replicated"
            },
            "virtualMachineTemplate": { "spec": {
                "runStrategy": "Always",
                "template": { "spec": {
                    "domain": {
                        "cpu": { "cores": 2 },
                        "memory": { "guest": "4Gi" },
                        "devices": { "interfaces": [{ "name": "default", "bridge": {} }] }
                    },
                    "networks": [{ "name": "default", "pod": {} }]
                }}
            }}
        })
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

    /// Like [`World::wait_machine`], with the guest's log on failure.
    async fn wait_guest_machine(
        &self,
        name: &str,
        what: &str,
        predicate: impl Fn(&KubevirtMachine) -> bool,
    ) -> KubevirtMachine {
        let api: Api<KubevirtMachine> = self.api();
        wait::until(format!("KubevirtMachine {name}: {what}"), DEADLINE, || {
            let api = api.clone();
            let found = async move { api.get_opt(name).await };
            let predicate = &predicate;
            async move { Ok(found.await?.filter(|m| predicate(m))) }
        })
        .await
        .unwrap_or_else(|e| self.fail_with_guest(name, e))
    }

    async fn wait_machine(
        &self,
        name: &str,
        what: &str,
        predicate: impl Fn(&KubevirtMachine) -> bool,
    ) -> KubevirtMachine {
        let api: Api<KubevirtMachine> = self.api();
        wait::until(format!("KubevirtMachine {name}: {what}"), DEADLINE, || {
            let api = api.clone();
            let found = async move { api.get_opt(name).await };
            let predicate = &predicate;
            async move { Ok(found.await?.filter(|m| predicate(m))) }
        })
        .await
        .unwrap_or_else(|e| self.fail(e))
    }

    async fn wait_cluster_provisioned(&self, name: &str) -> KubevirtCluster {
        let clusters: Api<Cluster> = self.api();
        wait::until(
            format!("Cluster {name} infrastructure provisioned"),
            DEADLINE,
            || {
                let clusters = clusters.clone();
                async move {
                    let cluster = clusters.get(name).await?;
                    let provisioned = cluster
                        .status
                        .as_ref()
                        .and_then(|s| s.initialization.as_ref())
                        .and_then(|i| i.infrastructure_provisioned)
                        == Some(true);
                    Ok(provisioned.then_some(()))
                }
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
async fn leftovers(client: &kube::Client, names: &[String]) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    let list = |kind: &'static str, items: Vec<String>| {
        items.into_iter().map(move |n| format!("{kind} {n}"))
    };
    let machines: Api<KubevirtMachine> = Api::namespaced(client.clone(), NAMESPACE);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), NAMESPACE);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NAMESPACE);
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let names_of = |items: Vec<String>| {
        items
            .into_iter()
            .filter(|n| names.iter().any(|m| n.starts_with(m.as_str())))
            .collect::<Vec<_>>()
    };
    left.extend(list(
        "KubevirtMachine",
        names_of(
            machines
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| o.name_any())
                .collect(),
        ),
    ));
    left.extend(list(
        "VirtualMachine",
        names_of(
            vms.list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| o.name_any())
                .collect(),
        ),
    ));
    left.extend(list(
        "VirtualMachineInstance",
        names_of(
            vmis.list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| o.name_any())
                .collect(),
        ),
    ));
    left.extend(list(
        "DataVolume",
        names_of(
            dvs.list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| o.name_any())
                .collect(),
        ),
    ));
    left.extend(list(
        "PersistentVolumeClaim",
        names_of(
            pvcs.list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| o.name_any())
                .collect(),
        ),
    ));
    left.extend(list(
        "Secret",
        names_of(
            secrets
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| o.name_any())
                .filter(|n| n.ends_with("-userdata"))
                .collect(),
        ),
    ));
    Ok(left)
}

async fn create(client: &kube::Client, document: Value) {
    tenantry_e2e::manifests::create_object(client, &document, NAMESPACE)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
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
    format!(
        "version: v1alpha1\ndebug: false\nmachine:\n  type: worker\n  token: test-token\ncluster:\n  controlPlane:\n    endpoint: https://kubernetes-{cluster}.{NAMESPACE}.svc:6443\n"
    )
}

fn condition<'a>(
    machine: &'a KubevirtMachine,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    machine
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn is_provisioned(machine: &KubevirtMachine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true)
        && condition(machine, "Ready").is_some_and(|c| c.status == "True")
}

#[tokio::test]
async fn machine_is_provisioned_through_capi_and_deletion_waits_for_the_vm() {
    let world = World::start().await;
    world.create_cluster("demo", json!({})).await;
    let kubevirt_cluster = world.wait_cluster_provisioned("demo").await;

    // The control-plane Service exists and gave the cluster its endpoint.
    let service = world
        .api::<Service>()
        .get("demo-lb")
        .await
        .expect("control-plane Service demo-lb");
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
    let vm = world
        .api::<VirtualMachine>()
        .get("demo-worker-1")
        .await
        .expect("VirtualMachine");
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
    let userdata = world
        .api::<Secret>()
        .get("demo-worker-1-userdata")
        .await
        .expect("userdata Secret");
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
    world
        .api::<Machine>()
        .delete("demo-worker-1", &DeleteParams::default())
        .await
        .expect("delete Machine");
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
    world.create_cluster("demo", json!({})).await;
    world.wait_cluster_provisioned("demo").await;
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
            .api::<VirtualMachineInstance>()
            .get_opt("demo-bad-image")
            .await
            .unwrap()
            .is_none()
    );

    world
        .api::<Machine>()
        .delete("demo-bad-image", &DeleteParams::default())
        .await
        .expect("delete Machine");
    world.wait_all_gone(&["demo-bad-image".to_string()]).await;
}

#[tokio::test]
async fn a_vm_that_never_becomes_ready_says_why() {
    let world = World::start().await;
    world.create_cluster("demo", json!({})).await;
    world.wait_cluster_provisioned("demo").await;
    world.sim().faults().inject(
        FaultTarget::named(NAMESPACE, "demo-stuck"),
        Fault::Unschedulable(Some(
            "0/3 nodes are available: 3 Insufficient memory".into(),
        )),
    );
    world
        .create_worker(
            "demo",
            "demo-stuck",
            world.talos_machine_spec(TALOS_VERSION),
        )
        .await;
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
    world.create_cluster("demo", json!({})).await;
    world.wait_cluster_provisioned("demo").await;
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
    world
        .api::<Cluster>()
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": true } })),
        )
        .await
        .expect("pause Cluster");
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
            .api::<VirtualMachine>()
            .get_opt("demo-paused")
            .await
            .unwrap()
            .is_none()
    );
    assert!(condition(&machine, "VMProvisioned").is_none());

    world
        .api::<Cluster>()
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": false } })),
        )
        .await
        .expect("unpause Cluster");
    let machine = world
        .wait_machine("demo-paused", "provisioned after unpause", is_provisioned)
        .await;
    assert_eq!(condition(&machine, "Paused").unwrap().status, "False");
}

#[tokio::test]
async fn manager_restart_mid_provisioning_creates_no_second_vm() {
    let mut world = World::start().await;
    world.create_cluster("demo", json!({})).await;
    world.wait_cluster_provisioned("demo").await;
    world.sim().faults().inject(
        FaultTarget::any(),
        Fault::SlowImport(Duration::from_secs(4)),
    );
    world
        .create_worker(
            "demo",
            "demo-restart",
            world.talos_machine_spec(TALOS_VERSION),
        )
        .await;
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
    world.create_cluster("demo", json!({})).await;
    world.wait_cluster_provisioned("demo").await;
    world.sim().faults().inject(
        FaultTarget::any(),
        Fault::SlowImport(Duration::from_secs(3)),
    );
    let names: Vec<String> = (0..20).map(|i| format!("demo-many-{i:02}")).collect();
    for name in &names {
        world
            .create_worker("demo", name, world.talos_machine_spec(TALOS_VERSION))
            .await;
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
    let machines: Api<Machine> = world.api();
    for name in &names {
        machines
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete Machine");
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
    create(&world.client(), json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "KubevirtCluster",
        "metadata": { "name": "kamaji", "namespace": NAMESPACE, "annotations": { "cluster.x-k8s.io/managed-by": "kamaji" } },
        "spec": { "controlPlaneEndpoint": { "host": "kubernetes-kamaji.default.svc", "port": 6443 } }
    }))
    .await;
    create(&world.client(), json!({
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
    assert!(
        world
            .api::<Service>()
            .get_opt("kamaji-lb")
            .await
            .unwrap()
            .is_none()
    );
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

/// The Secret `infraClusterSecretRef` names: a kubeconfig of the
/// infrastructure cluster, VMs in its namespace `vms`.
async fn create_infra_kubeconfig_secret(world: &World, kubeconfig: &str) {
    create(
        &world.client(),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "infra-kubeconfig", "namespace": NAMESPACE },
            "stringData": { "kubeconfig": kubeconfig, "namespace": "vms" }
        }),
    )
    .await;
}

#[tokio::test]
async fn vms_run_in_an_external_infrastructure_cluster() {
    let world = World::start().await;
    let infra = start_infra_cluster().await;
    let kubeconfig = std::fs::read_to_string(infra.control_plane().kubeconfig_path()).unwrap();
    create_infra_kubeconfig_secret(&world, &kubeconfig).await;
    create(
        &infra.client(),
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "vms" } }),
    )
    .await;
    world
        .create_cluster("ext", json!({ "infraClusterSecretRef": { "apiVersion": "v1", "kind": "Secret", "name": "infra-kubeconfig", "namespace": NAMESPACE } }))
        .await;
    world.wait_cluster_provisioned("ext").await;
    let infra_services: Api<Service> = Api::namespaced(infra.client(), "vms");
    assert!(
        infra_services.get_opt("ext-lb").await.unwrap().is_some(),
        "Service in the infrastructure cluster"
    );

    world
        .create_worker("ext", "ext-worker", world.talos_machine_spec(TALOS_VERSION))
        .await;
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
            .api::<VirtualMachine>()
            .get_opt("ext-worker")
            .await
            .unwrap()
            .is_none(),
        "nothing in management"
    );

    world
        .api::<Machine>()
        .delete("ext-worker", &DeleteParams::default())
        .await
        .expect("delete Machine");
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
    let _ = PostParams::default();
}

/// An infrastructure cluster that refuses a request (here its RBAC does not
/// yet let tenantry write Secrets) makes the machine say so on Ready, naming
/// the refusal, instead of backing off in silence; once the access is
/// granted it provisions without a restart.
#[tokio::test]
async fn a_refusing_infrastructure_cluster_is_named_on_the_machine_until_it_recovers() {
    let world = World::start().await;
    let infra = start_infra_cluster().await;
    create(
        &infra.client(),
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "vms" } }),
    )
    .await;
    // Everything tenantry needs in the infrastructure namespace but Secrets.
    let rules_without_secrets = json!([
        { "apiGroups": [""], "resources": ["services"], "verbs": ["*"] },
        { "apiGroups": ["kubevirt.io"], "resources": ["virtualmachines", "virtualmachineinstances"], "verbs": ["*"] },
        { "apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["*"] }
    ]);
    create(
        &infra.client(),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "tenantry", "namespace": "vms" },
            "rules": rules_without_secrets
        }),
    )
    .await;
    create(
        &infra.client(),
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
    create_infra_kubeconfig_secret(&world, &kubeconfig).await;
    world
        .create_cluster("refusing", json!({ "infraClusterSecretRef": { "apiVersion": "v1", "kind": "Secret", "name": "infra-kubeconfig", "namespace": NAMESPACE } }))
        .await;
    world.wait_cluster_provisioned("refusing").await;
    world
        .create_worker(
            "refusing",
            "refusing-worker",
            world.talos_machine_spec(TALOS_VERSION),
        )
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
    world.create_cluster("demo", json!({})).await;
    let kubevirt_cluster = world.wait_cluster_provisioned("demo").await;

    // The cluster's key pair, as CAPK keeps it.
    let keys_secret = kubevirt_cluster
        .spec
        .ssh_keys
        .as_ref()
        .and_then(|k| k.data_secret_name.clone());
    assert_eq!(keys_secret.as_deref(), Some("demo-ssh-keys"));
    let secret = world
        .api::<Secret>()
        .get("demo-ssh-keys")
        .await
        .expect("SSH keys Secret");
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
        .wait_guest_machine("demo-kubeadm", "waiting for the bootstrap sentinel", |m| {
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
        .wait_guest_machine(
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
    let vm = world
        .api::<VirtualMachine>()
        .get("demo-kubeadm")
        .await
        .expect("the VirtualMachine");
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
    let userdata = world
        .api::<Secret>()
        .get("demo-kubeadm-userdata")
        .await
        .expect("userdata Secret");
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
    world.create_cluster("demo", json!({})).await;
    world.wait_cluster_provisioned("demo").await;
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
        .wait_guest_machine("demo-no-join", "waiting for the bootstrap sentinel", |m| {
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
    let machine = world
        .api::<KubevirtMachine>()
        .get("demo-no-join")
        .await
        .unwrap();
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
    world.create_cluster("meta", json!({})).await;
    world.wait_cluster_provisioned("meta").await;

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
    create(
        &world.client(),
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachineTemplate",
            "metadata": { "name": "meta-workers", "namespace": NAMESPACE },
            "spec": { "template": { "spec": machine_spec.clone() } }
        }),
    )
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

    let vm = world
        .api::<VirtualMachine>()
        .get("meta-worker-1")
        .await
        .expect("VirtualMachine");
    let vm = serde_json::to_value(vm).unwrap();
    assert_eq!(
        vm["spec"]["template"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"],
        "default/storage-net"
    );
    let vmi = world
        .api::<VirtualMachineInstance>()
        .get("meta-worker-1")
        .await
        .expect("VirtualMachineInstance");
    let vmi_labels = vmi.metadata.labels.unwrap_or_default();
    assert_eq!(
        vmi_labels.get("example.com/tier").map(String::as_str),
        Some("gold")
    );
    let vmi_annotations = vmi.metadata.annotations.unwrap_or_default();
    assert_eq!(
        vmi_annotations
            .get("k8s.v1.cni.cncf.io/networks")
            .map(String::as_str),
        Some("default/storage-net")
    );
    let dv = world
        .api::<DataVolume>()
        .get("meta-worker-1-scratch")
        .await
        .expect("DataVolume meta-worker-1-scratch");
    let dv_labels = dv.metadata.labels.unwrap_or_default();
    assert_eq!(
        dv_labels.get("example.com/disk").map(String::as_str),
        Some("scratch")
    );
    let dv_annotations = dv.metadata.annotations.unwrap_or_default();
    assert_eq!(
        dv_annotations
            .get("cdi.kubevirt.io/storage.bind.immediate.requested")
            .map(String::as_str),
        Some("true")
    );
}
