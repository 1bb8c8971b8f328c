//! The kubelet's reservations and eviction thresholds of a pool, checked
//! against the worker's size.

use super::*;

/// A memory eviction threshold.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Threshold {
    /// A percentage of the worker's memory, in (0, 100].
    Percent(f64),
    /// An amount, in thousandths of a byte.
    Amount(i128),
}

impl Threshold {
    /// The threshold in thousandths of a byte on a worker with `memory`.
    fn of(self, memory: i128) -> i128 {
        match self {
            // Exact enough: the percentages are short decimals and the
            // result only feeds a comparison with the worker's memory.
            Self::Percent(percent) => (memory as f64 * percent / 100.0).ceil() as i128,
            Self::Amount(amount) => amount,
        }
    }
}

fn parse_threshold(key: &str, text: &str) -> Result<Threshold, String> {
    if let Some(number) = text.strip_suffix('%') {
        let valid = !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && number.matches('.').count() <= 1;
        let percent: f64 = number
            .parse()
            .ok()
            .filter(|_| valid)
            .ok_or_else(|| format!("{text:?} is not a percentage such as 7%"))?;
        if percent <= 0.0 || percent > 100.0 {
            return Err(format!(
                "{key} percentage must be greater than 0 and at most 100, got {text}"
            ));
        }
        return Ok(Threshold::Percent(percent));
    }
    match quantity_milli_value(text) {
        Some(amount) if amount > 0 => Ok(Threshold::Amount(amount)),
        _ => Err(format!(
            "{text:?} is neither a percentage (e.g. 7%) nor a positive memory quantity (e.g. 500Mi)"
        )),
    }
}

/// A reservation as the kubelet gets it: the one set, else the computed
/// default; None when the one set is invalid (and refused).
fn reservation(
    key: &str,
    set: Option<&Quantity>,
    default: i128,
    kind: &str,
    verdict: &mut Verdict,
) -> Option<(i128, String)> {
    match set {
        None => Some((default, "computed".to_string())),
        Some(quantity) => match positive_quantity(quantity) {
            Some(value) => Some((value, quantity.0.clone())),
            None => {
                refuse(
                    verdict,
                    format!("{KUBELET}.{key}"),
                    format!(
                        "{:?} is not a positive {kind} quantity; use e.g. {}",
                        quantity.0,
                        if kind == "CPU" { "100m" } else { "512Mi" }
                    ),
                );
                None
            }
        },
    }
}

/// The reference chart's rules: reservations valid and above zero,
/// eviction thresholds of one kind with hard below soft, and reservations
/// plus the hard threshold leaving memory (and CPU) for pods.
pub(super) fn check_kubelet(pool: &KubernetesNodes, size: &WorkerSize, verdict: &mut Verdict) {
    let kubelet = &pool.spec.kubelet;
    let memory_default = i128::try_from(default_reserved_memory_bytes(
        size.memory.max(0) as u128 / 1_000,
    ))
    .unwrap_or(i128::MAX / MILLI)
        * MILLI;
    let cpu_default =
        i128::try_from(default_reserved_millicpu(size.millicpu.max(0) as u128)).unwrap_or(0);
    let system_memory = reservation(
        "systemReservedMemory",
        kubelet.system_reserved_memory.as_ref(),
        memory_default,
        "memory",
        verdict,
    );
    let kube_memory = reservation(
        "kubeReservedMemory",
        kubelet.kube_reserved_memory.as_ref(),
        memory_default,
        "memory",
        verdict,
    );
    let system_cpu = reservation(
        "systemReservedCpu",
        kubelet.system_reserved_cpu.as_ref(),
        cpu_default,
        "CPU",
        verdict,
    );
    let kube_cpu = reservation(
        "kubeReservedCpu",
        kubelet.kube_reserved_cpu.as_ref(),
        cpu_default,
        "CPU",
        verdict,
    );
    let hard = parse_threshold("evictionHardMemory", &kubelet.eviction_hard_memory)
        .map_err(|message| refuse(verdict, format!("{KUBELET}.evictionHardMemory"), message))
        .ok();
    let soft = parse_threshold("evictionSoftMemory", &kubelet.eviction_soft_memory)
        .map_err(|message| refuse(verdict, format!("{KUBELET}.evictionSoftMemory"), message))
        .ok();

    if let (Some(hard), Some(soft)) = (hard, soft) {
        let (hard_text, soft_text) = (&kubelet.eviction_hard_memory, &kubelet.eviction_soft_memory);
        let ordered = match (hard, soft) {
            (Threshold::Percent(h), Threshold::Percent(s)) => Some(h < s),
            (Threshold::Amount(h), Threshold::Amount(s)) => Some(h < s),
            _ => None,
        };
        match ordered {
            None => refuse(
                verdict,
                format!("{KUBELET}.evictionHardMemory"),
                format!(
                    "evictionHardMemory ({hard_text}) and evictionSoftMemory ({soft_text}) must be of the same kind: both percentages or both amounts"
                ),
            ),
            Some(false) => refuse(
                verdict,
                format!("{KUBELET}.evictionHardMemory"),
                format!(
                    "evictionHardMemory ({hard_text}) must be below evictionSoftMemory ({soft_text}): the kubelet evicts at once below the hard threshold, after a grace period below the soft one"
                ),
            ),
            Some(true) => {}
        }
    }

    if let (Some((system, system_text)), Some((kube, kube_text)), Some(hard)) =
        (&system_memory, &kube_memory, hard)
    {
        let total = system + kube + hard.of(size.memory);
        if total >= size.memory {
            refuse(
                verdict,
                KUBELET,
                format!(
                    "systemReservedMemory ({}) + kubeReservedMemory ({}) + evictionHardMemory ({}) = {} leave no memory for pods on workers with {} ({}); lower the reservations or size the workers up",
                    shown(system_text, *system, mebibytes),
                    shown(kube_text, *kube, mebibytes),
                    kubelet.eviction_hard_memory,
                    mebibytes(total),
                    size.memory_text,
                    size.source,
                ),
            );
        }
    }
    if let (Some((system, system_text)), Some((kube, kube_text))) = (&system_cpu, &kube_cpu)
        && system + kube >= size.millicpu
    {
        refuse(
            verdict,
            KUBELET,
            format!(
                "systemReservedCpu ({}) + kubeReservedCpu ({}) = {}m leave no CPU for pods on workers with {} vCPUs ({}); lower the reservations or size the workers up",
                shown(system_text, *system, millicores),
                shown(kube_text, *kube, millicores),
                system + kube,
                size.millicpu / MILLI,
                size.source,
            ),
        );
    }
}

/// A reservation for a message: as written, or `computed: <value>`.
fn shown(text: &str, value: i128, format: fn(i128) -> String) -> String {
    if text == "computed" {
        format!("computed: {}", format(value))
    } else {
        text.to_string()
    }
}

/// Thousandths of a byte as MiB, e.g. `256Mi` or `35.8Mi`.
fn mebibytes(milli: i128) -> String {
    let tenths = (milli * 10 + MEBIBYTE_MILLI - 1) / MEBIBYTE_MILLI;
    if tenths % 10 == 0 {
        format!("{}Mi", tenths / 10)
    } else {
        format!("{}.{}Mi", tenths / 10, tenths % 10)
    }
}

fn millicores(milli: i128) -> String {
    format!("{milli}m")
}

// ---------------------------------------------------------------------------
// Warnings
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_as_the_kubelet_reads_them() {
        assert_eq!(parse_threshold("k", "7.5%"), Ok(Threshold::Percent(7.5)));
        assert_eq!(parse_threshold("k", "100%"), Ok(Threshold::Percent(100.0)));
        assert_eq!(
            parse_threshold("k", "500Mi"),
            Ok(Threshold::Amount(500 * MEBIBYTE_MILLI))
        );
        assert_eq!(
            parse_threshold("k", "1e9"),
            Ok(Threshold::Amount(1_000_000_000 * MILLI))
        );
        for bad in ["abc%", "-5%", "%", "1.2.3%", "banana", "0", "-1Gi"] {
            assert!(parse_threshold("k", bad).is_err(), "{bad}");
        }
        assert_eq!(
            Threshold::Percent(50.0).of(4 * GIBIBYTE_MILLI),
            2 * GIBIBYTE_MILLI
        );
        assert_eq!(mebibytes(256 * MEBIBYTE_MILLI), "256Mi");
        assert_eq!(mebibytes(MEBIBYTE_MILLI * 7 / 2), "3.5Mi");
    }
}
