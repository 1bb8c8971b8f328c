//! The TCP Service Kamaji puts in front of a tenant's apiserver, its
//! endpoints, and the names it gives the tenant.

use super::*;

/// The names of the TCP Service, which Kamaji puts in the apiserver's
/// serving certificate.
pub(super) fn service_names(kcp: &str, namespace: &str) -> Vec<String> {
    vec![
        kcp.to_string(),
        format!("{kcp}.{namespace}"),
        format!("{kcp}.{namespace}.svc"),
        format!("{kcp}.{namespace}.svc.cluster.local"),
    ]
}

/// `host:port` of the TCP Service's cluster DNS names, which worker configs
/// name (`https://<kcp>.<ns>.svc:6443`) and the tenant is registered under
/// besides its real endpoint. The short `<kcp>` and `<kcp>.<ns>` forms
/// depend on the resolver's search path, so they are left out.
pub(super) fn service_endpoints(kcp: &str, namespace: &str, port: u16) -> Vec<String> {
    vec![
        format!("{kcp}.{namespace}.svc:{port}"),
        format!("{kcp}.{namespace}.svc.cluster.local:{port}"),
    ]
}

/// The Service Kamaji puts in front of a TCP's pods
/// (`internal/resources/k8s_service_resource.go`), from the fields Kamaji's
/// provider copies from the KamajiControlPlane's `spec.network`: named after
/// it, `kube-apiserver` on `port`, then `additionalServicePorts`, of
/// `serviceType` (Kamaji's default `LoadBalancer`), with `serviceLabels` and
/// `serviceAnnotations`. Left out: the konnectivity port (no addons run),
/// `serviceAddress`/external IPs.
pub(super) fn desired_service(kcp: &DynamicObject, port: u16, api: KamajiApi) -> Value {
    let name = kcp.metadata.name.clone().unwrap_or_default();
    let network = &kcp.data["spec"]["network"];
    let mut labels = serde_json::Map::new();
    if let Some(extra) = network["serviceLabels"].as_object() {
        labels.extend(extra.clone());
    }
    for (key, value) in [
        ("kamaji.clastix.io/project", "kamaji"),
        ("kamaji.clastix.io/name", name.as_str()),
        ("kamaji.clastix.io/component", "service"),
    ] {
        labels.insert(key.into(), json!(value));
    }
    let service_type = network["serviceType"].as_str().unwrap_or("LoadBalancer");
    let mut api_server_port = json!({
        "name": "kube-apiserver",
        "protocol": "TCP",
        "port": port,
        "targetPort": port,
    });
    if service_type == "NodePort" {
        // Kamaji exposes the apiserver on the same port on every node.
        api_server_port["nodePort"] = json!(port);
    }
    let mut ports = vec![api_server_port];
    for extra in network["additionalServicePorts"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mut port = json!({
            "name": extra["name"],
            "protocol": extra["protocol"].as_str().unwrap_or("TCP"),
            "port": extra["port"],
            "targetPort": extra["targetPort"],
        });
        if let Some(app_protocol) = extra["appProtocol"].as_str() {
            port["appProtocol"] = json!(app_protocol);
        }
        ports.push(port);
    }
    let mut spec = json!({
        "type": service_type,
        "selector": { "kamaji.clastix.io/name": name },
        "ports": ports,
    });
    if service_type == "LoadBalancer" {
        spec["allocateLoadBalancerNodePorts"] = json!(true);
        let config = &network["loadBalancerConfig"];
        if let Some(class) = config["loadBalancerClass"].as_str() {
            spec["loadBalancerClass"] = json!(class);
        }
        if let Some(ranges) = config["loadBalancerSourceRanges"]
            .as_array()
            .filter(|r| !r.is_empty())
        {
            spec["loadBalancerSourceRanges"] = json!(ranges);
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": kcp.metadata.namespace,
            "labels": labels,
            "annotations": network["serviceAnnotations"].as_object().cloned().unwrap_or_default(),
            "ownerReferences": [{
                "apiVersion": api.api_version(),
                "kind": KAMAJI_CONTROL_PLANE_KIND,
                "name": name,
                "uid": kcp.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    })
}

/// Whether the Service already has what `desired` sets (the apiserver
/// fills in more: ClusterIP, node ports, session affinity).
pub(super) fn service_matches(current: &Value, desired: &Value) -> bool {
    let covers = |current: &Value, desired: &Value| {
        desired
            .as_object()
            .is_none_or(|fields| fields.iter().all(|(k, v)| current.get(k) == Some(v)))
    };
    let ports_match = {
        let current = current["spec"]["ports"].as_array();
        let desired = desired["spec"]["ports"].as_array();
        match (current, desired) {
            (Some(current), Some(desired)) => {
                current.len() == desired.len()
                    && current.iter().zip(desired).all(|(c, d)| covers(c, d))
            }
            _ => false,
        }
    };
    ports_match
        && current["spec"]["type"] == desired["spec"]["type"]
        && current["spec"]["selector"] == desired["spec"]["selector"]
        && covers(
            &current["metadata"]["labels"],
            &desired["metadata"]["labels"],
        )
        && covers(
            &current["metadata"]["annotations"],
            &desired["metadata"]["annotations"],
        )
}

/// Creates or updates the TCP Service of a running tenant, owned by the
/// KamajiControlPlane (standing in for the TCP) so it goes with it.
pub(super) async fn ensure_service(
    client: &kube::Client,
    api: KamajiApi,
    kcp: &DynamicObject,
    port: u16,
) -> anyhow::Result<()> {
    let namespace = kcp.metadata.namespace.clone().unwrap_or_default();
    let name = kcp.metadata.name.clone().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let desired = desired_service(kcp, port, api);
    if let Some(current) = services.get_opt(&name).await?
        && service_matches(&serde_json::to_value(&current)?, &desired)
    {
        return Ok(());
    }
    services
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await
        .with_context(|| format!("apply Service {namespace}/{name}"))?;
    tracing::info!(%namespace, kcp = %name, "tenant control plane Service applied");
    Ok(())
}

/// The endpoints of the TCP Service: the tenant apiserver at `address`
/// and its real port, under the Service port's name, as the EndpointSlice
/// controller lists the TCP pods of a real Kamaji. Owned by the
/// KamajiControlPlane, so it goes with it.
pub(super) async fn ensure_endpoint_slice(
    client: &kube::Client,
    api: KamajiApi,
    kcp: &DynamicObject,
    address: std::net::Ipv4Addr,
    endpoint: &str,
) -> anyhow::Result<()> {
    let namespace = kcp.metadata.namespace.clone().unwrap_or_default();
    let name = kcp.metadata.name.clone().unwrap_or_default();
    let (_, port) = split_endpoint(endpoint)?;
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-tenant-apiserver"),
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "kamaji-simulator.tenantry.dev",
            },
            "ownerReferences": [{
                "apiVersion": api.api_version(),
                "kind": KAMAJI_CONTROL_PLANE_KIND,
                "name": name,
                "uid": kcp.metadata.uid,
            }],
        },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": [address.to_string()], "conditions": { "ready": true } }],
        "ports": [{ "name": "kube-apiserver", "port": port, "protocol": "TCP" }],
    });
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), &namespace);
    slices
        .patch(
            &format!("{name}-tenant-apiserver"),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&slice),
        )
        .await
        .with_context(|| format!("apply EndpointSlice {namespace}/{name}-tenant-apiserver"))?;
    Ok(())
}

/// Deletes the TCP Service of a stopped tenant (the garbage collector would
/// too, where the management cluster runs one).
pub(super) async fn delete_service(client: &kube::Client, namespace: &str, name: &str) {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    match services.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => {
            tracing::debug!(%namespace, kcp = %name, %error, "tenant control plane Service not deleted");
        }
    }
}
