//! The VirtualMachine a KubevirtMachine runs, rendered from its spec. Pure:
//! plain data in, a VirtualMachine out.
//!
//! The VM spec is edited as JSON: the generated KubeVirt types are deep, and
//! the edits (rename disks, add volumes) are about a few well-known paths.
//! The result is decoded into the generated `VirtualMachine` type, which
//! checks its shape.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::kubevirt::{KubevirtMachine, TalosBootDisk};

use crate::capi::bootstrap::BootstrapFormat;

/// Label on the VM, VMI and DataVolumes naming the KubevirtMachine (CAPK's key).
pub const MACHINE_NAME_LABEL: &str = "capk.cluster.x-k8s.io/kubevirt-machine-name";
/// Label naming the KubevirtMachine's namespace (CAPK's key).
pub const MACHINE_NAMESPACE_LABEL: &str = "capk.cluster.x-k8s.io/kubevirt-machine-namespace";
/// Label CAPI's conventions use for the machine's role.
pub const ROLE_LABEL: &str = "cluster.x-k8s.io/role";
/// Annotation on the VM recording the bootstrap data's format (which picks
/// the bootstrap check), so that the bootstrap-data Secret need not be read
/// again once the VM exists.
pub const BOOTSTRAP_FORMAT_ANNOTATION: &str = "infrastructure.tenantry.dev/bootstrap-format";
/// The volume and disk carrying the bootstrap data as a config drive.
pub const CLOUD_INIT_VOLUME: &str = "cloudinitvolume";
/// The DataVolume template, volume and disk the Talos `bootDisk` renders.
pub const TALOS_BOOT_DISK: &str = "talos-boot";

/// Whether a machine belongs to the control plane or the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineRole {
    ControlPlane,
    Worker,
}

impl MachineRole {
    pub fn as_label(self) -> &'static str {
        match self {
            MachineRole::ControlPlane => "control-plane",
            MachineRole::Worker => "worker",
        }
    }
}

/// Everything the VM depends on besides the KubevirtMachine itself.
#[derive(Clone, Debug)]
pub struct VmPlacement<'a> {
    /// The workload cluster's name.
    pub cluster_name: &'a str,
    /// Control plane or worker.
    pub role: MachineRole,
    /// The namespace the VM runs in (in the infrastructure cluster).
    pub namespace: &'a str,
    /// The Secret holding the bootstrap data as `userdata`.
    pub userdata_secret: &'a str,
    /// The bootstrap data's format, recorded on the VM.
    pub bootstrap_format: BootstrapFormat,
}

/// Why a KubevirtMachine's spec cannot become a VirtualMachine. Each names
/// the field to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    #[error(
        "spec.virtualMachineTemplate.spec.template.spec is missing: a VirtualMachine needs a domain"
    )]
    MissingTemplate,
    #[error(
        "spec.bootDisk renders a disk, volume and DataVolume named {TALOS_BOOT_DISK:?}, but spec.virtualMachineTemplate already has one: rename it or drop bootDisk"
    )]
    BootDiskNameTaken,
    #[error("spec.virtualMachineTemplate.spec.dataVolumeTemplates[{0}] has no metadata.name")]
    UnnamedDataVolumeTemplate(usize),
    #[error("the rendered VirtualMachine does not match KubeVirt's schema: {0}")]
    Schema(String),
}

/// The labels every object of a machine carries (VM, VMI, DataVolumes).
pub fn machine_labels(
    machine_name: &str,
    machine_namespace: &str,
    placement: &VmPlacement,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubevirt.io/vm".to_string(), machine_name.to_string()),
        ("name".to_string(), machine_name.to_string()),
        (
            ROLE_LABEL.to_string(),
            placement.role.as_label().to_string(),
        ),
        (
            CLUSTER_NAME_LABEL.to_string(),
            placement.cluster_name.to_string(),
        ),
        (MACHINE_NAME_LABEL.to_string(), machine_name.to_string()),
        (
            MACHINE_NAMESPACE_LABEL.to_string(),
            machine_namespace.to_string(),
        ),
    ])
}

/// The name a DataVolume template gets for one machine, so that every machine
/// made from one template has its own disk.
pub fn data_volume_name(machine_name: &str, template_name: &str) -> String {
    format!("{machine_name}-{template_name}")
}

/// The DataVolumes a machine's VM gets from its templates (the Talos boot
/// disk's included), named as tenantry and CAPK both name them.
pub fn data_volume_names(machine: &KubevirtMachine) -> Vec<String> {
    let machine_name = machine.metadata.name.as_deref().unwrap_or_default();
    let templates = machine
        .spec
        .virtual_machine_template
        .spec
        .data_volume_templates
        .iter()
        .flatten()
        .filter_map(|template| template.metadata.as_ref()?.get("name")?.as_str());
    let boot_disk = machine.spec.boot_disk.as_ref().map(|_| TALOS_BOOT_DISK);
    templates
        .chain(boot_disk)
        .map(|template| data_volume_name(machine_name, template))
        .collect()
}

/// The VirtualMachine for a KubevirtMachine.
pub fn desired_virtual_machine(
    machine: &KubevirtMachine,
    placement: &VmPlacement,
) -> Result<VirtualMachine, RenderError> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    let machine_namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let template = &machine.spec.virtual_machine_template;
    let mut spec =
        serde_json::to_value(&template.spec).map_err(|e| RenderError::Schema(e.to_string()))?;
    if spec.pointer("/template/spec").is_none_or(Value::is_null) {
        return Err(RenderError::MissingTemplate);
    }
    let labels = machine_labels(&name, &machine_namespace, placement);

    if let Some(boot_disk) = &machine.spec.boot_disk {
        add_talos_boot_disk(&mut spec, boot_disk)?;
    }
    rename_data_volumes(&mut spec, &name, placement.namespace, &labels)?;
    attach_bootstrap_data(&mut spec, placement.userdata_secret);

    // The VMI carries the machine's labels (the control-plane Service selects
    // on role and cluster name) and the machine's name as hostname, so the
    // workload Node is named like the machine.
    let vmi_meta = ensure_object(&mut spec["template"], "metadata");
    merge_labels(vmi_meta, &labels);
    if let Some(hostname) = guest_hostname(&name) {
        spec["template"]["spec"]["hostname"] = json!(hostname);
    }
    if spec.get("runStrategy").is_none_or(Value::is_null)
        && spec.get("running").is_none_or(Value::is_null)
    {
        spec["runStrategy"] = json!("Always");
    }

    let mut vm_labels: BTreeMap<String, String> = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    vm_labels.extend(labels);
    let mut annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(
        BOOTSTRAP_FORMAT_ANNOTATION.to_string(),
        placement.bootstrap_format.as_str().to_string(),
    );
    let vm = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "namespace": placement.namespace,
            "labels": vm_labels,
            "annotations": annotations,
        },
        "spec": spec,
    });
    serde_json::from_value(vm).map_err(|e| RenderError::Schema(e.to_string()))
}

/// The guest hostname for a machine: its name, with any dots as dashes —
/// KubeVirt's admission wants a DNS label, and a machine name is a DNS
/// subdomain (a template named after a Kubernetes version, say
/// `workers-v1.35.4`, gives machines with dots). None for a name longer than
/// a label: KubeVirt then names the guest itself.
fn guest_hostname(machine_name: &str) -> Option<String> {
    (machine_name.len() <= 63).then(|| machine_name.replace('.', "-"))
}

/// The bootstrap format recorded on a VM tenantry created; `None` for a VM
/// without the annotation (made by an older tenantry, or by CAPK).
pub fn bootstrap_format_of(vm: &VirtualMachine) -> Option<BootstrapFormat> {
    vm.metadata
        .annotations
        .as_ref()?
        .get(BOOTSTRAP_FORMAT_ANNOTATION)
        .and_then(|name| BootstrapFormat::parse(name))
}

/// The Secret a VM made by CAPK reads its user data from: CAPK names it
/// `<bootstrap data Secret>-userdata` (shared by the machines of one
/// bootstrap Secret) and deletes it with the machine. `None` for a VM
/// tenantry created (it records the bootstrap format and reads
/// `<machine>-userdata`).
pub fn capk_userdata_secret(vm: &VirtualMachine) -> Option<String> {
    if bootstrap_format_of(vm).is_some() {
        return None;
    }
    let own = format!("{}-userdata", vm.metadata.name.as_deref()?);
    vm.spec
        .template
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|volume| volume.name == CLOUD_INIT_VOLUME)?
        .cloud_init_config_drive
        .as_ref()?
        .secret_ref
        .as_ref()?
        .name
        .clone()
        .filter(|name| *name != own)
}

/// Adds the DataVolume template importing the Talos image, and the virtio
/// system disk booting from it. `blockSize.matchVolume` makes the guest see
/// the volume's real block size, so 4Kn-backed storage works.
fn add_talos_boot_disk(spec: &mut Value, boot_disk: &TalosBootDisk) -> Result<(), RenderError> {
    let taken = |list: Option<&Value>, key: &str| {
        list.and_then(Value::as_array).is_some_and(|items| {
            items
                .iter()
                .any(|i| i.pointer(key) == Some(&json!(TALOS_BOOT_DISK)))
        })
    };
    if taken(spec.get("dataVolumeTemplates"), "/metadata/name")
        || taken(spec.pointer("/template/spec/volumes"), "/name")
        || taken(spec.pointer("/template/spec/domain/devices/disks"), "/name")
    {
        return Err(RenderError::BootDiskNameTaken);
    }
    let mut storage = json!({ "resources": { "requests": { "storage": boot_disk.disk_size.0 } } });
    if let Some(class) = &boot_disk.storage_class {
        storage["storageClassName"] = json!(class);
    }
    push(
        spec,
        "dataVolumeTemplates",
        json!({
            "metadata": { "name": TALOS_BOOT_DISK },
            "spec": { "source": { "http": { "url": boot_disk.image_url() } }, "storage": storage },
        }),
    );
    let template_spec = &mut spec["template"]["spec"];
    push(
        template_spec,
        "volumes",
        json!({ "name": TALOS_BOOT_DISK, "dataVolume": { "name": TALOS_BOOT_DISK } }),
    );
    let devices = ensure_object(ensure_object(template_spec, "domain"), "devices");
    let disks = devices
        .as_object_mut()
        .expect("devices is an object")
        .entry("disks")
        .or_insert_with(|| json!([]));
    if let Some(disks) = disks.as_array_mut() {
        disks.insert(
            0,
            json!({
                "name": TALOS_BOOT_DISK,
                "bootOrder": 1,
                "disk": { "bus": "virtio" },
                "blockSize": { "matchVolume": { "enabled": true } },
            }),
        );
    }
    Ok(())
}

/// Renames every DataVolume template `<machine>-<name>` and rewrites the
/// volumes that refer to it; labels them; fills in a source PVC's namespace
/// (CDI would default it to the DataVolume's own, KubeVirt's schema requires it).
fn rename_data_volumes(
    spec: &mut Value,
    machine_name: &str,
    vm_namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), RenderError> {
    let mut renamed = BTreeMap::new();
    if let Some(templates) = spec
        .get_mut("dataVolumeTemplates")
        .and_then(Value::as_array_mut)
    {
        for (index, template) in templates.iter_mut().enumerate() {
            let old = template
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or(RenderError::UnnamedDataVolumeTemplate(index))?
                .to_string();
            let new = data_volume_name(machine_name, &old);
            template["metadata"]["name"] = json!(new);
            merge_labels(&mut template["metadata"], labels);
            if let Some(pvc) = template.pointer_mut("/spec/source/pvc")
                && pvc.get("namespace").is_none_or(|n| n.is_null() || n == "")
            {
                pvc["namespace"] = json!(vm_namespace);
            }
            renamed.insert(old, new);
        }
    }
    if let Some(volumes) = spec
        .pointer_mut("/template/spec/volumes")
        .and_then(Value::as_array_mut)
    {
        for volume in volumes {
            for path in ["/dataVolume/name", "/persistentVolumeClaim/claimName"] {
                if let Some(reference) = volume.pointer_mut(path)
                    && let Some(new) = reference.as_str().and_then(|old| renamed.get(old))
                {
                    *reference = json!(new);
                }
            }
        }
    }
    Ok(())
}

/// Attaches the bootstrap data as a config drive (Talos' OpenStack image and
/// cloud-init both read it), replacing a volume of the same name.
fn attach_bootstrap_data(spec: &mut Value, userdata_secret: &str) {
    let template_spec = &mut spec["template"]["spec"];
    let volume = json!({
        "name": CLOUD_INIT_VOLUME,
        "cloudInitConfigDrive": { "secretRef": { "name": userdata_secret } },
    });
    replace_or_push(template_spec, "volumes", volume);
    let devices = ensure_object(ensure_object(template_spec, "domain"), "devices");
    let disk = json!({ "name": CLOUD_INIT_VOLUME, "disk": { "bus": "virtio" } });
    replace_or_push(devices, "disks", disk);
}

fn ensure_object<'a>(value: &'a mut Value, key: &str) -> &'a mut Value {
    if !value.get(key).is_some_and(Value::is_object) {
        value[key] = json!({});
    }
    &mut value[key]
}

fn push(value: &mut Value, key: &str, item: Value) {
    match value.get_mut(key).and_then(Value::as_array_mut) {
        Some(list) => list.push(item),
        None => value[key] = json!([item]),
    }
}

fn replace_or_push(value: &mut Value, key: &str, item: Value) {
    if let Some(list) = value.get_mut(key).and_then(Value::as_array_mut) {
        if let Some(existing) = list.iter_mut().find(|i| i.get("name") == item.get("name")) {
            *existing = item;
            return;
        }
        list.push(item);
    } else {
        value[key] = json!([item]);
    }
}

fn merge_labels(metadata: &mut Value, labels: &BTreeMap<String, String>) {
    if !metadata.is_object() {
        *metadata = json!({});
    }
    let existing = ensure_object(metadata, "labels");
    for (key, value) in labels {
        existing[key] = json!(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    fn machine(spec: Value) -> KubevirtMachine {
        let mut machine: KubevirtMachine = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KubevirtMachine",
            "metadata": {},
            "spec": spec,
        }))
        .unwrap();
        machine.metadata = ObjectMeta {
            name: Some("demo-md-0-abc".into()),
            namespace: Some("tenant-a".into()),
            ..Default::default()
        };
        machine
    }

    fn placement() -> VmPlacement<'static> {
        VmPlacement {
            cluster_name: "demo",
            role: MachineRole::Worker,
            namespace: "tenant-a",
            userdata_secret: "demo-md-0-abc-userdata",
            bootstrap_format: BootstrapFormat::TalosConfig,
        }
    }

    /// The shape of CAPK's Talos template machine (cluster-template-lb-talos).
    fn capk_talos_spec() -> Value {
        json!({
            "virtualMachineBootstrapCheck": { "checkStrategy": "none" },
            "virtualMachineTemplate": {
                "metadata": { "namespace": "tenant-a" },
                "spec": {
                    "runStrategy": "Always",
                    "dataVolumeTemplates": [{
                        "metadata": { "name": "boot-volume" },
                        "spec": {
                            "pvc": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "20Gi" } } },
                            "source": { "pvc": { "name": "talos-image" } }
                        }
                    }],
                    "template": { "spec": {
                        "domain": {
                            "cpu": { "cores": 2 },
                            "memory": { "guest": "4Gi" },
                            "devices": { "disks": [{ "name": "dv-volume", "disk": { "bus": "virtio" } }] }
                        },
                        "evictionStrategy": "External",
                        "volumes": [{ "name": "dv-volume", "dataVolume": { "name": "boot-volume" } }]
                    }}
                }
            }
        })
    }

    #[test]
    fn data_volumes_are_renamed_per_machine_and_volumes_follow() {
        let vm = desired_virtual_machine(&machine(capk_talos_spec()), &placement()).unwrap();
        let vm = serde_json::to_value(vm).unwrap();
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
            "demo-md-0-abc-boot-volume"
        );
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["metadata"]["labels"][MACHINE_NAME_LABEL],
            "demo-md-0-abc"
        );
        let volumes = vm["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap();
        assert_eq!(
            volumes[0]["dataVolume"]["name"],
            "demo-md-0-abc-boot-volume"
        );
        // The source PVC namespace CAPK's template leaves out is filled in.
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["spec"]["source"]["pvc"]["namespace"],
            "tenant-a"
        );
    }

    #[test]
    fn a_machine_name_with_dots_gives_a_hostname_kubevirt_accepts() {
        assert_eq!(
            guest_hostname("demo-cp-v1.35.4-x7k2p").as_deref(),
            Some("demo-cp-v1-35-4-x7k2p")
        );
        assert_eq!(
            guest_hostname("demo-md-0-abc").as_deref(),
            Some("demo-md-0-abc")
        );
        assert_eq!(guest_hostname(&"a".repeat(64)), None);
    }

    #[test]
    fn bootstrap_data_is_a_config_drive_and_labels_and_hostname_are_set() {
        let vm = serde_json::to_value(
            desired_virtual_machine(&machine(capk_talos_spec()), &placement()).unwrap(),
        )
        .unwrap();
        let template = &vm["spec"]["template"];
        let volumes = template["spec"]["volumes"].as_array().unwrap();
        let cloud_init = volumes
            .iter()
            .find(|v| v["name"] == CLOUD_INIT_VOLUME)
            .unwrap();
        assert_eq!(
            cloud_init["cloudInitConfigDrive"]["secretRef"]["name"],
            "demo-md-0-abc-userdata"
        );
        let disks = template["spec"]["domain"]["devices"]["disks"]
            .as_array()
            .unwrap();
        assert!(disks.iter().any(|d| d["name"] == CLOUD_INIT_VOLUME));
        assert_eq!(template["spec"]["hostname"], "demo-md-0-abc");
        assert_eq!(template["metadata"]["labels"][ROLE_LABEL], "worker");
        assert_eq!(template["metadata"]["labels"][CLUSTER_NAME_LABEL], "demo");
        assert_eq!(vm["metadata"]["name"], "demo-md-0-abc");
        assert_eq!(vm["metadata"]["namespace"], "tenant-a");
        assert_eq!(vm["spec"]["runStrategy"], "Always");
    }

    #[test]
    fn the_vm_remembers_the_bootstrap_format_next_to_the_templates_annotations() {
        let mut spec = capk_talos_spec();
        spec["virtualMachineTemplate"]["metadata"] =
            json!({ "annotations": { "team": "storage" } });
        let vm = desired_virtual_machine(&machine(spec), &placement()).unwrap();
        assert_eq!(bootstrap_format_of(&vm), Some(BootstrapFormat::TalosConfig));
        let annotations = vm.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["team"], "storage");

        let mut unrecorded = vm.clone();
        unrecorded.metadata.annotations = None;
        assert_eq!(bootstrap_format_of(&unrecorded), None);
    }

    #[test]
    fn talos_boot_disk_renders_the_factory_url_size_class_and_block_size() {
        let mut spec = capk_talos_spec();
        spec["virtualMachineTemplate"]["spec"]["dataVolumeTemplates"] = json!([]);
        spec["virtualMachineTemplate"]["spec"]["template"]["spec"]["volumes"] = json!([]);
        spec["virtualMachineTemplate"]["spec"]["template"]["spec"]["domain"]["devices"]["disks"] =
            json!([]);
        let mut machine = machine(spec);
        machine.spec.boot_disk = Some(TalosBootDisk {
            image_factory_url: Some("http://mirror.local:8080".into()),
            schematic_id: "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".into(),
            talos_version: "v1.13.0".into(),
            platform_image: None,
            disk_size: Quantity("25Gi".into()),
            storage_class: Some("replicated".into()),
        });
        let vm =
            serde_json::to_value(desired_virtual_machine(&machine, &placement()).unwrap()).unwrap();
        let dv = &vm["spec"]["dataVolumeTemplates"][0];
        assert_eq!(dv["metadata"]["name"], "demo-md-0-abc-talos-boot");
        assert_eq!(
            dv["spec"]["source"]["http"]["url"],
            "http://mirror.local:8080/image/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba/v1.13.0/openstack-amd64.raw.xz"
        );
        assert_eq!(
            dv["spec"]["storage"]["resources"]["requests"]["storage"],
            "25Gi"
        );
        assert_eq!(dv["spec"]["storage"]["storageClassName"], "replicated");
        let disk = &vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0];
        assert_eq!(disk["name"], TALOS_BOOT_DISK);
        assert_eq!(disk["disk"]["bus"], "virtio");
        assert_eq!(disk["bootOrder"], 1);
        assert_eq!(disk["blockSize"]["matchVolume"]["enabled"], true);
        let volume = &vm["spec"]["template"]["spec"]["volumes"][0];
        assert_eq!(volume["dataVolume"]["name"], "demo-md-0-abc-talos-boot");
    }

    #[test]
    fn boot_disk_name_clash_is_refused_with_the_field_to_change() {
        let mut spec = capk_talos_spec();
        spec["virtualMachineTemplate"]["spec"]["template"]["spec"]["volumes"][0]["name"] =
            json!(TALOS_BOOT_DISK);
        let mut machine = machine(spec);
        machine.spec.boot_disk = Some(TalosBootDisk {
            schematic_id: "0".repeat(64),
            talos_version: "v1.13.0".into(),
            disk_size: Quantity("20Gi".into()),
            ..Default::default()
        });
        assert_eq!(
            desired_virtual_machine(&machine, &placement()).unwrap_err(),
            RenderError::BootDiskNameTaken
        );
    }

    /// A VM as CAPK v0.1 creates it: no bootstrap-format record, the config
    /// drive reading `<bootstrap data Secret>-userdata`.
    fn capk_vm(userdata_secret: &str) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": { "name": "demo-md-0-abc", "namespace": "tenant-a" },
            "spec": { "template": { "spec": {
                "domain": { "devices": {} },
                "volumes": [
                    { "name": "boot", "dataVolume": { "name": "demo-md-0-abc-boot" } },
                    { "name": CLOUD_INIT_VOLUME, "cloudInitConfigDrive": { "secretRef": { "name": userdata_secret } } }
                ]
            }}}
        }))
        .unwrap()
    }

    #[test]
    fn data_volumes_are_named_after_the_machine_and_template() {
        let mut machine = machine(capk_talos_spec());
        assert_eq!(data_volume_names(&machine), ["demo-md-0-abc-boot-volume"]);
        machine.spec.boot_disk = Some(TalosBootDisk::default());
        assert_eq!(
            data_volume_names(&machine),
            ["demo-md-0-abc-boot-volume", "demo-md-0-abc-talos-boot"]
        );
    }

    #[test]
    fn capks_userdata_secret_is_found_on_its_vms_only() {
        assert_eq!(
            capk_userdata_secret(&capk_vm("demo-worker-bootstrap-userdata")).as_deref(),
            Some("demo-worker-bootstrap-userdata")
        );
        // Tenantry's own Secret, on a VM of a tenantry without the record.
        assert_eq!(
            capk_userdata_secret(&capk_vm("demo-md-0-abc-userdata")),
            None
        );
        let vm = desired_virtual_machine(&machine(capk_talos_spec()), &placement()).unwrap();
        assert_eq!(capk_userdata_secret(&vm), None);
    }

    #[test]
    fn a_machine_without_a_vm_template_is_refused() {
        let err = desired_virtual_machine(&machine(json!({})), &placement()).unwrap_err();
        assert_eq!(err, RenderError::MissingTemplate);
        assert!(
            err.to_string()
                .contains("spec.virtualMachineTemplate.spec.template.spec")
        );
    }
}
