//! Tenantry's Proxmox kinds, served by a real kube-apiserver: capmox's own
//! cluster templates and ClusterClasses apply unchanged, what the apiserver
//! stores reads back into tenantry's types, and bad input is refused at
//! admission with a message naming the field.
//!
//! Every capmox template uses `infrastructure.cluster.x-k8s.io/v1alpha2`,
//! the only version tenantry serves, so no object is skipped for its version.

use std::path::Path;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind, ObjectMeta};
use serde_json::{Value, json};
use tenantry_api::proxmox::{
    ProxmoxCluster, ProxmoxClusterTemplate, ProxmoxMachine, ProxmoxMachineTemplate,
};
use tenantry_e2e::World;
use tenantry_e2e::clusterctl_template::{substitute, test_variables};
use tenantry_e2e::manifests::{install_crds, parse_documents};

const GROUP: &str = "infrastructure.cluster.x-k8s.io";
const API_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha2";

fn capmox_fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream/capmox")
}

/// An apiserver to try schemas on: no controllers, no CRDs yet.
async fn bare_world() -> World {
    World::builder("harness")
        .without_controller_manager()
        .without_tenantry_crds()
        .start()
        .await
}

/// An apiserver with tenantry's CRDs.
async fn world_with_tenantry_crds() -> World {
    World::builder("harness")
        .without_controller_manager()
        .start()
        .await
}

fn api_for(client: &kube::Client, document: &Value, namespace: &str) -> Api<DynamicObject> {
    let api_version = document["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').expect("group/version");
    let kind = document["kind"].as_str().expect("kind");
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = format!("{}s", kind.to_lowercase());
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

/// Server-side applies the object with strict field validation: an unknown
/// field is an error, not silently pruned, so a field our schema lacks cannot
/// go unnoticed.
async fn apply_strictly(api: &Api<DynamicObject>, document: &Value) -> kube::Result<DynamicObject> {
    let object: DynamicObject = serde_json::from_value(document.clone()).expect("object");
    let name = object.metadata.name.as_deref().expect("object name");
    let params = PatchParams::apply("tenantry-e2e").validation_strict();
    api.patch(name, &params, &Patch::Apply(&object)).await
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// The `infrastructure.cluster.x-k8s.io` objects of one clusterctl template,
/// variables substituted. Documents are substituted one by one: the flatcar
/// flavour writes `${ VM_SSH_KEYS }` (with spaces) in its
/// KubeadmControlPlane, which is none of our business and which our
/// clusterctl-compatible substitution, like clusterctl, does not resolve.
fn infrastructure_objects(text: &str, cluster: &str, namespace: &str) -> Vec<Value> {
    let variables = test_variables(cluster, namespace);
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            documents.push(String::new());
        } else {
            let current = documents.last_mut().expect("a document");
            current.push_str(line);
            current.push('\n');
        }
    }
    let mut objects = Vec::new();
    for document in documents {
        let ours = document
            .lines()
            .any(|line| line.starts_with(&format!("apiVersion: {GROUP}/")));
        if !ours {
            continue;
        }
        let rendered = substitute(&document, &variables).unwrap_or_else(|e| panic!("{e}"));
        objects.extend(parse_documents(&rendered).expect("parse template document"));
    }
    objects
}

/// Decodes what the apiserver stored into tenantry's type for its kind, so a
/// field the reconcilers cannot read fails here rather than in production.
fn decode_into_tenantry_type(stored: &DynamicObject) -> Result<(), serde_json::Error> {
    let value = serde_json::to_value(stored).expect("serialize stored object");
    match stored.types.as_ref().map(|t| t.kind.as_str()) {
        Some("ProxmoxCluster") => serde_json::from_value::<ProxmoxCluster>(value).map(drop),
        Some("ProxmoxClusterTemplate") => {
            serde_json::from_value::<ProxmoxClusterTemplate>(value).map(drop)
        }
        Some("ProxmoxMachine") => serde_json::from_value::<ProxmoxMachine>(value).map(drop),
        Some("ProxmoxMachineTemplate") => {
            serde_json::from_value::<ProxmoxMachineTemplate>(value).map(drop)
        }
        other => panic!("unexpected kind {other:?}"),
    }
}

#[tokio::test]
async fn every_capmox_template_object_creates_against_tenantry_crds() {
    let world = world_with_tenantry_crds().await;
    let client = world.client();
    let mut files: Vec<_> = std::fs::read_dir(capmox_fixtures().join("templates"))
        .expect("read capmox templates")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let mut created = 0;
    for (index, file) in files.iter().enumerate() {
        let file_name = file.file_name().unwrap().to_string_lossy().into_owned();
        // One namespace per template: the three ClusterClass flavours reuse
        // the same object names.
        let namespace = format!("capmox-{index}");
        create_namespace(&client, &namespace).await;
        let text = std::fs::read_to_string(file).expect("read template");
        for document in infrastructure_objects(&text, &format!("capmox-{index}"), &namespace) {
            assert_eq!(
                document["apiVersion"], API_VERSION,
                "{file_name}: capmox templates are expected to use v1alpha2 only"
            );
            let stored = apply_strictly(&api_for(&client, &document, &namespace), &document)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{file_name}: {} {} refused: {e}",
                        document["kind"], document["metadata"]["name"]
                    )
                });
            decode_into_tenantry_type(&stored).unwrap_or_else(|e| {
                panic!(
                    "{file_name}: stored {} {} does not decode into tenantry's type: {e}",
                    document["kind"], document["metadata"]["name"]
                )
            });
            created += 1;
        }
    }
    // 3 ClusterClass files with a ProxmoxClusterTemplate and 3
    // ProxmoxMachineTemplates each, and 10 cluster templates with a
    // ProxmoxCluster and 2 ProxmoxMachineTemplates (3 in the load-balancer
    // flavour).
    assert_eq!(
        created, 43,
        "infrastructure objects found in the capmox templates"
    );
}

/// capmox's ClusterClasses ship ProxmoxMachineTemplates whose clone source
/// (templateID + sourceNode, or templateSelector) only the ClusterClass
/// patches add, and capmox's own v1alpha2 CRD refuses them. Tenantry accepts
/// a template with no clone source at all (a ProxmoxMachine still needs one);
/// this test pins the upstream behaviour that decision works around.
#[tokio::test]
async fn capmox_refuses_its_own_clusterclass_machine_templates() {
    let world = bare_world().await;
    let client = world.client();
    install_crds(&client, &[capmox_fixtures().join("crds")])
        .await
        .expect("install capmox CRDs");
    let text = std::fs::read_to_string(capmox_fixtures().join("templates/cluster-class.yaml"))
        .expect("read ClusterClass");
    let mut refused = 0;
    for document in infrastructure_objects(&text, "capmox", "default") {
        let result = apply_strictly(&api_for(&client, &document, "default"), &document).await;
        if document["kind"] == "ProxmoxMachineTemplate" {
            let error = result.expect_err("capmox refuses a template without a clone source");
            assert!(
                error
                    .to_string()
                    .contains("Must specify either templateID or templateSelector"),
                "{error}"
            );
            refused += 1;
        } else {
            result.expect("capmox accepts the ProxmoxClusterTemplate");
        }
    }
    assert_eq!(refused, 3);
}

fn cluster(name: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "ProxmoxCluster",
        "metadata": { "name": name },
        "spec": {
            "controlPlaneEndpoint": { "host": "10.10.10.9", "port": 6443 },
            "ipv4Config": {
                "addresses": ["10.10.10.10-10.10.10.100"],
                "prefix": 24,
                "gateway": "10.10.10.1"
            },
            "dnsServers": ["8.8.8.8"],
            "credentialsRef": { "name": "proxmox-credentials" }
        }
    })
}

fn machine_spec() -> Value {
    json!({
        "sourceNode": "pve1",
        "templateID": 9000,
        "format": "qcow2",
        "full": true,
        "memoryMiB": 4096,
        "disks": { "bootVolume": { "disk": "scsi0", "sizeGb": 20 } },
        "network": {
            "networkDevices": [{
                "name": "net0",
                "bridge": "vmbr0",
                "model": "virtio",
                "ipPoolRef": [{
                    "apiGroup": "ipam.cluster.x-k8s.io",
                    "kind": "GlobalInClusterIPPool",
                    "name": "shared"
                }],
                "routingPolicy": [{ "from": "10.0.0.0/24", "priority": 100 }]
            }],
            "vrfs": [{ "name": "vrf-ext", "table": 500, "interfaces": ["net0"] }]
        },
        "pool": "tenant-a",
        "isoStorage": "local"
    })
}

fn machine(name: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "ProxmoxMachine",
        "metadata": { "name": name },
        "spec": machine_spec()
    })
}

fn machine_template(name: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "ProxmoxMachineTemplate",
        "metadata": { "name": name },
        "spec": { "template": { "spec": machine_spec() } }
    })
}

fn cluster_template(name: &str) -> Value {
    let mut spec = cluster("unused")["spec"].clone();
    spec.as_object_mut().unwrap().remove("ipv4Config");
    json!({
        "apiVersion": API_VERSION,
        "kind": "ProxmoxClusterTemplate",
        "metadata": { "name": name },
        "spec": { "template": { "spec": spec } }
    })
}

/// One change to a valid object.
enum Edit {
    /// Put a value at a JSON pointer, creating missing objects on the way
    /// (an index one past the end of an array appends).
    Set(&'static str, Value),
    /// Remove the value at a JSON pointer.
    Remove(&'static str),
}

fn edited(mut document: Value, edits: &[Edit]) -> Value {
    for edit in edits {
        match edit {
            Edit::Set(pointer, value) => {
                let (parent, key) = pointer.rsplit_once('/').expect("pointer");
                let mut target = &mut document;
                for segment in parent.split('/').skip(1) {
                    target = match target {
                        Value::Array(items) => &mut items[segment.parse::<usize>().unwrap()],
                        other => other
                            .as_object_mut()
                            .expect("object on the path")
                            .entry(segment)
                            .or_insert_with(|| json!({})),
                    };
                }
                match target {
                    Value::Array(items) => {
                        let index = key.parse::<usize>().unwrap();
                        if index == items.len() {
                            items.push(value.clone());
                        } else {
                            items[index] = value.clone();
                        }
                    }
                    other => {
                        other
                            .as_object_mut()
                            .expect("object")
                            .insert(key.into(), value.clone());
                    }
                }
            }
            Edit::Remove(pointer) => {
                let (parent, key) = pointer.rsplit_once('/').expect("pointer");
                document
                    .pointer_mut(parent)
                    .and_then(Value::as_object_mut)
                    .expect("parent object")
                    .remove(key);
            }
        }
    }
    document
}

struct Refusal {
    base: fn(&str) -> Value,
    edits: Vec<Edit>,
    /// The field path the apiserver must name.
    field: &'static str,
    /// A fragment of the rule's message.
    message: &'static str,
}

fn refusal(
    base: fn(&str) -> Value,
    edits: Vec<Edit>,
    field: &'static str,
    message: &'static str,
) -> Refusal {
    Refusal {
        base,
        edits,
        field,
        message,
    }
}

/// Each rule capmox's schema or webhooks hold, broken once on a valid
/// object: the field the apiserver must name and a fragment of its message.
fn refusal_cases() -> Vec<Refusal> {
    use Edit::{Remove, Set};
    vec![
        // ProxmoxCluster
        refusal(
            cluster,
            vec![Remove("/spec/ipv4Config")],
            "spec",
            "spec needs an address pool: set ipv4Config, ipv6Config or both",
        ),
        refusal(
            cluster,
            vec![Set("/spec/ipv4Config/addresses", json!([]))],
            "spec.ipv4Config.addresses",
            "addresses must list at least one IP, range or CIDR",
        ),
        refusal(
            cluster,
            vec![Set("/spec/ipv4Config/prefix", json!(0))],
            "spec.ipv4Config.prefix",
            "greater than or equal to 1",
        ),
        refusal(
            cluster,
            vec![Set("/spec/ipv4Config/prefix", json!(129))],
            "spec.ipv4Config.prefix",
            "less than or equal to 128",
        ),
        refusal(
            cluster,
            vec![Set("/spec/ipv4Config/gateway", json!(""))],
            "spec.ipv4Config.gateway",
            "at least 1 chars long",
        ),
        refusal(
            cluster,
            vec![Set("/spec/ipv4Config/metric", json!(-1))],
            "spec.ipv4Config.metric",
            "greater than or equal to 0",
        ),
        refusal(
            cluster,
            vec![Remove("/spec/ipv4Config/gateway")],
            "spec.ipv4Config.gateway",
            "Required value",
        ),
        refusal(
            cluster,
            vec![Remove("/spec/dnsServers")],
            "spec.dnsServers",
            "Required value",
        ),
        refusal(
            cluster,
            vec![Set("/spec/dnsServers", json!([]))],
            "spec.dnsServers",
            "at least 1 items",
        ),
        refusal(
            cluster,
            vec![Set("/spec/dnsServers", json!(["8.8.8.8", "8.8.8.8"]))],
            ".spec.dnsServers",
            "duplicate entries",
        ),
        refusal(
            cluster,
            vec![Set("/spec/controlPlaneEndpoint/port", json!(0))],
            "spec.controlPlaneEndpoint",
            "controlPlaneEndpoint.port must be between 1 and 65535",
        ),
        refusal(
            cluster,
            vec![Set("/spec/controlPlaneEndpoint/host", json!(""))],
            "spec.controlPlaneEndpoint",
            "controlPlaneEndpoint.host must be 1 to 512 characters long",
        ),
        refusal(
            cluster,
            vec![Set("/spec/schedulerHints/memoryAdjustment", json!(-1))],
            "spec.schedulerHints.memoryAdjustment",
            "greater than or equal to 0",
        ),
        refusal(
            cluster,
            vec![Set(
                "/spec/zoneConfig",
                json!([{ "zone": "-bad-", "dnsServers": ["8.8.8.8"] }]),
            )],
            "spec.zoneConfig[0].zone",
            "should match",
        ),
        refusal(
            cluster,
            vec![Set("/spec/zoneConfig", json!([{ "zone": "zone-a" }]))],
            "spec.zoneConfig[0].dnsServers",
            "Required value",
        ),
        refusal(
            cluster,
            vec![Set(
                "/spec/zoneConfig",
                json!([
                    { "zone": "zone-a", "dnsServers": ["8.8.8.8"] },
                    { "zone": "zone-a", "dnsServers": ["8.8.4.4"] }
                ]),
            )],
            ".spec.zoneConfig",
            "duplicate entries",
        ),
        // v1alpha1's cloneSpec is gone in v1alpha2; strict validation says so.
        refusal(
            cluster,
            vec![Set("/spec/cloneSpec", json!({}))],
            ".spec.cloneSpec",
            "field not declared in schema",
        ),
        // ProxmoxMachine: clone source
        refusal(
            machine,
            vec![Set(
                "/spec/templateSelector",
                json!({ "matchTags": ["capi"] }),
            )],
            "spec",
            "spec.templateSelector cannot be combined with spec.templateID or spec.sourceNode",
        ),
        refusal(
            machine,
            vec![Remove("/spec/sourceNode")],
            "spec",
            "spec needs a clone source: templateSelector, or templateID together with sourceNode",
        ),
        refusal(
            machine,
            vec![Remove("/spec/sourceNode"), Remove("/spec/templateID")],
            "spec",
            "spec needs a clone source",
        ),
        refusal(
            machine,
            vec![Set("/spec/sourceNode", json!(""))],
            "spec.sourceNode",
            "at least 1 chars long",
        ),
        refusal(
            machine,
            vec![
                Remove("/spec/sourceNode"),
                Remove("/spec/templateID"),
                Set("/spec/templateSelector", json!({ "matchTags": [] })),
            ],
            "spec.templateSelector.matchTags",
            "at least 1 items",
        ),
        refusal(
            machine,
            vec![
                Remove("/spec/sourceNode"),
                Remove("/spec/templateID"),
                Set(
                    "/spec/templateSelector",
                    json!({ "matchTags": ["capi"], "matchPolicy": "fuzzy" }),
                ),
            ],
            "spec.templateSelector.matchPolicy",
            "Unsupported value",
        ),
        // ProxmoxMachine: clone options and sizing
        refusal(
            machine,
            vec![Set("/spec/full", json!(false))],
            "spec",
            "format needs full=true",
        ),
        refusal(
            machine,
            vec![
                Remove("/spec/format"),
                Set("/spec/full", json!(false)),
                Set("/spec/storage", json!("local-lvm")),
            ],
            "spec",
            "storage needs full=true",
        ),
        refusal(
            machine,
            vec![Set("/spec/format", json!("vdi"))],
            "spec.format",
            "Unsupported value",
        ),
        refusal(
            machine,
            vec![Set("/spec/memoryMiB", json!(4100))],
            "spec.memoryMiB",
            "multiple of 8",
        ),
        refusal(
            machine,
            vec![Set("/spec/numCores", json!(0))],
            "spec.numCores",
            "greater than or equal to 1",
        ),
        refusal(
            machine,
            vec![Set("/spec/numSockets", json!(0))],
            "spec.numSockets",
            "greater than or equal to 1",
        ),
        refusal(
            machine,
            vec![Set("/spec/disks/bootVolume/sizeGb", json!(4))],
            "spec.disks.bootVolume.sizeGb",
            "greater than or equal to 5",
        ),
        refusal(
            machine,
            vec![Set("/spec/disks/bootVolume/disk", json!(""))],
            "spec.disks.bootVolume.disk",
            "at least 1 chars long",
        ),
        refusal(
            machine,
            vec![Set("/spec/providerID", json!("proxmox://region-1/105"))],
            "spec.providerID",
            "at least 46 chars long",
        ),
        refusal(
            machine,
            vec![Set(
                "/spec/providerID",
                json!("proxmox://zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"),
            )],
            "spec.providerID",
            "should match",
        ),
        refusal(
            machine,
            vec![Set("/spec/vmIDRange", json!({ "start": 200, "end": 100 }))],
            "spec.vmIDRange",
            "vmIDRange.end must not be below vmIDRange.start",
        ),
        refusal(
            machine,
            vec![Set("/spec/vmIDRange", json!({ "start": 99, "end": 200 }))],
            "spec.vmIDRange.start",
            "greater than or equal to 100",
        ),
        refusal(
            machine,
            vec![Set("/spec/tags", json!(["bad tag"]))],
            "spec.tags[0]",
            "should match",
        ),
        refusal(
            machine,
            vec![Set("/spec/tags", json!([]))],
            "spec.tags",
            "at least 1 items",
        ),
        refusal(
            machine,
            vec![Set("/spec/metadataSettings", json!({}))],
            "spec.metadataSettings.providerIDInjection",
            "Required value",
        ),
        refusal(
            machine,
            vec![Set("/spec/isoStorage", json!("local/iso"))],
            "spec.isoStorage",
            "isoStorage must be a Proxmox storage ID",
        ),
        // ProxmoxMachine: network
        refusal(
            machine,
            vec![Remove("/spec/network")],
            "spec.network",
            "Required value",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/zone", json!("-bad-"))],
            "spec.network.zone",
            "should match",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/name", json!("eth0"))],
            "spec.network.networkDevices[0].name",
            "should match",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/model", json!("ne2k"))],
            "spec.network.networkDevices[0].model",
            "Unsupported value",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/bridge", json!(""))],
            "spec.network.networkDevices[0].bridge",
            "at least 1 chars long",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/vlan", json!(4095))],
            "spec.network.networkDevices[0].vlan",
            "less than or equal to 4094",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/queues", json!(0))],
            "spec.network.networkDevices[0].queues",
            "greater than or equal to 1",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/mtu", json!(500))],
            "spec.network.networkDevices[0].mtu",
            "mtu must be 1 (the bridge's MTU) or between 576 and 65520",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/linkMtu", json!(70000))],
            "spec.network.networkDevices[0].linkMtu",
            "linkMtu must be 1 or between 576 and 65520",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/dnsServers", json!([]))],
            "spec.network.networkDevices[0].dnsServers",
            "at least 1 items",
        ),
        refusal(
            machine,
            vec![Set(
                "/spec/network/networkDevices/0/ipPoolRef/0/apiGroup",
                json!("ipam.example.com"),
            )],
            "spec.network.networkDevices[0].ipPoolRef[0]",
            "ipPoolRef.apiGroup must be ipam.cluster.x-k8s.io",
        ),
        refusal(
            machine,
            vec![Remove(
                "/spec/network/networkDevices/0/ipPoolRef/0/apiGroup",
            )],
            "spec.network.networkDevices[0].ipPoolRef[0]",
            "ipPoolRef.apiGroup must be ipam.cluster.x-k8s.io",
        ),
        refusal(
            machine,
            vec![Set(
                "/spec/network/networkDevices/0/ipPoolRef/0/kind",
                json!("IPPool"),
            )],
            "spec.network.networkDevices[0].ipPoolRef[0]",
            "ipPoolRef.kind must be InClusterIPPool or GlobalInClusterIPPool",
        ),
        refusal(
            machine,
            vec![Set(
                "/spec/network/networkDevices/0/routingPolicy/0/priority",
                json!(32765),
            )],
            "spec.network.networkDevices[0].routingPolicy[0].priority",
            "routingPolicy priority must be 1-32764 or above 32766",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/networkDevices/0/routes", json!([]))],
            "spec.network.networkDevices[0].routes",
            "at least 1 items",
        ),
        refusal(
            machine,
            vec![Set(
                "/spec/network/networkDevices/1",
                json!({ "name": "net0", "bridge": "vmbr1" }),
            )],
            ".spec.network.networkDevices",
            "duplicate entries",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/vrfs/0/table", json!(254))],
            "spec.network.vrfs[0].table",
            "vrfs table must not be 254 or 255",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/vrfs/0/name", json!("ab"))],
            "spec.network.vrfs[0].name",
            "at least 3 chars long",
        ),
        refusal(
            machine,
            vec![Set("/spec/network/vrfs/0/interfaces", json!(["eth0"]))],
            "spec.network.vrfs[0].interfaces[0]",
            "should match",
        ),
        // ProxmoxMachineTemplate: the template keeps capmox's rules, with a
        // clone source that may be left out entirely but not half given.
        refusal(
            machine_template,
            vec![Remove("/spec/template/spec/sourceNode")],
            "spec.template.spec",
            "templateID and sourceNode go together",
        ),
        refusal(
            machine_template,
            vec![Set("/spec/template/spec/full", json!(false))],
            "spec.template.spec",
            "format needs full=true",
        ),
        refusal(
            machine_template,
            vec![Set("/spec/template/spec/memoryMiB", json!(12))],
            "spec.template.spec.memoryMiB",
            "multiple of 8",
        ),
        refusal(
            cluster_template,
            vec![Set("/spec/template/spec/dnsServers", json!([]))],
            "spec.template.spec.dnsServers",
            "at least 1 items",
        ),
    ]
}

#[tokio::test]
async fn bad_proxmox_input_is_refused_naming_the_field() {
    use Edit::{Remove, Set};
    let world = world_with_tenantry_crds().await;
    let client = world.client();

    // The valid objects every case starts from, and what tenantry accepts
    // beyond capmox: a machine template that ClusterClass patches complete,
    // and a cluster template without address pools.
    let accepted = [
        cluster("good-cluster"),
        machine("good-machine"),
        machine_template("good-template"),
        edited(
            machine_template("template-without-clone-source"),
            &[
                Remove("/spec/template/spec/sourceNode"),
                Remove("/spec/template/spec/templateID"),
            ],
        ),
        cluster_template("cluster-template-without-pools"),
        edited(
            cluster("ipv6-only"),
            &[
                Remove("/spec/ipv4Config"),
                Set(
                    "/spec/ipv6Config",
                    json!({"addresses": ["2001:db8::10-2001:db8::100"], "prefix": 64, "gateway": "2001:db8::1"}),
                ),
            ],
        ),
    ];
    for document in &accepted {
        apply_strictly(&api_for(&client, document, "default"), document)
            .await
            .unwrap_or_else(|e| panic!("{} refused: {e}", document["metadata"]["name"]));
    }

    let cases = refusal_cases();

    let mut failures = Vec::new();
    for (index, case) in cases.into_iter().enumerate() {
        let name = format!("bad-{index}");
        let document = edited((case.base)(&name), &case.edits);
        let api = api_for(&client, &document, "default");
        match apply_strictly(&api, &document).await {
            Ok(_) => failures.push(format!(
                "{name} ({}: {}) was accepted",
                case.field, case.message
            )),
            Err(error) => {
                let message = error.to_string();
                if !(message.contains(&format!("{}:", case.field))
                    || message.contains(&format!("{} ", case.field)))
                    || !message.contains(case.message)
                {
                    failures.push(format!(
                        "{name}: expected {:?} naming {:?}, got: {message}",
                        case.message, case.field
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_machines_boot_volume_pool_and_iso_storage_cannot_change() {
    use Edit::{Remove, Set};
    let world = world_with_tenantry_crds().await;
    let client = world.client();
    let with_everything = machine("immutable");
    let with_nothing = edited(
        machine("immutable-unset"),
        &[Remove("/spec/pool"), Remove("/spec/isoStorage")],
    );
    let api = api_for(&client, &with_everything, "default");
    for original in [&with_everything, &with_nothing] {
        apply_strictly(&api, original)
            .await
            .expect("create machine");
        // Re-applying the same values is fine.
        apply_strictly(&api, original)
            .await
            .expect("re-apply unchanged machine");
    }

    let cases = [
        (
            &with_everything,
            Set("/spec/disks/bootVolume/sizeGb", json!(40)),
            "spec.disks.bootVolume",
            "disks.bootVolume is immutable",
        ),
        (
            &with_everything,
            Set("/spec/pool", json!("tenant-b")),
            "spec.pool",
            "pool is immutable",
        ),
        (
            &with_everything,
            Remove("/spec/pool"),
            "spec.pool",
            "pool is immutable",
        ),
        (
            &with_nothing,
            Set("/spec/pool", json!("tenant-a")),
            "spec.pool",
            "pool is immutable",
        ),
        (
            &with_everything,
            Set("/spec/isoStorage", json!("cephfs")),
            "spec.isoStorage",
            "isoStorage is immutable",
        ),
        (
            &with_everything,
            Remove("/spec/isoStorage"),
            "spec.isoStorage",
            "isoStorage is immutable",
        ),
        (
            &with_nothing,
            Set("/spec/isoStorage", json!("local")),
            "spec.isoStorage",
            "isoStorage is immutable",
        ),
    ];
    let mut failures = Vec::new();
    for (original, edit, field, expected) in cases {
        let changed = edited(original.clone(), std::slice::from_ref(&edit));
        let name = &original["metadata"]["name"];
        match apply_strictly(&api, &changed).await {
            Ok(_) => failures.push(format!("{name}: {field} change accepted")),
            Err(error) => {
                let message = error.to_string();
                if !(message.contains(&format!("{field}:")) && message.contains(expected)) {
                    failures.push(format!("{name}: {field}: {message}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Templates are not held to it: CAPI's topology controller dry-runs a
    // changed template against the current one to decide whether to rotate
    // it, and that request must go through.
    let template = machine_template("rotated");
    let api = api_for(&client, &template, "default");
    apply_strictly(&api, &template)
        .await
        .expect("create template");
    let changed = edited(
        template,
        &[
            Set("/spec/template/spec/disks/bootVolume/sizeGb", json!(40)),
            Set("/spec/template/spec/pool", json!("tenant-b")),
            Remove("/spec/template/spec/isoStorage"),
        ],
    );
    let object: DynamicObject = serde_json::from_value(changed).expect("object");
    let params = PatchParams::apply("tenantry-e2e")
        .validation_strict()
        .dry_run();
    api.patch("rotated", &params, &Patch::Apply(&object))
        .await
        .expect("a dry run of a changed template is accepted");
}
