//! What a KubevirtMachine reconcile reads before it decides: the gates
//! (pause, owner Machine, Cluster, bootstrap data named, the
//! infrastructure cluster), the VM, the bootstrap data, the cluster's SSH
//! keys, the VM's instance and disks, and the guest's bootstrap sentinel.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tenantry_api::contract::CONTROL_PLANE_LABEL;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::KubevirtCluster;

use super::decide::{self, RESYNC};
use super::reconcile::{Error, Halt, Run};
use super::status::{BOOTSTRAP_EXEC_SUCCEEDED, Reason};
use crate::capi::bootstrap::{self, BootstrapData, BootstrapState};
use crate::capi::conditions::DesiredCondition;
use crate::capi::stores::{NotYet, Owners};
use crate::capi::{Cluster, Machine, pause};
use crate::kubevirt::infra::{InfraCluster, InfraClusterError};
use crate::kubevirt::render::MachineRole;
use crate::kubevirt::ssh::{self, SshKeyPair};

/// How often a machine waits for its cluster's SSH keys (CAPK: 10 s).
const SSH_KEYS_POLL: Duration = Duration::from_secs(10);
/// The longest one ssh bootstrap check may take, connecting included, so an
/// unreachable guest holds a reconcile for seconds, not minutes.
const BOOTSTRAP_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the gates found: everything creating and watching the VM needs.
pub(super) struct Gates {
    pub cluster_name: String,
    pub cluster: Cluster,
    pub owner_machine: Machine,
    pub role: MachineRole,
    pub kubevirt_cluster: Option<KubevirtCluster>,
    /// The infrastructure cluster's Secret, from the machine or its
    /// KubevirtCluster.
    pub secret_ref: Option<ObjectReference>,
    pub infra: InfraCluster,
}

impl Run<'_> {
    /// Pause is checked first so a paused cluster's new machines say so even
    /// before CAPI adopts them; `None` when paused (and reported).
    pub(super) async fn gates(&self) -> Result<Option<Gates>, Halt> {
        let client = &self.ctx.base.client;
        let stores = &self.ctx.caches.capi;
        let machine = &self.machine;
        let owners = stores
            .owners(client, &self.namespace, &machine.metadata)
            .await?;
        let Owners {
            cluster_name,
            cluster,
            owner_machine,
        } = match owners {
            Ok(owners) => owners,
            Err(NotYet::Paused(by)) => {
                self.report_paused(by).await?;
                return Ok(None);
            }
            Err(not_yet) => {
                return Err(Halt::wait(
                    not_yet.reason(),
                    not_yet.message("KubevirtMachine"),
                    not_yet.retry(RESYNC),
                ));
            }
        };
        let role = if [&machine.metadata, &owner_machine.metadata]
            .iter()
            .any(|m| {
                m.labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
            }) {
            MachineRole::ControlPlane
        } else {
            MachineRole::Worker
        };
        // The data itself is read only when the VM needs it.
        if owner_machine.spec.bootstrap.data_secret_name.is_none() {
            return Err(decide::waiting_for_bootstrap_data(role, &cluster, &owner_machine).into());
        }
        // The machine's own reference wins; the cluster's is copied onto
        // the machine so deletion works later even if the KubevirtCluster
        // is gone first.
        let kubevirt_cluster = match cluster.spec.infrastructure_ref.as_ref() {
            Some(infra_ref) if infra_ref.kind == "KubevirtCluster" => {
                self.ctx
                    .caches
                    .kubevirt_cluster(client, &self.namespace, &infra_ref.name)
                    .await?
            }
            _ => None,
        };
        let secret_ref = machine.spec.infra_cluster_secret_ref.clone().or_else(|| {
            kubevirt_cluster
                .as_ref()
                .and_then(|c| c.spec.infra_cluster_secret_ref.clone())
        });
        let infra = self.infra_cluster(secret_ref.as_ref(), "").await?;
        Ok(Some(Gates {
            cluster_name,
            cluster,
            owner_machine,
            role,
            kubevirt_cluster,
            secret_ref,
            infra,
        }))
    }

    /// The cluster the machine's VM lives in; a wait saying why there is
    /// none (the message led by `doing`).
    pub(super) async fn infra_cluster(
        &self,
        secret_ref: Option<&ObjectReference>,
        doing: &str,
    ) -> Result<InfraCluster, Halt> {
        let vm_namespace = self
            .machine
            .spec
            .virtual_machine_template
            .metadata
            .as_ref()
            .and_then(|m| m.namespace.clone());
        match self
            .ctx
            .infra
            .resolve(
                &self.ctx.base.client,
                &self.namespace,
                secret_ref,
                vm_namespace.as_deref(),
            )
            .await
        {
            Ok(infra) => Ok(infra),
            Err(InfraClusterError::Kube(error)) => Err(Error::from(error).into()),
            Err(error) => Err(Halt::wait(
                Reason::InfraClusterUnavailable,
                format!("{doing}{error}"),
                Some(Duration::from_secs(30)),
            )),
        }
    }

    /// Pause, as the contract asks: the `Paused` condition and nothing else.
    pub(super) async fn paused(&self, cluster: Option<&Cluster>) -> Result<bool, Error> {
        let paused = pause::paused_by(cluster, &self.machine.metadata);
        if let Some(by) = paused {
            self.report_paused(by).await?;
        }
        Ok(paused.is_some())
    }

    /// The owner Machine's bootstrap data, or a wait saying what it lacks.
    pub(super) async fn bootstrap_data(&self, gates: &Gates) -> Result<BootstrapData, Halt> {
        match bootstrap::read(&self.ctx.base.client, &gates.owner_machine).await? {
            BootstrapState::Ready(data) => Ok(data),
            BootstrapState::NotReady => Err(decide::waiting_for_bootstrap_data(
                gates.role,
                &gates.cluster,
                &gates.owner_machine,
            )
            .into()),
            BootstrapState::SecretMissing(secret) | BootstrapState::KeyMissing(secret) => {
                Err(Halt::wait(
                    Reason::BootstrapDataSecretMissing,
                    format!(
                        "bootstrap data Secret {}/{secret} is missing or has no 'value' key",
                        self.namespace
                    ),
                    Some(Duration::from_secs(30)),
                ))
            }
        }
    }

    /// The cluster's SSH key pair, from the Secret its KubevirtCluster
    /// names; a wait while there is none.
    pub(super) async fn ssh_keys(
        &self,
        kubevirt_cluster: &KubevirtCluster,
    ) -> Result<SshKeyPair, Halt> {
        let cluster = kubevirt_cluster
            .metadata
            .name
            .as_deref()
            .unwrap_or_default();
        let namespace = kubevirt_cluster
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default();
        let waiting =
            |reason: Reason, message: String| Halt::wait(reason, message, Some(SSH_KEYS_POLL));
        let Some(secret_name) = kubevirt_cluster
            .spec
            .ssh_keys
            .as_ref()
            .and_then(|k| k.data_secret_name.as_deref())
        else {
            return Err(waiting(
                Reason::WaitingForSshKeys,
                format!(
                    "KubevirtCluster {cluster} has no SSH keys yet (spec.sshKeys.dataSecretName)"
                ),
            ));
        };
        let Some(secret) = Api::<Secret>::namespaced(self.ctx.base.client.clone(), namespace)
            .get_opt(secret_name)
            .await?
        else {
            return Err(waiting(
                Reason::WaitingForSshKeys,
                format!(
                    "the SSH keys Secret {namespace}/{secret_name} of KubevirtCluster {cluster} does not exist yet"
                ),
            ));
        };
        let data = secret.data.unwrap_or_default();
        let Some(private) = data.get(ssh::PRIVATE_KEY_KEY) else {
            return Err(waiting(
                Reason::SshKeysInvalid,
                format!(
                    "the SSH keys Secret {namespace}/{secret_name} has no '{}' key",
                    ssh::PRIVATE_KEY_KEY
                ),
            ));
        };
        SshKeyPair::from_secret(
            &private.0,
            data.get(ssh::PUBLIC_KEY_KEY).map(|p| p.0.as_slice()),
        )
        .map_err(|error| {
            waiting(
                Reason::SshKeysInvalid,
                format!("the SSH keys Secret {namespace}/{secret_name}: {error}"),
            )
        })
    }

    /// CAPK's ssh bootstrap check: once the VMI is Ready, log in to its
    /// first IP as `capk` and read CAPI's bootstrap sentinel. Bounded by
    /// [`BOOTSTRAP_CHECK_TIMEOUT`]; a sentinel found once counts for good.
    pub(super) async fn ssh_bootstrap_check(
        &self,
        vmi: Option<&VirtualMachineInstance>,
        vm_ready: bool,
        keys: &SshKeyPair,
    ) -> DesiredCondition {
        if decide::bootstrap_confirmed(self.conditions()) {
            return DesiredCondition::true_(
                BOOTSTRAP_EXEC_SUCCEEDED,
                Reason::BootstrapSentinelFound.as_str(),
            );
        }
        if !vm_ready {
            return DesiredCondition::false_(
                BOOTSTRAP_EXEC_SUCCEEDED,
                Reason::WaitingForVm.as_str(),
                "the ssh bootstrap check starts once the VirtualMachineInstance is Ready",
            );
        }
        let Some(ip) = vmi.and_then(decide::first_ip_address) else {
            return DesiredCondition::false_(
                BOOTSTRAP_EXEC_SUCCEEDED,
                Reason::WaitingForIpAddress.as_str(),
                "the VirtualMachineInstance reports no IP address in status.interfaces yet",
            );
        };
        let result =
            ssh::read_bootstrap_sentinel(ip, ssh::SSH_PORT, keys, BOOTSTRAP_CHECK_TIMEOUT).await;
        let machine = self.name.as_str();
        match &result {
            Ok(ssh::SentinelReading::Success) => {
                tracing::info!(machine, %ip, "bootstrap sentinel says success")
            }
            Ok(reading) => tracing::debug!(machine, %ip, ?reading, "bootstrap sentinel read"),
            Err(error) => {
                tracing::debug!(machine, %ip, %error, "bootstrap sentinel not readable")
            }
        }
        decide::sentinel_condition(ip, &result)
    }
}
