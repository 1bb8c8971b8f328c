//! Reading YAML manifests and putting them into a control plane: CRDs (waited
//! on until Established) and arbitrary objects (through discovery).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use kube::runtime::wait::{await_condition, conditions};
use serde::Deserialize;

/// The field manager the harness applies with.
pub const FIELD_MANAGER: &str = "tenantry-e2e";

const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Every YAML document in `path` (a file, or a folder whose `*.yaml`/`*.yml`
/// files are read in name order). Empty documents are skipped.
pub fn read_documents(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)
            .with_context(|| format!("read folder {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect()
    } else {
        vec![path.to_owned()]
    };
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        documents
            .extend(parse_documents(&text).with_context(|| format!("parse {}", file.display()))?);
    }
    Ok(documents)
}

/// Every non-empty YAML document in `text`.
pub fn parse_documents(text: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(document)?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// The CustomResourceDefinitions among `documents`.
pub fn crds_of(documents: Vec<serde_json::Value>) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    documents
        .into_iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| serde_json::from_value(d).context("decode CustomResourceDefinition"))
        .collect()
}

/// Installs every CRD found under `paths` and waits until each is Established.
/// Returns the CRD names.
pub async fn install_crds<P: AsRef<Path>>(
    client: &kube::Client,
    paths: &[P],
) -> anyhow::Result<Vec<String>> {
    let mut crds = Vec::new();
    for path in paths {
        crds.extend(crds_of(read_documents(path.as_ref())?)?);
    }
    if crds.is_empty() {
        bail!("no CustomResourceDefinition found in the given paths");
    }
    apply_crds(client, crds).await
}

/// Server-side applies the CRDs and waits until each is Established.
pub async fn apply_crds(
    client: &kube::Client,
    crds: Vec<CustomResourceDefinition>,
) -> anyhow::Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::with_capacity(crds.len());
    for mut crd in crds {
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.status = None;
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("apply CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        tokio::time::timeout(
            ESTABLISH_TIMEOUT,
            await_condition(api.clone(), name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not Established within {ESTABLISH_TIMEOUT:?}"))?
        .with_context(|| format!("watch CRD {name}"))?;
    }
    Ok(names)
}

/// Creates one object of any kind the apiserver serves, found through
/// discovery. Namespaced objects without a namespace go to `default_namespace`.
pub async fn create_object(
    client: &kube::Client,
    document: &serde_json::Value,
    default_namespace: &str,
) -> anyhow::Result<DynamicObject> {
    let (api, object) = dynamic_api_for(client, document, default_namespace).await?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| {
            format!(
                "create {} {}",
                document["kind"].as_str().unwrap_or("?"),
                object.metadata.name.as_deref().unwrap_or("?")
            )
        })
}

/// Server-side applies one object of any kind the apiserver serves.
pub async fn apply_object(
    client: &kube::Client,
    document: &serde_json::Value,
    default_namespace: &str,
) -> anyhow::Result<DynamicObject> {
    let (api, object) = dynamic_api_for(client, document, default_namespace).await?;
    let name = object
        .metadata
        .name
        .clone()
        .context("object without a name")?;
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .with_context(|| format!("apply {} {name}", document["kind"].as_str().unwrap_or("?")))
}

async fn dynamic_api_for(
    client: &kube::Client,
    document: &serde_json::Value,
    default_namespace: &str,
) -> anyhow::Result<(Api<DynamicObject>, DynamicObject)> {
    let api_version = document["apiVersion"]
        .as_str()
        .context("object without apiVersion")?;
    let kind = document["kind"].as_str().context("object without kind")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discover {api_version} {kind}"))?;
    let object: DynamicObject =
        serde_json::from_value(document.clone()).context("decode object")?;
    let api = match capabilities.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let namespace = object
                .metadata
                .namespace
                .as_deref()
                .unwrap_or(default_namespace);
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
    };
    Ok((api, object))
}
