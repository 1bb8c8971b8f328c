//! Worker pools end to end: a `Kubernetes` cluster and its `KubernetesNodes`
//! pools become Talos workers that join the tenant cluster, as a user sees
//! them with `kubectl --kubeconfig admin.conf get nodes`.
//!
//! Real: the management kube-apiserver and etcd, the Cluster API core
//! manager (MachineDeployments, MachineSets, Machines, health checks),
//! tenantry with its webhooks, each tenant's kube-apiserver. Simulated
//! (`e2e/src/sim/`): Kamaji and etcd-operator, KubeVirt and CDI or the
//! Proxmox VE API, CABPT (which cannot be built here), and the workers'
//! kubelets — which register a Node only when the Talos config the pool
//! rendered names the tenant's endpoint, carries its CA and a bootstrap
//! token that exists in the tenant, as a real kubelet's TLS bootstrap needs.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde::Serialize;
use serde_json::{Value, json};
use tenantry_api::tenant::{DEFAULT_TALOS_SCHEMATIC_ID, Kubernetes};
use tenantry_api::tenant_nodes::KubernetesNodes;
use tenantry_e2e::bench::resource;
use tenantry_e2e::fixtures::{self, NamespacedKind, Substrate, capi};
use tenantry_e2e::pve_lab::{TEMPLATE, TEMPLATE_NODE, lab_config};
use tenantry_e2e::sim::kubevirt::{ImageFactoryConfig, KubevirtSimConfig};
use tenantry_e2e::sim::tenant::{NodeFault, NodeSimConfig, TenantControlPlaneOptions};
use tenantry_e2e::{Kubevirt, wait};

/// Generous upper bound for a step; never the thing measured.
const DEADLINE: Duration = Duration::from_secs(300);
const TALOS: &str = "v1.13.6";
const TALOS_NEXT: &str = "v1.13.7";

/// A manifest of tenantry's `kind` (`Kubernetes`, `KubernetesNodes`).
fn tenantry_object(kind: &str, namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "apps.tenantry.dev/v1alpha1",
        "kind": kind,
        "metadata": { "name": name, "namespace": namespace },
        "spec": spec,
    })
}

/// The management cluster with the real Cluster API manager, CABPT and
/// tenantry (with its webhooks), Kamaji and etcd-operator simulated, the
/// substrate and the tenant nodes' kubelets.
struct World {
    parts: tenantry_e2e::World,
    substrate: Substrate,
}

impl World {
    async fn start(proxmox_tenants: Option<&[&str]>) -> Self {
        let builder = tenantry_e2e::World::builder("management").cluster_api();
        let (builder, substrate) = match proxmox_tenants {
            None => (
                builder
                    .kubevirt(Kubevirt::Real, KubevirtSimConfig::fast())
                    // The schematic a `Kubernetes` object that names none gets.
                    .image_factory(ImageFactoryConfig {
                        schematics: vec![DEFAULT_TALOS_SCHEMATIC_ID.into()],
                        versions: vec![TALOS.into(), TALOS_NEXT.into()],
                        ..Default::default()
                    }),
                Substrate::Kubevirt,
            ),
            Some(tenants) => (builder.ipam().pve(lab_config(tenants)), Substrate::Proxmox),
        };
        let builder = builder
            .kamaji(TenantControlPlaneOptions {
                node_monitor_grace_period: Duration::from_secs(8),
                ..Default::default()
            })
            .kamaji_waits_for_data_stores()
            .etcd()
            .nodes(NodeSimConfig {
                verify_join: true,
                validate_talos_config: true,
                ..Default::default()
            })
            .cabpt()
            .tenantry()
            .webhooks();
        // As a platform without access to the public factory runs it: its
        // own factory is the default of clusters that name none.
        let builder = match substrate {
            Substrate::Kubevirt => builder.factory_as_default(),
            Substrate::Proxmox => builder,
        };
        Self {
            parts: builder.start().await,
            substrate,
        }
    }

    fn client(&self) -> kube::Client {
        self.parts.client()
    }

    fn fail(&self, error: anyhow::Error) -> ! {
        self.parts.fail(error)
    }

    /// Creates tenantry's object `K` (`Kubernetes`, `KubernetesNodes`).
    async fn create_tenantry_object<K: NamespacedKind + Serialize>(
        &self,
        namespace: &str,
        name: &str,
        spec: Value,
    ) {
        let kind = K::kind(&());
        let object: K = serde_json::from_value(tenantry_object(&kind, namespace, name, spec))
            .unwrap_or_else(|e| panic!("{kind} object: {e}"));
        Api::<K>::namespaced(self.client(), namespace)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));
    }

    async fn create_kubernetes(&self, namespace: &str, name: &str, spec: Value) {
        self.create_tenantry_object::<Kubernetes>(namespace, name, spec)
            .await;
    }

    /// `kubectl apply --server-side` of a `Kubernetes` manifest, as a user
    /// would; returns the stored object.
    async fn apply_kubernetes(&self, namespace: &str, name: &str, spec: Value) -> Kubernetes {
        let manifest = tenantry_object("Kubernetes", namespace, name, spec);
        Api::<Kubernetes>::namespaced(self.client(), namespace)
            .patch(
                name,
                &PatchParams::apply("platform-user"),
                &Patch::Apply(manifest),
            )
            .await
            .expect("apply Kubernetes")
    }

    async fn create_pool(&self, namespace: &str, name: &str, spec: Value) {
        self.create_tenantry_object::<KubernetesNodes>(namespace, name, spec)
            .await;
    }

    async fn patch<K: NamespacedKind>(&self, namespace: &str, name: &str, patch: Value) {
        Api::<K>::namespaced(self.client(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("patch");
    }

    /// A client of the tenant built from the `admin.conf` key of the
    /// Secret the cluster's status names: what a user downloads.
    async fn admin_client(&self, namespace: &str, name: &str) -> kube::Client {
        let secret_name = wait::until("the admin kubeconfig", DEADLINE, || async move {
            let object = Api::<Kubernetes>::namespaced(self.client(), namespace)
                .get(name)
                .await?;
            Ok(object.status.and_then(|s| s.admin_kubeconfig_secret_name))
        })
        .await
        .unwrap_or_else(|e| self.fail(e));
        let secret = Api::<Secret>::namespaced(self.client(), namespace)
            .get(&secret_name)
            .await
            .expect("admin kubeconfig Secret");
        let text = String::from_utf8(secret.data.expect("data")["admin.conf"].0.clone())
            .expect("UTF-8 kubeconfig");
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("client config");
        kube::Client::try_from(config).expect("tenant client")
    }

    /// The tenant's Ready Nodes (`kubectl get nodes`), by name, with their
    /// OS image; None until the pool's status and the tenant agree on
    /// `count` Ready workers and no Node is NotReady.
    async fn ready_nodes(
        &self,
        tenant: &kube::Client,
        namespace: &str,
        pool: &str,
        count: usize,
    ) -> anyhow::Result<Option<Vec<(String, String)>>> {
        let nodes = Api::<Node>::all(tenant.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let mut ready = Vec::new();
        for node in &nodes {
            let status = node.status.clone().unwrap_or_default();
            let is_ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if !is_ready {
                return Ok(None);
            }
            ready.push((
                node.metadata.name.clone().unwrap_or_default(),
                status.node_info.map(|i| i.os_image).unwrap_or_default(),
            ));
        }
        let object = Api::<KubernetesNodes>::namespaced(self.client(), namespace)
            .get(pool)
            .await?;
        let status = object.status.unwrap_or_default();
        let pool_ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let counted =
            status.ready_replicas == Some(count as i32) && status.replicas == Some(count as i32);
        Ok((ready.len() == count && pool_ready && counted).then_some(ready))
    }

    async fn wait_ready_nodes(
        &self,
        what: &str,
        tenant: &kube::Client,
        namespace: &str,
        pool: &str,
        count: usize,
        check: impl Fn(&[(String, String)]) -> bool,
    ) -> Vec<(String, String)> {
        let check = &check;
        let result = wait::until(what, DEADLINE, || async move {
            Ok(self
                .ready_nodes(tenant, namespace, pool, count)
                .await?
                .filter(|nodes| check(nodes)))
        })
        .await;
        match result {
            Ok(nodes) => nodes,
            Err(error) => {
                // What an operator would look at: the Nodes, the pool's
                // status and its MachineDeployment's.
                let nodes: Vec<_> = Api::<Node>::all(tenant.clone())
                    .list(&ListParams::default())
                    .await
                    .map(|l| {
                        l.items
                            .into_iter()
                            .map(|n| {
                                let status = n.status.unwrap_or_default();
                                (
                                    n.metadata.name.unwrap_or_default(),
                                    status.node_info.map(|i| i.os_image).unwrap_or_default(),
                                    status
                                        .conditions
                                        .unwrap_or_default()
                                        .into_iter()
                                        .find(|c| c.type_ == "Ready")
                                        .map(|c| c.status)
                                        .unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let status = Api::<KubernetesNodes>::namespaced(self.client(), namespace)
                    .get(pool)
                    .await
                    .ok()
                    .and_then(|p| serde_json::to_string(&p.status).ok());
                let machines: Vec<_> = Api::<DynamicObject>::namespaced_with(
                    self.client(),
                    namespace,
                    &capi("Machine", "machines"),
                )
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .map(|m| {
                            format!(
                                "{} {} {}",
                                m.metadata.name.unwrap_or_default(),
                                m.data["status"]["phase"],
                                m.data["spec"]["infrastructureRef"]["name"]
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
                self.fail(error.context(format!(
                    "nodes {nodes:?}\npool status {status:?}\nmachines {machines:?}"
                )))
            }
        }
    }

    async fn names(&self, namespace: &str, resource: &ApiResource) -> Vec<String> {
        fixtures::dynamic_names(&self.client(), namespace, resource).await
    }

    /// Everything of a namespace's clusters that could be left behind.
    async fn leftovers(&self, namespace: &str) -> Vec<String> {
        let mut kinds = vec![
            resource(
                "apps.tenantry.dev",
                "v1alpha1",
                "KubernetesNodes",
                "kubernetesnodes",
            ),
            resource(
                "apps.tenantry.dev",
                "v1alpha1",
                "Kubernetes",
                "kuberneteses",
            ),
            capi("Cluster", "clusters"),
            capi("MachineDeployment", "machinedeployments"),
            capi("MachineSet", "machinesets"),
            capi("Machine", "machines"),
            capi("MachineHealthCheck", "machinehealthchecks"),
            resource(
                "bootstrap.cluster.x-k8s.io",
                "v1alpha3",
                "TalosConfigTemplate",
                "talosconfigtemplates",
            ),
            resource(
                "bootstrap.cluster.x-k8s.io",
                "v1alpha3",
                "TalosConfig",
                "talosconfigs",
            ),
        ];
        match self.substrate {
            Substrate::Kubevirt => kinds.extend([
                resource(
                    "infrastructure.cluster.x-k8s.io",
                    "v1alpha1",
                    "KubevirtMachineTemplate",
                    "kubevirtmachinetemplates",
                ),
                resource(
                    "infrastructure.cluster.x-k8s.io",
                    "v1alpha1",
                    "KubevirtMachine",
                    "kubevirtmachines",
                ),
                resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines"),
                resource("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes"),
            ]),
            Substrate::Proxmox => kinds.extend([
                resource(
                    "infrastructure.cluster.x-k8s.io",
                    "v1alpha2",
                    "ProxmoxMachineTemplate",
                    "proxmoxmachinetemplates",
                ),
                resource(
                    "infrastructure.cluster.x-k8s.io",
                    "v1alpha2",
                    "ProxmoxMachine",
                    "proxmoxmachines",
                ),
                resource(
                    "ipam.cluster.x-k8s.io",
                    "v1beta2",
                    "IPAddressClaim",
                    "ipaddressclaims",
                ),
            ]),
        }
        let mut left = Vec::new();
        for kind in &kinds {
            left.extend(
                self.names(namespace, kind)
                    .await
                    .into_iter()
                    .map(|n| format!("{}/{n}", kind.kind)),
            );
        }
        // Secrets the user made (Proxmox credentials) stay; nothing else.
        let secrets: Api<Secret> = Api::namespaced(self.client(), namespace);
        for secret in secrets
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let name = secret.metadata.name.unwrap_or_default();
            if !name.ends_with("-pve-credentials") {
                left.push(format!("Secret/{name}"));
            }
        }
        if let Substrate::Proxmox = self.substrate {
            for vm in self
                .parts
                .pve()
                .sim
                .snapshot()
                .vms
                .iter()
                .filter(|vm| !vm.template)
            {
                if vm.pool.as_deref() == Some(namespace) {
                    left.push(format!("PVE VM {}", vm.name));
                }
            }
        }
        left
    }

    async fn delete_and_wait_for_nothing(&self, namespace: &str, name: &str) {
        Api::<Kubernetes>::namespaced(self.client(), namespace)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete Kubernetes");
        let last = std::sync::Mutex::new(Vec::new());
        let last = &last;
        let result = wait::until(
            "nothing of the cluster to be left",
            DEADLINE,
            || async move {
                let left = self.leftovers(namespace).await;
                let done = left.is_empty();
                *last.lock().unwrap() = left;
                Ok(done.then_some(()))
            },
        )
        .await;
        if let Err(error) = result {
            let left = last.lock().unwrap().clone();
            self.fail(error.context(format!("left: {left:?}")));
        }
    }
}

/// No credential of the management side in the tenant: no Secret or
/// ConfigMap of the tenant holds a management secret's value.
async fn assert_no_management_secret_in_tenant(tenant: &kube::Client, forbidden: &[String]) {
    let mut texts = Vec::new();
    for secret in Api::<Secret>::all(tenant.clone())
        .list(&ListParams::default())
        .await
        .expect("list tenant Secrets")
        .items
    {
        for value in secret.data.unwrap_or_default().into_values() {
            texts.push(String::from_utf8_lossy(&value.0).to_string());
        }
    }
    for map in Api::<ConfigMap>::all(tenant.clone())
        .list(&ListParams::default())
        .await
        .expect("list tenant ConfigMaps")
        .items
    {
        texts.extend(map.data.unwrap_or_default().into_values());
    }
    for secret in forbidden.iter().filter(|s| s.len() >= 8) {
        assert!(
            !texts.iter().any(|t| t.contains(secret.as_str())),
            "a management credential was written into the tenant cluster"
        );
    }
}

/// The values of the management namespace's Secrets that must stay there:
/// Talos machine token and cluster secret, kubeconfigs, credentials.
async fn management_secret_values(client: &kube::Client, namespace: &str) -> Vec<String> {
    let mut values = Vec::new();
    for secret in Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list Secrets")
        .items
    {
        for (key, value) in secret.data.unwrap_or_default() {
            // The bootstrap token is meant for the tenant.
            if key.starts_with("bootstrapToken") || key == "tls.crt" || key == "ca.crt" {
                continue;
            }
            values.push(String::from_utf8_lossy(&value.0).to_string());
        }
    }
    values
}

#[tokio::test]
async fn kubevirt_pool_joins_scales_rolls_heals_and_goes_with_its_cluster() {
    let world = World::start(None).await;
    let factory = world.parts.factory();
    let (namespace, name, pool) = ("tenant-a", "demo", "demo-md0");
    world.parts.create_namespace(namespace).await;
    // A cluster with the default Talos image: it names no image factory
    // and no schematic, and is stored with the manager's factory.
    let spec = json!({ "version": "v1.35", "talos": { "version": TALOS } });
    let factory_url = factory.base_url().trim_end_matches('/');
    let stored = world.apply_kubernetes(namespace, name, spec.clone()).await;
    assert_eq!(
        stored.spec.talos.image_factory_url.as_deref(),
        Some(factory_url),
        "the manager's default image factory is stored"
    );
    // Applying the same manifest again keeps it.
    let stored = world.apply_kubernetes(namespace, name, spec).await;
    assert_eq!(
        stored.spec.talos.image_factory_url.as_deref(),
        Some(factory_url)
    );
    world
        .create_pool(
            namespace,
            pool,
            json!({
                "cluster": name,
                "minReplicas": 2,
                "maxReplicas": 4,
                "nodeHealthCheck": { "readyFalseTimeout": "5s", "readyUnknownTimeout": "20s" },
            }),
        )
        .await;
    let tenant = world.admin_client(namespace, name).await;

    // Two workers join as Ready Nodes.
    let two = world
        .wait_ready_nodes("two Ready workers", &tenant, namespace, pool, 2, |_| true)
        .await;
    assert!(two.iter().all(|(_, os)| os.contains(TALOS)), "{two:?}");
    // They booted from the manager's factory, with the default schematic.
    let image = format!(
        "/image/{DEFAULT_TALOS_SCHEMATIC_ID}/{TALOS}/{}",
        tenantry_api::kubevirt::DEFAULT_TALOS_PLATFORM_IMAGE
    );
    assert!(factory.requests_for(&image) > 0, "nothing fetched {image}");
    assert_eq!(factory.not_found(), 0, "the factory answered 404");
    // The deployment carries the autoscaler's bounds and no replicas of ours.
    let md = Api::<DynamicObject>::namespaced_with(
        world.client(),
        namespace,
        &capi("MachineDeployment", "machinedeployments"),
    )
    .get("kubernetes-demo-md0")
    .await
    .expect("MachineDeployment");
    let annotations = md.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        annotations
            .get("cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size")
            .map(String::as_str),
        Some("4")
    );
    let applied_replicas = md
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter(|f| {
            f.manager.as_deref() == Some("tenantry") && f.operation.as_deref() == Some("Apply")
        })
        .any(|f| {
            f.fields_v1
                .as_ref()
                .is_some_and(|v| v.0["f:spec"].get("f:replicas").is_some())
        });
    assert!(
        !applied_replicas,
        "tenantry's applied configuration must not own spec.replicas"
    );
    let forbidden = management_secret_values(&world.client(), namespace).await;
    assert_no_management_secret_in_tenant(&tenant, &forbidden).await;
    // The tenant offers the management cluster's storage: with no LINSTOR
    // class here, `replicated` through kubevirt-csi, as the default.
    let classes = Api::<StorageClass>::all(tenant.clone())
        .list(&ListParams::default())
        .await
        .expect("tenant StorageClasses")
        .items;
    let offered: Vec<_> = classes
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.provisioner.clone(),
                c.metadata
                    .annotations
                    .clone()
                    .unwrap_or_default()
                    .get("storageclass.kubernetes.io/is-default-class")
                    .cloned(),
            )
        })
        .collect();
    assert_eq!(
        offered,
        [(
            "replicated".to_string(),
            "csi.kubevirt.io".to_string(),
            Some("true".to_string())
        )]
    );

    // Raising minReplicas adds a worker and keeps the two.
    world
        .patch::<KubernetesNodes>(namespace, pool, json!({ "spec": { "minReplicas": 3 } }))
        .await;
    let three = world
        .wait_ready_nodes("three Ready workers", &tenant, namespace, pool, 3, |_| true)
        .await;
    let before: BTreeSet<_> = two.iter().map(|(n, _)| n.clone()).collect();
    let after: BTreeSet<_> = three.iter().map(|(n, _)| n.clone()).collect();
    assert!(
        before.is_subset(&after),
        "scaling up kept {before:?}: {after:?}"
    );

    // A new Talos version rolls every worker onto it.
    world
        .patch::<Kubernetes>(
            namespace,
            name,
            json!({ "spec": { "talos": { "version": TALOS_NEXT } } }),
        )
        .await;
    let rolled = world
        .wait_ready_nodes(
            "the workers to roll to the new Talos",
            &tenant,
            namespace,
            pool,
            3,
            |nodes| nodes.iter().all(|(_, os)| os.contains(TALOS_NEXT)),
        )
        .await;
    let rolled_names: BTreeSet<_> = rolled.iter().map(|(n, _)| n.clone()).collect();
    assert!(
        rolled_names.is_disjoint(&after),
        "every worker was replaced"
    );

    // A worker whose Node stays NotReady is replaced.
    let sick = rolled[0].0.clone();
    world.parts.nodes().inject_fault(&sick, NodeFault::NotReady);
    let healed = world
        .wait_ready_nodes(
            "the NotReady worker to be replaced",
            &tenant,
            namespace,
            pool,
            3,
            |nodes| nodes.iter().all(|(n, _)| n != &sick),
        )
        .await;
    assert_eq!(healed.len(), 3);

    // Deleting the cluster takes its pool first, and leaves nothing.
    world.delete_and_wait_for_nothing(namespace, name).await;
    assert_eq!(
        world.parts.kamaji().running().await,
        0,
        "the tenant control plane stopped"
    );
}

#[tokio::test]
async fn proxmox_pools_of_two_tenants_join_their_own_clusters() {
    let tenants = ["tenant-a", "tenant-b"];
    let world = World::start(Some(&tenants)).await;
    let pve = world.parts.pve();
    for (index, tenant) in tenants.iter().enumerate() {
        world.parts.create_namespace(tenant).await;
        let token = pve.tenant(tenant, &[]).await;
        let credentials = format!("{tenant}-pve-credentials");
        world
            .parts
            .create(tenant, fixtures::pve_credentials(&credentials, pve, &token))
            .await;
        world
            .create_kubernetes(
                tenant,
                "demo",
                json!({
                    "version": "v1.35",
                    "substrate": "proxmox",
                    "proxmox": {
                        "credentialsSecretName": credentials,
                        "allowedNodes": ["pve1", "pve2"],
                        "dnsServers": ["10.10.0.53"],
                        "ipv4Config": {
                            "addresses": [format!("10.10.{}.10-10.10.{}.60", index + 1, index + 1)],
                            "gateway": format!("10.10.{}.1", index + 1),
                            "prefix": 24,
                        },
                    },
                }),
            )
            .await;
        world
            .create_pool(
                tenant,
                "demo-workers",
                json!({
                    "cluster": "demo",
                    "minReplicas": 2,
                    "maxReplicas": 3,
                    "proxmox": {
                        "pool": tenant,
                        "sourceNode": TEMPLATE_NODE,
                        "templateID": TEMPLATE,
                        "storage": format!("{tenant}-disks"),
                        "isoStorage": format!("{tenant}-iso"),
                    },
                }),
            )
            .await;
    }
    let mut seen = Vec::new();
    for tenant in tenants {
        let client = world.admin_client(tenant, "demo").await;
        let nodes = world
            .wait_ready_nodes(
                "two Ready workers",
                &client,
                tenant,
                "demo-workers",
                2,
                |_| true,
            )
            .await;
        // Each worker is a VM in its tenant's Proxmox pool.
        let snapshot = pve.sim.snapshot();
        for (node, _) in &nodes {
            let vm = snapshot
                .vms
                .iter()
                .find(|vm| &vm.name == node)
                .unwrap_or_else(|| panic!("no PVE VM named {node}"));
            assert_eq!(
                vm.pool.as_deref(),
                Some(tenant),
                "{node} is in its tenant's pool"
            );
        }
        seen.push((tenant, nodes, client));
    }
    // The tenants' clusters are separate: neither sees the other's workers.
    let a: BTreeSet<_> = seen[0].1.iter().map(|(n, _)| n.clone()).collect();
    let b: BTreeSet<_> = seen[1].1.iter().map(|(n, _)| n.clone()).collect();
    assert!(a.is_disjoint(&b));
    for (tenant, _, client) in &seen {
        // The Proxmox CSI controller and CCM run in the management
        // namespace, their config (with the token) composed there.
        let deployments = Api::<Deployment>::namespaced(world.client(), tenant);
        let secrets = Api::<Secret>::namespaced(world.client(), tenant);
        for name in ["kubernetes-demo-proxmox-csi", "kubernetes-demo-proxmox-ccm"] {
            assert!(
                deployments
                    .get_opt(name)
                    .await
                    .expect("get Deployment")
                    .is_some(),
                "{tenant}/{name}"
            );
            let config = secrets
                .get(name)
                .await
                .expect("the controller's config Secret");
            let text = String::from_utf8(config.data.unwrap_or_default()["config.yaml"].0.clone())
                .unwrap();
            assert!(text.contains("/api2/json"), "{text}");
        }
        let forbidden = management_secret_values(&world.client(), tenant).await;
        assert_no_management_secret_in_tenant(client, &forbidden).await;
        // Nothing of the controllers in the tenant.
        assert!(
            Api::<Deployment>::all(client.clone())
                .list(&ListParams::default())
                .await
                .expect("tenant Deployments")
                .items
                .is_empty()
        );
    }

    for tenant in tenants {
        world.delete_and_wait_for_nothing(tenant, "demo").await;
    }
    assert!(
        pve.sim.snapshot().vms.iter().all(|vm| vm.template),
        "only the template is left on the hypervisor"
    );
}
