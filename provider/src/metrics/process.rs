//! The process series Go's client library serves (`process_*`), read from
//! `/proc` at each scrape (Linux only; elsewhere there are none). Written
//! here: prometheus-client has no process collector, and the five numbers
//! are a few lines of `/proc` parsing.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub struct ProcessCollector {
    ticks_per_second: f64,
    page_size: f64,
}

impl ProcessCollector {
    pub fn new() -> Self {
        // SAFETY: sysconf only reads configuration values.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        Self {
            ticks_per_second: if ticks > 0 { ticks as f64 } else { 100.0 },
            page_size: if page > 0 { page as f64 } else { 4096.0 },
        }
    }
}

/// What `/proc/self/stat` says, in the units of the series.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    virtual_bytes: f64,
    resident_bytes: f64,
    /// Seconds after boot.
    started_after_boot: f64,
}

/// Parses `/proc/self/stat`: the fields after the command name, which is
/// in parentheses and may itself hold spaces and parentheses.
fn parse_stat(text: &str, ticks_per_second: f64, page_size: f64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state): field n is fields[n - 3].
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) / ticks_per_second,
        started_after_boot: field(22)? / ticks_per_second,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_size,
    })
}

/// The soft limit on open files from `/proc/self/limits`.
fn parse_max_fds(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The boot time from `/proc/stat` (`btime`), seconds since the epoch.
fn parse_boot_time(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        if let Some(stat) = read("/proc/self/stat")
            .and_then(|t| parse_stat(&t, self.ticks_per_second, self.page_size))
        {
            ConstCounter::new(stat.cpu_seconds).encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?)?;
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stat.resident_bytes,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stat.virtual_bytes,
            )?;
            if let Some(boot) = read("/proc/stat").and_then(|t| parse_boot_time(&t)) {
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    boot + stat.started_after_boot,
                )?;
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                fds.count() as f64,
            )?;
        }
        if let Some(max) = read("/proc/self/limits").and_then(|t| parse_max_fds(&t)) {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime priority nice threads
        // itrealvalue starttime vsize rss …
        let text = "42 (ten ant) ry) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 1000 104857600 2560 18446744073709551615";
        assert_eq!(
            parse_stat(text, 100.0, 4096.0),
            Some(Stat {
                cpu_seconds: 3.0,
                virtual_bytes: 104857600.0,
                resident_bytes: 2560.0 * 4096.0,
                started_after_boot: 10.0,
            })
        );
        assert_eq!(parse_stat("42 (x) S 1", 100.0, 4096.0), None);
    }

    #[test]
    fn limits_and_boot_time() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n";
        assert_eq!(parse_max_fds(limits), Some(1048576.0));
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1765000000\nprocesses 9\n"),
            Some(1765000000.0)
        );
    }
}
