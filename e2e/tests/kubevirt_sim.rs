//! The KubeVirt + CDI simulator against a real control plane: objects are
//! created as JSON the way a user or CAPK would, and the assertions are on
//! what a controller sees through the API.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tenantry_e2e::sim::kubevirt::{
    DEFAULT_SCHEMATIC, Fault, FaultTarget, ImageFactory, ImageFactoryConfig, KubevirtSimConfig,
    KubevirtSimulator, annotations, imported,
};
use tenantry_e2e::{Kubevirt, wait};

const DEADLINE: Duration = Duration::from_secs(60);
const NS: &str = "default";
const TALOS: &str = "v1.11.0";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// A control plane (without tenantry's CRDs) with the simulator and an
/// image factory.
struct World {
    inner: tenantry_e2e::World,
}

impl World {
    async fn start() -> Self {
        let inner = tenantry_e2e::World::builder("harness")
            .without_tenantry_crds()
            .kubevirt(Kubevirt::Simulated, KubevirtSimConfig::fast())
            .image_factory(ImageFactoryConfig {
                image_size: 1 << 20,
                ..Default::default()
            })
            .start()
            .await;
        Self { inner }
    }

    fn sim(&self) -> &KubevirtSimulator {
        self.inner.kubevirt()
    }

    fn images(&self) -> &ImageFactory {
        self.inner.factory()
    }

    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.inner.client(), NS, resource)
    }

    fn vms(&self) -> Api<DynamicObject> {
        self.api(&resource(
            "kubevirt.io",
            "v1",
            "VirtualMachine",
            "virtualmachines",
        ))
    }

    fn vmis(&self) -> Api<DynamicObject> {
        self.api(&resource(
            "kubevirt.io",
            "v1",
            "VirtualMachineInstance",
            "virtualmachineinstances",
        ))
    }

    fn migrations(&self) -> Api<DynamicObject> {
        self.api(&resource(
            "kubevirt.io",
            "v1",
            "VirtualMachineInstanceMigration",
            "virtualmachineinstancemigrations",
        ))
    }

    fn dvs(&self) -> Api<DynamicObject> {
        self.api(&resource(
            "cdi.kubevirt.io",
            "v1beta1",
            "DataVolume",
            "datavolumes",
        ))
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        self.inner.api(NS)
    }

    fn image_url(&self, file: &str) -> String {
        self.images().image_url(DEFAULT_SCHEMATIC, TALOS, file)
    }

    async fn create_vm(&self, vm: Value) -> DynamicObject {
        let object: DynamicObject = serde_json::from_value(vm).expect("VM object");
        self.vms()
            .create(&PostParams::default(), &object)
            .await
            .expect("create VM")
    }
}

/// Waits until `api` has `name` and `check` holds on it (as JSON).
async fn wait_for(
    what: &str,
    api: &Api<DynamicObject>,
    name: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let last = std::sync::Mutex::new(Value::Null);
    wait::until(what, DEADLINE, || {
        let api = api.clone();
        let name = name.to_string();
        let check = &check;
        let last = &last;
        async move {
            let Some(object) = api.get_opt(&name).await? else {
                return Ok(None);
            };
            let value = serde_json::to_value(&object)?;
            *last.lock().expect("last") = value.clone();
            Ok(check(&value).then_some(value))
        }
    })
    .await
    .unwrap_or_else(|error| {
        let last = last.lock().expect("last").clone();
        panic!("{error:#}\nlast seen: {last:#}")
    })
}

async fn wait_gone(what: &str, api: &Api<DynamicObject>, name: &str) {
    wait::until(what, DEADLINE, || {
        let api = api.clone();
        let name = name.to_string();
        async move { Ok(api.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_status(object: &Value, kind: &str) -> Option<String> {
    condition(object, kind).and_then(|c| c["status"].as_str().map(String::from))
}

fn phase(object: &Value) -> &str {
    object["status"]["phase"].as_str().unwrap_or("")
}

fn printable(object: &Value) -> &str {
    object["status"]["printableStatus"].as_str().unwrap_or("")
}

fn is_running_and_ready(vmi: &Value) -> bool {
    phase(vmi) == "Running" && condition_status(vmi, "Ready").as_deref() == Some("True")
}

/// A VM like a KubevirtMachineTemplate's `virtualMachineTemplate` from
/// CAPK's `cluster-template-lb-talos.yaml`, with an HTTP DataVolume.
fn talos_vm(name: &str, image_url: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {
            "instancetype": {"kind": "VirtualMachineClusterInstancetype", "name": "u1.large"},
            "preference": {"kind": "VirtualMachineClusterPreference", "name": "ubuntu"},
            "dataVolumeTemplates": [{
                "metadata": {"name": format!("{name}-boot-volume")},
                "spec": {
                    "pvc": {
                        "volumeMode": "Block",
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "10Gi"}},
                        "storageClassName": "local",
                    },
                    "source": {"http": {"url": image_url}},
                },
            }],
            "runStrategy": "Always",
            "template": {
                "metadata": {"labels": {"app": "demo-md-0"}},
                "spec": {
                    "domain": {"devices": {
                        "networkInterfaceMultiqueue": true,
                        "disks": [{"disk": {"bus": "virtio"}, "name": "dv-volume"}],
                    }},
                    "evictionStrategy": "External",
                    "volumes": [{"dataVolume": {"name": format!("{name}-boot-volume")}, "name": "dv-volume"}],
                },
            },
        },
    })
}

/// A VM booting from a containerDisk: no DataVolume.
fn container_disk_vm(name: &str, run_strategy: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "runStrategy": run_strategy,
            "template": {
                "metadata": {"labels": {"kubevirt.io/vm": name}, "annotations": {"example.com/note": "kept"}},
                "spec": {
                    "domain": {
                        "cpu": {"cores": 2},
                        "memory": {"guest": "2Gi"},
                        "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                    },
                    "volumes": [{"name": "root", "containerDisk": {"image": "quay.io/capk/talos:v1.11.0"}}],
                },
            },
        },
    })
}

#[tokio::test]
async fn always_vm_gets_a_running_ready_vmi_with_an_ip_from_the_pool() {
    let world = World::start().await;
    let vm = world.create_vm(container_disk_vm("web", "Always")).await;
    let vmi = wait_for(
        "VMI web Running and Ready",
        &world.vmis(),
        "web",
        is_running_and_ready,
    )
    .await;

    let owner = &vmi["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "VirtualMachine");
    assert_eq!(owner["uid"], json!(vm.metadata.uid));
    assert_eq!(owner["controller"], true);
    assert_eq!(vmi["metadata"]["labels"]["kubevirt.io/vm"], "web");
    assert_eq!(vmi["metadata"]["annotations"]["example.com/note"], "kept");
    let node = vmi["status"]["nodeName"].as_str().expect("nodeName");
    assert!(node.starts_with("infra-node-"), "{node}");
    assert_eq!(vmi["metadata"]["labels"]["kubevirt.io/nodeName"], node);
    let interface = &vmi["status"]["interfaces"][0];
    assert_eq!(interface["name"], "default");
    let ip = interface["ipAddress"].as_str().expect("ipAddress");
    assert!(ip.starts_with("10.244."), "{ip}");
    assert_eq!(interface["ipAddresses"], json!([ip]));
    assert!(interface["mac"].as_str().is_some());
    assert_eq!(vmi["status"]["guestOSInfo"]["id"], "talos");
    assert_eq!(
        condition_status(&vmi, "AgentConnected").as_deref(),
        Some("True")
    );
    assert_eq!(
        condition_status(&vmi, "LiveMigratable").as_deref(),
        Some("True")
    );
    assert!(
        vmi["metadata"]["finalizers"]
            .as_array()
            .expect("finalizers")
            .iter()
            .any(|f| f == "kubevirt.io/foregroundDeleteVirtualMachine")
    );
    let phases: Vec<&str> = vmi["status"]["phaseTransitionTimestamps"]
        .as_array()
        .expect("phase transitions")
        .iter()
        .filter_map(|t| t["phase"].as_str())
        .collect();
    assert_eq!(phases, ["Pending", "Scheduling", "Scheduled", "Running"]);

    let vm = wait_for("VM web Running", &world.vms(), "web", |vm| {
        printable(vm) == "Running" && vm["status"]["ready"] == true
    })
    .await;
    assert_eq!(vm["status"]["created"], true);
    assert_eq!(vm["status"]["runStrategy"], "Always");
    assert_eq!(condition_status(&vm, "Ready").as_deref(), Some("True"));
    assert!(
        vm["metadata"]["finalizers"]
            .as_array()
            .expect("VM finalizers")
            .iter()
            .any(|f| f == "kubevirt.io/virtualMachineControllerFinalize")
    );

    // The legacy `running: true` is RunStrategy Always.
    let mut legacy = container_disk_vm("legacy", "Always");
    legacy["spec"]
        .as_object_mut()
        .unwrap()
        .remove("runStrategy");
    legacy["spec"]["running"] = json!(true);
    world.create_vm(legacy).await;
    let other = wait_for(
        "VMI legacy Running",
        &world.vmis(),
        "legacy",
        is_running_and_ready,
    )
    .await;
    assert_ne!(
        other["status"]["interfaces"][0]["ipAddress"],
        json!(ip),
        "each VMI its own IP"
    );
}

#[tokio::test]
async fn image_factory_serves_the_talos_layout_and_404s_the_rest() {
    let images = ImageFactory::start(ImageFactoryConfig {
        image_size: 256 * 1024,
        ..Default::default()
    })
    .await
    .expect("start image factory");
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("tls versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        )
        .build()
        .expect("http client");
    let get = |url: String| {
        let client = client.clone();
        async move {
            let response = client.get(url).send().await.expect("GET");
            let status = response.status().as_u16();
            (status, response.bytes().await.expect("body").to_vec())
        }
    };

    let file = "openstack-amd64.raw.xz";
    let (status, body) = get(images.image_url(DEFAULT_SCHEMATIC, TALOS, file)).await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]),
        "xz magic"
    );
    let (status, body) =
        get(images.image_url(DEFAULT_SCHEMATIC, TALOS, "nocloud-arm64.raw.gz")).await;
    assert_eq!(status, 200);
    assert!(body.starts_with(&[0x1f, 0x8b]), "gzip magic");

    let unknown_schematic = "0".repeat(64);
    for url in [
        images.image_url(&unknown_schematic, TALOS, file),
        images.image_url(DEFAULT_SCHEMATIC, "v0.0.1", file),
        images.image_url(DEFAULT_SCHEMATIC, TALOS, "openstack-amd64.vhdx"),
        format!("{}/elsewhere", images.base_url()),
    ] {
        assert_eq!(get(url.clone()).await.0, 404, "{url}");
    }
    assert_eq!(images.requests(), 6);
    assert_eq!(images.not_found(), 4);
    assert_eq!(
        images.requests_for(&format!("/image/{DEFAULT_SCHEMATIC}/{TALOS}/{file}")),
        1
    );
}

#[tokio::test]
async fn http_data_volume_is_imported_before_the_vmi_starts() {
    let world = World::start().await;
    let file = "openstack-amd64.raw.xz";
    let mut vm = talos_vm("cp-0", &world.image_url(file));
    // A slow import, so the in-between states can be seen; and a second,
    // gzip-compressed disk.
    vm["spec"]["dataVolumeTemplates"][0]["metadata"]["annotations"] =
        json!({annotations::IMPORT_DURATION: "3s"});
    vm["spec"]["dataVolumeTemplates"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "metadata": {"name": "cp-0-data"},
            "spec": {
                "storage": {"resources": {"requests": {"storage": "1Gi"}}},
                "source": {"http": {"url": world.image_url("nocloud-amd64.raw.gz")}},
            },
        }));
    vm["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "data", "dataVolume": {"name": "cp-0-data"}}));
    world.create_vm(vm).await;

    let dv = wait_for(
        "DV importing with progress",
        &world.dvs(),
        "cp-0-boot-volume",
        |dv| {
            phase(dv) == "ImportInProgress"
                && dv["status"]["progress"]
                    .as_str()
                    .is_some_and(|p| p.ends_with('%') && p != "100.0%")
                && condition_status(dv, "Running").as_deref() == Some("True")
        },
    )
    .await;
    assert_eq!(condition_status(&dv, "Bound").as_deref(), Some("True"));
    assert_eq!(
        condition(&dv, "Ready").unwrap()["reason"],
        "TransferRunning"
    );
    assert_eq!(
        dv["metadata"]["ownerReferences"][0]["kind"],
        "VirtualMachine"
    );
    assert!(
        world
            .vmis()
            .get_opt("cp-0")
            .await
            .expect("get VMI")
            .is_none(),
        "no VMI while the import runs"
    );
    wait_for("VM Provisioning", &world.vms(), "cp-0", |vm| {
        printable(vm) == "Provisioning"
    })
    .await;

    let dv = wait_for("DV Succeeded", &world.dvs(), "cp-0-boot-volume", |dv| {
        phase(dv) == "Succeeded"
    })
    .await;
    assert_eq!(dv["status"]["progress"], "100.0%");
    assert_eq!(condition_status(&dv, "Ready").as_deref(), Some("True"));
    let running = condition(&dv, "Running").expect("Running condition");
    assert_eq!(running["status"], "False");
    assert_eq!(running["reason"], "Completed");
    assert_eq!(running["message"], "Import Complete");
    assert_eq!(dv["status"]["claimName"], "cp-0-boot-volume");

    let pvc = world.pvcs().get("cp-0-boot-volume").await.expect("PVC");
    let status = pvc.status.clone().expect("PVC status");
    assert_eq!(status.phase.as_deref(), Some("Bound"));
    assert_eq!(status.capacity.expect("capacity")["storage"].0, "10Gi");
    let spec = pvc.spec.clone().expect("PVC spec");
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
    let owner = &pvc.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("DataVolume", "cp-0-boot-volume")
    );
    let annotations = pvc.metadata.annotations.clone().expect("annotations");
    let (sha, size) = world
        .images()
        .raw_digest(DEFAULT_SCHEMATIC, TALOS, file)
        .expect("digest");
    assert_eq!(
        annotations[imported::SHA256],
        sha,
        "the image really arrived"
    );
    assert_eq!(annotations[imported::SIZE], size.to_string());
    assert_eq!(annotations[imported::COMPRESSION], "xz");
    let data = world.pvcs().get("cp-0-data").await.expect("data PVC");
    let data_annotations = data.metadata.annotations.expect("annotations");
    assert_eq!(data_annotations[imported::COMPRESSION], "gz");
    assert_eq!(
        data.spec.expect("spec").access_modes,
        Some(vec!["ReadWriteOnce".to_string()])
    );

    let vmi = wait_for("VMI Running", &world.vmis(), "cp-0", is_running_and_ready).await;
    let dv_ready = condition(&vmi, "DataVolumesReady").expect("DataVolumesReady");
    assert_eq!(dv_ready["status"], "True");
    assert_eq!(dv_ready["reason"], "AllDVsReady");
    // RWO disks cannot be live-migrated.
    let migratable = condition(&vmi, "LiveMigratable").expect("LiveMigratable");
    assert_eq!(migratable["status"], "False");
    assert_eq!(migratable["reason"], "DisksNotLiveMigratable");
    let boot = world.dvs().get("cp-0-boot-volume").await.expect("DV");
    let vmi_created = vmi["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .to_string();
    let succeeded_at = serde_json::to_value(&boot).unwrap()["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap()
        .to_string();
    assert!(
        vmi_created >= succeeded_at,
        "VMI created {vmi_created} before the DV was ready {succeeded_at}"
    );
    assert_eq!(
        world
            .images()
            .requests_for(&format!("/image/{DEFAULT_SCHEMATIC}/{TALOS}/{file}")),
        1,
        "imported once"
    );
}

#[tokio::test]
async fn missing_image_fails_the_way_cdi_reports_it() {
    let world = World::start().await;
    world
        .create_vm(talos_vm(
            "w-404",
            &world.image_url("openstack-amd64.raw.zip"),
        ))
        .await;
    let expected = "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found";
    let dv = wait_for(
        "DV failing with restarts",
        &world.dvs(),
        "w-404-boot-volume",
        |dv| {
            dv["status"]["restartCount"].as_i64().unwrap_or(0) >= 2
                && condition(dv, "Running").is_some_and(|c| c["status"] == "False")
        },
    )
    .await;
    // CDI keeps retrying a connection error: the phase stays ImportInProgress.
    assert_eq!(phase(&dv), "ImportInProgress");
    let running = condition(&dv, "Running").expect("Running");
    assert_eq!(running["reason"], "Error");
    assert_eq!(running["message"], expected);
    assert_eq!(condition_status(&dv, "Ready").as_deref(), Some("False"));
    assert_eq!(condition_status(&dv, "Bound").as_deref(), Some("True"));
    wait_for("VM DataVolumeError", &world.vms(), "w-404", |vm| {
        printable(vm) == "DataVolumeError"
    })
    .await;
    assert!(world.vmis().get_opt("w-404").await.expect("get").is_none());
    assert!(world.images().not_found() >= 2);
}

#[tokio::test]
async fn halted_vm_has_no_vmi_until_started_and_halting_removes_it() {
    let world = World::start().await;
    let mut idle = container_disk_vm("idle", "Halted");
    // Long enough a shutdown to see the VM `Stopping`.
    idle["metadata"]["annotations"] = json!({annotations::SHUTDOWN_GRACE: "3s"});
    world.create_vm(idle).await;
    let vm = wait_for("VM Stopped", &world.vms(), "idle", |vm| {
        printable(vm) == "Stopped"
    })
    .await;
    assert_eq!(vm["status"]["created"], false);
    assert_eq!(vm["status"]["ready"], false);
    assert_eq!(condition(&vm, "Ready").unwrap()["reason"], "VMINotExists");
    assert!(world.vmis().get_opt("idle").await.expect("get").is_none());

    let patch = |strategy: &str| json!({"spec": {"runStrategy": strategy}});
    world
        .vms()
        .patch(
            "idle",
            &PatchParams::default(),
            &Patch::Merge(patch("Always")),
        )
        .await
        .expect("start");
    wait_for("VMI Running", &world.vmis(), "idle", is_running_and_ready).await;
    world
        .vms()
        .patch(
            "idle",
            &PatchParams::default(),
            &Patch::Merge(patch("Halted")),
        )
        .await
        .expect("halt");
    wait_for("VM Stopping", &world.vms(), "idle", |vm| {
        printable(vm) == "Stopping"
    })
    .await;
    wait_gone("VMI gone", &world.vmis(), "idle").await;
    wait_for("VM Stopped again without VMI", &world.vms(), "idle", |vm| {
        printable(vm) == "Stopped" && vm["status"]["created"] == false
    })
    .await;
}

#[tokio::test]
async fn deleting_the_vm_waits_for_guest_shutdown_then_removes_vmi_dv_and_pvc() {
    let world = World::start().await;
    let mut vm = talos_vm("gone", &world.image_url("openstack-amd64.raw.xz"));
    vm["metadata"]["annotations"] = json!({annotations::SHUTDOWN_GRACE: "3s"});
    world.create_vm(vm).await;
    wait_for("VMI Running", &world.vmis(), "gone", is_running_and_ready).await;

    world
        .vms()
        .delete("gone", &DeleteParams::default())
        .await
        .expect("delete VM");
    // The guest shuts down while the finalizers hold the objects.
    // The simulator reports the termination in its own write after the
    // apiserver sets the deletion timestamp; wait for both.
    let vmi = wait_for("VMI shutting down", &world.vmis(), "gone", |vmi| {
        vmi["metadata"]["deletionTimestamp"].is_string()
            && condition(vmi, "Ready").is_some_and(|c| c["reason"] == "PodTerminating")
    })
    .await;
    assert_eq!(phase(&vmi), "Running");
    wait_for("VM Terminating", &world.vms(), "gone", |vm| {
        printable(vm) == "Terminating"
    })
    .await;

    wait_gone("VM gone", &world.vms(), "gone").await;
    wait_gone("VMI gone", &world.vmis(), "gone").await;
    wait_gone("DV gone", &world.dvs(), "gone-boot-volume").await;
    let pvcs = world.pvcs();
    wait::until("PVC gone", DEADLINE, || {
        let pvcs = pvcs.clone();
        async move {
            Ok(pvcs
                .get_opt("gone-boot-volume")
                .await?
                .is_none()
                .then_some(()))
        }
    })
    .await
    .expect("PVC gone");
}

#[tokio::test]
async fn unschedulable_vmi_reports_error_unschedulable_until_the_fault_clears() {
    let world = World::start().await;
    let mut vm = container_disk_vm("big", "Always");
    vm["metadata"]["annotations"] = json!({annotations::UNSCHEDULABLE: ""});
    world.create_vm(vm).await;
    let vmi = wait_for("VMI unschedulable", &world.vmis(), "big", |vmi| {
        condition(vmi, "PodScheduled").is_some()
    })
    .await;
    assert_eq!(phase(&vmi), "Scheduling");
    let scheduled = condition(&vmi, "PodScheduled").unwrap();
    assert_eq!(scheduled["status"], "False");
    assert_eq!(scheduled["reason"], "Unschedulable");
    assert!(
        scheduled["message"]
            .as_str()
            .unwrap()
            .contains("Insufficient memory")
    );
    let vm = wait_for("VM ErrorUnschedulable", &world.vms(), "big", |vm| {
        printable(vm) == "ErrorUnschedulable"
    })
    .await;
    assert_eq!(
        condition_status(&vm, "PodScheduled").as_deref(),
        Some("False")
    );

    world
        .vms()
        .patch(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::UNSCHEDULABLE: null}}})),
        )
        .await
        .expect("clear fault");
    let vmi = wait_for("VMI Running", &world.vmis(), "big", is_running_and_ready).await;
    assert!(condition(&vmi, "PodScheduled").is_none());
    wait_for("VM Running", &world.vms(), "big", |vm| {
        printable(vm) == "Running"
    })
    .await;
}

#[tokio::test]
async fn image_pull_failure_reports_err_image_pull_then_image_pull_back_off() {
    let world = World::start().await;
    let target = FaultTarget::named(NS, "pull");
    let fault = world
        .sim()
        .faults()
        .inject(target, Fault::ImagePullError(None));
    world.create_vm(container_disk_vm("pull", "Always")).await;
    let vmi = wait_for("VMI ErrImagePull", &world.vmis(), "pull", |vmi| {
        condition(vmi, "Synchronized").is_some()
    })
    .await;
    assert_eq!(phase(&vmi), "Scheduling");
    let synchronized = condition(&vmi, "Synchronized").unwrap();
    assert_eq!(synchronized["status"], "False");
    assert!(
        synchronized["message"]
            .as_str()
            .unwrap()
            .contains("quay.io/capk/talos:v1.11.0")
    );
    wait_for(
        "VM ErrImagePull or ImagePullBackOff",
        &world.vms(),
        "pull",
        |vm| matches!(printable(vm), "ErrImagePull" | "ImagePullBackOff"),
    )
    .await;
    wait_for("VM ImagePullBackOff", &world.vms(), "pull", |vm| {
        printable(vm) == "ImagePullBackOff"
    })
    .await;
    world.sim().faults().clear(fault);
    wait_for("VMI Running", &world.vmis(), "pull", is_running_and_ready).await;
}

#[tokio::test]
async fn crashed_guest_is_restarted_and_failing_starts_back_off() {
    let world = World::start().await;
    world.create_vm(container_disk_vm("crash", "Always")).await;
    let first = wait_for("VMI Running", &world.vmis(), "crash", is_running_and_ready).await;
    let first_uid = first["metadata"]["uid"].clone();

    world
        .sim()
        .fail_vmi(NS, "crash")
        .await
        .expect("crash the guest");
    let second = wait_for("a new VMI Running", &world.vmis(), "crash", |vmi| {
        vmi["metadata"]["uid"] != first_uid && is_running_and_ready(vmi)
    })
    .await;
    assert_ne!(
        second["status"]["interfaces"][0]["ipAddress"],
        first["status"]["interfaces"][0]["ipAddress"],
        "a restarted VMI gets a new pod IP"
    );

    // Every start now fails before the guest runs: KubeVirt backs off.
    let fault = world
        .sim()
        .faults()
        .inject(FaultTarget::named(NS, "crash"), Fault::FailAtStart);
    world
        .sim()
        .fail_vmi(NS, "crash")
        .await
        .expect("crash again");
    let vm = wait_for("VM CrashLoopBackOff", &world.vms(), "crash", |vm| {
        printable(vm) == "CrashLoopBackOff"
            && vm["status"]["startFailure"]["consecutiveFailCount"]
                .as_u64()
                .unwrap_or(0)
                >= 2
    })
    .await;
    assert!(vm["status"]["startFailure"]["retryAfterTimestamp"].is_string());
    world.sim().faults().clear(fault);
    let vm = wait_for(
        "VM Running after the fault clears",
        &world.vms(),
        "crash",
        |vm| printable(vm) == "Running",
    )
    .await;
    assert!(
        vm["status"].get("startFailure").is_none(),
        "cleared once a VMI runs"
    );
}

#[tokio::test]
async fn hung_guest_runs_but_never_becomes_ready() {
    let world = World::start().await;
    let mut vm = container_disk_vm("hung", "Always");
    vm["metadata"]["annotations"] = json!({annotations::HUNG_GUEST: "true"});
    world.create_vm(vm).await;
    let vmi = wait_for("VMI Running", &world.vmis(), "hung", |vmi| {
        phase(vmi) == "Running" && condition(vmi, "Ready").is_some()
    })
    .await;
    let ready = condition(&vmi, "Ready").unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "ContainersNotReady");
    assert!(condition(&vmi, "AgentConnected").is_none());
    assert!(vmi["status"]["interfaces"][0]["ipAddress"].is_string());
    let vm = wait_for("VM Running but not ready", &world.vms(), "hung", |vm| {
        printable(vm) == "Running"
    })
    .await;
    assert_eq!(vm["status"]["ready"], false);
    assert_eq!(condition_status(&vm, "Ready").as_deref(), Some("False"));
}

#[tokio::test]
async fn eviction_follows_the_eviction_strategy() {
    let world = World::start().await;
    for (name, strategy) in [
        ("ext", "External"),
        ("none", "None"),
        ("live", "LiveMigrate"),
    ] {
        let mut vm = container_disk_vm(name, "Always");
        vm["spec"]["template"]["spec"]["evictionStrategy"] = json!(strategy);
        world.create_vm(vm).await;
    }
    let mut before = std::collections::HashMap::new();
    for name in ["ext", "none", "live"] {
        let vmi = wait_for("VMI Running", &world.vmis(), name, is_running_and_ready).await;
        before.insert(name, vmi);
        world.sim().evict_vmi(NS, name).await.expect("evict");
    }

    // External: only marked; whoever set the strategy acts on it.
    let ext = wait_for("evacuation marked", &world.vmis(), "ext", |vmi| {
        vmi["status"]["evacuationNodeName"].is_string()
    })
    .await;
    assert_eq!(
        ext["status"]["evacuationNodeName"],
        ext["status"]["nodeName"]
    );
    assert_eq!(
        condition_status(&ext, "EvictionRequested").as_deref(),
        Some("True")
    );
    assert_eq!(phase(&ext), "Running");

    // None: the launcher pod is evicted, the VMI fails, the VM restarts it.
    let old_uid = before["none"]["metadata"]["uid"].clone();
    wait_for("VMI replaced", &world.vmis(), "none", |vmi| {
        vmi["metadata"]["uid"] != old_uid && is_running_and_ready(vmi)
    })
    .await;

    // LiveMigrate: an evacuation migration moves it to another node.
    let old_node = before["live"]["status"]["nodeName"].clone();
    let live = wait_for("VMI migrated", &world.vmis(), "live", |vmi| {
        vmi["status"]["migrationState"]["completed"] == true
    })
    .await;
    assert_ne!(live["status"]["nodeName"], old_node);
    assert_eq!(live["metadata"]["uid"], before["live"]["metadata"]["uid"]);
    assert!(live["status"].get("evacuationNodeName").is_none());
    let migrations = world
        .migrations()
        .list(&Default::default())
        .await
        .expect("list");
    assert_eq!(migrations.items.len(), 1);
    let migration = serde_json::to_value(&migrations.items[0]).unwrap();
    assert_eq!(migration["spec"]["vmiName"], "live");
    assert_eq!(phase(&migration), "Succeeded");
}

#[tokio::test]
async fn import_faults_are_retried_or_fatal() {
    let world = World::start().await;
    let url = world.image_url("openstack-amd64.raw.xz");
    world.sim().faults().inject(
        FaultTarget::named(NS, "retry-boot-volume"),
        Fault::ImportError("disk write failed: input/output error".into()),
    );
    world.create_vm(talos_vm("retry", &url)).await;
    let mut fatal = talos_vm("fatal", &url);
    fatal["spec"]["dataVolumeTemplates"][0]["metadata"]["annotations"] =
        json!({annotations::IMPORT_FATAL: "the image is corrupt"});
    world.create_vm(fatal).await;
    // `http.checksum` is newer than the DataVolume schema embedded in the
    // VirtualMachine CRD, so this one is a DataVolume of its own.
    let checksum: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": "sum-boot-volume", "namespace": NS},
        "spec": {
            "storage": {"resources": {"requests": {"storage": "1Gi"}}},
            "source": {"http": {"url": url, "checksum": format!("sha256:{}", "0".repeat(64))}},
        },
    }))
    .unwrap();
    world
        .dvs()
        .create(&PostParams::default(), &checksum)
        .await
        .expect("create DV");

    let dv = wait_for("retried import", &world.dvs(), "retry-boot-volume", |dv| {
        dv["status"]["restartCount"].as_i64().unwrap_or(0) >= 1
            && condition(dv, "Running").is_some_and(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(phase(&dv), "ImportInProgress");
    assert_eq!(
        condition(&dv, "Running").unwrap()["message"],
        "disk write failed: input/output error"
    );

    let dv = wait_for("fatal import", &world.dvs(), "fatal-boot-volume", |dv| {
        phase(dv) == "Failed"
    })
    .await;
    assert_eq!(
        condition(&dv, "Running").unwrap()["message"],
        "the image is corrupt"
    );
    wait_for("VM DataVolumeError", &world.vms(), "fatal", |vm| {
        printable(vm) == "DataVolumeError"
    })
    .await;

    let dv = wait_for("checksum mismatch", &world.dvs(), "sum-boot-volume", |dv| {
        phase(dv) == "Failed"
    })
    .await;
    let running = condition(&dv, "Running").unwrap();
    assert_eq!(running["reason"], "ChecksumError");
    assert!(
        running["message"]
            .as_str()
            .unwrap()
            .starts_with("Unable to process data: checksum validation failed: checksum mismatch: expected sha256:0000"),
        "{running}"
    );
    for name in ["retry", "fatal"] {
        assert!(world.vmis().get_opt(name).await.expect("get").is_none());
    }
}

#[tokio::test]
async fn once_and_rerun_on_failure_restart_only_as_kubevirt_does() {
    let world = World::start().await;
    world.create_vm(container_disk_vm("once", "Once")).await;
    world
        .create_vm(container_disk_vm("rerun", "RerunOnFailure"))
        .await;
    world.create_vm(container_disk_vm("manual", "Manual")).await;
    wait_for(
        "VMI once Running",
        &world.vmis(),
        "once",
        is_running_and_ready,
    )
    .await;
    let rerun = wait_for(
        "VMI rerun Running",
        &world.vmis(),
        "rerun",
        is_running_and_ready,
    )
    .await;

    // Once: a guest that powers off stays off, its VMI kept.
    world
        .sim()
        .shutdown_guest(NS, "once")
        .await
        .expect("shutdown");
    wait_for("VM once Stopped", &world.vms(), "once", |vm| {
        printable(vm) == "Stopped"
    })
    .await;
    let vmi = world.vmis().get("once").await.expect("VMI kept");
    assert_eq!(
        serde_json::to_value(&vmi).unwrap()["status"]["phase"],
        "Succeeded"
    );

    // RerunOnFailure: a failure restarts it, a clean shutdown does not.
    let rerun_uid = rerun["metadata"]["uid"].clone();
    world.sim().fail_vmi(NS, "rerun").await.expect("crash");
    let second = wait_for("VMI rerun restarted", &world.vmis(), "rerun", |vmi| {
        vmi["metadata"]["uid"] != rerun_uid && is_running_and_ready(vmi)
    })
    .await;
    world
        .sim()
        .shutdown_guest(NS, "rerun")
        .await
        .expect("shutdown");
    wait_gone("VMI rerun gone", &world.vmis(), "rerun").await;
    wait_for(
        "VM rerun Stopped without VMI",
        &world.vms(),
        "rerun",
        |vm| printable(vm) == "Stopped" && vm["status"]["created"] == false,
    )
    .await;
    assert_ne!(second["metadata"]["uid"], rerun_uid);

    // Manual: nothing starts until asked (virtctl start adds this request).
    wait_for("VM manual Stopped", &world.vms(), "manual", |vm| {
        printable(vm) == "Stopped"
    })
    .await;
    world
        .vms()
        .patch_status(
            "manual",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"stateChangeRequests": [{"action": "Start"}]}})),
        )
        .await
        .expect("start request");
    wait_for(
        "VMI manual Running",
        &world.vmis(),
        "manual",
        is_running_and_ready,
    )
    .await;
    wait_for("start request consumed", &world.vms(), "manual", |vm| {
        vm["status"]["stateChangeRequests"]
            .as_array()
            .is_none_or(|r| r.is_empty())
    })
    .await;
}

#[tokio::test]
async fn restarting_the_simulator_converges_without_duplicates() {
    let mut world = World::start().await;
    let url = world.image_url("openstack-amd64.raw.xz");
    world.create_vm(talos_vm("steady", &url)).await;
    world.create_vm(container_disk_vm("plain", "Always")).await;
    let steady = wait_for(
        "VMI steady Running",
        &world.vmis(),
        "steady",
        is_running_and_ready,
    )
    .await;
    let plain = wait_for(
        "VMI plain Running",
        &world.vmis(),
        "plain",
        is_running_and_ready,
    )
    .await;
    // One more, stopped in the middle of its import.
    let mut slow = talos_vm("slow", &url);
    slow["spec"]["dataVolumeTemplates"][0]["metadata"]["annotations"] =
        json!({annotations::IMPORT_DURATION: "2s"});
    world.create_vm(slow).await;
    wait_for(
        "slow import running",
        &world.dvs(),
        "slow-boot-volume",
        |dv| phase(dv) == "ImportInProgress",
    )
    .await;

    world.inner.stop_kubevirt().await;
    let requests_before = world.images().requests();
    world
        .inner
        .start_kubevirt(Kubevirt::Simulated, KubevirtSimConfig::fast())
        .await;

    wait_for(
        "VMI slow Running",
        &world.vmis(),
        "slow",
        is_running_and_ready,
    )
    .await;
    let dv = world.dvs().get("slow-boot-volume").await.expect("DV");
    assert_eq!(
        serde_json::to_value(&dv).unwrap()["status"]["phase"],
        "Succeeded"
    );
    assert!(
        world.images().requests() > requests_before,
        "the interrupted import ran again"
    );
    for (name, before) in [("steady", &steady), ("plain", &plain)] {
        let now = wait_for(
            "VMI still Running",
            &world.vmis(),
            name,
            is_running_and_ready,
        )
        .await;
        assert_eq!(
            now["metadata"]["uid"], before["metadata"]["uid"],
            "{name} kept its VMI"
        );
        assert_eq!(
            now["status"]["interfaces"], before["status"]["interfaces"],
            "{name} kept its IP"
        );
        assert_eq!(
            now["status"]["phaseTransitionTimestamps"],
            before["status"]["phaseTransitionTimestamps"]
        );
    }
    wait_for("VM steady Running", &world.vms(), "steady", |vm| {
        printable(vm) == "Running"
    })
    .await;
    assert_eq!(
        world
            .vmis()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    assert_eq!(
        world
            .dvs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    assert_eq!(
        world
            .pvcs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    assert_eq!(
        world.images().requests_for(&format!(
            "/image/{DEFAULT_SCHEMATIC}/{TALOS}/openstack-amd64.raw.xz"
        )),
        world.images().requests(),
        "only the image was fetched"
    );
    // The steady DV was not imported again.
    let steady_dv = world.pvcs().get("steady-boot-volume").await.expect("PVC");
    assert_eq!(
        steady_dv.metadata.annotations.unwrap()["cdi.kubevirt.io/storage.pod.restarts"],
        "0"
    );
}

#[tokio::test]
async fn simulators_on_two_control_planes_work_at_once() {
    let world = |name: &str, pool: &str| {
        tenantry_e2e::World::builder("harness")
            .without_tenantry_crds()
            .kubevirt(
                Kubevirt::Simulated,
                KubevirtSimConfig {
                    name: name.into(),
                    ip_pool: pool.into(),
                    ..KubevirtSimConfig::fast()
                },
            )
            .start()
    };
    let (a, b) = tokio::join!(
        world("sim-a", "10.10.0.0/24"),
        world("sim-b", "10.20.0.0/24")
    );
    let vm = container_disk_vm("twin", "Always");
    let vmis = |client: kube::Client| {
        Api::<DynamicObject>::namespaced_with(
            client,
            NS,
            &resource(
                "kubevirt.io",
                "v1",
                "VirtualMachineInstance",
                "virtualmachineinstances",
            ),
        )
    };
    for client in [a.client(), b.client()] {
        let vms = Api::<DynamicObject>::namespaced_with(
            client,
            NS,
            &resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines"),
        );
        vms.create(
            &PostParams::default(),
            &serde_json::from_value(vm.clone()).unwrap(),
        )
        .await
        .expect("create VM");
    }
    let on_a = wait_for("VMI on a", &vmis(a.client()), "twin", is_running_and_ready).await;
    let on_b = wait_for("VMI on b", &vmis(b.client()), "twin", is_running_and_ready).await;
    assert!(
        on_a["status"]["interfaces"][0]["ipAddress"]
            .as_str()
            .unwrap()
            .starts_with("10.10.0.")
    );
    assert!(
        on_b["status"]["interfaces"][0]["ipAddress"]
            .as_str()
            .unwrap()
            .starts_with("10.20.0.")
    );
    assert_eq!(
        vmis(a.client())
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}
