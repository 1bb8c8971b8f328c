//! `/nodes/{node}/qemu/{vmid}/agent/...`: the QEMU guest agent.
//!
//! Every call fails with [`super::ProxmoxError::GuestAgentNotRunning`] while
//! the guest boots, [`super::ProxmoxError::VmNotRunning`] while it is off, and
//! [`super::ProxmoxError::GuestAgentNotConfigured`] when the VM has no
//! `agent: 1`. Privileges: `VM.GuestAgent.Audit` on PVE 9, `VM.Monitor` on 8.

use super::error::Result;
use super::types::{AgentResult, GuestInterface, GuestOsInfo, RawGuestInterface};
use super::{NoParams, ProxmoxClient, api_path};

/// The guest agent of one VM. Get it with [`super::QemuApi::agent`].
#[derive(Debug, Clone)]
pub struct AgentApi<'a> {
    client: &'a ProxmoxClient,
    node: String,
    vmid: u32,
}

impl<'a> AgentApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient, node: &str, vmid: u32) -> Self {
        Self {
            client,
            node: node.to_owned(),
            vmid,
        }
    }

    fn path(&self, command: &str) -> String {
        api_path(&[
            "nodes",
            &self.node,
            "qemu",
            &self.vmid.to_string(),
            "agent",
            command,
        ])
    }

    /// `GET …/agent/network-get-interfaces`: interfaces with MAC and
    /// addresses (with prefix length). Unparseable addresses are skipped.
    pub async fn network_interfaces(&self) -> Result<Vec<GuestInterface>> {
        let raw: AgentResult<Vec<RawGuestInterface>> = self
            .client
            .get(&self.path("network-get-interfaces"), &NoParams)
            .await?;
        Ok(raw.result.into_iter().map(Into::into).collect())
    }

    /// `GET …/agent/get-osinfo`.
    pub async fn os_info(&self) -> Result<GuestOsInfo> {
        let raw: AgentResult<GuestOsInfo> =
            self.client.get(&self.path("get-osinfo"), &NoParams).await?;
        Ok(raw.result)
    }

    /// `POST …/agent/ping`: succeeds once the agent answers.
    pub async fn ping(&self) -> Result<()> {
        let _: serde_json::Value = self.client.post(&self.path("ping"), &NoParams).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::proxmox::client::test_support::client;

    #[test]
    fn agent_paths() {
        let client = client();
        let agent = client.qemu("pve1", 105).agent();
        assert_eq!(
            agent.path("network-get-interfaces"),
            "/nodes/pve1/qemu/105/agent/network-get-interfaces"
        );
    }
}
