//! The tenant kube-apiserver a KamajiControlPlane gets: which build runs
//! which version, how versions may change, and which `extraArgs` reach it.

use super::*;

/// kube-apiserver flags Kamaji always sets itself (`mergeAPIServerArgs` in
/// `internal/builders/controlplane/deployment.go`): a user's
/// `extraArgs.apiServer` entry naming one is dropped.
pub const KAMAJI_OWNED_APISERVER_FLAGS: &[&str] = &[
    // identity and certificates
    "advertise-address",
    "client-ca-file",
    "tls-cert-file",
    "tls-private-key-file",
    "secure-port",
    // kubelet client
    "kubelet-client-certificate",
    "kubelet-client-key",
    "kubelet-preferred-address-types",
    // front proxy
    "proxy-client-cert-file",
    "proxy-client-key-file",
    "requestheader-allowed-names",
    "requestheader-client-ca-file",
    // service accounts and admission plugins
    "service-account-key-file",
    "service-account-signing-key-file",
    "service-cluster-ip-range",
    "enable-admission-plugins",
    // the datastore
    "etcd-servers",
    "etcd-prefix",
    "etcd-cafile",
    "etcd-certfile",
    "etcd-keyfile",
    "etcd-compaction-interval",
];

/// Flags a user may set in production (Kamaji only defaults them, or owns
/// them only with `dataStoreOverrides`) that the harness kube-apiserver sets
/// for its own wiring and cannot take twice.
pub(super) const HARNESS_APISERVER_FLAGS: &[&str] = &[
    "allow-privileged",
    "authorization-mode",
    // Excludes --authorization-mode, which the harness always sets (Kamaji
    // drops its own default instead).
    "authorization-config",
    "service-account-issuer",
    "bind-address",
    "cert-dir",
    "disable-admission-plugins",
    "endpoint-reconciler-type",
    "profiling",
    // Other datastores are not reachable from the harness etcd.
    "etcd-servers-overrides",
];

/// What became of a KamajiControlPlane's `spec.apiServer.extraArgs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtraArgs {
    /// Passed to the tenant kube-apiserver.
    pub passed: Vec<String>,
    /// Dropped because Kamaji sets the flag itself, as Kamaji drops them.
    pub owned_by_kamaji: Vec<String>,
    /// Dropped because the harness apiserver sets the flag for its own
    /// wiring (production would honour them).
    pub kept_by_harness: Vec<String>,
    /// Dropped because they name files that do not exist here (production
    /// mounts them from `extraVolumes`).
    pub missing_files: Vec<String>,
    /// Passed, but the harness kube-apiserver did not start with them, so it
    /// runs without them.
    pub refused_by_apiserver: Vec<String>,
}

/// `(major, minor, patch)` of `v1.34.2`, `1.34.2` or `v1.34` (patch 0).
pub(super) fn parse_version(version: &str) -> Option<(u32, u32, u32)> {
    let version = version.trim();
    let version = version.strip_prefix('v').unwrap_or(version);
    // Build metadata and pre-release tags (`v1.35.0-rc.1`) do not change
    // which build runs.
    let core = version.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(patch) => patch.parse().ok()?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// The supported minors, for messages: `v1.34, v1.35`.
pub(super) fn supported_minors() -> String {
    KUBE_APISERVER_MINORS
        .iter()
        .map(|(minor, _)| format!("v1.{minor}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kube-apiserver build for a KamajiControlPlane's `spec.version`, or
/// why the simulator cannot run it.
pub fn apiserver_for_version(version: &str) -> Result<Binary, String> {
    let unsupported = || {
        format!(
            "spec.version {version:?}: the tenant control plane simulator runs Kubernetes {} \
             only (the kube-apiserver builds of hack/upstream)",
            supported_minors()
        )
    };
    match parse_version(version) {
        Some((1, minor, _)) => Binary::kube_apiserver_for_minor(minor).ok_or_else(unsupported),
        _ => Err(unsupported()),
    }
}

/// What a change of `spec.version` does to a running tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionChange {
    /// Nothing: the tenant serves this version.
    None,
    /// Another patch of the minor that runs: the same build serves it.
    Patch,
    /// The next minor: restart the apiserver with this build.
    Upgrade(Binary),
    /// Refused, with the message (Kamaji's version webhook refuses
    /// downgrades and skipped minors; the simulator refuses what it has
    /// no build for).
    Refused(String),
}

/// How a tenant serving `current` on `running` moves to `requested`.
pub fn version_change(current: &str, running: Binary, requested: &str) -> VersionChange {
    if current == requested {
        return VersionChange::None;
    }
    let binary = match apiserver_for_version(requested) {
        Ok(binary) => binary,
        Err(message) => return VersionChange::Refused(message),
    };
    let (Some(from), Some(to)) = (parse_version(current), parse_version(requested)) else {
        return VersionChange::Refused(format!("unable to parse the version {current:?}"));
    };
    // The messages of Kamaji's TCP version webhook.
    if to < from {
        return VersionChange::Refused(format!(
            "unable to downgrade a TenantControlPlane from {current} to {requested}"
        ));
    }
    if to.1 > from.1 + 1 {
        return VersionChange::Refused(
            "unable to upgrade to a minor version in a non-sequential mode".into(),
        );
    }
    if binary == running {
        VersionChange::Patch
    } else {
        VersionChange::Upgrade(binary)
    }
}

/// The flag name of a kube-apiserver argument: `authorization-mode` for
/// `--authorization-mode=RBAC`.
pub(super) fn flag_name(arg: &str) -> &str {
    let arg = arg.trim().trim_start_matches('-');
    arg.split_once('=').map_or(arg, |(name, _)| name)
}

/// Sorts a KamajiControlPlane's `spec.apiServer.extraArgs` into what the
/// tenant kube-apiserver gets and what is dropped, and why. `exists` says
/// whether a file path exists on this machine.
pub fn split_extra_args(args: &[String], exists: impl Fn(&str) -> bool) -> ExtraArgs {
    let mut out = ExtraArgs::default();
    for arg in args {
        let name = flag_name(arg);
        if KAMAJI_OWNED_APISERVER_FLAGS.contains(&name) {
            out.owned_by_kamaji.push(arg.clone());
        } else if HARNESS_APISERVER_FLAGS.contains(&name) {
            out.kept_by_harness.push(arg.clone());
        } else if arg.split_once('=').is_some_and(|(_, value)| {
            value
                .split(',')
                .any(|part| part.starts_with('/') && !exists(part))
        }) {
            out.missing_files.push(arg.clone());
        } else {
            out.passed.push(arg.clone());
        }
    }
    out
}
