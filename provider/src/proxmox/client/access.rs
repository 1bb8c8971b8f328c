//! `/access/...`: ACLs and effective permissions, for preflight checks that
//! name the missing privilege before a clone fails on it.

use serde::Serialize;

use super::error::Result;
use super::types::{AclEntry, Permissions};
use super::{NoParams, ProxmoxClient};

/// ACLs and permissions. Get it with [`ProxmoxClient::access`].
#[derive(Debug, Clone, Copy)]
pub struct AccessApi<'a> {
    client: &'a ProxmoxClient,
}

#[derive(Serialize)]
struct PermissionsQuery<'q> {
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'q str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    userid: Option<&'q str>,
}

impl<'a> AccessApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient) -> Self {
        Self { client }
    }

    /// `GET /access/permissions[?path=&userid=]`: effective privileges per
    /// path, for the calling token unless `userid` names another user or
    /// token (which needs `Sys.Audit` on `/access`).
    pub async fn permissions(
        &self,
        path: Option<&str>,
        userid: Option<&str>,
    ) -> Result<Permissions> {
        self.client
            .get("/access/permissions", &PermissionsQuery { path, userid })
            .await
    }

    /// `GET /access/acl`.
    pub async fn acl(&self) -> Result<Vec<AclEntry>> {
        self.client.get("/access/acl", &NoParams).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::client::test_support::query_string;

    #[test]
    fn permissions_query() {
        assert_eq!(
            query_string(&PermissionsQuery {
                path: Some("/pool/tenant-a"),
                userid: Some("capmox@pve!capi")
            }),
            "path=%2Fpool%2Ftenant-a&userid=capmox%40pve%21capi"
        );
        assert_eq!(
            query_string(&PermissionsQuery {
                path: None,
                userid: None
            }),
            ""
        );
    }
}
