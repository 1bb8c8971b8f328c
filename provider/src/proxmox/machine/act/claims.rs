//! The machine's IPAddressClaims: made for each address it needs (owned
//! by it, so they go with it), read for their addresses, released on
//! deletion or when another machine holds the same address.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::generated::capi::ip_address::IpAddress;
use tenantry_api::generated::capi::ip_address_claim::{
    IpAddressClaim, IpAddressClaimPoolRef, IpAddressClaimSpec, IpAddressClaimStatusConditionsStatus,
};
use tenantry_api::proxmox::ProxmoxMachine;

use super::super::cache::{Caches, ClaimLookup};
use super::super::decide::{Addresses, ClaimPlan, DeviceAddress};
use crate::reconciler::FIELD_MANAGER;

/// Label on the IPAddressClaims of a machine, naming it.
pub const MACHINE_LABEL: &str = "infrastructure.tenantry.dev/proxmoxmachine";

/// Creates the machine's missing IPAddressClaims (owned by it, so they go
/// with it) and reads the addresses of all.
pub async fn ensure_addresses(
    client: &kube::Client,
    caches: &Caches,
    machine: &ProxmoxMachine,
    cluster_name: &str,
    plans: &[ClaimPlan],
) -> kube::Result<Addresses> {
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let name = machine.metadata.name.clone().unwrap_or_default();
    let claims: Api<IpAddressClaim> = Api::namespaced(client.clone(), &namespace);
    let addresses: Api<IpAddress> = Api::namespaced(client.clone(), &namespace);
    let mut allocated = Vec::new();
    let mut pending = Vec::new();
    for plan in plans {
        let claim = match caches.claim(&claims, &namespace, &plan.name).await? {
            ClaimLookup::Found(claim) => *claim,
            ClaimLookup::JustCreated => {
                pending.push(format!(
                    "IPAddressClaim {} on {} {}",
                    plan.name, plan.pool_kind, plan.pool_name
                ));
                continue;
            }
            ClaimLookup::Absent => {
                let claim = IpAddressClaim {
                    metadata: ObjectMeta {
                        name: Some(plan.name.clone()),
                        namespace: Some(namespace.clone()),
                        labels: Some(BTreeMap::from([
                            (CLUSTER_NAME_LABEL.to_string(), cluster_name.to_string()),
                            (MACHINE_LABEL.to_string(), name.clone()),
                        ])),
                        owner_references: machine.controller_owner_ref(&()).map(|o| vec![o]),
                        ..Default::default()
                    },
                    spec: IpAddressClaimSpec {
                        cluster_name: Some(cluster_name.to_string()),
                        pool_ref: IpAddressClaimPoolRef {
                            api_group: plan.pool_group.clone(),
                            kind: plan.pool_kind.clone(),
                            name: plan.pool_name.clone(),
                        },
                    },
                    status: None,
                };
                let params = PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                match claims.create(&params, &claim).await {
                    Ok(created) => {
                        tracing::info!(machine = %name, claim = %plan.name, pool = %plan.pool_name, "created IPAddressClaim");
                        caches.created_claim(&namespace, &plan.name);
                        created
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        claims.get(&plan.name).await?
                    }
                    Err(error) => return Err(error),
                }
            }
        };
        let claim = adopt_claim(&claims, claim, machine).await?;
        if claim.metadata.deletion_timestamp.is_some() {
            // Released (an address conflict, or a deletion under way): its
            // address is not this machine's any more; a new claim is made
            // once the IPAM provider lets it go.
            pending.push(format!(
                "IPAddressClaim {} to be released by the IPAM provider",
                plan.name
            ));
            continue;
        }
        let status = claim.status.as_ref();
        let refused = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| {
                c.r#type == "Ready"
                    && c.status == IpAddressClaimStatusConditionsStatus::False
                    && !c.message.is_empty()
            });
        match status.and_then(|s| s.address_ref.as_ref()) {
            Some(reference) => match caches
                .address(&addresses, &namespace, &reference.name)
                .await?
            {
                Some(address) => match address.spec.address.parse::<IpAddr>() {
                    Ok(ip) => allocated.push(DeviceAddress {
                        device: plan.device.clone(),
                        address: ip,
                        prefix: u8::try_from(address.spec.prefix).unwrap_or(0),
                        gateway: address.spec.gateway.as_deref().and_then(|g| g.parse().ok()),
                    }),
                    Err(_) => {
                        return Ok(Addresses::Failed(format!(
                            "IPAddress {} holds {:?}, not an IP address",
                            reference.name, address.spec.address
                        )));
                    }
                },
                None => pending.push(format!(
                    "IPAddress {} of claim {}",
                    reference.name, plan.name
                )),
            },
            None => match refused {
                Some(condition) => {
                    return Ok(Addresses::Failed(format!(
                        "IPAddressClaim {} on {} {}: {}: {}",
                        plan.name,
                        plan.pool_kind,
                        plan.pool_name,
                        condition.reason,
                        condition.message
                    )));
                }
                None => pending.push(format!(
                    "IPAddressClaim {} on {} {}",
                    plan.name, plan.pool_kind, plan.pool_name
                )),
            },
        }
    }
    if pending.is_empty() {
        Ok(Addresses::Allocated(allocated))
    } else {
        Ok(Addresses::Pending(format!(
            "waiting for {}",
            pending.join(", ")
        )))
    }
}

/// Labels a claim of the machine's that lacks the machine label: capmox
/// names its claims as tenantry does and owns them by the ProxmoxMachine,
/// but does not label them. Labelled, a claim taken over from capmox is in
/// the controller's store, wakes the machine when it changes, and is
/// released when the machine is deleted, like one tenantry made. A claim
/// the machine does not own is left as it is.
async fn adopt_claim(
    api: &Api<IpAddressClaim>,
    claim: IpAddressClaim,
    machine: &ProxmoxMachine,
) -> kube::Result<IpAddressClaim> {
    let name = machine.metadata.name.as_deref().unwrap_or_default();
    let labelled = claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MACHINE_LABEL))
        .is_some_and(|m| m == name);
    let owned = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| Some(&o.uid) == machine.metadata.uid.as_ref());
    if labelled || !owned || claim.metadata.deletion_timestamp.is_some() {
        return Ok(claim);
    }
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({ "metadata": { "labels": { MACHINE_LABEL: name } } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let adopted = api
        .patch(&claim_name, &params, &Patch::Merge(&patch))
        .await?;
    tracing::info!(machine = %name, claim = %claim_name, "adopted IPAddressClaim");
    Ok(adopted)
}

/// Deletes the machine's IPAddressClaims; returns those not yet released
/// (neither gone nor being deleted by the IPAM provider, which holds an
/// address through its pool's reuse grace period). The claims come from the
/// controller's store once it has listed; the delete's answer says whether a
/// claim is gone or on its way.
pub async fn release_addresses(
    client: &kube::Client,
    caches: &Caches,
    machine: &ProxmoxMachine,
) -> kube::Result<Vec<String>> {
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let name = machine.metadata.name.clone().unwrap_or_default();
    let uid = machine.metadata.uid.clone().unwrap_or_default();
    let claims: Api<IpAddressClaim> = Api::namespaced(client.clone(), &namespace);
    let labelled = |claim: &IpAddressClaim| {
        claim.metadata.namespace.as_deref() == Some(namespace.as_str())
            && claim
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MACHINE_LABEL))
                .is_some_and(|m| *m == name)
    };
    let found: Vec<IpAddressClaim> = if crate::capi::stores::is_ready(&caches.claims) {
        caches
            .claims
            .state()
            .iter()
            .filter(|c| labelled(c))
            .map(|c| (**c).clone())
            .collect()
    } else {
        claims
            .list(&ListParams::default().labels(&format!("{MACHINE_LABEL}={name}")))
            .await?
            .items
    };
    let mut left = Vec::new();
    for claim in found {
        let owned = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid);
        if !owned || claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        match claims
            .delete(&claim_name, &DeleteParams::background())
            .await
        {
            Ok(answer) => {
                tracing::info!(machine = %name, claim = %claim_name, "released IPAddressClaim");
                // Still there without a deletion timestamp: something
                // refused the deletion quietly; look again.
                if answer
                    .left()
                    .is_some_and(|c| c.metadata.deletion_timestamp.is_none())
                {
                    left.push(claim_name);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(left)
}

/// This machine's addresses that another IPAddress of the same pool holds
/// too, when this machine's IPAddress is the newer of the two: an IPAM
/// provider allocating from a stale cache (the in-cluster provider after
/// kube-apiserver restarts, kubernetes-sigs/cluster-api-ipam-provider-in-cluster
/// PR 338) can hand one address out twice, and a VM booted with it would
/// take another machine's address. Reads every IPAddress of the namespace
/// from the apiserver (the watch store may be as stale as the provider's
/// cache), once per machine: just before its seed is written.
pub async fn address_conflicts(
    client: &kube::Client,
    caches: &Caches,
    machine: &ProxmoxMachine,
    plans: &[ClaimPlan],
) -> kube::Result<Vec<super::decide::AddressConflict>> {
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    let claims: Api<IpAddressClaim> = Api::namespaced(client.clone(), &namespace);
    let addresses: Api<IpAddress> = Api::namespaced(client.clone(), &namespace);
    let mut ours = Vec::new();
    for plan in plans {
        let ClaimLookup::Found(claim) = caches.claim(&claims, &namespace, &plan.name).await? else {
            continue;
        };
        let Some(reference) = claim.status.and_then(|s| s.address_ref) else {
            continue;
        };
        if let Some(address) = caches
            .address(&addresses, &namespace, &reference.name)
            .await?
        {
            ours.push((plan.name.clone(), address));
        }
    }
    if ours.is_empty() {
        return Ok(Vec::new());
    }
    let all = addresses.list(&ListParams::default()).await?.items;
    Ok(super::decide::address_conflicts(&ours, &all))
}

/// Deletes the IPAddressClaim `name` (gone already is fine), so that the
/// IPAM provider releases its address and a new claim gets another.
pub async fn release_claim(client: &kube::Client, namespace: &str, name: &str) -> kube::Result<()> {
    let claims: Api<IpAddressClaim> = Api::namespaced(client.clone(), namespace);
    match claims.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}
