//! Service names and addresses for pods: the parts CoreDNS and kube-proxy
//! play in a cluster.
//!
//! - **DNS** (CoreDNS's `kubernetes` plugin, A records only): a UDP server
//!   on the node address answers `<service>.<namespace>.svc.cluster.local`
//!   with the Service's ClusterIP; anything else is NXDOMAIN (there is no
//!   upstream to forward to). Pods get a `resolv.conf` naming it, with the
//!   kubelet's search list and `ndots:5`, so `<service>.<namespace>.svc`
//!   resolves too.
//! - **Service proxy** (kube-proxy's old userspace mode): every TCP port of
//!   every Service whose ClusterIP is in this node's range gets a listener
//!   on `ClusterIP:port` (the ClusterIP made a local address of the node),
//!   which forwards each connection to a ready endpoint of the matching
//!   EndpointSlice port, taking turns.
//!
//! Left out: UDP Services, NodePorts, headless Services' per-pod records,
//! session affinity, SRV/PTR/AAAA records, external names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::task::JoinHandle;

use super::network::NodeNetwork;

/// The cluster's domain, as kubelets are configured by default.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// `/etc/resolv.conf` of a pod in `namespace`, as the kubelet writes it for
/// `dnsPolicy: ClusterFirst`.
pub fn resolv_conf(namespace: &str, nameserver: Ipv4Addr) -> String {
    format!(
        "search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\nnameserver {nameserver}\noptions ndots:5\n"
    )
}

/// DNS and the service proxy of one node; stop by dropping.
pub struct ClusterServices {
    tasks: Vec<JoinHandle<()>>,
    listeners: Arc<Mutex<HashMap<SocketAddr, JoinHandle<()>>>>,
    network: Arc<NodeNetwork>,
}

impl ClusterServices {
    /// Starts both on the node address of `network`.
    pub async fn start(client: kube::Client, network: Arc<NodeNetwork>) -> anyhow::Result<Self> {
        let (services, services_writer) = reflector::store::<Service>();
        let (slices, slices_writer) = reflector::store::<EndpointSlice>();
        let dns_socket = tokio::net::UdpSocket::bind((network.node_ip(), 53))
            .await
            .with_context(|| format!("listen for DNS on {}:53", network.node_ip()))?;
        let (changed_tx, mut changed_rx) = tokio::sync::mpsc::channel::<()>(1);
        let mut tasks = Vec::new();
        let watch_services = watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(services_writer)
        .applied_objects();
        let tx = changed_tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(watch_services);
            while stream.next().await.is_some() {
                let _ = tx.try_send(());
            }
        }));
        let watch_slices = watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(slices_writer)
        .applied_objects();
        tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(watch_slices);
            while stream.next().await.is_some() {}
        }));
        let dns_services = services.clone();
        tasks.push(tokio::spawn(serve_dns(dns_socket, dns_services)));

        let listeners: Arc<Mutex<HashMap<SocketAddr, JoinHandle<()>>>> = Arc::default();
        let reconcile_listeners = listeners.clone();
        let reconcile_network = network.clone();
        tasks.push(tokio::spawn(async move {
            while changed_rx.recv().await.is_some() {
                sync_listeners(&services, &slices, &reconcile_network, &reconcile_listeners).await;
            }
        }));
        Ok(Self {
            tasks,
            listeners,
            network,
        })
    }
}

impl Drop for ClusterServices {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for (address, listener) in self.listeners.lock().expect("listeners").drain() {
            listener.abort();
            if let std::net::IpAddr::V4(ip) = address.ip() {
                self.network.remove_service_ip(ip);
            }
        }
    }
}

/// A Service's TCP ports on its ClusterIP, when the ClusterIP is this
/// node's to serve.
fn service_ports(service: &Service, range: &str) -> Vec<(SocketAddr, Option<String>)> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    let Some(ip) = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    else {
        return Vec::new();
    };
    if !in_range(ip, range) {
        return Vec::new();
    }
    spec.ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok()?;
            Some((SocketAddr::from((ip, port)), p.name.clone()))
        })
        .collect()
}

fn in_range(ip: Ipv4Addr, cidr: &str) -> bool {
    let Some((base, bits)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(base), Ok(bits)) = (base.parse::<Ipv4Addr>(), bits.parse::<u32>()) else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    (u32::from(ip) & mask) == (u32::from(base) & mask)
}

async fn sync_listeners(
    services: &Store<Service>,
    slices: &Store<EndpointSlice>,
    network: &Arc<NodeNetwork>,
    listeners: &Arc<Mutex<HashMap<SocketAddr, JoinHandle<()>>>>,
) {
    let range = network.service_cidr();
    let mut wanted: BTreeMap<SocketAddr, (String, String, Option<String>)> = BTreeMap::new();
    for service in services.state() {
        let namespace = service.metadata.namespace.clone().unwrap_or_default();
        let name = service.metadata.name.clone().unwrap_or_default();
        for (address, port_name) in service_ports(&service, &range) {
            wanted.insert(address, (namespace.clone(), name.clone(), port_name));
        }
    }
    let current: BTreeSet<SocketAddr> = listeners
        .lock()
        .expect("listeners")
        .keys()
        .copied()
        .collect();
    for gone in current.iter().filter(|a| !wanted.contains_key(a)) {
        if let Some(listener) = listeners.lock().expect("listeners").remove(gone) {
            listener.abort();
        }
    }
    let still_used: BTreeSet<Ipv4Addr> = wanted
        .keys()
        .filter_map(|a| match a.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        })
        .collect();
    for gone in &current {
        if let std::net::IpAddr::V4(ip) = gone.ip()
            && !still_used.contains(&ip)
        {
            network.remove_service_ip(ip);
        }
    }
    for (address, (namespace, name, port_name)) in wanted {
        if current.contains(&address) {
            continue;
        }
        let std::net::IpAddr::V4(ip) = address.ip() else {
            continue;
        };
        if let Err(error) = network.add_service_ip(ip) {
            tracing::warn!(%error, %address, "cannot serve a ClusterIP");
            continue;
        }
        let listener = match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, %address, "cannot listen on a ClusterIP");
                continue;
            }
        };
        let slices = slices.clone();
        let turn = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let endpoints = ready_endpoints(&slices, &namespace, &name, port_name.as_deref());
                if endpoints.is_empty() {
                    // No endpoint: the connection is refused, as with
                    // kube-proxy's REJECT rule.
                    continue;
                }
                let target = endpoints[turn.fetch_add(1, Ordering::Relaxed) % endpoints.len()];
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        listeners.lock().expect("listeners").insert(address, task);
    }
}

/// The ready addresses of a Service port, from its EndpointSlices.
fn ready_endpoints(
    slices: &Store<EndpointSlice>,
    namespace: &str,
    service: &str,
    port_name: Option<&str>,
) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for slice in slices.state() {
        let labels = slice.metadata.labels.as_ref();
        if slice.metadata.namespace.as_deref() != Some(namespace)
            || labels
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .map(String::as_str)
                != Some(service)
        {
            continue;
        }
        let Some(port) = slice
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref().unwrap_or_default() == port_name.unwrap_or_default())
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for address in &endpoint.addresses {
                if let Ok(ip) = address.parse::<Ipv4Addr>() {
                    out.push(SocketAddr::from((ip, port)));
                }
            }
        }
    }
    out
}

async fn serve_dns(socket: tokio::net::UdpSocket, services: Store<Service>) {
    let mut buffer = vec![0u8; 1500];
    loop {
        let Ok((length, peer)) = socket.recv_from(&mut buffer).await else {
            continue;
        };
        if let Some(answer) = answer(&buffer[..length], &services) {
            let _ = socket.send_to(&answer, peer).await;
        }
    }
}

/// The reply to one DNS query.
fn answer(query: &[u8], services: &Store<Service>) -> Option<Vec<u8>> {
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType, rdata::A};
    let request = Message::from_vec(query).ok()?;
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(false)
        .set_authoritative(true);
    response.add_queries(request.queries().to_vec());
    let mut known = false;
    for question in request.queries() {
        let name = question.name().to_ascii().to_ascii_lowercase();
        if let Some(ip) = lookup(services, name.trim_end_matches('.')) {
            known = true;
            if question.query_type() == RecordType::A {
                response.add_answer(Record::from_rdata(
                    question.name().clone(),
                    5,
                    RData::A(A(ip)),
                ));
            }
        }
    }
    if !known {
        response.set_response_code(ResponseCode::NXDomain);
    }
    response.to_vec().ok()
}

/// `<service>.<namespace>.svc.cluster.local` → the Service's ClusterIP.
fn lookup(services: &Store<Service>, name: &str) -> Option<Ipv4Addr> {
    let rest = name.strip_suffix(&format!(".svc.{CLUSTER_DOMAIN}"))?;
    let (service, namespace) = rest.split_once('.')?;
    if namespace.contains('.') {
        return None;
    }
    let service = services.get(&reflector::ObjectRef::new(service).within(namespace))?;
    service.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ips_belong_to_the_node_range() {
        assert!(in_range("10.201.7.12".parse().unwrap(), "10.201.7.0/24"));
        assert!(!in_range("10.201.8.12".parse().unwrap(), "10.201.7.0/24"));
        assert!(!in_range("10.96.0.1".parse().unwrap(), "10.201.7.0/24"));
    }

    #[test]
    fn pods_search_their_namespace_first() {
        let text = resolv_conf("tenantry-system", Ipv4Addr::new(10, 200, 7, 1));
        assert!(text.starts_with(
            "search tenantry-system.svc.cluster.local svc.cluster.local cluster.local\n"
        ));
        assert!(text.contains("nameserver 10.200.7.1\n"));
        assert!(text.contains("options ndots:5"));
    }
}
