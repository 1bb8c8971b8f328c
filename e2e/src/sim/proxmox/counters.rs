//! Counters of API calls, by endpoint (method and path template) and by
//! caller, so tests and benchmarks can report PVE calls per machine.

use std::collections::BTreeMap;

/// The caller recorded for calls that failed authentication.
pub const UNAUTHENTICATED: &str = "<unauthenticated>";
/// The template recorded for paths no endpoint matches.
pub const UNKNOWN_PATH: &str = "<unknown>";

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts {
    pub total: u64,
    /// `"POST /nodes/{node}/qemu/{vmid}/clone"` -> calls.
    pub by_endpoint: BTreeMap<String, u64>,
    /// `"capmox@pve!capi"` -> calls.
    pub by_caller: BTreeMap<String, u64>,
    /// (caller, endpoint) -> calls.
    pub by_caller_endpoint: BTreeMap<(String, String), u64>,
}

impl CallCounts {
    /// Calls of one endpoint, e.g. `count("GET", "/cluster/resources")`.
    pub fn count(&self, method: &str, template: &str) -> u64 {
        self.by_endpoint
            .get(&format!("{method} {template}"))
            .copied()
            .unwrap_or(0)
    }

    /// Calls made by one user or token.
    pub fn by(&self, caller: &str) -> u64 {
        self.by_caller.get(caller).copied().unwrap_or(0)
    }

    /// Calls of one endpoint by one caller.
    pub fn count_by(&self, caller: &str, method: &str, template: &str) -> u64 {
        self.by_caller_endpoint
            .get(&(caller.to_string(), format!("{method} {template}")))
            .copied()
            .unwrap_or(0)
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        fn diff<K: Ord + Clone>(
            now: &BTreeMap<K, u64>,
            then: &BTreeMap<K, u64>,
        ) -> BTreeMap<K, u64> {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect()
        }
        CallCounts {
            total: self.total - earlier.total,
            by_endpoint: diff(&self.by_endpoint, &earlier.by_endpoint),
            by_caller: diff(&self.by_caller, &earlier.by_caller),
            by_caller_endpoint: diff(&self.by_caller_endpoint, &earlier.by_caller_endpoint),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct CallCounters {
    counts: CallCounts,
}

impl CallCounters {
    pub fn record(&mut self, caller: &str, method: &str, template: &str) {
        let endpoint = format!("{method} {template}");
        let counts = &mut self.counts;
        counts.total += 1;
        *counts.by_endpoint.entry(endpoint.clone()).or_default() += 1;
        *counts.by_caller.entry(caller.to_string()).or_default() += 1;
        *counts
            .by_caller_endpoint
            .entry((caller.to_string(), endpoint))
            .or_default() += 1;
    }

    pub fn snapshot(&self) -> CallCounts {
        self.counts.clone()
    }

    pub fn reset(&mut self) {
        self.counts = CallCounts::default();
    }
}
