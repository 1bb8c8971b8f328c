//! What a ProxmoxMachine reconcile reads from Proxmox VE: the machine's VM
//! (by ID, or by name and description when its status was lost), clones
//! still running, tasks, and the seed's volumes.

use std::time::Duration;

use super::super::cache::Caches;
use super::super::decide::{VmFacts, VmPresence};
use crate::proxmox::client::{
    Pool, ProxmoxClient, ProxmoxError, ResourceFilter, ResourceType, TaskOutcome, TaskWaitConfig,
    Upid,
};

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
