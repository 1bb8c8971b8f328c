//! What a ProxmoxMachine reconcile writes: its status, its spec, and one
//! PVE request per step. Each write is idempotent or guarded by state
//! recorded before it, so a crash between any two is harmless. A step that
//! starts a task halts with it ([`Run::started`]); the next look goes on
//! from the VM's own state.

pub mod claims;
mod clone;
mod delete;
mod seed;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tenantry_api::contract::{MachineInitialization, READY_CONDITION};
use tenantry_api::proxmox::provider_id;

use super::decide::{self, Addresses, RESYNC, VmFacts, Wait};
use super::reconcile::{Error, Halt, Run, refused};
use super::status::{Reason, VM_PROVISIONED};
use crate::capi::conditions::DesiredCondition;
use crate::metrics::machines::Substrate;
use crate::proxmox::client::{DiskSize, ProxmoxClient, Upid, VmConfigUpdate};
use crate::reconciler;

impl Run<'_> {
    /// Writes the status built so far (with its conditions as they are).
    pub(super) async fn persist(&mut self) -> Result<(), Error> {
        if let Some(updated) = reconciler::apply_status(
            &self.api,
            &self.machine,
            self.written.as_ref(),
            &self.status,
        )
        .await?
        {
            self.ctx.caches.saw_latest(&updated);
            self.machine.metadata.resource_version = updated.metadata.resource_version;
        }
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Writes the status built so far only if the machine is still as this
    /// reconcile read it: for what comes right before an irreversible step.
    /// A refusal (someone wrote meanwhile, or the copy was stale) has the
    /// machine read afresh and looked at again in a moment.
    async fn persist_at_version(&mut self) -> Result<(), Halt> {
        match reconciler::apply_status_at_version(&self.api, &self.machine, &self.status).await {
            Ok(updated) => {
                self.ctx.caches.saw_latest(&updated);
                self.machine.metadata.resource_version = updated.metadata.resource_version;
                self.written = Some(self.status.clone());
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.ctx.caches.distrust(&self.uid);
                Err(Error::Waiting(
                    "the machine changed since it was read; reading it again".into(),
                    Duration::from_millis(200),
                )
                .into())
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Drops the reserved VM ID and node. A merge patch, not an apply: the
    /// reservation may have been written by another field manager (an
    /// older manager, a restore), whose fields an apply cannot remove.
    pub(super) async fn forget_reservation(&mut self) -> Result<(), Error> {
        let patch = json!({
            "metadata": { "resourceVersion": self.machine.metadata.resource_version },
            "status": { "virtualMachineID": null, "proxmoxNode": null },
        });
        let updated = match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => updated,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.ctx.caches.distrust(&self.uid);
                return Err(Error::Waiting(
                    "the machine changed since it was read; reading it again".into(),
                    Duration::from_millis(200),
                ));
            }
            Err(error) => return Err(error.into()),
        };
        self.ctx.caches.saw_latest(&updated);
        self.machine.metadata.resource_version = updated.metadata.resource_version;
        self.ctx.caches.release_vmid(&self.uid);
        self.status.virtual_machine_id = None;
        self.status.proxmox_node = None;
        if let Some(written) = self.written.as_mut() {
            written.virtual_machine_id = None;
            written.proxmox_node = None;
        }
        Ok(())
    }

    /// Records a task just started; the next look waits for it.
    fn started(&mut self, upid: Upid, running: Reason, message: String) -> Halt {
        tracing::info!(machine = %self.name, upid = %upid, task = upid.task_type(), "started Proxmox task");
        self.status.task_ref = Some(upid.to_string());
        self.status.retry_after = None;
        Halt::Wait(Wait {
            task_started: true,
            ..Wait::new(running, message, Some(Duration::from_millis(500)))
        })
    }

    /// Records the VM's ID, node and providerID on the machine.
    pub(super) async fn record_vm(&mut self, vm: &VmFacts) -> Result<(), Halt> {
        let provider = vm
            .config
            .smbios_uuid()
            .and_then(|uuid| provider_id(uuid).ok());
        let mut spec_patch = serde_json::Map::new();
        if self.machine.spec.virtual_machine_id != Some(i64::from(vm.vmid)) {
            spec_patch.insert("virtualMachineID".into(), json!(vm.vmid));
        }
        if let Some(provider) = &provider
            && self.machine.spec.provider_id.as_deref() != Some(provider.as_str())
        {
            spec_patch.insert("providerID".into(), json!(provider));
        }
        if !spec_patch.is_empty() {
            self.machine = self
                .api
                .patch(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": spec_patch })),
                )
                .await?;
            self.ctx.caches.saw_latest(&self.machine);
        }
        self.status.virtual_machine_id = Some(i64::from(vm.vmid));
        self.status.proxmox_node = Some(vm.node.clone());
        if self.status.vm_status.is_none() {
            self.status.vm_status = Some("pending".into());
        }
        Ok(())
    }

    /// Sizes the stopped clone: CPU, memory, network (MACs kept), tags.
    pub(super) async fn configure(
        &mut self,
        client: &ProxmoxClient,
        vm: &VmFacts,
        update: &VmConfigUpdate,
    ) -> Halt {
        let what = format!("configuring VM {} on {}", vm.vmid, vm.node);
        match client.qemu(&vm.node, vm.vmid).update_config(update).await {
            Ok(upid) => self.started(upid, Reason::Configuring, what),
            Err(e) => refused(e, Reason::ConfigurationFailed, what),
        }
    }

    pub(super) async fn grow_disk(
        &mut self,
        client: &ProxmoxClient,
        vm: &VmFacts,
        disk: &str,
        gib: u64,
    ) -> Halt {
        let what = format!("growing disk {disk} of VM {} to {gib} GiB", vm.vmid);
        match client
            .qemu(&vm.node, vm.vmid)
            .resize(disk, &DiskSize::Gib(gib))
            .await
        {
            Ok(Some(upid)) => self.started(upid, Reason::ResizingDisk, what),
            Ok(None) => Halt::wait(Reason::ResizingDisk, what, Some(Duration::from_millis(200))),
            Err(e) => refused(e, Reason::DiskResizeFailed, what),
        }
    }

    /// Starts the VM, its seed attached.
    pub(super) async fn start(&mut self, client: &ProxmoxClient, vm: &VmFacts) -> Halt {
        // Recorded with the next write.
        self.status.bootstrap_data_provided = Some(true);
        let what = format!("starting VM {} on {}", vm.vmid, vm.node);
        match client.qemu(&vm.node, vm.vmid).start().await {
            Ok(upid) => self.started(upid, Reason::PoweringOn, what),
            Err(e) => refused(e, Reason::PoweringOnFailed, what),
        }
    }

    /// The guest took its addresses: provisioned. Written with the next
    /// write, whatever the steps after it meet.
    pub(super) fn mark_provisioned(&mut self, addresses: &Addresses) {
        let Addresses::Allocated(allocated) = addresses else {
            unreachable!("provisioned only with every address allocated");
        };
        self.status.initialization = Some(MachineInitialization {
            provisioned: Some(true),
        });
        self.status.ready = true;
        self.status.addresses = Some(decide::machine_addresses(&self.name, allocated));
        self.status.ip_addresses = Some(decide::ip_addresses_status(allocated));
        self.set_conditions(&[
            DesiredCondition::true_(VM_PROVISIONED, Reason::Provisioned.as_str()),
            DesiredCondition::true_(READY_CONDITION, Reason::Provisioned.as_str()),
        ]);
        self.newly_provisioned = true;
    }

    /// Says once, after the write that records it, that the machine is
    /// provisioned.
    pub(super) async fn announce_provisioned(&mut self) {
        if !std::mem::take(&mut self.newly_provisioned) {
            return;
        }
        let vmid = self.status.virtual_machine_id.unwrap_or_default();
        let node = self.status.proxmox_node.clone().unwrap_or_default();
        tracing::info!(machine = %self.name, namespace = %self.namespace, vmid, node = %node, "ProxmoxMachine provisioned");
        crate::metrics::global().machines.provisioned(
            Substrate::Proxmox,
            self.machine.metadata.creation_timestamp.as_ref(),
        );
        self.ctx
            .base
            .event(
                &self.machine,
                EventType::Normal,
                Reason::Provisioned.as_str(),
                format!("VM {vmid} on {node} is provisioned"),
            )
            .await;
    }

    /// Provisioned and running: say so, and look again at the next resync.
    pub(super) async fn ready(&mut self, addresses: &Addresses) -> Result<Action, Error> {
        if let Addresses::Allocated(allocated) = addresses {
            self.status.addresses = Some(decide::machine_addresses(&self.name, allocated));
        }
        self.status.ready = true;
        self.set_conditions(&[
            DesiredCondition::true_(VM_PROVISIONED, Reason::Provisioned.as_str()),
            DesiredCondition::true_(READY_CONDITION, Reason::Provisioned.as_str()),
        ]);
        self.persist().await?;
        self.announce_provisioned().await;
        self.ctx
            .caches
            .checked_vm(&self.uid, self.machine.metadata.generation);
        Ok(Action::requeue(RESYNC))
    }
}
