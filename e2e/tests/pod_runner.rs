//! The pod runner plays a node of a management cluster: a Deployment of
//! tenantry's built image gets scheduled by the real kube-scheduler, runs
//! from the image's root filesystem with its ServiceAccount token, becomes
//! Ready through its readiness probe, and its Service reaches it by
//! ClusterIP and by name, as in a cluster.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tenantry_e2e::management::{ManagementCluster, tenantry_image_reference};
use tenantry_e2e::manifests::{apply_crds, apply_object};
use tenantry_e2e::wait;

const DEADLINE: Duration = Duration::from_secs(180);
const NAMESPACE: &str = "runner-test";

async fn apply(client: &kube::Client, object: serde_json::Value) {
    apply_object(client, &object, NAMESPACE)
        .await
        .unwrap_or_else(|e| panic!("apply {}: {e:#}", object["kind"]));
}

#[tokio::test]
async fn a_deployment_of_the_built_image_runs_ready_behind_its_service() {
    let cluster = ManagementCluster::start("pod-runner")
        .await
        .expect("management cluster");
    let client = cluster.client();
    apply_crds(&client, tenantry_api::crds::all())
        .await
        .expect("tenantry CRDs");
    let image = tenantry_image_reference().expect("tenantry image built by hack/image.sh");
    apply(
        &client,
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } }),
    )
    .await;
    apply(
        &client,
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "manager", "namespace": NAMESPACE },
        }),
    )
    .await;
    apply(&client, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": { "name": "runner-test-manager" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": "manager", "namespace": NAMESPACE }],
    }))
    .await;
    apply(&client, json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "manager", "namespace": NAMESPACE },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "manager" } },
            "template": {
                "metadata": { "labels": { "app": "manager" } },
                "spec": {
                    "serviceAccountName": "manager",
                    "securityContext": { "runAsNonRoot": true },
                    "containers": [{
                        "name": "manager",
                        "image": image,
                        "args": ["run", "--no-webhooks", "--health-addr=0.0.0.0:9440", "--namespace=$(POD_NAMESPACE)"],
                        "env": [{ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }],
                        "ports": [{ "name": "healthz", "containerPort": 9440 }],
                        "readinessProbe": { "httpGet": { "path": "/readyz", "port": "healthz" }, "periodSeconds": 1 },
                        "securityContext": { "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false },
                    }],
                },
            },
        },
    }))
    .await;
    apply(
        &client,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "manager", "namespace": NAMESPACE },
            "spec": { "selector": { "app": "manager" }, "ports": [
                { "name": "health", "port": 80, "targetPort": "healthz" },
                // A second port of the same ClusterIP (as webhooks plus metrics).
                { "name": "health-again", "port": 8080, "targetPort": "healthz" },
            ] },
        }),
    )
    .await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let logs = || {
        format!(
            "{}\n{}",
            cluster.describe(),
            cluster.runner.logs(NAMESPACE, "manager", 40)
        )
    };
    wait::until("the Deployment to be available", DEADLINE, || async {
        let deployment = deployments.get("manager").await?;
        Ok(deployment
            .status
            .and_then(|s| s.available_replicas)
            .filter(|n| *n == 1))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", logs()));

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = pods
        .list(&ListParams::default().labels("app=manager"))
        .await
        .expect("pods")
        .items
        .remove(0);
    let status = pod.status.clone().expect("status");
    let pod_ip: std::net::Ipv4Addr = status
        .pod_ip
        .as_deref()
        .expect("podIP")
        .parse()
        .expect("IPv4");
    assert_eq!(
        pod_ip.octets()[..3],
        cluster.node_ip().octets()[..3],
        "pod address on the node's network"
    );
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(cluster.runner.node_name())
    );
    let container = &status.container_statuses.expect("container statuses")[0];
    assert!(
        container.ready && container.started == Some(true),
        "{container:?}"
    );
    assert!(
        container
            .image_id
            .ends_with(image.split('@').nth(1).expect("digest")),
        "{}",
        container.image_id
    );
    // The ServiceAccount admission plugin gave it the token volume the
    // manager authenticated with.
    assert!(
        pod.spec
            .as_ref()
            .expect("spec")
            .volumes
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|v| v.projected.is_some()),
        "no projected token volume"
    );

    // Its Service: an EndpointSlice naming the pod, the ClusterIP proxied
    // to it, the name resolved by the cluster DNS.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    wait::until(
        "the Service's endpoints to name the pod",
        DEADLINE,
        || async {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=manager"))
                .await?;
            Ok(list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .any(|e| e.addresses.contains(&pod_ip.to_string()))
                .then_some(()))
        },
    )
    .await
    .expect("endpoints");
    let service = Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .get("manager")
        .await
        .expect("service");
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).expect("clusterIP");
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    for port in [80, 8080] {
        let url = format!("http://{cluster_ip}:{port}/healthz");
        wait::until(
            format!("the ClusterIP's port {port} to answer"),
            DEADLINE,
            || {
                let http = http.clone();
                let url = url.clone();
                async move {
                    Ok(
                        match http.get(&url).timeout(Duration::from_secs(2)).send().await {
                            Ok(response) => {
                                response.text().await.ok().filter(|t| t == "ok").map(|_| ())
                            }
                            Err(_) => None,
                        },
                    )
                }
            },
        )
        .await
        .expect("service proxy");
    }
    let resolved = resolve(
        cluster.node_ip(),
        &format!("manager.{NAMESPACE}.svc.cluster.local"),
    )
    .await;
    assert_eq!(resolved, Some(cluster_ip.parse().expect("IPv4")));
    assert_eq!(
        resolve(cluster.node_ip(), "nothing.example.org").await,
        None
    );

    // Scaled to zero, the pod is stopped and deleted by the kubelet.
    deployments
        .patch(
            "manager",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 0 } })),
        )
        .await
        .expect("scale to zero");
    wait::until("the pod to be gone", DEADLINE, || async {
        let list = pods
            .list(&ListParams::default().labels("app=manager"))
            .await?;
        Ok(list.items.is_empty().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", logs()));
    deployments
        .delete("manager", &DeleteParams::default())
        .await
        .expect("delete");
}

/// An A query to the cluster DNS.
async fn resolve(server: std::net::Ipv4Addr, name: &str) -> Option<std::net::Ipv4Addr> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let mut query = Message::new();
    query.set_id(7).set_recursion_desired(true);
    query.add_query(Query::query(
        Name::from_ascii(name).expect("name"),
        RecordType::A,
    ));
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0")
        .await
        .expect("socket");
    socket
        .send_to(&query.to_vec().expect("encode"), (server, 53))
        .await
        .expect("send");
    let mut buffer = vec![0u8; 1500];
    let length = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buffer))
        .await
        .expect("a DNS answer")
        .expect("recv");
    let answer = Message::from_vec(&buffer[..length]).expect("decode");
    answer.answers().iter().find_map(|r| match r.data() {
        RData::A(a) => Some(a.0),
        _ => None,
    })
}
