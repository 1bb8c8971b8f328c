//! tenantry's monitoring artifacts (`config/monitoring/`) judged by
//! Prometheus's own parsers through `promcheck` (`hack/upstream/prometheus`):
//! the PrometheusRule loads as a Prometheus rule file, every dashboard and
//! rule query parses, reads only series tenantry serves (or Prometheus writes)
//! and filters the names other controller-runtime providers share by the
//! scrape job; the ServiceMonitor scrapes the metrics Service as deployed.
//! No control plane needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tenantry_e2e::promcheck::{self, ParsedExpr, Selector};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every series family tenantry's manager serves. docs/observability.md
/// lists the same; a name added to one belongs in the other.
const CATALOGUE: &[(&str, Kind)] = &[
    // controller-runtime compatible
    ("controller_runtime_reconcile_total", Kind::Counter),
    ("controller_runtime_reconcile_errors_total", Kind::Counter),
    ("controller_runtime_reconcile_time_seconds", Kind::Histogram),
    ("controller_runtime_max_concurrent_reconciles", Kind::Gauge),
    ("controller_runtime_active_workers", Kind::Gauge),
    ("workqueue_depth", Kind::Gauge),
    ("workqueue_adds_total", Kind::Counter),
    ("workqueue_queue_duration_seconds", Kind::Histogram),
    ("workqueue_retries_total", Kind::Counter),
    ("controller_runtime_webhook_requests_total", Kind::Counter),
    ("controller_runtime_webhook_requests_in_flight", Kind::Gauge),
    (
        "controller_runtime_webhook_latency_seconds",
        Kind::Histogram,
    ),
    ("leader_election_master_status", Kind::Gauge),
    ("process_cpu_seconds_total", Kind::Counter),
    ("process_resident_memory_bytes", Kind::Gauge),
    ("process_virtual_memory_bytes", Kind::Gauge),
    ("process_open_fds", Kind::Gauge),
    ("process_max_fds", Kind::Gauge),
    ("process_start_time_seconds", Kind::Gauge),
    // tenantry's own
    ("tenantry_build_info", Kind::Gauge),
    ("tenantry_proxmox_api_requests_total", Kind::Counter),
    (
        "tenantry_proxmox_api_request_duration_seconds",
        Kind::Histogram,
    ),
    ("tenantry_proxmox_task_duration_seconds", Kind::Histogram),
    (
        "tenantry_machine_provisioning_duration_seconds",
        Kind::Histogram,
    ),
    (
        "tenantry_machine_deletion_duration_seconds",
        Kind::Histogram,
    ),
    ("tenantry_machines", Kind::Gauge),
    (
        "tenantry_machines_unprovisioned_oldest_seconds",
        Kind::Gauge,
    ),
    ("tenantry_admission_requests_total", Kind::Counter),
    ("tenantry_kubernetes_clusters", Kind::Gauge),
    ("tenantry_kubernetes_nodes_pools", Kind::Gauge),
    ("tenantry_kubernetes_nodes_replicas", Kind::Gauge),
];

/// Series Prometheus writes itself for every target it scrapes.
const SCRAPE_SERIES: &[&str] = &["up"];

/// Names every controller-runtime provider (Cluster API's core manager,
/// the bootstrap and control plane providers) serves too, so a query must
/// say whose it means.
const SHARED_PREFIXES: &[&str] = &[
    "controller_runtime_",
    "workqueue_",
    "leader_election_",
    "process_",
    "up",
];

// What the catalogue says about the endpoint.
const NAMESPACE: &str = "tenantry-system";
/// The metrics Service, which is also the scrape job a ServiceMonitor gives.
const SERVICE: &str = "tenantry-metrics-service";
const PORT: &str = "https";
const CERT_SECRET: &str = "tenantry-webhook-server-cert";
const SERVER_NAME: &str = "tenantry-metrics-service.tenantry-system.svc";
const SELECTOR_LABELS: &[(&str, &str)] = &[
    ("cluster.x-k8s.io/provider", "infrastructure-tenantry"),
    ("control-plane", "controller-manager"),
];

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/monitoring")
        .join(file)
}

fn read(file: &str) -> String {
    let path = monitoring(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn rule_file() -> Value {
    serde_norway::from_str(&read("prometheus-rule.yaml")).expect("prometheus-rule.yaml is YAML")
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana-dashboard.json")).expect("grafana-dashboard.json is JSON")
}

/// The rules of the PrometheusRule, each as (alert or record name, rule).
fn rules() -> Vec<(String, Value)> {
    rule_file()["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules").clone())
        .map(|rule| {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .expect("a rule names its alert or record")
                .to_string();
            (name, rule)
        })
        .collect()
}

fn rule_exprs() -> Vec<(String, String)> {
    rules()
        .into_iter()
        .map(|(name, rule)| {
            let expr = rule["expr"].as_str().expect("expr").to_string();
            (name, expr)
        })
        .collect()
}

/// Every panel, those inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<Value> {
    fn walk(panels: &Value, out: &mut Vec<Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            out.push(panel.clone());
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query of the dashboard, as (panel title, expression).
fn dashboard_exprs() -> Vec<(String, String)> {
    panels(&dashboard())
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|target| target["expr"].as_str())
                .map(move |expr| (title.clone(), expr.to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The catalogue family a series name belongs to, if any: a histogram's
/// `_bucket`, `_sum` and `_count` series belong to it, its bare name does not.
fn family(series: &str) -> Option<(&'static str, Kind)> {
    CATALOGUE.iter().copied().find(|(name, kind)| match kind {
        Kind::Histogram => ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| series.strip_suffix(suffix) == Some(name)),
        Kind::Counter | Kind::Gauge => series == *name,
    })
}

/// Problems with the series the parsed expressions read: names neither in
/// the catalogue nor written by Prometheus nor recorded by our rules, and
/// shared names not filtered by `job` = `job_value`.
fn series_problems(
    labelled: &[(String, String)],
    parsed: &[ParsedExpr],
    recorded: &BTreeSet<String>,
    job_value: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for ((label, expr), parsed) in labelled.iter().zip(parsed) {
        if parsed.selectors.is_empty() {
            problems.push(format!("{label}: {expr:?} reads no series"));
        }
        for Selector { metric, matchers } in &parsed.selectors {
            if metric.is_empty() {
                problems.push(format!("{label}: {expr:?} picks names by pattern"));
                continue;
            }
            let known = family(metric).is_some()
                || SCRAPE_SERIES.contains(&metric.as_str())
                || recorded.contains(metric);
            if !known {
                problems.push(format!("{label}: {metric} is not in the catalogue"));
            }
            let shared = SHARED_PREFIXES.iter().any(|p| metric.starts_with(p));
            let by_job = matchers
                .iter()
                .any(|m| m.name == "job" && m.op == "=" && m.value == job_value);
            if shared && !by_job {
                problems.push(format!(
                    "{label}: {metric} is served by other providers too; filter it by job=\"{job_value}\""
                ));
            }
        }
    }
    problems
}

fn recorded_names() -> BTreeSet<String> {
    rules()
        .into_iter()
        .filter_map(|(name, rule)| rule["record"].as_str().map(|_| name))
        .collect()
}

fn assert_no_problems(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

#[test]
fn prometheus_loads_the_rules() {
    promcheck::check_rules(&read("prometheus-rule.yaml"))
        .unwrap_or_else(|e| panic!("prometheus-rule.yaml: {e:#}"));
}

#[test]
fn every_alert_tells_its_severity_and_what_to_look_at() {
    let mut problems = Vec::new();
    for (name, rule) in rules() {
        if rule["alert"].is_null() {
            continue;
        }
        let severity = rule["labels"]["severity"].as_str().unwrap_or("");
        if !["critical", "warning", "info"].contains(&severity) {
            problems.push(format!("{name}: severity {severity:?}"));
        }
        for annotation in ["summary", "description"] {
            if rule["annotations"][annotation]
                .as_str()
                .is_none_or(|text| text.trim().is_empty())
            {
                problems.push(format!("{name}: no {annotation}"));
            }
        }
        if !rule["annotations"]["description"]
            .as_str()
            .unwrap_or("")
            .contains("kubectl ")
        {
            problems.push(format!("{name}: the description names no kubectl command"));
        }
        if rule["for"].as_str().is_none() {
            problems.push(format!("{name}: fires on a single evaluation (no `for`)"));
        }
    }
    assert_no_problems("alerts", &problems);
}

#[test]
fn rule_expressions_read_catalogued_series() {
    let exprs = rule_exprs();
    let parsed = promcheck::parse_exprs(&exprs.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("rule expressions: {e:#}"));
    let problems = series_problems(&exprs, &parsed, &recorded_names(), SERVICE);
    assert_no_problems("rule expressions", &problems);
}

#[test]
fn every_dashboard_query_parses_and_reads_catalogued_series() {
    let exprs = dashboard_exprs();
    // Every row of the layout has queries; a walk that missed the collapsed
    // rows' panels would find far fewer.
    assert!(exprs.len() >= 30, "only {} queries found", exprs.len());
    let parsed = promcheck::parse_exprs(&exprs.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("dashboard queries: {e:#}"));
    let mut problems = series_problems(&exprs, &parsed, &recorded_names(), "$job");
    for (title, expr) in &exprs {
        if !expr.contains("job=\"$job\"") {
            problems.push(format!("{title}: {expr:?} ignores the job variable"));
        }
        // Ranges follow the scrape interval Grafana knows of, so rates are
        // never computed over fewer than two samples.
        for range in expr.split('[').skip(1) {
            if !range.starts_with("$__rate_interval]") {
                problems.push(format!(
                    "{title}: {expr:?} has a range other than $__rate_interval"
                ));
            }
        }
    }
    assert_no_problems("dashboard queries", &problems);
}

#[test]
fn dashboard_has_the_agreed_shape() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "tenantry-overview");
    assert_eq!(dashboard["schemaVersion"], 39);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} variable"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    assert_eq!(variable("job")["current"]["value"], SERVICE);

    let all = panels(&dashboard);
    let rows: Vec<&str> = all
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Overview",
            "Machines",
            "Controllers",
            "Proxmox VE",
            "Admission",
            "Process"
        ]
    );
    let mut ids = BTreeSet::new();
    for panel in &all {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "{title}: panel id used twice"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{title}: not on the datasource variable"
            );
        }
    }
}

#[test]
fn service_monitor_scrapes_the_metrics_service() {
    let monitor: Value = serde_norway::from_str(&read("service-monitor.yaml"))
        .expect("service-monitor.yaml is YAML");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["kind"], "ServiceMonitor");
    assert_eq!(monitor["metadata"]["namespace"], NAMESPACE);
    let spec = &monitor["spec"];
    for (key, value) in SELECTOR_LABELS {
        assert_eq!(
            spec["selector"]["matchLabels"][key], *value,
            "selector {key}"
        );
    }
    assert_eq!(spec["namespaceSelector"]["matchNames"][0], NAMESPACE);
    let endpoints = spec["endpoints"].as_array().expect("endpoints");
    assert_eq!(endpoints.len(), 1);
    let endpoint = &endpoints[0];
    assert_eq!(endpoint["port"], PORT);
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["path"], "/metrics");
    // Prometheus's own token: the manager authorises the scrape by it.
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let tls = &endpoint["tlsConfig"];
    assert_eq!(tls["ca"]["secret"]["name"], CERT_SECRET);
    assert_eq!(tls["ca"]["secret"]["key"], "ca.crt");
    assert_eq!(tls["serverName"], SERVER_NAME);
    assert!(
        tls["insecureSkipVerify"].is_null(),
        "the scrape must verify the serving certificate"
    );
    assert!(
        read("service-monitor.yaml").contains("tenantry-metrics-reader"),
        "the header names the ClusterRole to bind Prometheus to"
    );
}

/// The endpoint the ServiceMonitor expects is what the provider's
/// components deploy: the Service, its port, the certificate's Secret and
/// name, the reader ClusterRole.
#[test]
fn service_monitor_matches_the_released_components() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/release/infrastructure-components.yaml");
    let text = std::fs::read_to_string(&path).expect("read infrastructure-components.yaml");
    let objects: Vec<Value> = text
        .split("\n---")
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_norway::from_str(doc).expect("a components document is YAML"))
        .collect();
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the components have no {kind} {name}"))
    };
    let service = find("Service", SERVICE);
    assert_eq!(service["metadata"]["namespace"], NAMESPACE);
    for (key, value) in SELECTOR_LABELS {
        assert_eq!(
            service["metadata"]["labels"][key], *value,
            "Service label {key}"
        );
    }
    let ports = service["spec"]["ports"].as_array().expect("Service ports");
    assert!(
        ports.iter().any(|p| p["name"] == PORT && p["port"] == 8443),
        "the Service has no port {PORT} (8443): {ports:?}"
    );
    let certificate = find("Certificate", "tenantry-serving-cert");
    assert_eq!(certificate["spec"]["secretName"], CERT_SECRET);
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .any(|n| *n == SERVER_NAME),
        "the serving certificate does not name {SERVER_NAME}"
    );
    let reader = find("ClusterRole", "tenantry-metrics-reader");
    assert_eq!(reader["rules"][0]["nonResourceURLs"][0], "/metrics");
    assert_eq!(reader["rules"][0]["verbs"][0], "get");
}

#[test]
fn prometheus_refuses_what_it_cannot_load() {
    let broken = "sum(rate(tenantry_machines[5m])".to_string();
    let error = promcheck::check_exprs(&["up".to_string(), broken.clone()])
        .expect_err("an unclosed parenthesis parses");
    assert!(
        format!("{error:#}").contains("expression 1"),
        "the error names the broken expression: {error:#}"
    );
    assert!(
        promcheck::check_exprs(&["rate(up[$__rate_interval]) + $job".to_string()]).is_err(),
        "a variable outside a label matcher parses"
    );

    // The real rule file with one expression broken.
    let rules = read("prometheus-rule.yaml").replacen(
        "expr: absent(up{job=\"tenantry-metrics-service\"} == 1)",
        &format!("expr: {broken}"),
        1,
    );
    assert_ne!(
        rules,
        read("prometheus-rule.yaml"),
        "the rule to break was found"
    );
    let error = promcheck::check_rules(&rules).expect_err("a broken rule loads");
    assert!(
        format!("{error:#}").contains("TenantryManagerDown"),
        "the error names the rule: {error:#}"
    );
    // And an alert template that does not parse.
    let rules = read("prometheus-rule.yaml").replacen("{{ $labels.name }}", "{{ $labels.name ", 1);
    assert!(
        promcheck::check_rules(&rules).is_err(),
        "a broken template loads"
    );

    // A series tenantry does not serve, and a shared one without the job.
    let exprs = [
        (
            "typo".to_string(),
            "tenantry_machine{ready=\"false\"}".to_string(),
        ),
        (
            "unfiltered".to_string(),
            "controller_runtime_active_workers".to_string(),
        ),
    ];
    let parsed = promcheck::parse_exprs(&exprs.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>())
        .expect("both parse");
    let problems = series_problems(&exprs, &parsed, &BTreeSet::new(), SERVICE);
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[test]
fn scrape_bodies_are_read_as_prometheus_reads_them() {
    let openmetrics = "# TYPE tenantry_machines gauge\n\
        tenantry_machines{substrate=\"kubevirt\",ready=\"false\",reason=\"WaitingForBootstrapData\"} 2\n\
        # TYPE workqueue_adds counter\n\
        workqueue_adds_total{controller=\"kubevirtmachine\",name=\"kubevirtmachine\"} 7\n\
        # EOF\n";
    let samples = promcheck::parse_scrape(
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        openmetrics,
    )
    .expect("OpenMetrics body");
    assert_eq!(samples.len(), 2, "{samples:?}");
    assert_eq!(samples[0].name, "tenantry_machines");
    assert_eq!(samples[0].labels["reason"], "WaitingForBootstrapData");
    assert_eq!(samples[0].value, 2.0);
    assert_eq!(samples[1].name, "workqueue_adds_total");

    // OpenMetrics requires the closing # EOF; the text format does not.
    let body = openmetrics.replace("# EOF\n", "");
    assert!(promcheck::parse_scrape("application/openmetrics-text; version=1.0.0", &body).is_err());
    let text =
        "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e+09\nx NaN\n";
    let samples = promcheck::parse_scrape("text/plain; version=0.0.4; charset=utf-8", text)
        .expect("text format body");
    assert_eq!(samples[0].value, 1.7e9);
    assert!(samples[1].value.is_nan());
    assert!(promcheck::parse_scrape("application/json", text).is_err());
    assert!(promcheck::version().expect("version").contains("v0."));
}
