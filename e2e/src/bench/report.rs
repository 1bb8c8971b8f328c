//! Medians over repeated runs, the side-by-side table and its JSON form.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::RunResult;

/// One figure: how it is read off a run, and its label.
struct Figure {
    label: &'static str,
    read: fn(&RunResult) -> Option<f64>,
}

const FIGURES: &[Figure] = &[
    Figure {
        label: "provision: wall time (s)",
        read: |r| Some(r.provision.wall_seconds),
    },
    Figure {
        label: "provision: p50 per machine (s)",
        read: |r| Some(r.provision.p50_seconds),
    },
    Figure {
        label: "provision: p99 per machine (s)",
        read: |r| Some(r.provision.p99_seconds),
    },
    Figure {
        label: "provision: apiserver requests/machine",
        read: |r| Some(r.provision.requests_per_machine),
    },
    Figure {
        label: "provision: PVE calls/machine",
        read: |r| r.provision.pve_calls_per_machine,
    },
    Figure {
        label: "provision: CPU (s)",
        read: |r| Some(r.provision.cpu_seconds),
    },
    Figure {
        label: "delete: wall time (s)",
        read: |r| Some(r.delete.wall_seconds),
    },
    Figure {
        label: "delete: p50 per machine (s)",
        read: |r| Some(r.delete.p50_seconds),
    },
    Figure {
        label: "delete: p99 per machine (s)",
        read: |r| Some(r.delete.p99_seconds),
    },
    Figure {
        label: "delete: apiserver requests/machine",
        read: |r| Some(r.delete.requests_per_machine),
    },
    Figure {
        label: "delete: PVE calls/machine",
        read: |r| r.delete.pve_calls_per_machine,
    },
    Figure {
        label: "delete: CPU (s)",
        read: |r| Some(r.delete.cpu_seconds),
    },
    Figure {
        label: "peak RSS (MiB)",
        read: |r| Some(r.peak_rss_mib),
    },
    Figure {
        label: "CPU, whole run (s)",
        read: |r| Some(r.cpu_seconds),
    },
];

/// The median of a figure over the runs of one provider in one setting.
#[derive(Clone, Debug, Serialize)]
pub struct Median {
    pub figure: String,
    pub provider: String,
    pub value: f64,
    pub runs: usize,
}

/// One setting: substrate, Cluster API on or off, wave size.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Setting {
    pub substrate: String,
    pub capi: bool,
    pub machines: usize,
}

/// Medians of one setting, with tenantry's ratio to each peer.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub setting: Setting,
    pub medians: Vec<Median>,
    /// `figure -> peer -> tenantry / peer` (lower favours tenantry).
    pub ratios: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The whole report: every run and the comparisons.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub generated: String,
    pub host: String,
    pub runs: Vec<RunResult>,
    pub comparisons: Vec<Comparison>,
}

pub fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// Groups runs by setting and takes medians.
pub fn compare(runs: &[RunResult]) -> Vec<Comparison> {
    let mut settings: BTreeMap<Setting, Vec<&RunResult>> = BTreeMap::new();
    for run in runs {
        settings
            .entry(Setting {
                substrate: run.substrate.clone(),
                capi: run.capi,
                machines: run.machines,
            })
            .or_default()
            .push(run);
    }
    settings
        .into_iter()
        .map(|(setting, runs)| {
            let mut providers: Vec<String> = runs.iter().map(|r| r.provider.clone()).collect();
            providers.sort();
            providers.dedup();
            let mut medians = Vec::new();
            let mut ratios: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
            for figure in FIGURES {
                let mut by_provider = BTreeMap::new();
                for provider in &providers {
                    let values: Vec<f64> = runs
                        .iter()
                        .filter(|r| &r.provider == provider)
                        .filter_map(|r| (figure.read)(r))
                        .collect();
                    let count = values.len();
                    if let Some(value) = median(values) {
                        by_provider.insert(provider.clone(), value);
                        medians.push(Median {
                            figure: figure.label.into(),
                            provider: provider.clone(),
                            value,
                            runs: count,
                        });
                    }
                }
                if let Some(ours) = by_provider.get("tenantry") {
                    for (peer, theirs) in &by_provider {
                        if peer != "tenantry" && *theirs > 0.0 {
                            ratios
                                .entry(figure.label.into())
                                .or_default()
                                .insert(peer.clone(), ours / theirs);
                        }
                    }
                }
            }
            Comparison {
                setting,
                medians,
                ratios,
            }
        })
        .collect()
}

/// The side-by-side table, one block per setting.
pub fn table(comparisons: &[Comparison]) -> String {
    let mut out = String::new();
    for comparison in comparisons {
        let setting = &comparison.setting;
        let mut providers: Vec<&str> = comparison
            .medians
            .iter()
            .map(|m| m.provider.as_str())
            .collect();
        providers.sort_by_key(|p| (*p != "tenantry", p.to_string()));
        providers.dedup();
        let runs = comparison.medians.iter().map(|m| m.runs).min().unwrap_or(0);
        let _ = writeln!(
            out,
            "\n{} · Cluster API core {} · {} machines · median of {} run(s)",
            setting.substrate,
            if setting.capi { "on" } else { "off" },
            setting.machines,
            runs
        );
        let peers: Vec<&str> = providers
            .iter()
            .copied()
            .filter(|p| *p != "tenantry")
            .collect();
        let _ = write!(out, "{:<40}", "figure");
        for provider in &providers {
            let _ = write!(out, "{provider:>12}");
        }
        for peer in &peers {
            let _ = write!(out, "{:>16}", format!("tenantry/{peer}"));
        }
        out.push('\n');
        for figure in FIGURES {
            let values: Vec<Option<f64>> = providers
                .iter()
                .map(|p| {
                    comparison
                        .medians
                        .iter()
                        .find(|m| m.figure == figure.label && m.provider == *p)
                        .map(|m| m.value)
                })
                .collect();
            if values.iter().all(Option::is_none) {
                continue;
            }
            let _ = write!(out, "{:<40}", figure.label);
            for value in &values {
                match value {
                    Some(v) => {
                        let _ = write!(out, "{:>12}", format_value(*v));
                    }
                    None => {
                        let _ = write!(out, "{:>12}", "—");
                    }
                }
            }
            for peer in &peers {
                match comparison
                    .ratios
                    .get(figure.label)
                    .and_then(|r| r.get(*peer))
                {
                    Some(ratio) => {
                        let _ = write!(out, "{:>16}", format!("{ratio:.2}×"));
                    }
                    None => {
                        let _ = write!(out, "{:>16}", "—");
                    }
                }
            }
            out.push('\n');
        }
    }
    out
}

fn format_value(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::PhaseResult;

    fn run(provider: &str, wall: f64, rss: f64) -> RunResult {
        RunResult {
            provider: provider.into(),
            substrate: "kubevirt".into(),
            capi: false,
            machines: 100,
            provision: PhaseResult {
                wall_seconds: wall,
                ..Default::default()
            },
            delete: PhaseResult::default(),
            peak_rss_mib: rss,
            cpu_seconds: 1.0,
        }
    }

    #[test]
    fn medians_and_ratios_per_setting() {
        let runs = vec![
            run("tenantry", 2.0, 30.0),
            run("tenantry", 9.0, 31.0),
            run("tenantry", 4.0, 29.0),
            run("capk", 20.0, 60.0),
            run("capk", 16.0, 62.0),
            run("capk", 40.0, 58.0),
        ];
        let comparisons = compare(&runs);
        assert_eq!(comparisons.len(), 1);
        let ratios = &comparisons[0].ratios;
        assert_eq!(ratios["provision: wall time (s)"]["capk"], 0.2);
        assert_eq!(ratios["peak RSS (MiB)"]["capk"], 0.5);
        let text = table(&comparisons);
        assert!(text.contains("median of 3 run(s)"), "{text}");
        assert!(text.contains("0.20×"), "{text}");
        assert!(!text.contains("PVE calls"), "{text}");
    }

    #[test]
    fn median_of_even_counts_is_the_mean_of_the_middle() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }
}
