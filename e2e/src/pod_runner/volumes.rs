//! A pod's volumes and environment, as the kubelet makes them: Secret,
//! ConfigMap, projected (ServiceAccount token, ConfigMap, Secret, downward
//! API) and downward API volumes written into the pod's folder the way the
//! kubelet's atomic writer does (`..<timestamp>/` folders, a `..data`
//! symlink swapped in one rename, top-level symlinks through it, so a
//! reader never sees half an update), re-written when their sources
//! change; `emptyDir` as a plain folder; ServiceAccount tokens from the
//! TokenRequest API, bound to the pod, renewed at 80% of their life.
//! Environment variables from values, `fieldRef`, `resourceFieldRef`,
//! `secretKeyRef`, `configMapKeyRef` and `envFrom`, with `$(VAR)`
//! expansion.
//!
//! Left out: hostPath, PersistentVolumeClaims and every other volume type
//! (a pod using one stays `ContainerCreating` with a message naming it),
//! subPath, and the service-link variables of Services other than
//! `kubernetes`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::{Api, PostParams};

/// The token projection kubelets give pods by default (`kube-api-access-*`
/// asks for 3607 s, so that one hour plus a little is visible as "bound").
const DEFAULT_TOKEN_SECONDS: i64 = 3607;

/// Files of one volume: relative path → (bytes, mode).
type Payload = BTreeMap<String, (Vec<u8>, u32)>;

/// Tokens the kubelet holds, with when it fetched them and their life.
#[derive(Default)]
pub struct TokenCache {
    tokens: BTreeMap<String, (String, SystemTime, Duration)>,
}

/// Writes (or refreshes) every volume of the pod under `dir/<volume>` and
/// returns the host folder of each. An error names the volume and what is
/// missing; the pod keeps waiting, as with the kubelet's FailedMount.
pub async fn prepare(
    client: &kube::Client,
    pod: &Pod,
    dir: &Path,
    tokens: &mut TokenCache,
) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut folders = BTreeMap::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for volume in &volumes {
        let folder = dir.join(&volume.name);
        if volume.empty_dir.is_some() {
            if !folder.is_dir() {
                std::fs::create_dir_all(&folder)?;
                use std::os::unix::fs::PermissionsExt as _;
                // The kubelet makes emptyDir world-writable.
                std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o777))?;
            }
        } else {
            let payload = payload(client, namespace, pod, volume, tokens)
                .await
                .with_context(|| format!("volume {}", volume.name))?;
            write_atomically(&folder, &payload)
                .with_context(|| format!("write volume {}", volume.name))?;
        }
        folders.insert(volume.name.clone(), folder);
    }
    Ok(folders)
}

async fn payload(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    volume: &Volume,
    tokens: &mut TokenCache,
) -> anyhow::Result<Payload> {
    let mut files = Payload::new();
    if let Some(secret) = &volume.secret {
        let name = secret.secret_name.as_deref().unwrap_or_default();
        let mode = secret.default_mode.unwrap_or(0o644) as u32;
        let data = secret_data(client, namespace, name, secret.optional.unwrap_or(false)).await?;
        add_keys(
            &mut files,
            &data,
            secret.items.as_deref(),
            mode,
            "Secret",
            name,
        )?;
    } else if let Some(config_map) = &volume.config_map {
        let mode = config_map.default_mode.unwrap_or(0o644) as u32;
        let data = config_map_data(
            client,
            namespace,
            &config_map.name,
            config_map.optional.unwrap_or(false),
        )
        .await?;
        add_keys(
            &mut files,
            &data,
            config_map.items.as_deref(),
            mode,
            "ConfigMap",
            &config_map.name,
        )?;
    } else if let Some(downward) = &volume.downward_api {
        let mode = downward.default_mode.unwrap_or(0o644) as u32;
        for item in downward.items.as_deref().unwrap_or_default() {
            add_downward(&mut files, pod, item, mode)?;
        }
    } else if let Some(projected) = &volume.projected {
        let mode = projected.default_mode.unwrap_or(0o644) as u32;
        for source in projected.sources.as_deref().unwrap_or_default() {
            if let Some(token) = &source.service_account_token {
                let value = token_for(
                    client,
                    pod,
                    token.audience.as_deref(),
                    token.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
                    tokens,
                )
                .await?;
                files.insert(token.path.clone(), (value.into_bytes(), mode));
            }
            if let Some(config_map) = &source.config_map {
                let data = config_map_data(
                    client,
                    namespace,
                    &config_map.name,
                    config_map.optional.unwrap_or(false),
                )
                .await?;
                add_keys(
                    &mut files,
                    &data,
                    config_map.items.as_deref(),
                    mode,
                    "ConfigMap",
                    &config_map.name,
                )?;
            }
            if let Some(secret) = &source.secret {
                let data = secret_data(
                    client,
                    namespace,
                    &secret.name,
                    secret.optional.unwrap_or(false),
                )
                .await?;
                add_keys(
                    &mut files,
                    &data,
                    secret.items.as_deref(),
                    mode,
                    "Secret",
                    &secret.name,
                )?;
            }
            if let Some(downward) = &source.downward_api {
                for item in downward.items.as_deref().unwrap_or_default() {
                    add_downward(&mut files, pod, item, mode)?;
                }
            }
        }
    } else {
        bail!(
            "this volume type is not supported by the pod runner (only secret, configMap, projected, downwardAPI, emptyDir)"
        );
    }
    Ok(files)
}

async fn secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    optional: bool,
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    {
        Some(secret) => Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .chain(
                secret
                    .string_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes())),
            )
            .collect()),
        None if optional => Ok(BTreeMap::new()),
        None => bail!("secret \"{name}\" not found"),
    }
}

async fn config_map_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    optional: bool,
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    match Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    {
        Some(config_map) => Ok(config_map
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .chain(
                config_map
                    .binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            )
            .collect()),
        None if optional => Ok(BTreeMap::new()),
        None => bail!("configmap \"{name}\" not found"),
    }
}

fn add_keys(
    files: &mut Payload,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    match items {
        None => {
            for (key, value) in data {
                files.insert(key.clone(), (value.clone(), mode));
            }
        }
        Some(items) => {
            for item in items {
                let value = data
                    .get(&item.key)
                    .with_context(|| format!("{kind} {name} has no key {}", item.key))?;
                let mode = item.mode.map_or(mode, |m| m as u32);
                files.insert(item.path.clone(), (value.clone(), mode));
            }
        }
    }
    Ok(())
}

fn add_downward(
    files: &mut Payload,
    pod: &Pod,
    item: &DownwardAPIVolumeFile,
    mode: u32,
) -> anyhow::Result<()> {
    let value = match (&item.field_ref, &item.resource_field_ref) {
        (Some(field), _) => field_value(pod, &field.field_path)?,
        (None, Some(_)) => bail!("resourceFieldRef in downward API volumes is not supported"),
        (None, None) => bail!("downward API item {} names no field", item.path),
    };
    files.insert(
        item.path.clone(),
        (value.into_bytes(), item.mode.map_or(mode, |m| m as u32)),
    );
    Ok(())
}

/// A pod field by its downward API path.
pub fn field_value(pod: &Pod, path: &str) -> anyhow::Result<String> {
    let meta = &pod.metadata;
    let map_text = |map: &Option<BTreeMap<String, String>>| {
        map.iter()
            .flatten()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => map_text(&meta.labels),
        "metadata.annotations" => map_text(&meta.annotations),
        "spec.nodeName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default(),
        "status.hostIP" => pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .unwrap_or_default(),
        other => {
            if let Some(key) = other
                .strip_prefix("metadata.labels['")
                .and_then(|k| k.strip_suffix("']"))
            {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = other
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
            {
                meta.annotations
                    .as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default()
            } else {
                bail!("field {other} is not supported by the downward API here")
            }
        }
    })
}

async fn token_for(
    client: &kube::Client,
    pod: &Pod,
    audience: Option<&str>,
    seconds: i64,
    tokens: &mut TokenCache,
) -> anyhow::Result<String> {
    let key = format!("{}/{seconds}", audience.unwrap_or_default());
    if let Some((token, fetched, life)) = tokens.tokens.get(&key)
        && fetched.elapsed().unwrap_or_default() < life.mul_f64(0.8)
    {
        return Ok(token.clone());
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_string()]).unwrap_or_default(),
            expiration_seconds: Some(seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let response = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("request a token for ServiceAccount {namespace}/{account}"))?;
    let token = response
        .status
        .map(|s| s.token)
        .context("TokenRequest answered without a token")?;
    tokens.tokens.insert(
        key,
        (
            token.clone(),
            SystemTime::now(),
            Duration::from_secs(seconds.max(600) as u64),
        ),
    );
    Ok(token)
}

/// The kubelet's atomic writer: nothing changes when the payload is the
/// same; otherwise a new `..<timestamp>` folder, `..data` swapped to it by
/// a rename, user-visible names as symlinks through `..data`, the old
/// folder removed.
pub fn write_atomically(dir: &Path, payload: &Payload) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let data_link = dir.join("..data");
    if let Ok(current) = std::fs::read_link(&data_link) {
        let current = dir.join(current);
        if same_payload(&current, payload) {
            return Ok(());
        }
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let stamp = format!(
        "..{}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    );
    let version = dir.join(&stamp);
    std::fs::create_dir(&version)?;
    std::fs::set_permissions(&version, std::fs::Permissions::from_mode(0o755))?;
    for (path, (bytes, mode)) in payload {
        if path.starts_with('/') || path.split('/').any(|p| p == ".." || p.is_empty()) {
            bail!("volume path {path:?} is not a relative path inside the volume");
        }
        let file = version.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, bytes)?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode))?;
    }
    let previous = std::fs::read_link(&data_link).ok();
    let temporary = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&temporary);
    std::os::unix::fs::symlink(&stamp, &temporary)?;
    std::fs::rename(&temporary, &data_link)?;
    let top: std::collections::BTreeSet<&str> = payload
        .keys()
        .map(|p| p.split('/').next().unwrap_or(p))
        .collect();
    for name in &top {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_err() {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(format!("..data/{name}"), &link)?;
        }
    }
    // Names no longer in the payload.
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top.contains(name.as_str()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(previous) = previous {
        let _ = std::fs::remove_dir_all(dir.join(previous));
    }
    Ok(())
}

fn same_payload(version: &Path, payload: &Payload) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let mut count = 0;
    fn count_files(dir: &Path, count: &mut usize) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                count_files(&path, count);
            } else {
                *count += 1;
            }
        }
    }
    count_files(version, &mut count);
    count == payload.len()
        && payload.iter().all(|(path, (bytes, mode))| {
            let file = version.join(path);
            std::fs::read(&file).ok().as_ref() == Some(bytes)
                && std::fs::metadata(&file)
                    .map(|m| m.permissions().mode() & 0o7777 == *mode)
                    .unwrap_or(false)
        })
}

/// The container's environment: `KUBERNETES_SERVICE_*` first (what the
/// kubelet adds for the `kubernetes` Service), the image's, then the
/// container's `envFrom` and `env` in order, `$(VAR)` expanded against
/// what came before.
pub async fn environment(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    image_env: &[String],
    apiserver: (std::net::Ipv4Addr, u16),
) -> anyhow::Result<Vec<(String, String)>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
    };
    for entry in image_env {
        if let Some((name, value)) = entry.split_once('=') {
            set(&mut env, name.to_string(), value.to_string());
        }
    }
    let (host, port) = apiserver;
    for (name, value) in [
        ("KUBERNETES_SERVICE_HOST", host.to_string()),
        ("KUBERNETES_SERVICE_PORT", port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
        ("KUBERNETES_PORT", format!("tcp://{host}:{port}")),
        ("KUBERNETES_PORT_443_TCP", format!("tcp://{host}:{port}")),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".to_string()),
        ("KUBERNETES_PORT_443_TCP_PORT", port.to_string()),
        ("KUBERNETES_PORT_443_TCP_ADDR", host.to_string()),
    ] {
        set(&mut env, name.to_string(), value);
    }
    for source in container.env_from.as_deref().unwrap_or_default() {
        let prefix = source.prefix.clone().unwrap_or_default();
        let data = if let Some(secret) = &source.secret_ref {
            secret_data(
                client,
                namespace,
                &secret.name,
                secret.optional.unwrap_or(false),
            )
            .await?
        } else if let Some(config_map) = &source.config_map_ref {
            config_map_data(
                client,
                namespace,
                &config_map.name,
                config_map.optional.unwrap_or(false),
            )
            .await?
        } else {
            BTreeMap::new()
        };
        for (key, value) in data {
            set(
                &mut env,
                format!("{prefix}{key}"),
                String::from_utf8_lossy(&value).into_owned(),
            );
        }
    }
    for var in container.env.as_deref().unwrap_or_default() {
        let value = if let Some(value) = &var.value {
            expand(value, &env)
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                field_value(pod, &field.field_path)?
            } else if let Some(key) = &from.secret_key_ref {
                let data = secret_data(client, namespace, &key.name, key.optional.unwrap_or(false))
                    .await?;
                match data.get(&key.key) {
                    Some(value) => String::from_utf8_lossy(value).into_owned(),
                    None if key.optional.unwrap_or(false) => continue,
                    None => bail!("secret {} has no key {}", key.name, key.key),
                }
            } else if let Some(key) = &from.config_map_key_ref {
                let data =
                    config_map_data(client, namespace, &key.name, key.optional.unwrap_or(false))
                        .await?;
                match data.get(&key.key) {
                    Some(value) => String::from_utf8_lossy(value).into_owned(),
                    None if key.optional.unwrap_or(false) => continue,
                    None => bail!("configmap {} has no key {}", key.name, key.key),
                }
            } else if let Some(resource) = &from.resource_field_ref {
                resource_value(container, &resource.resource)
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        set(&mut env, var.name.clone(), value);
    }
    Ok(env)
}

/// `limits.cpu`, `requests.memory`, … of the container, as the kubelet
/// renders them with the default divisor (CPU rounded up to cores, memory
/// in bytes); empty when unset.
fn resource_value(container: &Container, resource: &str) -> String {
    let Some((kind, name)) = resource.split_once('.') else {
        return String::new();
    };
    let resources = container.resources.as_ref();
    let quantity = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => None,
    }
    .and_then(|m| m.get(name));
    let Some(quantity) = quantity else {
        return String::new();
    };
    let text = quantity.0.as_str();
    match tenantry_api::tenant_nodes::quantity_milli_value(text) {
        // Whole cores, rounded up; bytes.
        Some(milli) if name == "cpu" => ((milli + 999) / 1000).to_string(),
        Some(milli) => (milli / 1000).to_string(),
        None => text.to_string(),
    }
}

/// `$(VAR)` → the value of VAR where it is defined, `$$` → `$`; anything
/// else stays as written (Kubernetes' expansion rules).
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if bytes[i + 1] == b'('
                && let Some(end) = text[i + 2..].find(')')
            {
                let name = &text[i + 2..i + 2 + end];
                if let Some((_, value)) = env.iter().rev().find(|(n, _)| n == name) {
                    out.push_str(value);
                    i += 2 + end + 1;
                    continue;
                }
            }
        }
        let ch = text[i..].chars().next().expect("a char");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_expand_as_kubernetes_expands_them() {
        let env = vec![("NS".to_string(), "tenantry-system".to_string())];
        assert_eq!(
            expand("--namespace=$(NS)", &env),
            "--namespace=tenantry-system"
        );
        assert_eq!(expand("$(MISSING) $$(NS) $", &env), "$(MISSING) $(NS) $");
        assert_eq!(
            expand("--filter=$(NS)$(NS)", &env),
            "--filter=tenantry-systemtenantry-system"
        );
    }

    #[test]
    fn volumes_are_swapped_in_at_once_and_unchanged_payloads_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("cert");
        let mut payload = Payload::new();
        payload.insert("tls.crt".into(), (b"one".to_vec(), 0o644));
        write_atomically(&volume, &payload).unwrap();
        assert_eq!(std::fs::read(volume.join("tls.crt")).unwrap(), b"one");
        let first = std::fs::read_link(volume.join("..data")).unwrap();
        write_atomically(&volume, &payload).unwrap();
        assert_eq!(std::fs::read_link(volume.join("..data")).unwrap(), first);
        payload.insert("tls.crt".into(), (b"two".to_vec(), 0o644));
        write_atomically(&volume, &payload).unwrap();
        assert_eq!(std::fs::read(volume.join("tls.crt")).unwrap(), b"two");
        assert_ne!(std::fs::read_link(volume.join("..data")).unwrap(), first);
        assert!(!volume.join(first).exists(), "the old version is removed");
    }
}
