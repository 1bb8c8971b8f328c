//! `/pools`: resource pools, the unit tenantry scopes a tenant's VMs by.
//!
//! Uses the PVE 8.1+ forms (`GET /pools?poolid=`, `PUT /pools`,
//! `DELETE /pools?poolid=`); the older `/pools/{poolid}` paths are deprecated.

use serde::Serialize;

use super::error::{ProxmoxError, Result};
use super::serde_helpers::opt_bool_as_int;
use super::types::Pool;
use super::{NoParams, ProxmoxClient};

/// Resource pools. Get it with [`ProxmoxClient::pools`].
#[derive(Debug, Clone, Copy)]
pub struct PoolsApi<'a> {
    client: &'a ProxmoxClient,
}

#[derive(Serialize)]
struct PoolId<'q> {
    poolid: &'q str,
}

#[derive(Serialize)]
struct CreatePool<'q> {
    poolid: &'q str,
    #[serde(skip_serializing_if = "Option::is_none")]
    comment: Option<&'q str>,
}

/// Changes for `PUT /pools`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolUpdate {
    pub poolid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// VMs to add (or remove, with `delete`), comma-joined on the wire.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vms: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// Remove the listed members instead of adding them.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub delete: Option<bool>,
    /// Move VMs that are in another pool instead of failing
    /// ("VM N is already a pool member").
    #[serde(
        rename = "allow-move",
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_bool_as_int"
    )]
    pub allow_move: Option<bool>,
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

impl PoolUpdate {
    /// Adds VMs to the pool.
    pub fn add_vms(poolid: &str, vmids: &[u32]) -> Self {
        Self {
            poolid: poolid.to_owned(),
            vms: Some(join_ids(vmids)),
            ..Self::default()
        }
    }

    /// Removes VMs from the pool.
    pub fn remove_vms(poolid: &str, vmids: &[u32]) -> Self {
        Self {
            delete: Some(true),
            ..Self::add_vms(poolid, vmids)
        }
    }
}

impl<'a> PoolsApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient) -> Self {
        Self { client }
    }

    /// `GET /pools`: ids and comments (no members).
    pub async fn list(&self) -> Result<Vec<Pool>> {
        self.client.get("/pools", &NoParams).await
    }

    /// `GET /pools?poolid=…`: one pool with its members.
    pub async fn get(&self, poolid: &str) -> Result<Pool> {
        let pools: Vec<Pool> = self.client.get("/pools", &PoolId { poolid }).await?;
        pools
            .into_iter()
            .find(|p| p.poolid == poolid)
            .ok_or_else(|| ProxmoxError::NotFound {
                message: format!("pool '{poolid}' does not exist"),
            })
    }

    /// `POST /pools`.
    pub async fn create(&self, poolid: &str, comment: Option<&str>) -> Result<()> {
        let _: serde_json::Value = self
            .client
            .post("/pools", &CreatePool { poolid, comment })
            .await?;
        Ok(())
    }

    /// `PUT /pools`.
    pub async fn update(&self, update: &PoolUpdate) -> Result<()> {
        let _: serde_json::Value = self.client.put("/pools", update).await?;
        Ok(())
    }

    /// `DELETE /pools?poolid=…` (PVE refuses while the pool has members).
    pub async fn delete(&self, poolid: &str) -> Result<()> {
        let _: serde_json::Value = self.client.delete("/pools", &PoolId { poolid }).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::client::test_support::{form_body, query_string};

    #[test]
    fn pool_updates_encode_member_lists() {
        assert_eq!(
            form_body(&PoolUpdate::add_vms("tenant-a", &[105, 106])),
            "poolid=tenant-a&vms=105%2C106"
        );
        assert_eq!(
            form_body(&PoolUpdate::remove_vms("tenant-a", &[105])),
            "poolid=tenant-a&vms=105&delete=1"
        );
        let moving = PoolUpdate {
            allow_move: Some(true),
            ..PoolUpdate::add_vms("b", &[7])
        };
        assert_eq!(form_body(&moving), "poolid=b&vms=7&allow-move=1");
    }

    #[test]
    fn pool_queries() {
        assert_eq!(
            query_string(&PoolId { poolid: "tenant-a" }),
            "poolid=tenant-a"
        );
        assert_eq!(
            form_body(&CreatePool {
                poolid: "tenant-a",
                comment: Some("tenant A")
            }),
            "poolid=tenant-a&comment=tenant+A"
        );
    }
}
