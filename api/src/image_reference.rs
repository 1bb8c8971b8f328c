//! What a container image reference tenantry renders must look like: a tag
//! that names a release (never `latest`, never left out, which means
//! `latest`), and where a digest is given, a real one. A placeholder digest
//! (all zeros) would make every pull fail at the kubelet, long after the
//! manifest was accepted; `latest` makes two nodes run different code.

/// Why a reference is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnpinnedImage {
    /// No tag and no digest: the runtime pulls `latest`.
    NoTag(String),
    /// The tag `latest`.
    LatestTag(String),
    /// A digest that is not `sha256:` and 64 hex digits.
    MalformedDigest(String),
    /// The all-zero placeholder digest.
    PlaceholderDigest(String),
}

/// Checks one image reference (`registry/repository:tag[@sha256:…]`).
pub fn check_image_reference(reference: &str) -> Result<(), UnpinnedImage> {
    let (name, digest) = match reference.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (reference, None),
    };
    if let Some(digest) = digest {
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(UnpinnedImage::MalformedDigest(reference.to_string()));
        }
        if hex.bytes().all(|b| b == b'0') {
            return Err(UnpinnedImage::PlaceholderDigest(reference.to_string()));
        }
    }
    // The tag follows the last ':' after the last '/' (a registry port has
    // its ':' before a '/').
    let last_component = name.rsplit('/').next().unwrap_or(name);
    match last_component.split_once(':') {
        Some((_, "latest")) => Err(UnpinnedImage::LatestTag(reference.to_string())),
        Some((_, tag)) if !tag.is_empty() => Ok(()),
        _ if digest.is_some() => Ok(()),
        _ => Err(UnpinnedImage::NoTag(reference.to_string())),
    }
}

impl std::fmt::Display for UnpinnedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnpinnedImage::NoTag(r) => write!(f, "image {r} has no tag: it would pull latest"),
            UnpinnedImage::LatestTag(r) => {
                write!(f, "image {r} is tagged latest: name a release")
            }
            UnpinnedImage::MalformedDigest(r) => {
                write!(
                    f,
                    "image {r} has a digest that is not sha256 and 64 hex digits"
                )
            }
            UnpinnedImage::PlaceholderDigest(r) => {
                write!(f, "image {r} has the all-zero placeholder digest")
            }
        }
    }
}

impl std::error::Error for UnpinnedImage {}

/// Every `image` field in a manifest (a Kubernetes object as JSON, at any
/// depth, including `spec.template.spec.containers[*].image` and Kamaji's
/// `additionalContainers`), with its path for messages.
pub fn images_in(value: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(value: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, child) in map {
                    let child_path = format!("{path}.{key}");
                    if key == "image"
                        && let Some(reference) = child.as_str()
                    {
                        out.push((child_path.clone(), reference.to_string()));
                    }
                    walk(child, &child_path, out);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_pinned_by_tag_or_digest_pass() {
        for reference in [
            "ghcr.io/tenantry/tenantry:v0.1.0",
            "registry.local:5000/tenantry:v0.1.0",
            "ghcr.io/cozystack/cozystack/talos-csr-signer:v1.6.0@sha256:85b41e16e5e40398b1272fe0a69de72e205532c8034d0e6a9fc4a1d510f17818",
            "busybox@sha256:85b41e16e5e40398b1272fe0a69de72e205532c8034d0e6a9fc4a1d510f17818",
        ] {
            assert_eq!(check_image_reference(reference), Ok(()), "{reference}");
        }
    }

    #[test]
    fn latest_missing_tags_and_placeholder_digests_are_refused() {
        let zeros = format!("ghcr.io/a/b:v1@sha256:{}", "0".repeat(64));
        for (reference, expected) in [
            ("ghcr.io/a/b:latest", "latest"),
            ("ghcr.io/a/b", "no tag"),
            ("registry.local:5000/b", "no tag"),
            (zeros.as_str(), "all-zero"),
            ("ghcr.io/a/b:v1@sha256:1234", "64 hex"),
        ] {
            let error = check_image_reference(reference).unwrap_err().to_string();
            assert!(error.contains(expected), "{reference}: {error}");
        }
    }

    #[test]
    fn images_are_found_at_any_depth() {
        let object = serde_json::json!({
            "spec": { "template": { "spec": {
                "containers": [{ "image": "a:v1" }],
                "initContainers": [{ "image": "b:v2" }],
            }}},
            "other": { "image": { "not": "a string" } },
        });
        let found: Vec<String> = images_in(&object).into_iter().map(|(_, i)| i).collect();
        assert_eq!(found, ["a:v1", "b:v2"]);
    }
}
