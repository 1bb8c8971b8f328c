//! Prometheus's own verdict on tenantry's monitoring: `promcheck`
//! (`hack/upstream/prometheus`, a small main over
//! `github.com/prometheus/prometheus` at the pinned version) checks rule
//! files and PromQL with Prometheus's parsers and reads a `/metrics` body
//! with the parser a Prometheus scrape picks for its Content-Type.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::upstream::{Binary, Upstream};

/// One sample of a scrape, as Prometheus stores it: the metric name, the
/// other labels, the value (NaN and infinities included).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Checks a PrometheusRule manifest's rule groups as Prometheus loads a rule
/// file (`model/rulefmt`: every expression through the PromQL parser, alert
/// labels and annotations through the template parser). The error carries
/// every problem Prometheus names.
pub fn check_rules(yaml: &str) -> anyhow::Result<()> {
    let output = run(&["rules"], yaml)?;
    verdict(&output, "rules")
}

/// Parses each expression with Prometheus's PromQL parser, after Grafana's
/// interval variables (`$__rate_interval`, `$__interval`, `$__range`) are
/// replaced by a duration. The error names each expression that fails.
pub fn check_exprs(exprs: &[String]) -> anyhow::Result<()> {
    parse_exprs(exprs).map(drop)
}

/// What Prometheus's parser found in one expression.
#[derive(Clone, Debug, Deserialize)]
pub struct ParsedExpr {
    /// The metric names its selectors ask for.
    pub metrics: BTreeSet<String>,
    /// Its vector selectors, in the order they appear.
    pub selectors: Vec<Selector>,
}

/// One vector selector: the metric name it asks for (empty when it picks
/// names by regular expression) and its other label matchers.
#[derive(Clone, Debug, Deserialize)]
pub struct Selector {
    pub metric: String,
    pub matchers: Vec<Matcher>,
}

/// A label matcher as PromQL writes it: `name op "value"`, `op` one of
/// `=`, `!=`, `=~`, `!~`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Matcher {
    pub name: String,
    pub op: String,
    pub value: String,
}

/// Parses each expression as [`check_exprs`] does and reports, per
/// expression in order, the selectors Prometheus's parser found (so names
/// inside strings, functions and label names never count).
pub fn parse_exprs(exprs: &[String]) -> anyhow::Result<Vec<ParsedExpr>> {
    #[derive(Deserialize)]
    struct Report {
        index: usize,
        #[serde(flatten)]
        parsed: ParsedExpr,
    }
    let output = run(&["exprs"], &serde_json::to_string(exprs)?)?;
    verdict(&output, "exprs")?;
    let mut parsed = vec![None; exprs.len()];
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let report: Report =
            serde_json::from_str(line).with_context(|| format!("promcheck exprs said {line:?}"))?;
        *parsed
            .get_mut(report.index)
            .context("promcheck exprs reported an expression it was not given")? =
            Some(report.parsed);
    }
    parsed
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.with_context(|| format!("promcheck exprs skipped expression {i}")))
        .collect()
}

/// Reads a scrape body as Prometheus does when the target answers with
/// `content_type` (OpenMetrics for `application/openmetrics-text`, the text
/// format for `text/plain`): every sample, in the body's order. A body
/// Prometheus would refuse, or a series repeated in it, is an error.
pub fn parse_scrape(content_type: &str, body: &str) -> anyhow::Result<Vec<Sample>> {
    #[derive(Deserialize)]
    struct Line {
        name: String,
        labels: BTreeMap<String, String>,
        value: Value,
    }
    // promcheck spells non-finite values as strings: JSON numbers cannot
    // hold them.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Number(f64),
        Special(String),
    }
    let output = run(&["metrics", "--content-type", content_type], body)?;
    verdict(&output, "metrics")?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let parsed: Line = serde_json::from_str(line)
                .with_context(|| format!("promcheck metrics said {line:?}"))?;
            let value = match parsed.value {
                Value::Number(v) => v,
                Value::Special(s) => match s.as_str() {
                    "NaN" => f64::NAN,
                    "+Inf" => f64::INFINITY,
                    "-Inf" => f64::NEG_INFINITY,
                    other => bail!("promcheck metrics: unknown value {other:?}"),
                },
            };
            Ok(Sample {
                name: parsed.name,
                labels: parsed.labels,
                value,
            })
        })
        .collect()
}

/// The pinned Prometheus version, as promcheck reports it.
pub fn version() -> anyhow::Result<String> {
    let output = run(&["--version"], "")?;
    verdict(&output, "--version")?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn run(args: &[&str], input: &str) -> anyhow::Result<Output> {
    let binary = Upstream::locate()?.binary(Binary::Promcheck)?;
    let mut child = Command::new(&binary)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", binary.display()))?;
    let mut stdin = child.stdin.take().context("promcheck stdin")?;
    // Written from a thread: a large body would otherwise fill the pipes
    // both ways and stall both processes.
    let input = input.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().context("wait for promcheck")?;
    // promcheck may stop reading early (a usage error), which breaks the pipe;
    // its exit status then says what went wrong.
    let _ = writer.join();
    Ok(output)
}

fn verdict(output: &Output, mode: &str) -> anyhow::Result<()> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    match output.status.code() {
        Some(0) => Ok(()),
        Some(1) => bail!("Prometheus refuses it ({mode}):\n{}", stderr.trim_end()),
        _ => bail!("promcheck {mode} failed ({}): {stderr}", output.status),
    }
}
