//! The cluster's address pools as InClusterIPPools, and how its status
//! names them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::generated::ipam::in_cluster_ip_pool::InClusterIpPool;
use tenantry_api::proxmox::{
    DesiredIpPool, GATEWAY_METRIC_ANNOTATION, IP_FAMILY_ANNOTATION, InClusterZoneRef, IpFamily,
    PROXMOX_ZONE_LABEL,
};

/// The InClusterIPPool serving `pool`, owned by the ProxmoxCluster: the
/// labels name the cluster (and zone), the annotations what the IPAM
/// contract cannot say (family, gateway metric).
pub fn pool_object(
    pool: &DesiredIpPool,
    namespace: &str,
    cluster_name: &str,
    owner: Option<OwnerReference>,
) -> InClusterIpPool {
    let mut labels = BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), cluster_name.to_string())]);
    if let Some(zone) = &pool.zone {
        labels.insert(PROXMOX_ZONE_LABEL.to_string(), zone.clone());
    }
    InClusterIpPool {
        metadata: ObjectMeta {
            name: Some(pool.name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (
                    IP_FAMILY_ANNOTATION.to_string(),
                    pool.family.annotation_value().to_string(),
                ),
                (
                    GATEWAY_METRIC_ANNOTATION.to_string(),
                    pool.gateway_metric.to_string(),
                ),
            ])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: pool.spec.clone(),
        status: None,
    }
}

/// What the status says of the pools: the cluster-wide ones, and per zone
/// its IPv4 and IPv6 pool; `None` for an empty list.
pub fn pool_references(
    pools: &[DesiredIpPool],
) -> (
    Option<Vec<LocalObjectReference>>,
    Option<Vec<InClusterZoneRef>>,
) {
    let mut default_refs = Vec::new();
    let mut zone_refs: BTreeMap<String, InClusterZoneRef> = BTreeMap::new();
    for pool in pools {
        let reference = LocalObjectReference {
            name: pool.name.clone(),
        };
        match &pool.zone {
            None => default_refs.push(reference),
            Some(zone) => {
                let entry = zone_refs
                    .entry(zone.clone())
                    .or_insert_with(|| InClusterZoneRef {
                        zone: zone.clone(),
                        ..Default::default()
                    });
                match pool.family {
                    IpFamily::V4 => entry.in_cluster_ip_pool_ref_v4 = Some(reference),
                    IpFamily::V6 => entry.in_cluster_ip_pool_ref_v6 = Some(reference),
                }
            }
        }
    }
    (
        (!default_refs.is_empty()).then_some(default_refs),
        (!zone_refs.is_empty()).then(|| zone_refs.into_values().collect()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, zone: Option<&str>, family: IpFamily) -> DesiredIpPool {
        DesiredIpPool {
            name: name.into(),
            zone: zone.map(str::to_string),
            family,
            gateway_metric: 100,
            spec: Default::default(),
        }
    }

    /// The status references as one line: `defaults | zone v4 v6, …`.
    fn references(pools: &[DesiredIpPool]) -> String {
        let (defaults, zones) = pool_references(pools);
        let name = |r: Option<LocalObjectReference>| r.map(|r| r.name).unwrap_or("-".into());
        let defaults: Vec<String> = defaults.into_iter().flatten().map(|r| r.name).collect();
        let zones: Vec<String> = zones
            .into_iter()
            .flatten()
            .map(|z| {
                format!(
                    "{} {} {}",
                    z.zone,
                    name(z.in_cluster_ip_pool_ref_v4),
                    name(z.in_cluster_ip_pool_ref_v6)
                )
            })
            .collect();
        format!("{} | {}", defaults.join(" "), zones.join(", "))
    }

    #[test]
    fn pools_are_named_per_zone_and_family_in_the_status() {
        let cases: &[(&[DesiredIpPool], &str)] = &[
            (&[], " | "),
            (
                &[
                    pool("c-v4", None, IpFamily::V4),
                    pool("c-v6", None, IpFamily::V6),
                ],
                "c-v4 c-v6 | ",
            ),
            (
                &[
                    pool("c-v4", None, IpFamily::V4),
                    pool("c-a-v4", Some("a"), IpFamily::V4),
                    pool("c-a-v6", Some("a"), IpFamily::V6),
                    pool("c-b-v6", Some("b"), IpFamily::V6),
                ],
                "c-v4 | a c-a-v4 c-a-v6, b - c-b-v6",
            ),
        ];
        for (pools, expected) in cases {
            assert_eq!(references(pools), *expected, "{pools:?}");
        }
        // An empty list is left out of the status, not written as [].
        assert_eq!(pool_references(&[]), (None, None));
    }

    #[test]
    fn a_zone_pool_carries_the_cluster_zone_family_and_metric() {
        let object = pool_object(&pool("c-a-v6", Some("a"), IpFamily::V6), "ns", "c", None);
        let labels = object.metadata.labels.unwrap();
        assert_eq!(labels[CLUSTER_NAME_LABEL], "c");
        assert_eq!(labels[PROXMOX_ZONE_LABEL], "a");
        let annotations = object.metadata.annotations.unwrap();
        assert_eq!(
            annotations[IP_FAMILY_ANNOTATION],
            IpFamily::V6.annotation_value()
        );
        assert_eq!(annotations[GATEWAY_METRIC_ANNOTATION], "100");
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));

        let cluster_wide = pool_object(&pool("c-v4", None, IpFamily::V4), "ns", "c", None);
        assert!(
            !cluster_wide
                .metadata
                .labels
                .unwrap()
                .contains_key(PROXMOX_ZONE_LABEL)
        );
    }
}
