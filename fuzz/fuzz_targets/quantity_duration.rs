//! Tenantry's quantity and duration parsers on arbitrary text:
//! - `tenantry_api::tenant_nodes::quantity_milli_value`: Kubernetes
//!   quantities (CPU, memory, disk sizes of KubernetesNodes pools);
//! - `tenantry_api::remediation::parse_duration`: Go `time.ParseDuration`
//!   syntax, the remediation strategy's `timeout`;
//! - `tenantry_provider::tenant::kubernetes_nodes::render::duration_seconds`: whole s/m/h
//!   durations, the pool's MachineHealthCheck timeouts.
//!
//! Input: UTF-8 text; the first line is `a`, the second (if any) `b`. Each
//! parser reads `a` and `b`, and `a` followed by `b`.
//!
//! Invariants (none of the three has a formatter, so no parse∘format):
//! - quantities: a `+` sign changes nothing and a `-` sign negates; a
//!   decimal suffix means its power of ten (`k` is `e3`, `m` is `e-3`, …);
//!   each binary suffix is 1024 times the one before, and `Ki` 1024 times
//!   no suffix (exact for up to three decimals); a plain integer `n` is
//!   `n * 1000` thousandths; too large is `None`, never a panic.
//! - parse_duration accepts exactly what the CRD's pattern for `timeout`
//!   admits (short of values beyond `Duration::MAX`), and segments add up:
//!   `parse(a + b) == parse(a) + parse(b)`.
//! - duration_seconds reads every value the CRD's rule for the
//!   nodeHealthCheck timeouts admits, as h·3600 + m·60 + s; is positive;
//!   adds up over segments; and agrees with parse_duration.

#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use regex::Regex;
use tenantry_api::remediation::parse_duration;
use tenantry_api::tenant_nodes::quantity_milli_value;
use tenantry_provider::tenant::kubernetes_nodes::render::duration_seconds;

/// The `pattern` of `RemediationStrategy.timeout` (api/src/remediation.rs).
static DURATION_PATTERN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$").expect("regex"));

/// The CEL rule of the nodeHealthCheck timeouts (`WHOLE_DURATION_RULE`,
/// api/src/tenant_nodes.rs), with the hours, minutes and seconds captured.
static WHOLE_DURATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:(?<h>[1-9][0-9]{0,5})h(?:(?<hm>[0-9]{1,6})m)?(?:(?<hs>[0-9]{1,6})s)?|(?<m>[1-9][0-9]{0,5})m(?:(?<ms>[0-9]{1,6})s)?|(?<s>[1-9][0-9]{0,5})s)$",
    )
    .expect("regex")
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.splitn(2, '\n');
    let a = lines.next().unwrap_or_default();
    let b = lines.next();

    for part in [Some(a), b].into_iter().flatten() {
        check_quantity(part);
        check_parse_duration(part);
        check_duration_seconds(part);
    }
    if let Some(b) = b {
        let joined = format!("{a}{b}");
        check_quantity(&joined);
        check_parse_duration(&joined);
        check_duration_seconds(&joined);
        durations_add_up(a, b, &joined);
    }
});

/// `[0-9]*(\.[0-9]*)?` with at least one digit: a quantity without sign or
/// suffix.
fn plain_decimal(text: &str) -> Option<usize> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    (digits(whole) && digits(fraction) && !(whole.is_empty() && fraction.is_empty()))
        .then_some(fraction.len())
}

fn check_quantity(text: &str) {
    let value = quantity_milli_value(text);
    if text.starts_with(['+', '-']) {
        return;
    }
    assert_eq!(quantity_milli_value(&format!("+{text}")), value, "+{text}");
    assert_eq!(
        quantity_milli_value(&format!("-{text}")),
        value.map(|v| -v),
        "-{text}"
    );

    let Some(fraction_digits) = plain_decimal(text) else {
        return;
    };
    for (suffix, exponent) in [
        ("n", -9),
        ("u", -6),
        ("m", -3),
        ("k", 3),
        ("M", 6),
        ("G", 9),
        ("T", 12),
        ("P", 15),
        ("E", 18),
    ] {
        assert_eq!(
            quantity_milli_value(&format!("{text}{suffix}")),
            quantity_milli_value(&format!("{text}e{exponent}")),
            "{text}{suffix} against {text}e{exponent}"
        );
    }
    assert_eq!(quantity_milli_value(&format!("{text}e0")), value);
    assert_eq!(quantity_milli_value(&format!("{text}E+0")), value);

    if fraction_digits <= 3 {
        let mut previous = value;
        for suffix in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"] {
            let scaled = quantity_milli_value(&format!("{text}{suffix}"));
            assert_eq!(
                scaled,
                previous.and_then(|v| v.checked_mul(1024)),
                "{text}{suffix}"
            );
            previous = scaled;
        }
    }
    if fraction_digits == 0
        && text.len() <= 27
        && let Ok(n) = text.parse::<i128>()
    {
        assert_eq!(value, Some(n * 1000), "{text}");
    }
}

fn check_parse_duration(text: &str) {
    let parsed = parse_duration(text);
    let admitted = DURATION_PATTERN.is_match(text);
    match &parsed {
        Ok(_) => assert!(admitted, "{text:?} parsed, but the CRD refuses it"),
        Err(message) => {
            assert!(message.contains(&format!("{text:?}")), "{message}");
            // Only a value beyond Duration::MAX (584 billion years) may fail
            // after the schema admitted it.
            assert!(
                !admitted || longest_digit_run(text) >= 12,
                "{text:?} admitted by the CRD but refused: {message}"
            );
        }
    }
}

fn longest_digit_run(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0)
}

fn check_duration_seconds(text: &str) {
    let seconds = duration_seconds(text);
    if let Some(seconds) = seconds {
        assert!(seconds > 0, "{text:?}: {seconds}");
        let parsed = parse_duration(text).expect("a whole duration is a Go duration");
        assert!(
            close(parsed, Duration::from_secs(seconds as u64)),
            "{text:?}: {seconds}s against {parsed:?}"
        );
    }
    if let Some(captures) = WHOLE_DURATION.captures(text) {
        let field = |name: &str| {
            captures
                .name(name)
                .map_or(0, |m| m.as_str().parse::<i64>().expect("at most 6 digits"))
        };
        let want = (field("h")) * 3600
            + (field("hm") + field("m")) * 60
            + field("hs")
            + field("ms")
            + field("s");
        assert_eq!(seconds, Some(want), "{text:?} is admitted by the CRD");
    }
}

fn durations_add_up(a: &str, b: &str, joined: &str) {
    if let (Ok(x), Ok(y)) = (parse_duration(a), parse_duration(b)) {
        match (parse_duration(joined), x.checked_add(y)) {
            (Ok(sum), Some(want)) => {
                assert!(close(sum, want), "{joined:?}: {sum:?} against {want:?}")
            }
            // Past Duration::MAX.
            (Err(_), None) => {}
            (Err(_), Some(want)) => assert!(want > Duration::MAX / 2, "{joined:?} refused"),
            (Ok(sum), None) => assert!(sum > Duration::MAX / 2, "{joined:?}: {sum:?}"),
        }
    }
    if let (Some(x), Some(y)) = (duration_seconds(a), duration_seconds(b)) {
        assert_eq!(duration_seconds(joined), x.checked_add(y), "{joined:?}");
    }
}

/// Equal up to f64 rounding: parse_duration adds its segments as seconds in
/// an f64.
fn close(a: Duration, b: Duration) -> bool {
    let (a, b) = (a.as_secs_f64(), b.as_secs_f64());
    (a - b).abs() <= 3e-9 + a.max(b) * 1e-12
}
