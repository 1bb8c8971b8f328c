//! How long machines take to come and to go, per substrate.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Histograms, histogram};

/// From seconds to an hour: a VM from a cached image is up in under a
/// minute, a first import of a large image or a slow PVE clone takes tens.
const LIFECYCLE_BUCKETS: &[f64] = &[
    5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0, 450.0, 600.0, 900.0,
    1200.0, 1800.0, 3600.0,
];

fn lifecycle_histogram() -> Histogram {
    histogram(LIFECYCLE_BUCKETS)
}

/// The substrate a machine kind runs on, as the `substrate` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Substrate {
    Kubevirt,
    Proxmox,
}

impl Substrate {
    pub fn label(self) -> &'static str {
        match self {
            Substrate::Kubevirt => "kubevirt",
            Substrate::Proxmox => "proxmox",
        }
    }

    /// The substrate of an infrastructure machine kind.
    pub fn of_kind(kind: &str) -> Option<Substrate> {
        match kind {
            "KubevirtMachine" => Some(Substrate::Kubevirt),
            "ProxmoxMachine" => Some(Substrate::Proxmox),
            _ => None,
        }
    }
}

pub struct MachineSeries {
    provisioning: Histograms,
    deletion: Histograms,
}

impl MachineSeries {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let series = Self {
            provisioning: Histograms::new_with_constructor(lifecycle_histogram),
            deletion: Histograms::new_with_constructor(lifecycle_histogram),
        };
        registry.register(
            "tenantry_machine_provisioning_duration_seconds",
            "Time from an infrastructure machine's creation to its being provisioned, per substrate",
            series.provisioning.clone(),
        );
        registry.register(
            "tenantry_machine_deletion_duration_seconds",
            "Time from an infrastructure machine's deletion request to its finalizer's removal, per substrate",
            series.deletion.clone(),
        );
        series
    }

    /// A machine created at `created` is provisioned now (said once per
    /// machine: by the reconcile whose status write records it).
    pub fn provisioned(&self, substrate: Substrate, created: Option<&Time>) {
        if let Some(created) = created {
            self.provisioning
                .get_or_create(&vec![("substrate", substrate.label().to_string())])
                .observe(seconds_since(created));
        }
    }

    /// A machine whose deletion was asked at `requested` has lost its
    /// finalizer now.
    pub fn deleted(&self, substrate: Substrate, requested: &Time) {
        self.deletion
            .get_or_create(&vec![("substrate", substrate.label().to_string())])
            .observe(seconds_since(requested));
    }
}

/// Seconds from `time` to now; 0 for a time ahead of this clock.
pub(crate) fn seconds_since(time: &Time) -> f64 {
    let now = k8s_openapi::jiff::Timestamp::now();
    let elapsed = now.duration_since(time.0).as_secs_f64();
    elapsed.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_name_their_substrate() {
        assert_eq!(
            Substrate::of_kind("ProxmoxMachine"),
            Some(Substrate::Proxmox)
        );
        assert_eq!(
            Substrate::of_kind("KubevirtMachine").map(Substrate::label),
            Some("kubevirt")
        );
        assert_eq!(Substrate::of_kind("ProxmoxCluster"), None);
    }

    #[test]
    fn a_time_ahead_of_the_clock_counts_as_no_time() {
        let ahead = Time(k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_secs(60));
        assert_eq!(seconds_since(&ahead), 0.0);
        let before = Time(k8s_openapi::jiff::Timestamp::now() - std::time::Duration::from_secs(30));
        assert!(seconds_since(&before) >= 30.0);
    }
}
