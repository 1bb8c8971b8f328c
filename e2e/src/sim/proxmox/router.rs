//! The endpoint table: method + path template -> handler, and what a
//! handler gets (`Call`) and returns (`Reply`).

use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde_json::Value;

use super::error::ApiResult;
use super::params::Params;
use super::permissions::Perms;
use super::server::Shared;
use super::state::Cluster;
use super::storage::Upload;
use super::{access, agent, cluster_api, pools, qemu, storage, tasks};

/// One API call, with the cluster locked for its duration.
pub struct Call<'a> {
    pub shared: &'a Arc<Shared>,
    pub cluster: &'a mut Cluster,
    /// `user@realm!token` of the caller.
    pub authid: &'a str,
    /// Path, query and body parameters merged.
    pub params: Params,
    pub upload: Option<Upload>,
}

impl Call<'_> {
    pub fn perms(&self) -> Perms<'_> {
        Perms::new(&self.cluster.users, self.authid)
    }

    pub fn node(&self) -> String {
        self.params.string("node").unwrap_or_default()
    }

    pub fn vmid(&self) -> u32 {
        self.params.vmid("vmid").unwrap_or_default()
    }
}

/// A successful answer: `{"data": …}` plus `total` for paged lists.
#[derive(Debug)]
pub struct Reply {
    pub data: Value,
    pub total: Option<usize>,
}

impl Reply {
    pub fn null() -> Self {
        Value::Null.into()
    }

    pub fn with_total(data: Value, total: usize) -> Self {
        Self {
            data,
            total: Some(total),
        }
    }
}

impl From<Value> for Reply {
    fn from(data: Value) -> Self {
        Self { data, total: None }
    }
}

pub type Handler = fn(&mut Call<'_>) -> ApiResult<Reply>;

pub struct Route {
    pub method: &'static str,
    pub template: &'static str,
    pub handler: Handler,
    pattern: Regex,
    names: Vec<&'static str>,
}

impl Route {
    fn new(method: &'static str, template: &'static str, handler: Handler) -> Self {
        let mut pattern = String::from("^");
        let mut names = Vec::new();
        for segment in template.split('/').filter(|s| !s.is_empty()) {
            pattern.push('/');
            match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                // A volume id keeps its slashes (`local:iso/seed.iso`).
                Some("volume") => {
                    names.push("volume");
                    pattern.push_str("(.+)");
                }
                Some(name) => {
                    names.push(name);
                    pattern.push_str("([^/]+)");
                }
                None => pattern.push_str(&regex::escape(segment)),
            }
        }
        if template == "/" {
            pattern.push('/');
        }
        pattern.push('$');
        Self {
            method,
            template,
            handler,
            pattern: Regex::new(&pattern).expect("valid route pattern"),
            names,
        }
    }

    /// Whether PVE proxies this call to the node named in the path.
    pub fn proxied_to_node(&self) -> bool {
        self.template.starts_with("/nodes/{node}/")
    }

    pub fn is_upload(&self) -> bool {
        self.template == "/nodes/{node}/storage/{storage}/upload"
    }
}

/// What the path resolves to.
pub enum Resolved<'a> {
    Found(&'a Route, Vec<(&'static str, String)>),
    /// The path exists but not for this method, or does not exist: 501.
    NotImplemented,
}

pub fn resolve(method: &str, path: &str) -> Resolved<'static> {
    let path = if path.len() > 1 {
        path.trim_end_matches('/')
    } else {
        path
    };
    for route in ROUTES.iter().filter(|r| r.method == method) {
        if let Some(captures) = route.pattern.captures(path) {
            let values = route
                .names
                .iter()
                .enumerate()
                .map(|(index, name)| {
                    let raw = captures.get(index + 1).map_or("", |m| m.as_str());
                    (*name, decode_segment(raw))
                })
                .collect();
            return Resolved::Found(route, values);
        }
    }
    Resolved::NotImplemented
}

fn decode_segment(raw: &str) -> String {
    url::form_urlencoded::parse(format!("v={}", raw.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| raw.to_string())
}

static ROUTES: LazyLock<Vec<Route>> = LazyLock::new(|| {
    let r = Route::new;
    vec![
        r("GET", "/version", cluster_api::version),
        r("GET", "/nodes", cluster_api::nodes),
        r("GET", "/nodes/{node}/status", cluster_api::node_status),
        r("GET", "/cluster/resources", cluster_api::resources),
        r("GET", "/cluster/nextid", cluster_api::nextid),
        r("GET", "/cluster/status", cluster_api::cluster_status),
        // qemu-server
        r("GET", "/nodes/{node}/qemu", qemu::list),
        r("POST", "/nodes/{node}/qemu", qemu::create),
        r("GET", "/nodes/{node}/lxc", qemu::lxc_list),
        r("GET", "/nodes/{node}/qemu/{vmid}", qemu::index),
        r("DELETE", "/nodes/{node}/qemu/{vmid}", qemu::destroy),
        r("GET", "/nodes/{node}/qemu/{vmid}/config", qemu::config),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/config",
            qemu::update_async,
        ),
        r("PUT", "/nodes/{node}/qemu/{vmid}/config", qemu::update_sync),
        r("GET", "/nodes/{node}/qemu/{vmid}/pending", qemu::pending),
        r(
            "GET",
            "/nodes/{node}/qemu/{vmid}/status/current",
            qemu::status_current,
        ),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/start",
            qemu::start,
        ),
        r("POST", "/nodes/{node}/qemu/{vmid}/status/stop", qemu::stop),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/shutdown",
            qemu::shutdown,
        ),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/reboot",
            qemu::reboot,
        ),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/reset",
            qemu::reset,
        ),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/suspend",
            qemu::suspend,
        ),
        r(
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/resume",
            qemu::resume,
        ),
        r("POST", "/nodes/{node}/qemu/{vmid}/clone", qemu::clone),
        r("PUT", "/nodes/{node}/qemu/{vmid}/resize", qemu::resize),
        r("POST", "/nodes/{node}/qemu/{vmid}/template", qemu::template),
        r("PUT", "/nodes/{node}/qemu/{vmid}/unlink", qemu::unlink),
        // guest agent
        r(
            "GET",
            "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
            agent::network_get_interfaces,
        ),
        r(
            "GET",
            "/nodes/{node}/qemu/{vmid}/agent/get-osinfo",
            agent::get_osinfo,
        ),
        r(
            "GET",
            "/nodes/{node}/qemu/{vmid}/agent/get-host-name",
            agent::get_host_name,
        ),
        r("POST", "/nodes/{node}/qemu/{vmid}/agent/ping", agent::ping),
        r("POST", "/nodes/{node}/qemu/{vmid}/agent/exec", agent::exec),
        r(
            "GET",
            "/nodes/{node}/qemu/{vmid}/agent/exec-status",
            agent::exec_status,
        ),
        // tasks
        r("GET", "/nodes/{node}/tasks", tasks::list),
        r("GET", "/nodes/{node}/tasks/{upid}/status", tasks::status),
        r("GET", "/nodes/{node}/tasks/{upid}/log", tasks::log),
        // storage
        r("GET", "/nodes/{node}/storage", storage::list),
        r(
            "GET",
            "/nodes/{node}/storage/{storage}/status",
            storage::status,
        ),
        r(
            "GET",
            "/nodes/{node}/storage/{storage}/content",
            storage::content,
        ),
        r(
            "POST",
            "/nodes/{node}/storage/{storage}/content",
            storage::allocate,
        ),
        r(
            "GET",
            "/nodes/{node}/storage/{storage}/content/{volume}",
            storage::volume_info,
        ),
        r(
            "DELETE",
            "/nodes/{node}/storage/{storage}/content/{volume}",
            storage::delete_volume,
        ),
        r(
            "POST",
            "/nodes/{node}/storage/{storage}/upload",
            storage::upload,
        ),
        // pools
        r("GET", "/pools", pools::index),
        r("POST", "/pools", pools::create),
        r("PUT", "/pools", pools::update),
        r("DELETE", "/pools", pools::delete),
        r("GET", "/pools/{poolid}", pools::read_deprecated),
        r("PUT", "/pools/{poolid}", pools::update),
        r("DELETE", "/pools/{poolid}", pools::delete),
        // access control
        r("GET", "/access/users", access::users),
        r("POST", "/access/users", access::create_user),
        r("GET", "/access/users/{userid}", access::read_user),
        r("PUT", "/access/users/{userid}", access::update_user),
        r("DELETE", "/access/users/{userid}", access::delete_user),
        r("GET", "/access/users/{userid}/token", access::tokens),
        r(
            "GET",
            "/access/users/{userid}/token/{tokenid}",
            access::read_token,
        ),
        r(
            "POST",
            "/access/users/{userid}/token/{tokenid}",
            access::create_token,
        ),
        r(
            "PUT",
            "/access/users/{userid}/token/{tokenid}",
            access::update_token,
        ),
        r(
            "DELETE",
            "/access/users/{userid}/token/{tokenid}",
            access::delete_token,
        ),
        r("GET", "/access/groups", access::groups),
        r("POST", "/access/groups", access::create_group),
        r("GET", "/access/roles", access::roles),
        r("POST", "/access/roles", access::create_role),
        r("GET", "/access/roles/{roleid}", access::read_role),
        r("PUT", "/access/roles/{roleid}", access::update_role),
        r("DELETE", "/access/roles/{roleid}", access::delete_role),
        r("GET", "/access/acl", access::read_acl),
        r("PUT", "/access/acl", access::update_acl),
        r("GET", "/access/permissions", access::permissions),
    ]
});

/// Every endpoint as `METHOD template`, for the README and tests.
pub fn endpoints() -> Vec<String> {
    ROUTES
        .iter()
        .map(|r| format!("{} {}", r.method, r.template))
        .collect()
}
