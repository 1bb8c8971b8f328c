//! Counting apiserver requests: the apiserver's own `apiserver_request_total`
//! (everything every client sent) minus what the benchmark's own clients sent
//! (the harness driver and the simulators, counted as they send), leaves what
//! the provider under test (plus kube-controller-manager's garbage collector
//! acting on its objects) cost the apiserver.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use kube::client::ClientBuilder;

/// Requests by apiserver verb (`GET`, `LIST`, `POST`, `APPLY`, ...).
pub type VerbCounts = BTreeMap<String, u64>;

/// The verbs a benchmark reports. `WATCH` is left out: the apiserver counts a
/// watch when it ends, so watches still open at a snapshot are missing, and
/// their number follows the kinds watched, not the machines.
pub const REPORTED_VERBS: &[&str] = &[
    "GET",
    "LIST",
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Requests sent through clients made by [`RequestTally::client`].
#[derive(Clone, Debug, Default)]
pub struct RequestTally {
    counts: Arc<Mutex<VerbCounts>>,
}

impl RequestTally {
    /// A client for `config` whose requests are counted here.
    pub fn client(&self, config: kube::Config) -> anyhow::Result<kube::Client> {
        let counts = self.counts.clone();
        let builder = ClientBuilder::try_from(config).context("build a kube client")?;
        let layer =
            tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
                let verb = verb_of(
                    request.method(),
                    request.uri(),
                    request
                        .headers()
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok()),
                );
                *counts
                    .lock()
                    .expect("request tally")
                    .entry(verb.to_string())
                    .or_default() += 1;
                request
            });
        Ok(builder.with_layer(&layer).build())
    }

    /// The counts so far.
    pub fn snapshot(&self) -> VerbCounts {
        self.counts.lock().expect("request tally").clone()
    }
}

/// The verb the apiserver files a request under, as its request-info
/// resolver names it for `apiserver_request_total`.
pub fn verb_of(method: &http::Method, uri: &http::Uri, content_type: Option<&str>) -> &'static str {
    let query = uri.query().unwrap_or("");
    let watch = query
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1");
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segments.first() {
        Some(&"api") if segments.len() >= 2 => &segments[2..],
        Some(&"apis") if segments.len() >= 3 => &segments[3..],
        _ => &[],
    };
    let resource_path = if rest.len() >= 3 && rest[0] == "namespaces" {
        &rest[2..]
    } else {
        rest
    };
    let collection = resource_path.len() == 1;
    match *method {
        http::Method::GET if watch => "WATCH",
        http::Method::GET if collection => "LIST",
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH if content_type.is_some_and(|c| c.contains("apply-patch")) => "APPLY",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE if collection => "DELETECOLLECTION",
        http::Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

/// One `apiserver_request_total` sample: resource requests only.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSample {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub count: u64,
}

/// Reads `apiserver_request_total` from the apiserver's `/metrics`.
pub async fn scrape(client: &kube::Client) -> anyhow::Result<Vec<RequestSample>> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .context("build the /metrics request")?;
    let text = client
        .request_text(request)
        .await
        .context("read the apiserver's /metrics")?;
    Ok(parse_request_total(&text))
}

/// The resource-request samples of `apiserver_request_total` in a Prometheus
/// text exposition.
pub fn parse_request_total(text: &str) -> Vec<RequestSample> {
    text.lines()
        .filter_map(|line| line.strip_prefix("apiserver_request_total{"))
        .filter_map(|line| {
            let (labels, value) = line.rsplit_once("} ")?;
            let count = value.trim().parse::<f64>().ok()? as u64;
            let label = |name: &str| -> String {
                let key = format!("{name}=\"");
                labels
                    .split(",")
                    .find_map(|pair| pair.strip_prefix(&key))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            let resource = label("resource");
            (!resource.is_empty()).then(|| RequestSample {
                verb: label("verb"),
                resource,
                subresource: label("subresource"),
                count,
            })
        })
        .collect()
}

/// Requests between two scrapes, by verb.
pub fn by_verb(before: &[RequestSample], after: &[RequestSample]) -> VerbCounts {
    let mut counts = VerbCounts::new();
    for sample in after {
        *counts.entry(sample.verb.clone()).or_default() += sample.count;
    }
    for sample in before {
        let entry = counts.entry(sample.verb.clone()).or_default();
        *entry = entry.saturating_sub(sample.count);
    }
    counts.retain(|_, n| *n > 0);
    counts
}

/// Requests between two scrapes, by `verb resource[/subresource]`, for
/// finding where a provider's requests go.
pub fn by_resource(before: &[RequestSample], after: &[RequestSample]) -> BTreeMap<String, u64> {
    let key = |s: &RequestSample| {
        if s.subresource.is_empty() {
            format!("{} {}", s.verb, s.resource)
        } else {
            format!("{} {}/{}", s.verb, s.resource, s.subresource)
        }
    };
    let mut counts = BTreeMap::<String, u64>::new();
    for sample in after {
        *counts.entry(key(sample)).or_default() += sample.count;
    }
    for sample in before {
        let entry = counts.entry(key(sample)).or_default();
        *entry = entry.saturating_sub(sample.count);
    }
    counts.retain(|_, n| *n > 0);
    counts
}

/// `total - own`, verb by verb, never below zero.
pub fn subtract(total: &VerbCounts, own: &VerbCounts) -> VerbCounts {
    let mut out = total.clone();
    for (verb, n) in own {
        if let Some(entry) = out.get_mut(verb) {
            *entry = entry.saturating_sub(*n);
        }
    }
    out.retain(|_, n| *n > 0);
    out
}

/// The sum over [`REPORTED_VERBS`].
pub fn reported_total(counts: &VerbCounts) -> u64 {
    REPORTED_VERBS
        .iter()
        .filter_map(|verb| counts.get(*verb))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb(method: &str, uri: &str, content_type: Option<&str>) -> &'static str {
        verb_of(
            &method.parse().unwrap(),
            &uri.parse().unwrap(),
            content_type,
        )
    }

    #[test]
    fn verbs_follow_the_apiserver_request_info() {
        assert_eq!(
            verb("GET", "/api/v1/namespaces/default/secrets/a", None),
            "GET"
        );
        assert_eq!(
            verb("GET", "/api/v1/namespaces/default/secrets", None),
            "LIST"
        );
        assert_eq!(verb("GET", "/api/v1/namespaces/default", None), "GET");
        assert_eq!(verb("GET", "/api/v1/namespaces", None), "LIST");
        assert_eq!(
            verb(
                "GET",
                "/apis/kubevirt.io/v1/virtualmachines?watch=true&resourceVersion=1",
                None
            ),
            "WATCH"
        );
        assert_eq!(
            verb(
                "GET",
                "/apis/kubevirt.io/v1/namespaces/d/virtualmachines/vm/status",
                None
            ),
            "GET"
        );
        assert_eq!(verb("POST", "/api/v1/namespaces/d/secrets", None), "POST");
        assert_eq!(
            verb(
                "PATCH",
                "/apis/x/v1/namespaces/d/things/a/status",
                Some("application/apply-patch+yaml")
            ),
            "APPLY"
        );
        assert_eq!(
            verb(
                "PATCH",
                "/apis/x/v1/namespaces/d/things/a",
                Some("application/merge-patch+json")
            ),
            "PATCH"
        );
        assert_eq!(
            verb("DELETE", "/api/v1/namespaces/d/secrets/a", None),
            "DELETE"
        );
        assert_eq!(
            verb("DELETE", "/api/v1/namespaces/d/secrets", None),
            "DELETECOLLECTION"
        );
    }

    #[test]
    fn request_total_is_read_per_verb_and_resource() {
        let before = parse_request_total(
            "# HELP apiserver_request_total x\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 3\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"\",scope=\"\",subresource=\"/metrics\",verb=\"GET\",version=\"\"} 9\n",
        );
        let after = parse_request_total(
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 10\n\
             apiserver_request_total{code=\"404\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 2\n\
             apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"kubevirt.io\",resource=\"virtualmachines\",scope=\"resource\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 4\n",
        );
        assert_eq!(before.len(), 1, "non-resource requests are left out");
        let verbs = by_verb(&before, &after);
        assert_eq!(verbs.get("GET"), Some(&9));
        assert_eq!(verbs.get("PATCH"), Some(&4));
        let resources = by_resource(&before, &after);
        assert_eq!(resources.get("PATCH virtualmachines/status"), Some(&4));
        let own = VerbCounts::from([("GET".to_string(), 5)]);
        assert_eq!(subtract(&verbs, &own).get("GET"), Some(&4));
        assert_eq!(reported_total(&verbs), 13);
    }
}
