//! The clone: planned from the cluster's resources, its VM ID reserved and
//! recorded before PVE is asked, so a restart never clones twice.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use crate::proxmox::client::{ProxmoxClient, ProxmoxError};
use crate::proxmox::machine::decide::{self, CloneRequest, VmidSearch};
use crate::proxmox::machine::observe::Gates;
use crate::proxmox::machine::reconcile::{Error, Halt, Run, refused};
use crate::proxmox::machine::status::{self, Reason};

/// How many VM IDs are probed for a free one per reconcile.
const VMID_PROBES: usize = 20;

impl Run<'_> {
    /// Plans the clone, reserves a VM ID (unless one is), records it with
    /// the target node, then asks for the clone and records its task.
    /// Always halts: the next reconcile goes on from what was recorded.
    pub(in crate::proxmox::machine) async fn clone_vm(
        &mut self,
        gates: &Gates,
        reserved: Option<u32>,
    ) -> Halt {
        match self.try_clone_vm(gates, reserved).await {
            Ok(never) => match never {},
            Err(halt) => halt,
        }
    }

    async fn try_clone_vm(
        &mut self,
        gates: &Gates,
        reserved: Option<u32>,
    ) -> Result<std::convert::Infallible, Halt> {
        if let Some((after, reason, message)) = self.retry_after()
            && let Some(step) = decide::task_gate_until(after, reason, message, Timestamp::now())
        {
            return Err(step.into());
        }
        let client = &gates.client;
        let resources =
            client.cluster().resources(None).await.map_err(|e| {
                refused(e, Reason::CloningFailed, "reading the cluster's resources")
            })?;
        let machines = self.ctx.machines.state();
        let request = CloneRequest {
            spec: &self.machine.spec,
            namespace: &self.namespace,
            uid: &self.uid,
            cluster_name: &gates.cluster_name,
            cluster_spec: &gates.proxmox_cluster.spec,
            machines: &machines,
        };
        let plan = decide::plan_clone(&request, &resources)?;
        if let Some(pool) = self.pool().map(str::to_string)
            && self.machine.spec.storage.is_some()
            && self.machine.spec.full_clone()
        {
            let members =
                client.pools().get(&pool).await.map_err(|e| {
                    refused(e, Reason::CloningFailed, format!("reading pool {pool}"))
                })?;
            let storages: Vec<String> = members
                .members
                .iter()
                .filter_map(|m| m.storage.clone())
                .collect();
            if let Some(refusal) = decide::clone_storage_refusal(&self.machine.spec, &storages) {
                return Err(refusal.into());
            }
        }
        let vmid = match reserved {
            Some(vmid) => vmid,
            None => {
                self.reserve_vmid(client, decide::taken_vmids(&machines, &self.uid))
                    .await?
            }
        };
        let node = plan.node.clone();
        let template = &plan.template;
        let what = format!(
            "cloning template {} on {} to VM {vmid} on {node}{}",
            template.vmid,
            template.node,
            self.pool()
                .map(|p| format!(" in pool {p}"))
                .unwrap_or_default()
        );
        // Recorded before asking: from here on, a restart finds this clone
        // (or knows it never happened) instead of starting another.
        self.status.virtual_machine_id = Some(i64::from(vmid));
        self.status.proxmox_node = Some(node.clone());
        self.status.vm_status = Some("pending".into());
        self.set_conditions(&status::waiting(
            Reason::Cloning,
            format!(
                "cloning template {} on {} to VM {vmid} on {node}",
                template.vmid, template.node
            ),
        ));
        self.persist_at_version().await?;

        let params = decide::clone_params(
            &self.machine.spec,
            (&self.namespace, &self.name, &self.uid),
            vmid,
            &plan,
        );
        match client
            .qemu(&template.node, template.vmid)
            .clone_to(&params)
            .await
        {
            Ok(upid) => {
                self.ctx
                    .base
                    .event(&self.machine, EventType::Normal, "Cloning", what.clone())
                    .await;
                Err(self.started(upid, Reason::Cloning, what))
            }
            // Taken meanwhile: by this machine's own earlier request that
            // went through unnoticed, or by another. The next reconcile
            // looks at whose it is.
            Err(ProxmoxError::AlreadyExists { message }) => {
                tracing::info!(machine = %self.name, vmid, %message, "VM ID taken while cloning");
                Err(Halt::wait(
                    Reason::Cloning,
                    format!("VM ID {vmid} was taken meanwhile ({message}); checking whose"),
                    Some(Duration::from_millis(500)),
                ))
            }
            Err(error) => Err(refused(error, Reason::CloningFailed, what)),
        }
    }

    /// Reserves a free VM ID in this manager before PVE is asked: PVE's
    /// `nextid` names the same ID to concurrent callers until a clone
    /// claims it.
    async fn reserve_vmid(
        &self,
        client: &ProxmoxClient,
        taken: BTreeSet<u32>,
    ) -> Result<u32, Halt> {
        let range = self
            .machine
            .spec
            .vm_id_range
            .as_ref()
            .map(|r| (r.start, r.end));
        let next = match range {
            Some(_) => None,
            None => Some(client.cluster().next_id().await.map_err(Error::from)?),
        };
        let search = VmidSearch::new(range, next);
        let mut used = BTreeSet::new();
        for _ in 0..VMID_PROBES {
            let Some(candidate) = self.ctx.caches.reserve_vmid(&self.uid, |others| {
                let mut skip = taken.clone();
                skip.extend(others);
                skip.extend(&used);
                search.candidates(&skip, 1).first().copied()
            }) else {
                break;
            };
            if Some(candidate) == next
                || client
                    .cluster()
                    .is_vmid_free(candidate)
                    .await
                    .map_err(Error::from)?
            {
                return Ok(candidate);
            }
            used.insert(candidate);
        }
        Err(Halt::wait(
            Reason::VmidRangeExhausted,
            match range {
                Some((start, end)) => format!("no free VM ID in spec.vmIDRange {start}-{end}"),
                None => "no free VM ID found".to_string(),
            },
            Some(decide::HUMAN_RETRY),
        ))
    }
}
