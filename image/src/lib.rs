//! Tenantry's container image as an OCI image layout (image-spec v1.1),
//! written and read without a container engine.
//!
//! The machines tenantry is built and tested on have no container engine, so
//! `hack/image.sh` builds the manager's static binaries with cargo and this
//! crate packs them: one layer per platform holding the binary and Mozilla's
//! CA roots ([`roots`]), an image config, a manifest per platform and an
//! index over them ([`layout`]). Everything that goes into a blob is a
//! function of its inputs: entries sorted, owners and times fixed, gzip
//! without a timestamp, JSON keys in a fixed order. Two builds of one commit
//! therefore give one index digest.
//!
//! The test harness reads the same layouts back ([`read`]): the
//! management-cluster pod runner unpacks an image's root filesystem and
//! runs its entrypoint as the kubelet would.

pub mod layout;
pub mod read;
pub mod roots;

use std::fmt;

/// OCI media types this crate writes and reads.
pub mod media_type {
    pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
}

/// The annotation naming an image in a layout's `index.json` (its tag).
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// An operating system and CPU architecture, as OCI names them
/// (`linux/amd64`, `linux/arm64/v8`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// Parses `os/architecture[/variant]`. `linux/arm64` is read as
    /// `linux/arm64/v8`, the variant registries and engines record for it.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut parts = text.split('/');
        let (Some(os), Some(architecture)) = (parts.next(), parts.next()) else {
            anyhow::bail!("platform {text:?} is not os/architecture[/variant]");
        };
        let variant = parts.next().map(str::to_string);
        if parts.next().is_some() || os.is_empty() || architecture.is_empty() {
            anyhow::bail!("platform {text:?} is not os/architecture[/variant]");
        }
        let variant = match (architecture, variant) {
            ("arm64", None) => Some("v8".to_string()),
            (_, variant) => variant,
        };
        Ok(Self {
            os: os.to_string(),
            architecture: architecture.to_string(),
            variant,
        })
    }

    /// The platform of the machine this runs on.
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Self::parse(&format!("{}/{architecture}", std::env::consts::OS))
            .expect("the host platform parses")
    }

    /// Whether an image for `self` runs on `wanted`: same OS and
    /// architecture, and the same variant where both name one.
    pub fn matches(&self, wanted: &Platform) -> bool {
        self.os == wanted.os
            && self.architecture == wanted.architecture
            && match (&self.variant, &wanted.variant) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

/// `sha256:<hex>` of some bytes: how OCI names a blob.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm64_without_a_variant_is_read_as_v8() {
        let platform = Platform::parse("linux/arm64").unwrap();
        assert_eq!(platform.variant.as_deref(), Some("v8"));
        assert_eq!(platform.to_string(), "linux/arm64/v8");
        assert_eq!(Platform::parse("linux/amd64").unwrap().variant, None);
    }

    #[test]
    fn malformed_platforms_are_refused() {
        for text in ["linux", "linux/", "/amd64", "linux/arm/v7/extra"] {
            assert!(Platform::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_variant_only_matters_where_both_sides_name_one() {
        let image = Platform::parse("linux/arm64/v8").unwrap();
        let wanted = Platform {
            variant: None,
            ..image.clone()
        };
        assert!(image.matches(&wanted));
        assert!(!image.matches(&Platform::parse("linux/amd64").unwrap()));
    }
}
