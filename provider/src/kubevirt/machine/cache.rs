//! Read caches fed by the controller's own watches: a reconcile reads what
//! the controller watches anyway (Machines, Clusters, KubevirtClusters, and
//! its VMs, VMIs and DataVolumes) from memory instead of the apiserver:
//! those reads were most of its requests per machine (`docs/performance.md`).
//!
//! A cache answers only for what its watch covers: CAPI objects fall back to
//! a GET on a miss (not listed yet, or outside a label filter); the VM, VMI
//! and DataVolumes of a machine are trusted once their watch has listed, but
//! only in the management cluster and the watched namespace — an external
//! infrastructure cluster, or a VM namespace outside the watch, is read from
//! the apiserver as before.

use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use tenantry_api::generated::cdi::data_volume::DataVolume;
use tenantry_api::generated::kubevirt::virtual_machine::VirtualMachine;
use tenantry_api::generated::kubevirt::virtual_machine_instance::VirtualMachineInstance;
use tenantry_api::kubevirt::KubevirtCluster;

use crate::capi::stores::{CapiStores, is_ready, lookup};
use crate::kubevirt::infra::InfraCluster;
use crate::kubevirt::render::{MACHINE_NAME_LABEL, MACHINE_NAMESPACE_LABEL};

/// The controller's stores.
#[derive(Clone)]
pub struct Caches {
    /// Owner Machines and Clusters.
    pub capi: CapiStores,
    pub kubevirt_clusters: Store<KubevirtCluster>,
    pub vms: Store<VirtualMachine>,
    pub vmis: Store<VirtualMachineInstance>,
    pub data_volumes: Store<DataVolume>,
    /// The namespace the watches are limited to (`--namespace`), if any.
    pub watched_namespace: Option<String>,
}

impl Caches {
    /// The KubevirtCluster `name` in `namespace`, if it exists.
    pub async fn kubevirt_cluster(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<KubevirtCluster>> {
        if let Some(cluster) = lookup(&self.kubevirt_clusters, namespace, name) {
            return Ok(Some(cluster));
        }
        Api::<KubevirtCluster>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
    }

    /// Whether the watches of this machine's VM, VMI and DataVolumes cover
    /// where they run.
    pub fn covers(&self, infra: &InfraCluster) -> bool {
        !infra.external
            && self
                .watched_namespace
                .as_deref()
                .is_none_or(|watched| watched == infra.namespace)
    }

    /// The machine's VirtualMachine, if it exists.
    pub async fn vm(
        &self,
        infra: &InfraCluster,
        name: &str,
    ) -> kube::Result<Option<VirtualMachine>> {
        if self.covers(infra) && is_ready(&self.vms) {
            return Ok(lookup(&self.vms, &infra.namespace, name));
        }
        Api::<VirtualMachine>::namespaced(infra.client.clone(), &infra.namespace)
            .get_opt(name)
            .await
    }

    /// The machine's VirtualMachineInstance, if it exists.
    pub async fn vmi(
        &self,
        infra: &InfraCluster,
        name: &str,
    ) -> kube::Result<Option<VirtualMachineInstance>> {
        if self.covers(infra) && is_ready(&self.vmis) {
            return Ok(lookup(&self.vmis, &infra.namespace, name));
        }
        Api::<VirtualMachineInstance>::namespaced(infra.client.clone(), &infra.namespace)
            .get_opt(name)
            .await
    }

    /// The DataVolumes labelled with the machine `name` of `namespace`.
    pub async fn data_volumes(
        &self,
        infra: &InfraCluster,
        name: &str,
        namespace: &str,
    ) -> kube::Result<Vec<DataVolume>> {
        if self.covers(infra) && is_ready(&self.data_volumes) {
            return Ok(self
                .data_volumes
                .state()
                .into_iter()
                .filter(|dv| {
                    dv.metadata.namespace.as_deref() == Some(infra.namespace.as_str())
                        && dv.metadata.labels.as_ref().is_some_and(|labels| {
                            labels.get(MACHINE_NAME_LABEL).map(String::as_str) == Some(name)
                                && labels.get(MACHINE_NAMESPACE_LABEL).map(String::as_str)
                                    == Some(namespace)
                        })
                })
                .map(|dv| (*dv).clone())
                .collect());
        }
        Ok(
            Api::<DataVolume>::namespaced(infra.client.clone(), &infra.namespace)
                .list(&ListParams::default().labels(&format!(
                    "{MACHINE_NAME_LABEL}={name},{MACHINE_NAMESPACE_LABEL}={namespace}"
                )))
                .await?
                .items,
        )
    }
}
