//! Proxmox VE API requests and tasks, labelled by the API's own path
//! templates (`/nodes/{node}/qemu/{vmid}/clone`): bounded by the endpoints
//! tenantry calls, whatever the number of nodes and VMs.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Histograms, Labels, histogram};

const REQUEST_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

const TASK_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
];

fn request_histogram() -> Histogram {
    histogram(REQUEST_BUCKETS)
}

fn task_histogram() -> Histogram {
    histogram(TASK_BUCKETS)
}

pub struct ProxmoxSeries {
    requests: Family<Labels, Counter>,
    latency: Histograms,
    tasks: Histograms,
}

/// How a task ended, as tenantry saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskResult {
    Ok,
    Failed,
    /// Still running when tenantry stopped waiting.
    Timeout,
}

impl ProxmoxSeries {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let series = Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(request_histogram),
            tasks: Family::new_with_constructor(task_histogram),
        };
        registry.register(
            "tenantry_proxmox_api_requests",
            "Requests to Proxmox VE APIs, per endpoint template, method and status class (error: no answer)",
            series.requests.clone(),
        );
        registry.register(
            "tenantry_proxmox_api_request_duration_seconds",
            "Time to a Proxmox VE API's answer, per endpoint template and method",
            series.latency.clone(),
        );
        registry.register(
            "tenantry_proxmox_task_duration_seconds",
            "Time from a Proxmox VE task's start to its end as tenantry saw it, per task type and result",
            series.tasks.clone(),
        );
        series
    }

    /// One request to `path` answered with `status` (`None`: no answer).
    pub fn request(&self, method: &str, path: &str, status: Option<u16>, took: Duration) {
        let endpoint = endpoint_template(path);
        let code = match status {
            Some(status) => format!("{}xx", status / 100),
            None => "error".to_string(),
        };
        self.requests
            .get_or_create(&vec![
                ("endpoint", endpoint.clone()),
                ("method", method.to_string()),
                ("code", code),
            ])
            .inc();
        self.latency
            .get_or_create(&vec![
                ("endpoint", endpoint),
                ("method", method.to_string()),
            ])
            .observe(took.as_secs_f64());
    }

    /// A task of type `kind` (the UPID's, e.g. `qmclone`) ended.
    pub fn task(&self, kind: &str, result: TaskResult, took: Duration) {
        let result = match result {
            TaskResult::Ok => "ok",
            TaskResult::Failed => "failed",
            TaskResult::Timeout => "timeout",
        };
        self.tasks
            .get_or_create(&vec![
                ("type", kind.to_string()),
                ("result", result.to_string()),
            ])
            .observe(took.as_secs_f64());
    }
}

/// The PVE API schema's template of a request path: the segment after a
/// collection that names one member (`nodes`, `qemu`, `storage`, …) becomes
/// that member's placeholder, and a volume id (`content/<volid>`, whose
/// `/` stays in the path) is one placeholder.
pub fn endpoint_template(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut template = String::new();
    let mut placeholder: Option<&str> = None;
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        template.push('/');
        if let Some(name) = placeholder.take() {
            template.push_str(name);
            if name == "{volume}" {
                return template;
            }
            continue;
        }
        template.push_str(segment);
        placeholder = match segment {
            "nodes" => Some("{node}"),
            "qemu" | "lxc" => Some("{vmid}"),
            "storage" => Some("{storage}"),
            "content" => Some("{volume}"),
            "tasks" => Some("{upid}"),
            "pools" => Some("{poolid}"),
            "users" => Some("{userid}"),
            "token" => Some("{tokenid}"),
            "roles" => Some("{roleid}"),
            "groups" => Some("{groupid}"),
            _ => None,
        };
    }
    if template.is_empty() {
        template.push('/');
    }
    template
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_the_api_schemas_templates() {
        for (path, template) in [
            ("/version", "/version"),
            ("/nodes", "/nodes"),
            ("/nodes/pve-1/status", "/nodes/{node}/status"),
            (
                "/nodes/pve-1/qemu/9000/clone",
                "/nodes/{node}/qemu/{vmid}/clone",
            ),
            (
                "/nodes/pve-1/qemu/105/status/start",
                "/nodes/{node}/qemu/{vmid}/status/start",
            ),
            (
                "/nodes/pve-1/qemu/105/agent/network-get-interfaces",
                "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
            ),
            (
                "/nodes/pve-1/storage/local/content/local:iso/user-data-105.iso",
                "/nodes/{node}/storage/{storage}/content/{volume}",
            ),
            (
                "/nodes/pve-1/storage/local/upload",
                "/nodes/{node}/storage/{storage}/upload",
            ),
            (
                "/nodes/pve-1/tasks/UPID:pve-1:0001:0002:0003:qmclone:105:root@pam:/status",
                "/nodes/{node}/tasks/{upid}/status",
            ),
            ("/pools/tenant-a", "/pools/{poolid}"),
            ("/cluster/resources?type=vm", "/cluster/resources"),
            ("/access/permissions", "/access/permissions"),
            (
                "/access/users/capmox@pve/token/capi",
                "/access/users/{userid}/token/{tokenid}",
            ),
        ] {
            assert_eq!(endpoint_template(path), template, "{path}");
        }
    }

    #[test]
    fn requests_are_counted_by_template_and_status_class() {
        let mut registry = Registry::default();
        let series = ProxmoxSeries::register(&mut registry);
        let ms = Duration::from_millis(4);
        series.request("POST", "/nodes/a/qemu/1/clone", Some(200), ms);
        series.request("POST", "/nodes/b/qemu/2/clone", Some(200), ms);
        series.request("POST", "/nodes/b/qemu/2/clone", Some(503), ms);
        series.request("GET", "/version", None, ms);
        series.task("qmclone", TaskResult::Ok, Duration::from_secs(3));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"tenantry_proxmox_api_requests_total{endpoint="/nodes/{node}/qemu/{vmid}/clone",method="POST",code="2xx"} 2"#,
            r#"tenantry_proxmox_api_requests_total{endpoint="/nodes/{node}/qemu/{vmid}/clone",method="POST",code="5xx"} 1"#,
            r#"tenantry_proxmox_api_requests_total{endpoint="/version",method="GET",code="error"} 1"#,
            r#"tenantry_proxmox_task_duration_seconds_count{type="qmclone",result="ok"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
