//! Gauges counted from the controllers' caches at each scrape: machines by
//! substrate and condition reason, tenant control planes by readiness,
//! worker pools by ready and desired workers. Only the leader runs the
//! controllers, so only it reports these; a standby reports none.
//!
//! Reason labels are the substrate's own condition reasons (the `Reason`
//! enums), so a typo or a free-form reason cannot add series.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use tenantry_api::contract::READY_CONDITION;
use tenantry_api::kubevirt::KubevirtMachine;
use tenantry_api::proxmox::ProxmoxMachine;
use tenantry_api::tenant::Kubernetes;
use tenantry_api::tenant_nodes::KubernetesNodes;

use super::machines::{Substrate, seconds_since};

/// The reason label of a machine being deleted.
pub const DELETING: &str = "Deleting";
/// The reason label of a Ready condition missing or not one of the
/// substrate's reasons.
pub const UNKNOWN: &str = "Unknown";

/// The caches the gauges are counted from, set by each controller as it
/// starts.
#[derive(Default)]
pub struct Stores {
    kubevirt_machines: Mutex<Option<Store<KubevirtMachine>>>,
    proxmox_machines: Mutex<Option<Store<ProxmoxMachine>>>,
    kubernetes: Mutex<Option<Store<Kubernetes>>>,
    kubernetes_nodes: Mutex<Option<Store<KubernetesNodes>>>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stores")
    }
}

impl Stores {
    pub fn kubevirt_machines(&self, store: Store<KubevirtMachine>) {
        *lock(&self.kubevirt_machines) = Some(store);
    }

    pub fn proxmox_machines(&self, store: Store<ProxmoxMachine>) {
        *lock(&self.proxmox_machines) = Some(store);
    }

    pub fn kubernetes(&self, store: Store<Kubernetes>) {
        *lock(&self.kubernetes) = Some(store);
    }

    pub fn kubernetes_nodes(&self, store: Store<KubernetesNodes>) {
        *lock(&self.kubernetes_nodes) = Some(store);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the machine gauges need of one machine.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineFacts {
    pub ready: bool,
    /// The reason label (see [`machine_facts`]).
    pub reason: &'static str,
    /// Seconds since creation, while not provisioned and not deleting.
    pub unprovisioned_for: Option<f64>,
}

/// A machine's facts: `reason` is its Ready condition's reason when
/// `known` recognises it, [`DELETING`] while it is deleted, else
/// [`UNKNOWN`].
pub fn machine_facts(
    meta: &kube::api::ObjectMeta,
    conditions: Option<&[Condition]>,
    provisioned: bool,
    known: impl Fn(&str) -> Option<&'static str>,
) -> MachineFacts {
    let ready_condition = ready(conditions);
    let deleting = meta.deletion_timestamp.is_some();
    let reason = if deleting {
        DELETING
    } else {
        ready_condition
            .and_then(|c| known(&c.reason))
            .unwrap_or(UNKNOWN)
    };
    MachineFacts {
        ready: ready_condition.is_some_and(|c| c.status == "True"),
        reason,
        unprovisioned_for: (!provisioned && !deleting)
            .then(|| meta.creation_timestamp.as_ref().map(seconds_since))
            .flatten(),
    }
}

fn ready(conditions: Option<&[Condition]>) -> Option<&Condition> {
    conditions?.iter().find(|c| c.type_ == READY_CONDITION)
}

fn kubevirt_facts(machine: &KubevirtMachine) -> MachineFacts {
    let status = machine.status.as_ref();
    machine_facts(
        &machine.metadata,
        status.and_then(|s| s.conditions.as_deref()),
        status.is_some_and(|s| s.ready),
        |text| crate::kubevirt::reasons::Reason::parse(text).map(|r| r.as_str()),
    )
}

fn proxmox_facts(machine: &ProxmoxMachine) -> MachineFacts {
    let status = machine.status.as_ref();
    machine_facts(
        &machine.metadata,
        status.and_then(|s| s.conditions.as_deref()),
        status.is_some_and(|s| s.ready),
        |text| crate::proxmox::reasons::Reason::parse(text).map(|r| r.as_str()),
    )
}

fn tenant_reason(conditions: Option<&[Condition]>) -> (bool, &'static str) {
    let condition = ready(conditions);
    (
        condition.is_some_and(|c| c.status == "True"),
        condition
            .and_then(|c| crate::tenant::reasons::Reason::parse(&c.reason))
            .map_or(UNKNOWN, |r| r.as_str()),
    )
}

type Rows = BTreeMap<Vec<(&'static str, String)>, f64>;

/// Machine counts by (substrate, ready, reason) and the oldest
/// unprovisioned machine's age by substrate.
fn machine_rows(
    substrate: Substrate,
    facts: impl Iterator<Item = MachineFacts>,
    counts: &mut Rows,
    oldest: &mut Rows,
) {
    let label = substrate.label().to_string();
    let mut age: f64 = 0.0;
    for fact in facts {
        *counts
            .entry(vec![
                ("substrate", label.clone()),
                ("ready", fact.ready.to_string()),
                ("reason", fact.reason.to_string()),
            ])
            .or_default() += 1.0;
        age = age.max(fact.unprovisioned_for.unwrap_or(0.0));
    }
    oldest.insert(vec![("substrate", label)], age);
}

fn encode_gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Stores {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut machines = Rows::new();
        let mut oldest = Rows::new();
        if let Some(store) = lock(&self.kubevirt_machines).as_ref() {
            let facts = store.state().into_iter().map(|m| kubevirt_facts(&m));
            machine_rows(Substrate::Kubevirt, facts, &mut machines, &mut oldest);
        }
        if let Some(store) = lock(&self.proxmox_machines).as_ref() {
            let facts = store.state().into_iter().map(|m| proxmox_facts(&m));
            machine_rows(Substrate::Proxmox, facts, &mut machines, &mut oldest);
        }
        let mut clusters = Rows::new();
        if let Some(store) = lock(&self.kubernetes).as_ref() {
            for cluster in store.state() {
                let conditions = cluster
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref());
                let (ready, reason) = tenant_reason(conditions);
                *clusters
                    .entry(vec![
                        ("ready", ready.to_string()),
                        ("reason", reason.to_string()),
                    ])
                    .or_default() += 1.0;
            }
        }
        let mut pools = Rows::new();
        let mut replicas = Rows::new();
        if let Some(store) = lock(&self.kubernetes_nodes).as_ref() {
            let (mut desired, mut ready_workers) = (0.0, 0.0);
            for pool in store.state() {
                let status = pool.status.as_ref();
                let conditions = status.and_then(|s| s.conditions.as_deref());
                let (ready, _) = tenant_reason(conditions);
                *pools.entry(vec![("ready", ready.to_string())]).or_default() += 1.0;
                desired += f64::from(status.and_then(|s| s.replicas).unwrap_or(0));
                ready_workers += f64::from(status.and_then(|s| s.ready_replicas).unwrap_or(0));
            }
            replicas.insert(vec![("state", "desired".to_string())], desired);
            replicas.insert(vec![("state", "ready".to_string())], ready_workers);
        }
        encode_gauges(
            &mut encoder,
            "tenantry_machines",
            "Infrastructure machines, per substrate, Ready status and Ready reason",
            &machines,
        )?;
        encode_gauges(
            &mut encoder,
            "tenantry_machines_unprovisioned_oldest_seconds",
            "Age of the oldest machine not yet provisioned and not being deleted, per substrate (0: none)",
            &oldest,
        )?;
        encode_gauges(
            &mut encoder,
            "tenantry_kubernetes_clusters",
            "Tenant clusters (Kubernetes objects), per Ready status and reason",
            &clusters,
        )?;
        encode_gauges(
            &mut encoder,
            "tenantry_kubernetes_nodes_pools",
            "Worker pools (KubernetesNodes), per Ready status",
            &pools,
        )?;
        encode_gauges(
            &mut encoder,
            "tenantry_kubernetes_nodes_replicas",
            "Workers over all pools: desired (the pools' MachineDeployments) and ready (Node Ready)",
            &replicas,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    fn condition(status: &str, reason: &str) -> Condition {
        Condition {
            type_: READY_CONDITION.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
            observed_generation: None,
        }
    }

    fn created_secs_ago(seconds: u64) -> ObjectMeta {
        ObjectMeta {
            creation_timestamp: Some(Time(
                k8s_openapi::jiff::Timestamp::now() - std::time::Duration::from_secs(seconds),
            )),
            ..Default::default()
        }
    }

    fn known(text: &str) -> Option<&'static str> {
        crate::proxmox::reasons::Reason::parse(text).map(|r| r.as_str())
    }

    #[test]
    fn reasons_are_the_substrates_own_or_unknown() {
        let waiting = condition("False", "WaitingForBootstrapData");
        let facts = machine_facts(&created_secs_ago(90), Some(&[waiting]), false, known);
        assert_eq!(
            (facts.ready, facts.reason),
            (false, "WaitingForBootstrapData")
        );
        assert!(facts.unprovisioned_for.is_some_and(|age| age >= 90.0));

        let made_up = condition("False", "SomethingElse");
        let facts = machine_facts(&created_secs_ago(5), Some(&[made_up]), false, known);
        assert_eq!(facts.reason, UNKNOWN);
        assert_eq!(
            machine_facts(&created_secs_ago(5), None, false, known).reason,
            UNKNOWN
        );

        let provisioned = condition("True", "Provisioned");
        let facts = machine_facts(
            &created_secs_ago(5),
            Some(std::slice::from_ref(&provisioned)),
            true,
            known,
        );
        assert_eq!(
            (facts.ready, facts.reason, facts.unprovisioned_for),
            (true, "Provisioned", None)
        );

        let mut deleted = created_secs_ago(5);
        deleted.deletion_timestamp = deleted.creation_timestamp.clone();
        let facts = machine_facts(&deleted, Some(&[provisioned]), false, known);
        assert_eq!((facts.reason, facts.unprovisioned_for), (DELETING, None));
    }

    #[test]
    fn machines_are_counted_per_label_set_and_the_oldest_waiting_one_is_kept() {
        let fact = |ready, reason, age| MachineFacts {
            ready,
            reason,
            unprovisioned_for: age,
        };
        let (mut counts, mut oldest) = (Rows::new(), Rows::new());
        machine_rows(
            Substrate::Proxmox,
            [
                fact(true, "Provisioned", None),
                fact(true, "Provisioned", None),
                fact(false, "Cloning", Some(40.0)),
                fact(false, "Cloning", Some(700.0)),
            ]
            .into_iter(),
            &mut counts,
            &mut oldest,
        );
        let key = |ready: &str, reason: &str| {
            vec![
                ("substrate", "proxmox".to_string()),
                ("ready", ready.to_string()),
                ("reason", reason.to_string()),
            ]
        };
        assert_eq!(counts[&key("true", "Provisioned")], 2.0);
        assert_eq!(counts[&key("false", "Cloning")], 2.0);
        assert_eq!(oldest[&vec![("substrate", "proxmox".to_string())]], 700.0);
    }
}
