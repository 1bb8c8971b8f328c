//! The NoCloud seed: built and uploaded (unless an address turns out to be
//! another machine's), attached, and once read, detached and deleted.

use std::time::Duration;

use kube::runtime::events::EventType;
use tenantry_api::proxmox::provider_id;

use super::claims;
use crate::proxmox::client::{ProxmoxClient, VmConfigUpdate};
use crate::proxmox::machine::decide::{self, Addresses, ClaimPlan, POLL, SeedState, VmFacts};
use crate::proxmox::machine::observe::pve::{self, TaskPoll};
use crate::proxmox::machine::observe::{FAILED_TASK_PAUSE, Gates};
use crate::proxmox::machine::reconcile::{Error, Halt, Run, refused};
use crate::proxmox::machine::status::Reason;
use crate::proxmox::nocloud::{self, NoCloudSeed, UserData};

impl Run<'_> {
    /// Builds the NoCloud seed and uploads it to the ISO storage, unless
    /// one of its addresses turns out to be another machine's.
    pub(in crate::proxmox::machine) async fn upload_seed(
        &mut self,
        client: &ProxmoxClient,
        gates: &Gates,
        vm: &VmFacts,
        seed: &SeedState,
        addresses: &Addresses,
        plans: &[ClaimPlan],
    ) -> Halt {
        match self
            .try_upload_seed(client, gates, vm, seed, addresses, plans)
            .await
        {
            Ok(never) => match never {},
            Err(halt) => halt,
        }
    }

    async fn try_upload_seed(
        &mut self,
        client: &ProxmoxClient,
        gates: &Gates,
        vm: &VmFacts,
        seed: &SeedState,
        addresses: &Addresses,
        plans: &[ClaimPlan],
    ) -> Result<std::convert::Infallible, Halt> {
        let Addresses::Allocated(addresses) = addresses else {
            unreachable!("the seed is uploaded only with every address allocated");
        };
        // The seed fixes the addresses the guest takes: none of them may be
        // another machine's.
        let conflicts = claims::address_conflicts(
            &self.ctx.base.client,
            &self.ctx.caches,
            &self.machine,
            plans,
        )
        .await?;
        if !conflicts.is_empty() {
            for conflict in &conflicts {
                claims::release_claim(&self.ctx.base.client, &self.namespace, &conflict.claim)
                    .await?;
            }
            let message = conflicts
                .iter()
                .map(|c| c.message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            self.ctx
                .base
                .event(
                    &self.machine,
                    EventType::Warning,
                    Reason::IpAddressConflict.as_str(),
                    format!("{message}; released the claim to get another address"),
                )
                .await;
            return Err(Halt::wait(
                Reason::IpAddressConflict,
                format!("{message}; waiting for another address"),
                Some(Duration::from_secs(10)),
            ));
        }
        let failed =
            |m: String| Halt::wait(Reason::BootstrapDataFailed, m, Some(decide::HUMAN_RETRY));
        let network = decide::seed_network(
            &self.machine.spec,
            &gates.proxmox_cluster.spec,
            &vm.config,
            addresses,
        )
        .map_err(failed)?;
        let Some(uuid) = vm.config.smbios_uuid() else {
            return Err(failed(format!(
                "VM {} has no SMBIOS uuid (smbios1)",
                vm.vmid
            )));
        };
        let data = self
            .bootstrap_data(&gates.owner_machine, &gates.cluster, &gates.cluster_name)
            .await?;
        let inject = self
            .machine
            .spec
            .metadata_settings
            .as_ref()
            .is_some_and(|m| m.provider_id_injection);
        let rendered = NoCloudSeed {
            instance_id: uuid.to_string(),
            hostname: self.name.clone(),
            provider_id: inject.then(|| provider_id(uuid).ok()).flatten(),
            network,
            user_data: UserData::new(data.as_bytes().to_vec()),
        }
        .render()
        .map_err(|e| failed(e.to_string()))?;
        let file = nocloud::iso_file_name(&self.uid).map_err(|e| failed(e.to_string()))?;
        let what = format!("uploading the NoCloud seed {}", seed.volid);
        let upid = client
            .storage(&vm.node, &seed.storage)
            .upload_iso(&file, rendered.image.into_bytes())
            .await
            .map_err(|e| refused(e, Reason::BootstrapDataFailed, &what))?;
        Err(self.started(upid, Reason::UploadingBootstrapData, what))
    }

    /// Attaches the uploaded seed as a CD-ROM.
    pub(in crate::proxmox::machine) async fn attach_seed(
        &mut self,
        client: &ProxmoxClient,
        vm: &VmFacts,
        seed: &SeedState,
        slot: String,
    ) -> Halt {
        let what = format!(
            "attaching the NoCloud seed {} to VM {} as {slot}",
            seed.volid, vm.vmid
        );
        let update = VmConfigUpdate::new().set(slot, decide::cdrom_value(Some(&seed.volid)));
        match client.qemu(&vm.node, vm.vmid).update_config(&update).await {
            Ok(upid) => self.started(upid, Reason::UploadingBootstrapData, what),
            Err(e) => refused(e, Reason::BootstrapDataFailed, what),
        }
    }

    /// Detaches the seed CD-ROM and deletes the ISO: it holds the machine's
    /// bootstrap secrets and has been read.
    pub(in crate::proxmox::machine) async fn remove_seed(
        &mut self,
        client: &ProxmoxClient,
        vm: &VmFacts,
    ) -> Result<(), Halt> {
        let file = nocloud::iso_file_name(&self.uid)
            .map_err(|e| Halt::wait(Reason::BootstrapDataFailed, e.to_string(), None))?;
        let vm_api = client.qemu(&vm.node, vm.vmid);
        for (key, _) in vm.config.extra.iter().filter(|(_, v)| {
            v.as_str()
                .is_some_and(|v| v.contains(&format!(":iso/{file}")))
        }) {
            let update = VmConfigUpdate::new().set(key.clone(), decide::cdrom_value(None));
            vm_api.update_config_sync(&update).await.map_err(|e| {
                refused(
                    e,
                    Reason::BootstrapDataFailed,
                    format!("detaching the seed from VM {}", vm.vmid),
                )
            })?;
            tracing::info!(machine = %self.name, vmid = vm.vmid, drive = %key, "detached the NoCloud seed");
        }
        self.delete_seed_volumes(client, &vm.node, &file).await?;
        self.status.vm_status = Some("ready".into());
        Ok(())
    }

    pub(in crate::proxmox::machine) async fn delete_seed_volumes(
        &mut self,
        client: &ProxmoxClient,
        node: &str,
        file: &str,
    ) -> Result<(), Halt> {
        let volumes = pve::find_seed_volumes(client, node, file)
            .await
            .map_err(|e| {
                refused(
                    e,
                    Reason::BootstrapDataFailed,
                    format!("looking for the seed {file} on {node}"),
                )
            })?;
        for (storage, volid) in volumes {
            let deleted = client
                .storage(node, &storage)
                .delete_volume(&volid)
                .await
                .map_err(|e| {
                    refused(
                        e,
                        Reason::BootstrapDataFailed,
                        format!("deleting the seed {volid}"),
                    )
                })?;
            if let Some(upid) = deleted {
                match pve::poll_task(client, &upid, &pve::reconcile_task_wait())
                    .await
                    .map_err(Error::from)?
                {
                    TaskPoll::Running => {
                        return Err(Halt::wait(
                            Reason::UploadingBootstrapData,
                            format!("deleting the seed {volid}"),
                            Some(POLL),
                        ));
                    }
                    TaskPoll::Failed { exit_status, .. } => {
                        return Err(Halt::wait(
                            Reason::BootstrapDataFailed,
                            format!("deleting the seed {volid} failed: {exit_status}"),
                            Some(FAILED_TASK_PAUSE),
                        ));
                    }
                    TaskPoll::Done(_) | TaskPoll::Unknown => {}
                }
            }
            tracing::info!(machine = %self.name, %volid, "deleted the NoCloud seed");
        }
        Ok(())
    }
}
