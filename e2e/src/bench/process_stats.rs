//! What a provider process costs the machine, read from `/proc`.

use anyhow::Context as _;

/// CPU and memory of one process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Peak resident set size (`VmHWM`), in MiB.
    pub peak_rss_mib: f64,
}

/// Reads `/proc/<pid>/stat` and `/proc/<pid>/status`.
pub fn read(pid: u32) -> anyhow::Result<ProcessStats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    parse(&stat, &status, clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn parse(stat: &str, status: &str, ticks: f64) -> anyhow::Result<ProcessStats> {
    // The command name (field 2) may hold spaces; fields after its closing
    // parenthesis start at field 3 (state). utime and stime are fields 14, 15.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<f64> {
        fields
            .get(n - 3)
            .context("short /proc/<pid>/stat")?
            .parse::<f64>()
            .context("numeric /proc/<pid>/stat field")
    };
    let cpu_seconds = (field(14)? + field(15)?) / ticks;
    let peak_kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no VmHWM in /proc/<pid>/status")?
        .parse::<f64>()
        .context("numeric VmHWM")?;
    Ok(ProcessStats {
        cpu_seconds,
        peak_rss_mib: peak_kib / 1024.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_and_peak_rss() {
        let stat = "4242 (my (odd) name) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 8 0 100 0 0";
        let status = "Name:\tx\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t 40000 kB\n";
        let stats = parse(stat, status, 100.0).unwrap();
        assert_eq!(stats.cpu_seconds, 3.0);
        assert_eq!(stats.peak_rss_mib, 50.0);
    }

    #[test]
    fn reads_this_process() {
        let stats = read(std::process::id()).unwrap();
        assert!(stats.peak_rss_mib > 1.0, "{stats:?}");
    }
}
