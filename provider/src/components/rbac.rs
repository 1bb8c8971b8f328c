//! The components' RBAC: what the controllers do, audited from every `Api`
//! they build (each rule names the code that needs it), what Cluster API
//! core may do with tenantry's kinds, and who may read the metrics.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{INFRASTRUCTURE_GROUP, NAMESPACE, PROVIDER_LABEL, SERVICE_ACCOUNT, labels};

const MANAGER_ROLE: &str = "tenantry-manager-role";
const CAPI_AGGREGATED_ROLE: &str = "tenantry-aggregated-capi-manager-role";

/// Plurals of every kind tenantry serves in the infrastructure group.
pub(super) fn own_resources() -> Vec<String> {
    let plurals: BTreeSet<String> = tenantry_api::crds::all()
        .into_iter()
        .filter(|crd| crd.spec.group == INFRASTRUCTURE_GROUP)
        .map(|crd| crd.spec.names.plural)
        .collect();
    plurals.into_iter().collect()
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({ "apiGroups": groups, "resources": resources, "verbs": verbs })
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

pub(super) fn manager_role() -> Value {
    let own = own_resources();
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    let status: Vec<String> = own.iter().map(|p| format!("{p}/status")).collect();
    let finalizers: Vec<String> = own.iter().map(|p| format!("{p}/finalizers")).collect();
    let status: Vec<&str> = status.iter().map(String::as_str).collect();
    let finalizers: Vec<&str> = finalizers.iter().map(String::as_str).collect();
    let rules = vec![
        // Every reconciler: its kinds, their status (server-side apply) and
        // finalizers (kube::runtime::finalizer).
        rule(&[INFRASTRUCTURE_GROUP], &own, WRITE),
        rule(
            &[INFRASTRUCTURE_GROUP],
            &status,
            &["get", "patch", "update"],
        ),
        rule(&[INFRASTRUCTURE_GROUP], &finalizers, &["update"]),
        // capi/owner.rs reads the owner Machine and Cluster; the controllers
        // watch both. Remediation annotates and deletes the Machine it
        // remediates.
        // tenant: the Kubernetes objects, their status and finalizer.
        // tenant: the Kubernetes objects and their KubernetesNodes pools,
        // their status and finalizers.
        rule(
            &["apps.tenantry.dev"],
            &["kuberneteses", "kubernetesnodes"],
            WRITE,
        ),
        rule(
            &["apps.tenantry.dev"],
            &["kuberneteses/status", "kubernetesnodes/status"],
            &["get", "patch", "update"],
        ),
        rule(
            &["apps.tenantry.dev"],
            &["kuberneteses/finalizers", "kubernetesnodes/finalizers"],
            &["update"],
        ),
        // tenant pools: what a KubernetesNodes becomes — its workers'
        // MachineDeployment, MachineHealthCheck and Talos bootstrap template
        // (the machine templates are tenantry's own kinds, above); the
        // MachineSets still using an old machine template are read.
        rule(
            &["cluster.x-k8s.io"],
            &["machinedeployments", "machinehealthchecks"],
            WRITE,
        ),
        rule(&["cluster.x-k8s.io"], &["machinesets"], READ),
        rule(
            &["bootstrap.cluster.x-k8s.io"],
            &["talosconfigtemplates"],
            WRITE,
        ),
        // tenant: the Proxmox CSI controller and CCM of Proxmox tenants,
        // run in their management namespace.
        rule(&["apps"], &["deployments"], WRITE),
        // tenant: the infrastructure StorageClasses offered to tenants.
        rule(&["storage.k8s.io"], &["storageclasses"], READ),
        // tenant: what a Kubernetes object becomes — the CAPI Cluster, its
        // KamajiControlPlane, the namespace's etcd and its Kamaji DataStore.
        rule(&["cluster.x-k8s.io"], &["clusters"], WRITE),
        rule(
            &["controlplane.cluster.x-k8s.io"],
            &["kamajicontrolplanes"],
            WRITE,
        ),
        rule(&["etcd-operator.cozystack.io"], &["etcdclusters"], WRITE),
        // tenant: whether Kamaji's and etcd-operator's kinds are installed
        // (watched only then).
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["get"],
        ),
        rule(&["kamaji.clastix.io"], &["datastores"], WRITE),
        rule(
            &["cluster.x-k8s.io"],
            &["machines"],
            &["get", "list", "watch", "patch", "delete"],
        ),
        // proxmox/cluster reads the MachineDeployments naming the cluster's
        // templates (granted with the pools' rule above).
        // Bootstrap data, Proxmox credentials, infrastructure kubeconfigs (read);
        // the cluster SSH key pair and VM user data (written, deleted).
        rule(&[""], &["secrets"], WRITE),
        // tenant: the tenant's domain and ingress class, which the platform
        // records on the tenant namespace.
        rule(&[""], &["namespaces"], &["get"]),
        // kubevirt/cluster: the control-plane Service `<cluster>-lb`.
        rule(&[""], &["services"], WRITE),
        // runtime.rs: kube's event Recorder (events.k8s.io; core for older readers).
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        // leader.rs: the leader Lease (kube-lease-manager applies it).
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "update", "patch"],
        ),
        // kubevirt/machine: VMs created and deleted, VMIs read and waited on,
        // DataVolumes listed and deleted.
        rule(&["kubevirt.io"], &["virtualmachines"], WRITE),
        rule(
            &["kubevirt.io"],
            &["virtualmachineinstances"],
            &["get", "list", "watch", "delete"],
        ),
        rule(
            &["cdi.kubevirt.io"],
            &["datavolumes"],
            &["get", "list", "watch", "delete"],
        ),
        // proxmox: IP pools per cluster, claims per machine, the addresses
        // the IPAM provider allocates.
        rule(
            &["ipam.cluster.x-k8s.io"],
            &["inclusterippools", "ipaddressclaims"],
            WRITE,
        ),
        rule(&["ipam.cluster.x-k8s.io"], &["ipaddresses"], READ),
        // metrics/server.rs: who is scraping (TokenReview), and may they
        // (SubjectAccessReview).
        rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        rule(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
    ];
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": MANAGER_ROLE, "labels": labels() },
        "rules": rules,
    })
}

pub(super) fn manager_role_binding() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": "tenantry-manager-rolebinding", "labels": labels() },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": MANAGER_ROLE,
        },
        "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }],
    })
}

/// Aggregated into CAPI core's manager role (`capi-aggregated-manager-role`
/// selects `cluster.x-k8s.io/aggregate-to-manager: "true"`): CAPI reads our
/// infrastructure objects, clones templates, sets owner references and
/// deletes infrastructure machines.
pub(super) fn capi_aggregated_role() -> Value {
    let own = own_resources();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": CAPI_AGGREGATED_ROLE,
            "labels": {
                "cluster.x-k8s.io/provider": PROVIDER_LABEL,
                "cluster.x-k8s.io/aggregate-to-manager": "true",
            },
        },
        "rules": [rule(
            &[INFRASTRUCTURE_GROUP],
            &own.iter().map(String::as_str).collect::<Vec<_>>(),
            WRITE,
        )],
    })
}

/// Bound to a Prometheus' ServiceAccount, it may scrape the metrics
/// endpoint (`config/monitoring/service-monitor.yaml`).
pub(super) fn metrics_reader_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": super::METRICS_READER_ROLE, "labels": labels() },
        "rules": [{ "nonResourceURLs": ["/metrics"], "verbs": ["get"] }],
    })
}
