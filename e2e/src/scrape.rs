//! Scraping the deployed manager's metrics as a Prometheus does: through
//! the metrics Service, over HTTPS verified against the serving
//! certificate's CA, with a ServiceAccount token bound to the metrics
//! reader ClusterRole, asking for OpenMetrics; the answer read with
//! Prometheus's own parser (`promcheck`).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;
use tenantry_provider::components;

use crate::promcheck::{Sample, parse_scrape};

/// What Prometheus sends as `Accept` (OpenMetrics first).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// A scraper of the deployed manager's metrics.
pub struct Scraper {
    http: reqwest::Client,
    url: String,
}

/// One scrape, read by Prometheus's parser.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub samples: Vec<Sample>,
}

impl Scraper {
    /// A client trusting the serving certificate's CA (its Secret's
    /// `ca.crt`), reaching the metrics Service's DNS name at its ClusterIP.
    pub async fn new(client: &kube::Client) -> anyhow::Result<Self> {
        let namespace = components::NAMESPACE;
        let secret = Api::<Secret>::namespaced(client.clone(), namespace)
            .get(components::WEBHOOK_SECRET)
            .await
            .context("read the serving certificate's Secret")?;
        let ca = secret
            .data
            .unwrap_or_default()
            .get("ca.crt")
            .map(|ByteString(bytes)| String::from_utf8_lossy(bytes).into_owned())
            .context("the serving certificate's Secret has no ca.crt")?;
        let service = Api::<Service>::namespaced(client.clone(), namespace)
            .get(components::METRICS_SERVICE)
            .await
            .context("read the metrics Service")?;
        let cluster_ip = service
            .spec
            .and_then(|s| s.cluster_ip)
            .context("the metrics Service has no ClusterIP")?;
        let host = format!("{}.{namespace}.svc", components::METRICS_SERVICE);
        let address = SocketAddr::new(cluster_ip.parse()?, components::METRICS_PORT);
        let http = crate::pki::http_trusting_builder(&ca)
            .resolve(&host, address)
            .build()?;
        Ok(Self {
            http,
            url: format!("https://{host}:{}/metrics", components::METRICS_PORT),
        })
    }

    /// The HTTP status of a scrape with `token` (none: no Authorization).
    pub async fn status(&self, token: Option<&str>) -> anyhow::Result<u16> {
        let mut request = self.http.get(&self.url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        Ok(request.send().await?.status().as_u16())
    }

    /// A scrape with `token`, parsed.
    pub async fn scrape(&self, token: &str) -> anyhow::Result<Scrape> {
        let response = self
            .http
            .get(&self.url)
            .bearer_auth(token)
            .header(reqwest::header::ACCEPT, PROMETHEUS_ACCEPT)
            .send()
            .await
            .context("scrape the manager")?
            .error_for_status()?;
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = response.text().await?;
        Ok(Scrape {
            samples: parse_scrape(&content_type, &body)?,
        })
    }
}

impl Scrape {
    /// The sum of the samples named `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// The samples named `name` whose labels include `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Every label value of every sample, by label name.
    pub fn label_values(&self) -> BTreeMap<String, Vec<String>> {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for sample in &self.samples {
            for (name, value) in &sample.labels {
                values.entry(name.clone()).or_default().push(value.clone());
            }
        }
        values
    }
}

/// A ServiceAccount `namespace/name` and a token of it; with `reader`, the
/// account is bound to the metrics reader ClusterRole first.
pub async fn service_account_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    reader: bool,
) -> anyhow::Result<String> {
    let apply = |document: serde_json::Value| {
        let client = client.clone();
        async move { crate::manifests::apply_object(&client, &document, namespace).await }
    };
    apply(json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace } }))
        .await?;
    apply(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": name, "namespace": namespace },
    }))
    .await?;
    if reader {
        apply(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": format!("{namespace}-{name}-metrics-reader") },
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": components::METRICS_READER_ROLE,
            },
            "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": namespace }],
        }))
        .await?;
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let response = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("request a token for {namespace}/{name}"))?;
    Ok(response.status.context("no token in the answer")?.token)
}
