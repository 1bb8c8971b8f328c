//! What a ProxmoxMachine reconcile reads from and writes to Proxmox VE and
//! the management cluster. Each write is idempotent or guarded by state
//! recorded before it, so a crash between any two is harmless.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tenantry_api::contract::CLUSTER_NAME_LABEL;
use tenantry_api::generated::capi::ip_address::IpAddress;
use tenantry_api::generated::capi::ip_address_claim::{
    IpAddressClaim, IpAddressClaimPoolRef, IpAddressClaimSpec, IpAddressClaimStatusConditionsStatus,
};
use tenantry_api::proxmox::ProxmoxMachine;

use super::cache::{Caches, ClaimLookup};
use super::decide::{ClaimPlan, DeviceAddress, VmPresence};
use crate::proxmox::client::{
    Pool, ProxmoxClient, ProxmoxError, ResourceFilter, ResourceType, TaskOutcome, TaskWaitConfig,
    Upid, VmConfig, VmStatus,
};
use crate::reconciler::FIELD_MANAGER;

/// Label on the IPAddressClaims of a machine, naming it.
pub const MACHINE_LABEL: &str = "infrastructure.tenantry.dev/proxmoxmachine";

/// A VM in the machine's pool, as read before acting on it.
#[derive(Clone, Debug)]
pub struct VmFacts {
    pub vmid: u32,
    pub node: String,
    pub status: VmStatus,
    pub config: VmConfig,
}

/// Storages of a pool (PVE pools can hold storages as well as VMs).
pub type PoolStorages = Vec<String>;

/// Finds a VM ID from the machine's point of view: a member of its pool
/// (then read), taken by a VM outside it, or free. For a machine without
/// pool, a VM the credentials can see outside every pool counts as its own.
pub async fn lookup_vm(
    client: &ProxmoxClient,
    vmid: u32,
    pool: Option<&str>,
) -> Result<(VmPresence, Option<VmFacts>, PoolStorages), ProxmoxError> {
    let members = match pool {
        Some(name) => Some(client.pools().get(name).await?),
        None => None,
    };
    lookup_in(client, vmid, members).await
}

/// [`lookup_vm`] for the machine controller: the pool's members as read a
/// moment ago (by any machine) answer when they hold the VM and the VM is
/// still there; anything else reads the pool afresh, so a VM that just
/// joined it is never taken for a lost one.
pub async fn lookup_vm_cached(
    client: &ProxmoxClient,
    caches: &Caches,
    vmid: u32,
    pool: Option<&str>,
) -> Result<(VmPresence, Option<VmFacts>, PoolStorages), ProxmoxError> {
    if let Some(name) = pool
        && let Some(snapshot) = caches.recent_pool(client, name)
        && snapshot
            .members
            .iter()
            .any(|m| m.member_type == ResourceType::Qemu && m.vmid == Some(vmid))
    {
        let found = lookup_in(client, vmid, Some(snapshot)).await?;
        if matches!(found.0, VmPresence::InPool { .. }) {
            return Ok(found);
        }
    }
    let members = match pool {
        Some(name) => Some(caches.read_pool(client, name).await?),
        None => None,
    };
    lookup_in(client, vmid, members).await
}

/// [`lookup_vm`] with the pool's members at hand (`None`: no pool).
async fn lookup_in(
    client: &ProxmoxClient,
    vmid: u32,
    pool: Option<Pool>,
) -> Result<(VmPresence, Option<VmFacts>, PoolStorages), ProxmoxError> {
    let (node, storages) = match pool {
        Some(pool) => {
            let node = pool
                .members
                .iter()
                .find(|m| m.member_type == ResourceType::Qemu && m.vmid == Some(vmid))
                .and_then(|m| m.node.clone());
            let storages = pool
                .members
                .iter()
                .filter(|m| m.member_type == ResourceType::Storage)
                .filter_map(|m| m.storage.clone())
                .collect();
            (node, storages)
        }
        None => {
            let rows = client.cluster().resources(Some(ResourceFilter::Vm)).await?;
            let node = rows
                .iter()
                .find(|r| r.is_vm() && r.vmid == Some(vmid) && r.pool.is_none())
                .and_then(|r| r.node.clone());
            (node, Vec::new())
        }
    };
    let Some(node) = node else {
        let presence = if client.cluster().is_vmid_free(vmid).await? {
            VmPresence::Free
        } else {
            VmPresence::Elsewhere
        };
        return Ok((presence, None, storages));
    };
    let qemu = client.qemu(&node, vmid);
    let read = async { Ok::<_, ProxmoxError>((qemu.status().await?, qemu.config().await?)) };
    match read.await {
        Ok((status, config)) => {
            let presence = VmPresence::InPool {
                name: config.name.clone(),
                description: config.description.clone(),
            };
            Ok((
                presence,
                Some(VmFacts {
                    vmid,
                    node,
                    status,
                    config,
                }),
                storages,
            ))
        }
        // Destroyed between the two reads; a pool-scoped token is refused
        // (403) rather than told (404) once the VM left the pool.
        Err(ProxmoxError::NotFound { .. } | ProxmoxError::PermissionDenied { .. }) => {
            let presence = if client.cluster().is_vmid_free(vmid).await? {
                VmPresence::Free
            } else {
                VmPresence::Elsewhere
            };
            Ok((presence, None, storages))
        }
        Err(error) => Err(error),
    }
}

/// Looks for a VM of the machine in its pool when no ID is recorded (the
/// status was lost, e.g. by `clusterctl move`): one named after it whose
/// description does not name another machine.
pub async fn find_own_vm(
    client: &ProxmoxClient,
    pool: Option<&str>,
    namespace: &str,
    name: &str,
) -> Result<Option<u32>, ProxmoxError> {
    let candidates: Vec<(u32, String)> = match pool {
        Some(pool) => client
            .pools()
            .get(pool)
            .await?
            .members
            .into_iter()
            .filter(|m| m.member_type == ResourceType::Qemu && m.name.as_deref() == Some(name))
            .filter_map(|m| Some((m.vmid?, m.node?)))
            .collect(),
        None => client
            .cluster()
            .resources(Some(ResourceFilter::Vm))
            .await?
            .into_iter()
            .filter(|r| {
                r.is_vm() && !r.template && r.pool.is_none() && r.name.as_deref() == Some(name)
            })
            .filter_map(|r| Some((r.vmid?, r.node?)))
            .collect(),
    };
    for (vmid, node) in candidates {
        let config = client.qemu(&node, vmid).config().await?;
        if super::decide::ownership(
            namespace,
            name,
            config.name.as_deref(),
            config.description.as_deref(),
        ) == super::decide::Ownership::Ours
        {
            return Ok(Some(vmid));
        }
    }
    Ok(None)
}

/// Whether a clone started by this client's token still runs on any of the
/// nodes. While it runs, PVE has not added the new VM to the pool yet.
pub async fn own_clone_running(
    client: &ProxmoxClient,
    nodes: &[String],
) -> Result<bool, ProxmoxError> {
    let token = client.token_id().to_string();
    for node in nodes {
        let tasks = client.node(node).active_tasks(Some("qmclone")).await?;
        if tasks
            .iter()
            .filter_map(|t| t.upid.parse::<Upid>().ok())
            .any(|upid| upid.user() == token)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How a task a reconcile waited for ended.
#[derive(Debug)]
pub enum TaskPoll {
    Done(TaskOutcome),
    Running,
    /// Failed with PVE's exit status and the end of its log.
    Failed {
        exit_status: String,
        log_tail: Vec<String>,
    },
    /// PVE does not know the task (its node restarted): nothing to wait for.
    Unknown,
}

/// Waits a little for a task; long tasks are picked up again by the next
/// reconcile, from the UPID recorded in status.
pub async fn poll_task(
    client: &ProxmoxClient,
    upid: &Upid,
    wait: &TaskWaitConfig,
) -> Result<TaskPoll, ProxmoxError> {
    match client.wait_for_task_with(upid, wait).await {
        Ok(outcome) => Ok(TaskPoll::Done(outcome)),
        Err(ProxmoxError::TaskTimeout { .. }) => Ok(TaskPoll::Running),
        Err(ProxmoxError::TaskFailed {
            exit_status,
            log_tail,
            ..
        }) => Ok(TaskPoll::Failed {
            exit_status,
            log_tail,
        }),
        Err(ProxmoxError::NotFound { .. } | ProxmoxError::ParameterVerification { .. }) => {
            Ok(TaskPoll::Unknown)
        }
        Err(error) => Err(error),
    }
}

/// The seed ISO volumes named `file` on the node's ISO storages.
pub async fn find_seed_volumes(
    client: &ProxmoxClient,
    node: &str,
    file: &str,
) -> Result<Vec<(String, String)>, ProxmoxError> {
    let mut found = Vec::new();
    for storage in client.node(node).storage_list(Some("iso")).await? {
        if !storage.is_enabled() || !storage.holds("iso") {
            continue;
        }
        let volid = format!("{}:iso/{file}", storage.storage);
        let content = match client
            .storage(node, &storage.storage)
            .content(Some("iso"))
            .await
        {
            Ok(content) => content,
            // A storage the token may list but not read holds nothing of ours.
            Err(ProxmoxError::PermissionDenied { .. }) => continue,
            Err(error) => return Err(error),
        };
        if content.iter().any(|c| c.volid == volid) {
            found.push((storage.storage.clone(), volid));
        }
    }
    Ok(found)
}

/// Whether the volume is on the storage.
pub async fn volume_exists(
    client: &ProxmoxClient,
    node: &str,
    storage: &str,
    volid: &str,
) -> Result<bool, ProxmoxError> {
    let content = client.storage(node, storage).content(Some("iso")).await?;
    Ok(content.iter().any(|c| c.volid == volid))
}

// ------------------------------------------------------------------- IPAM

/// Where a machine's addresses stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addresses {
    /// Every claim has its address.
    Allocated(Vec<DeviceAddress>),
    /// Some claim waits; the message says which and why.
    Pending(String),
    /// The IPAM provider says why a claim has no address (pool exhausted,
    /// no such pool…); it keeps trying.
    Failed(String),
}

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

/// How long a reconcile waits for a task it has just started before it
/// records the task and comes back later: most of a provisioning's tasks
/// (configuring, resizing, uploading, attaching, starting) take PVE well
/// under a second, and going on at once saves writing a state that lasted
/// that long.
pub fn inline_task_wait() -> TaskWaitConfig {
    TaskWaitConfig {
        initial_interval: Duration::from_millis(50),
        max_interval: Duration::from_millis(500),
        factor: 2.0,
        jitter: true,
        timeout: Duration::from_secs(2),
        log_tail_lines: 5,
    }
}

/// How long a reconcile waits for a task before leaving it to the next one.
pub fn reconcile_task_wait() -> TaskWaitConfig {
    TaskWaitConfig {
        initial_interval: Duration::from_millis(200),
        max_interval: Duration::from_secs(1),
        factor: 1.5,
        jitter: true,
        timeout: Duration::from_secs(5),
        log_tail_lines: 5,
    }
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
