use super::*;
use tenantry_api::tenant::KubernetesSpec;

fn kubernetes(spec: Value) -> Kubernetes {
    let mut kubernetes = Kubernetes::new(
        "demo",
        serde_json::from_value::<KubernetesSpec>(spec).expect("spec"),
    );
    kubernetes.metadata.namespace = Some("tenant-a".into());
    kubernetes
}

#[test]
fn everything_is_named_after_the_cluster() {
    let k = kubernetes(json!({}));
    assert_eq!(cluster(&k)["metadata"]["name"], "kubernetes-demo");
    assert_eq!(
        cluster(&k)["spec"]["controlPlaneRef"]["name"],
        "kubernetes-demo"
    );
    assert_eq!(
        cluster(&k)["spec"]["infrastructureRef"]["kind"],
        "KubevirtCluster"
    );
    let kcp = kamaji_control_plane(&k, "tenant-a", &Exposure::default());
    assert_eq!(kcp["metadata"]["name"], "kubernetes-demo");
    assert_eq!(kcp["spec"]["dataStoreName"], "tenant-a");
    assert_eq!(
        kcp["spec"]["network"]["certSANs"],
        json!([
            "kubernetes-demo.tenant-a.svc",
            "kubernetes-demo.tenant-a.svc.cluster.local"
        ])
    );
}

#[test]
fn the_control_plane_runs_the_pinned_patch_of_the_minor() {
    let kcp = kamaji_control_plane(
        &kubernetes(json!({ "version": "v1.34" })),
        "ds",
        &Exposure::default(),
    );
    assert_eq!(kcp["spec"]["version"], "v1.34.9");
    assert_eq!(kcp["spec"]["replicas"], 2);
}

#[test]
fn presets_fill_resources_with_the_platform_ratios() {
    let kcp = kamaji_control_plane(&kubernetes(json!({})), "ds", &Exposure::default());
    // c1.medium: 2 CPUs, 2Gi.
    assert_eq!(
        kcp["spec"]["apiServer"]["resources"],
        json!({ "limits": { "cpu": "2", "memory": "2Gi" }, "requests": { "cpu": "200m", "memory": "2Gi" } })
    );
    let kcp = kamaji_control_plane(
        &kubernetes(json!({ "controlPlane": { "apiServer": { "resources": { "cpu": "500m" } } } })),
        "ds",
        &Exposure::default(),
    );
    assert_eq!(
        kcp["spec"]["apiServer"]["resources"]["limits"]["cpu"],
        "500m"
    );
    assert_eq!(
        kcp["spec"]["apiServer"]["resources"]["requests"]["cpu"],
        "50m"
    );
    assert_eq!(
        kcp["spec"]["apiServer"]["resources"]["limits"]["memory"],
        "2Gi"
    );
}

#[test]
fn talos_volumes_come_first_and_oidc_mounts_its_config() {
    let kcp = kamaji_control_plane(
        &kubernetes(json!({
            "oidc": { "mode": "CustomConfig", "customConfig": { "config": "apiVersion: x" } },
            "controlPlane": { "apiServer": {
                "extraVolumes": [{ "name": "audit", "configMap": { "name": "audit-policy" } }],
            } },
        })),
        "ds",
        &Exposure::default(),
    );
    let names: Vec<&str> = kcp["spec"]["deployment"]["extraVolumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "talos-ca",
            "talos-tls-cert",
            "audit",
            "authentication-config"
        ]
    );
    assert_eq!(
        kcp["spec"]["apiServer"]["extraArgs"],
        json!(["--authentication-config=/etc/kubernetes/authentication-config/config.yaml"])
    );
    assert_eq!(
        kcp["spec"]["deployment"]["extraVolumes"][3]["secret"]["secretName"],
        "kubernetes-demo-oidc-authn-config"
    );
}

#[test]
fn the_csr_signer_reads_the_token_and_serves_trustd() {
    let kcp = kamaji_control_plane(
        &kubernetes(json!({ "images": { "talosCsrSigner": "mirror/signer:v1" } })),
        "ds",
        &Exposure::default(),
    );
    let signer = &kcp["spec"]["deployment"]["extraContainers"][0];
    assert_eq!(signer["image"], "mirror/signer:v1");
    assert_eq!(signer["ports"][0]["containerPort"], 50001);
    assert_eq!(
        signer["env"][0]["valueFrom"]["secretKeyRef"]["name"],
        "kubernetes-demo-talos-secrets"
    );
    assert_eq!(
        kcp["spec"]["network"]["additionalServicePorts"][0]["port"],
        50001
    );
}

#[test]
fn etcd_quota_is_95_percent_of_the_volume() {
    let etcd = etcd_cluster("tenant-a");
    assert_eq!(etcd["spec"]["options"]["quotaBackendBytes"], 4080218931u64);
    assert_eq!(
        etcd["spec"]["tls"]["peer"]["secretRef"]["name"],
        "etcd-peer-tls"
    );
    let store = data_store("tenant-a");
    assert_eq!(
        store["spec"]["endpoints"],
        json!(["etcd.tenant-a.svc:2379"])
    );
    assert_eq!(
        store["spec"]["tlsConfig"]["certificateAuthority"]["privateKey"]["secretReference"]["keyPath"],
        "tls.key"
    );
}

#[test]
fn proxmox_clusters_get_the_address_pool_and_credentials() {
    let k = kubernetes(json!({
        "substrate": "proxmox",
        "proxmox": {
            "ipv4Config": { "addresses": ["10.0.0.10-10.0.0.20"], "gateway": "10.0.0.1" },
            "dnsServers": ["10.0.0.1"],
            "credentialsSecretName": "pve",
        },
    }));
    let infra = infrastructure_cluster(&k);
    assert_eq!(infra["kind"], "ProxmoxCluster");
    assert_eq!(infra["spec"]["credentialsRef"]["name"], "pve");
    assert_eq!(infra["spec"]["ipv4Config"]["prefix"], 24);
    assert_eq!(infra["spec"]["externalManagedControlPlane"], true);
    assert!(
        infra["metadata"]["annotations"]["cluster.x-k8s.io/managed-by"].is_null(),
        "tenantry reconciles the ProxmoxCluster (its address pool)"
    );
}

#[test]
fn a_published_apiserver_gets_a_passthrough_ingress_and_its_names() {
    let exposure = Exposure {
        host: Some("kubernetes-demo.a.example.org".into()),
        ingress_class: Some("tenant-a".into()),
        service_ip: Some("10.96.0.17".into()),
    };
    let kcp = kamaji_control_plane(&kubernetes(json!({})), "ds", &exposure);
    let network = &kcp["spec"]["network"];
    assert_eq!(network["serviceType"], "ClusterIP");
    assert_eq!(
        network["certSANs"],
        json!([
            "kubernetes-demo.tenant-a.svc",
            "kubernetes-demo.tenant-a.svc.cluster.local",
            "kubernetes-demo.a.example.org",
            "10.96.0.17",
        ])
    );
    assert_eq!(
        network["ingress"],
        json!({
            "hostname": "kubernetes-demo.a.example.org:443",
            "className": "tenant-a",
            "extraAnnotations": { "nginx.ingress.kubernetes.io/ssl-passthrough": "true" },
        })
    );
    assert_eq!(network["additionalServicePorts"][0]["port"], 50001);
    // Unpublished: no Ingress, the Service's names only.
    let kcp = kamaji_control_plane(&kubernetes(json!({})), "ds", &Exposure::default());
    assert!(kcp["spec"]["network"].get("ingress").is_none());
    assert_eq!(
        kcp["spec"]["network"]["certSANs"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn rendered_objects_read_as_the_upstream_kinds() {
    use tenantry_api::generated::etcd_operator::etcd_cluster::EtcdCluster;
    use tenantry_api::generated::kamaji::data_store::DataStore;
    use tenantry_api::generated::kamaji::kamaji_control_plane::KamajiControlPlane;
    let k = kubernetes(json!({
        "oidc": { "mode": "CustomConfig", "customConfig": { "config": "apiVersion: x" } },
        "controlPlane": { "apiServer": { "admissionControllers": ["PodSecurity"] } },
    }));
    let exposure = Exposure {
        host: Some("kubernetes-demo.a.example.org".into()),
        ingress_class: Some("tenant-a".into()),
        service_ip: Some("10.96.0.17".into()),
    };
    let kcp = kamaji_control_plane(&k, "tenant-a", &exposure);
    let typed: KamajiControlPlane =
        serde_json::from_value(kcp.clone()).expect("a KamajiControlPlane");
    // Nothing rendered is lost on the way through the generated type:
    // every field exists in the upstream schema.
    let back = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(back["spec"], kcp["spec"]);
    let etcd: EtcdCluster =
        serde_json::from_value(etcd_cluster("tenant-a")).expect("an EtcdCluster");
    assert_eq!(
        serde_json::to_value(&etcd).unwrap()["spec"],
        etcd_cluster("tenant-a")["spec"]
    );
    let store: DataStore = serde_json::from_value(data_store("tenant-a")).expect("a DataStore");
    assert_eq!(
        serde_json::to_value(&store).unwrap()["spec"],
        data_store("tenant-a")["spec"]
    );
}

#[test]
fn cpu_quantities_convert_to_millicores() {
    assert_eq!(millicores("2"), Some(2000));
    assert_eq!(millicores("1.5"), Some(1500));
    assert_eq!(millicores("250m"), Some(250));
    assert_eq!(millicores("lots"), None);
}
