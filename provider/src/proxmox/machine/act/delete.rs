//! Deletion: the VM stopped and destroyed (only if it is the machine's own,
//! in its pool), the seed deleted, the addresses released.

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::claims;
use crate::capi::pause;
use crate::proxmox::client::{DeleteParams, ProxmoxClient};
use crate::proxmox::machine::decide::{POLL, VmVerdict, VmidSource};
use crate::proxmox::machine::reconcile::{Error, Halt, Run, refused};
use crate::proxmox::machine::status::Reason;
use crate::proxmox::nocloud;

impl Run<'_> {
    /// Deletion: stop and destroy the VM (only if it is the machine's own,
    /// in its pool), confirm it is gone, delete the seed, release the
    /// addresses. The finalizer goes only when all of that is done.
    pub(in crate::proxmox::machine) async fn delete(&mut self) -> Result<Action, Halt> {
        let kube = self.ctx.base.client.clone();
        let (cluster_name, cluster) = self
            .ctx
            .caches
            .capi
            .labelled_cluster(&kube, &self.namespace, &self.machine.metadata)
            .await?;
        if let Some(by) = pause::paused_by(cluster.as_ref(), &self.machine.metadata) {
            self.report_paused(by).await?;
            return Err(Error::Waiting(
                "paused: deletion waits for unpause".into(),
                Duration::from_secs(30),
            )
            .into());
        }
        let vmid = self
            .machine
            .spec
            .virtual_machine_id
            .or(self.status.virtual_machine_id);
        let node = self.status.proxmox_node.clone();
        let needs_pve = vmid.is_some() || node.is_some() || self.status.task_ref.is_some();
        if needs_pve {
            let proxmox_cluster = match &cluster_name {
                Some(name) => self.proxmox_cluster(cluster.as_ref(), name).await?,
                None => None,
            };
            let Some(proxmox_cluster) = proxmox_cluster else {
                return Err(Halt::wait(
                    Reason::ProxmoxClusterNotFound,
                    "cannot delete the VM: the machine's ProxmoxCluster (and with it the credentials) is gone",
                    Some(Duration::from_secs(30)),
                ));
            };
            let client = self.client(&proxmox_cluster).await?;
            self.settle_task(&client).await.or_else(|halt| match halt {
                // A failed task does not stop a deletion.
                Halt::Wait(w) if w.reason.is_failure() => Ok(()),
                other => Err(other),
            })?;
            if let Some(vmid) = vmid.and_then(|v| u32::try_from(v).ok()) {
                self.destroy_vm(&client, vmid).await?;
            }
            if let Some(node) = &node {
                let file = nocloud::iso_file_name(&self.uid)
                    .map_err(|e| Halt::wait(Reason::DeletionFailed, e.to_string(), None))?;
                self.delete_seed_volumes(&client, node, &file).await?;
            }
        }
        let left = claims::release_addresses(&kube, &self.ctx.caches, &self.machine).await?;
        if !left.is_empty() {
            return Err(Halt::wait(
                Reason::Deleting,
                format!(
                    "waiting for IPAddressClaims {} to be released",
                    left.join(", ")
                ),
                Some(POLL),
            ));
        }
        tracing::info!(machine = %self.name, namespace = %self.namespace, "VM, seed and addresses are gone; releasing the finalizer");
        Ok(Action::await_change())
    }

    /// Stops and destroys the machine's VM; returns once it is gone (its ID
    /// free, or no longer the machine's VM in its pool).
    pub(in crate::proxmox::machine) async fn destroy_vm(
        &mut self,
        client: &ProxmoxClient,
        vmid: u32,
    ) -> Result<(), Halt> {
        let source = if self.machine.spec.virtual_machine_id.is_some() {
            VmidSource::Spec
        } else {
            VmidSource::Reserved
        };
        let (verdict, facts, _) = self
            .judge_vm(client, vmid, source, Reason::DeletionFailed)
            .await?;
        let facts = match verdict {
            VmVerdict::Ours => facts.expect("a VM in the pool was read"),
            VmVerdict::WaitForClone => {
                return Err(Halt::wait(
                    Reason::Deleting,
                    format!("waiting for the clone to VM {vmid} to end before deleting it"),
                    Some(POLL),
                ));
            }
            // Gone, never made, or not the machine's: nothing to delete.
            VmVerdict::Clone
            | VmVerdict::Missing { .. }
            | VmVerdict::Repick { .. }
            | VmVerdict::Refuse { .. } => {
                return Ok(());
            }
        };
        let vm = client.qemu(&facts.node, vmid);
        if let Some(lock) = &facts.status.lock {
            return Err(Halt::wait(
                Reason::Deleting,
                format!("VM {vmid} is locked ({lock}); deleting it when the operation ends"),
                Some(POLL),
            ));
        }
        if facts.status.is_running() {
            let what = format!("stopping VM {vmid} on {}", facts.node);
            let upid = vm
                .stop()
                .await
                .map_err(|e| refused(e, Reason::DeletionFailed, &what))?;
            return Err(self.started(upid, Reason::Deleting, what));
        }
        let what = format!("deleting VM {vmid} on {} with its disks", facts.node);
        let upid = vm
            .delete(&DeleteParams::thorough())
            .await
            .map_err(|e| refused(e, Reason::DeletionFailed, &what))?;
        self.ctx
            .base
            .event(&self.machine, EventType::Normal, "Deleting", what.clone())
            .await;
        Err(self.started(upid, Reason::Deleting, what))
    }
}
