use super::*;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};

fn service(type_: &str, cluster_ip: &str, ingress: Option<&str>) -> Service {
    Service {
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            cluster_ip: Some(cluster_ip.into()),
            ..Default::default()
        }),
        status: ingress.map(|ip| ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(ip.into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn user_endpoint_wins() {
    let user = ApiEndpoint {
        host: "api.example".into(),
        port: 443,
    };
    let found =
        endpoint_from(Some(&user), Some(&service("ClusterIP", "10.96.0.10", None))).unwrap();
    assert_eq!(found, user);
}

#[test]
fn cluster_ip_and_load_balancer_addresses() {
    let ip = endpoint_from(None, Some(&service("ClusterIP", "10.96.0.10", None))).unwrap();
    assert_eq!((ip.host.as_str(), ip.port), ("10.96.0.10", 6443));
    assert!(
        endpoint_from(None, Some(&service("LoadBalancer", "10.96.0.10", None))).is_none(),
        "no ingress yet"
    );
    let lb = endpoint_from(
        None,
        Some(&service("LoadBalancer", "10.96.0.10", Some("192.0.2.7"))),
    )
    .unwrap();
    assert_eq!(lb.host, "192.0.2.7");
}
