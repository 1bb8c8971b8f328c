//! Cluster-wide and per-node endpoints.

use serde::Serialize;

use super::error::{ProxmoxError, Result};
use super::serde_helpers::LenientNumber;
use super::types::{ClusterResource, NodeStatus, ResourceFilter, StorageSummary, VmSummary};
use super::{NoParams, ProxmoxClient, api_path};

/// `/cluster/...`.
#[derive(Debug, Clone, Copy)]
pub struct ClusterApi<'a> {
    client: &'a ProxmoxClient,
}

#[derive(Serialize)]
struct ResourcesQuery {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    filter: Option<ResourceFilter>,
}

#[derive(Serialize)]
struct NextIdQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    vmid: Option<u32>,
}

impl<'a> ClusterApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient) -> Self {
        Self { client }
    }

    /// `GET /cluster/resources[?type=…]`: every VM, storage and node the
    /// token may see (rows are filtered by privileges, not refused).
    pub async fn resources(&self, filter: Option<ResourceFilter>) -> Result<Vec<ClusterResource>> {
        self.client
            .get("/cluster/resources", &ResourcesQuery { filter })
            .await
    }

    /// `GET /cluster/nextid`: the lowest free vmid (PVE answers a string).
    /// Two callers can get the same answer; the clone of the slower one then
    /// fails with [`ProxmoxError::AlreadyExists`].
    pub async fn next_id(&self) -> Result<u32> {
        self.next_id_query(None).await
    }

    /// `GET /cluster/nextid?vmid=N`: whether `vmid` is free. PVE answers a
    /// taken id with a 400 parameter error ("VM N already exists").
    pub async fn is_vmid_free(&self, vmid: u32) -> Result<bool> {
        match self.next_id_query(Some(vmid)).await {
            Ok(_) => Ok(true),
            Err(ProxmoxError::AlreadyExists { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn next_id_query(&self, vmid: Option<u32>) -> Result<u32> {
        let raw: serde_json::Value = self
            .client
            .get("/cluster/nextid", &NextIdQuery { vmid })
            .await?;
        u32::from_value(&raw).ok_or_else(|| ProxmoxError::Decode {
            path: "/cluster/nextid".into(),
            reason: format!("expected a vmid, got {raw}"),
        })
    }
}

/// `/nodes/{node}/...`.
#[derive(Debug, Clone)]
pub struct NodeApi<'a> {
    client: &'a ProxmoxClient,
    node: String,
}

#[derive(Serialize)]
struct TasksQuery<'q> {
    /// `active`: only running tasks (PVE's default, `archive`, lists
    /// finished ones).
    source: &'q str,
    #[serde(skip_serializing_if = "Option::is_none")]
    typefilter: Option<&'q str>,
    limit: u32,
}

/// A row of `GET /nodes/{node}/tasks`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TaskSummary {
    pub upid: String,
    #[serde(default, rename = "type")]
    pub task_type: Option<String>,
    /// `running` while it runs; the exit status once stopped.
    #[serde(default)]
    pub status: Option<String>,
}

impl TaskSummary {
    pub fn is_running(&self) -> bool {
        self.status.as_deref().is_none_or(|s| s == "running")
    }
}

#[derive(Serialize)]
struct StorageQuery<'q> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'q str>,
}

impl<'a> NodeApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient, node: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
        }
    }

    pub fn name(&self) -> &str {
        &self.node
    }

    /// `GET /nodes/{node}/status`.
    pub async fn status(&self) -> Result<NodeStatus> {
        self.client
            .get(&api_path(&["nodes", &self.node, "status"]), &NoParams)
            .await
    }

    /// `GET /nodes/{node}/qemu`: the node's VMs and templates the token may see.
    pub async fn qemu_list(&self) -> Result<Vec<VmSummary>> {
        self.client
            .get(&api_path(&["nodes", &self.node, "qemu"]), &NoParams)
            .await
    }

    /// `GET /nodes/{node}/tasks?source=active[&typefilter=…]`: the running
    /// tasks the token may see (its own, or all with `Sys.Audit` on the
    /// node), e.g. to find a clone in flight after a restart.
    pub async fn active_tasks(&self, task_type: Option<&str>) -> Result<Vec<TaskSummary>> {
        let tasks: Vec<TaskSummary> = self
            .client
            .get(
                &api_path(&["nodes", &self.node, "tasks"]),
                &TasksQuery {
                    source: "active",
                    typefilter: task_type,
                    limit: 500,
                },
            )
            .await?;
        Ok(tasks.into_iter().filter(TaskSummary::is_running).collect())
    }

    /// `GET /nodes/{node}/storage[?content=iso]`.
    pub async fn storage_list(&self, content: Option<&str>) -> Result<Vec<StorageSummary>> {
        self.client
            .get(
                &api_path(&["nodes", &self.node, "storage"]),
                &StorageQuery { content },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::client::test_support::query_string;

    #[test]
    fn resource_filter_query() {
        assert_eq!(
            query_string(&ResourcesQuery {
                filter: Some(ResourceFilter::Vm)
            }),
            "type=vm"
        );
        assert_eq!(
            query_string(&ResourcesQuery {
                filter: Some(ResourceFilter::Storage)
            }),
            "type=storage"
        );
        assert_eq!(query_string(&ResourcesQuery { filter: None }), "");
    }

    #[test]
    fn next_id_query() {
        assert_eq!(query_string(&NextIdQuery { vmid: Some(105) }), "vmid=105");
        assert_eq!(query_string(&NextIdQuery { vmid: None }), "");
        assert_eq!(
            query_string(&StorageQuery {
                content: Some("iso")
            }),
            "content=iso"
        );
    }

    #[test]
    fn nextid_answers_are_strings_or_numbers() {
        assert_eq!(u32::from_value(&serde_json::json!("105")), Some(105));
        assert_eq!(u32::from_value(&serde_json::json!(105)), Some(105));
    }
}
