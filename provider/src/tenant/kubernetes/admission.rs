//! Admission of `Kubernetes` objects beyond the CRD: the rules that need
//! parsing or tables, which CEL cannot express (immutability, URL shapes,
//! volume sources, OIDC exclusivity and addon dependencies are CEL rules in
//! `tenantry_api::tenant`).
//!
//! [`mutate`] runs first (mutating webhook): it moves the two
//! `extraArgs` flags the control plane renders from fields into those
//! fields. [`validate`] then refuses what would break the tenant
//! control plane, naming the field and the rule, and warns about fields that
//! are stored but have no effect.
//!
//! The kube-apiserver reads `extraArgs` entries as Kamaji passes them, verbatim
//! and in order, with the pflag rules: `--name=value`, or `--name` followed
//! by an entry holding its value; repeats of a flag all reach the apiserver.

use std::collections::BTreeMap;
use std::fmt;

use tenantry_api::tenant::{
    ADMISSION_PLUGINS, CONTROL_PLANE_OWNED_FLAGS, DEFAULT_ADMISSION_PLUGINS,
    ENABLE_ADMISSION_PLUGINS_FLAG, KUBELET_PREFERRED_ADDRESS_TYPES_FLAG, Kubernetes,
    KubernetesSpec, KubernetesVersion, NODE_ADDRESS_TYPES, OidcMode,
};

const EXTRA_ARGS: &str = "spec.controlPlane.apiServer.extraArgs";
const ADMISSION_CONTROLLERS: &str = "spec.controlPlane.apiServer.admissionControllers";
const PREFERRED_ADDRESS_TYPES: &str = "spec.controlPlane.kubelet.preferredAddressTypes";
const VERSION: &str = "spec.version";
const TALOS_VERSION: &str = "spec.talos.version";

/// Which Kubernetes minors each Talos minor supports: (Talos 1.x, oldest
/// Kubernetes 1.y, newest Kubernetes 1.y). Talos supports the Kubernetes
/// release it ships with and the five before it (the support matrix of each
/// Talos release's documentation); v1.13's window, v1.31 to v1.36, is the
/// one the reference text names.
const TALOS_KUBERNETES_SUPPORT: &[(u32, u32, u32)] =
    &[(10, 28, 33), (11, 29, 34), (12, 30, 35), (13, 31, 36)];

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `spec.controlPlane.apiServer.extraArgs[2]`.
    pub field: String,
    /// What is wrong and what to change.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// What admission says about an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Reasons to refuse the object; empty means it is admitted.
    pub errors: Vec<FieldError>,
    /// Things the user should know, returned as admission warnings.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Whether the object is admitted.
    pub fn allowed(&self) -> bool {
        self.errors.is_empty()
    }

    /// Asserts that exactly `errors` were found, in order: each a field and
    /// a phrase its message contains. `case` names the table row.
    #[cfg(test)]
    pub fn assert_errors(&self, case: &str, errors: &[(&str, &str)]) {
        let got: Vec<&str> = self.errors.iter().map(|e| e.field.as_str()).collect();
        let want: Vec<&str> = errors.iter().map(|(field, _)| *field).collect();
        assert_eq!(got, want, "{case}: {self:#?}");
        for (error, (_, phrase)) in self.errors.iter().zip(errors) {
            assert!(
                error.message.contains(phrase),
                "{case}: {:?} lacks {phrase:?}",
                error.message
            );
        }
    }

    fn refuse(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }
}

/// Moves an `--enable-admission-plugins=` entry of `extraArgs` into
/// `admissionControllers`, and a `--kubelet-preferred-address-types=` entry
/// into `kubelet.preferredAddressTypes`, while the field is empty: the control
/// plane renders those flags from the fields and drops the entries. Only the
/// first `--flag=value` entry with a non-empty value moves; anything else
/// naming those flags stays, for [`validate`] to refuse. Returns a note per
/// move, for the user.
pub fn mutate(obj: &mut Kubernetes) -> Vec<String> {
    let control_plane = &mut obj.spec.control_plane;
    let args = &control_plane.api_server.extra_args;
    let plugins = if control_plane.api_server.admission_controllers.is_empty() {
        movable_entry(args, ENABLE_ADMISSION_PLUGINS_FLAG)
    } else {
        None
    };
    let address_types = if control_plane.kubelet.preferred_address_types.is_empty() {
        movable_entry(args, KUBELET_PREFERRED_ADDRESS_TYPES_FLAG)
    } else {
        None
    };

    let mut notes = Vec::new();
    let mut moved = Vec::new();
    if let Some((index, names)) = plugins {
        notes.push(format!(
            "moved {EXTRA_ARGS}[{index}] ({ENABLE_ADMISSION_PLUGINS_FLAG}) into {ADMISSION_CONTROLLERS}: the control plane renders that flag from the field"
        ));
        control_plane.api_server.admission_controllers = names;
        moved.push(index);
    }
    if let Some((index, names)) = address_types {
        notes.push(format!(
            "moved {EXTRA_ARGS}[{index}] ({KUBELET_PREFERRED_ADDRESS_TYPES_FLAG}) into {PREFERRED_ADDRESS_TYPES}: the control plane renders that flag from the field"
        ));
        control_plane.kubelet.preferred_address_types = names;
        moved.push(index);
    }
    moved.sort_unstable();
    for index in moved.into_iter().rev() {
        control_plane.api_server.extra_args.remove(index);
    }
    notes
}

/// The first `<flag>=a,b,…` entry with at least one name, and its names,
/// each once, in order.
fn movable_entry(args: &[String], flag: &str) -> Option<(usize, Vec<String>)> {
    args.iter().enumerate().find_map(|(index, arg)| {
        let value = arg.strip_prefix(flag)?.strip_prefix('=')?;
        let mut names: Vec<String> = Vec::new();
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !names.iter().any(|seen| seen == name) {
                names.push(name.to_string());
            }
        }
        (!names.is_empty()).then_some((index, names))
    })
}

/// Decides a CREATE (`old` is None) or UPDATE of a `Kubernetes` object that
/// [`mutate`] has seen.
pub fn validate(new: &Kubernetes, old: Option<&Kubernetes>) -> Verdict {
    let mut verdict = Verdict::default();
    let spec = &new.spec;
    let old_spec = old.map(|o| &o.spec);
    check_extra_args(spec, &mut verdict);
    check_listed_once(
        ADMISSION_CONTROLLERS,
        &spec.control_plane.api_server.admission_controllers,
        ADMISSION_PLUGINS,
        "admission plugin",
        "the plugins the KamajiControlPlane accepts",
        &mut verdict,
    );
    check_listed_once(
        PREFERRED_ADDRESS_TYPES,
        &spec.control_plane.kubelet.preferred_address_types,
        NODE_ADDRESS_TYPES,
        "address type",
        "Hostname, InternalIP, ExternalIP, InternalDNS or ExternalDNS",
        &mut verdict,
    );
    check_talos_support(spec, old_spec, &mut verdict);
    if let Some(old_spec) = old_spec {
        check_version_change(old_spec.version, spec.version, &mut verdict);
    }
    warn_about_ignored_fields(new, old_spec, &mut verdict);
    verdict
}

// ---------------------------------------------------------------------------
// extraArgs
// ---------------------------------------------------------------------------

/// A flag among the `extraArgs` entries.
#[derive(Debug, PartialEq, Eq)]
struct Flag<'a> {
    /// Index of the entry naming the flag.
    index: usize,
    /// The name with its dashes, e.g. `--feature-gates`.
    name: &'a str,
    /// The value, from `=…` or from the next entry.
    value: Option<&'a str>,
}

/// Reads `extraArgs` as the apiserver's flag parser does. Returns the flags
/// and the indices of entries that are neither a flag nor a flag's value.
fn parse_flags(args: &[String]) -> (Vec<Flag<'_>>, Vec<usize>) {
    let mut flags = Vec::new();
    let mut strays = Vec::new();
    let mut index = 0;
    while index < args.len() {
        let arg = args[index].as_str();
        if !arg.starts_with('-') || arg == "-" || arg == "--" {
            strays.push(index);
            index += 1;
            continue;
        }
        let (name, value, next) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value), index + 1),
            None => {
                // `--name value`: pflag takes the next argument as the value
                // unless it looks like a flag.
                match args.get(index + 1).filter(|next| !next.starts_with('-')) {
                    Some(value) => (arg, Some(value.as_str()), index + 2),
                    None => (arg, None, index + 1),
                }
            }
        };
        flags.push(Flag { index, name, value });
        index = next;
    }
    (flags, strays)
}

fn check_extra_args(spec: &KubernetesSpec, verdict: &mut Verdict) {
    let args = &spec.control_plane.api_server.extra_args;
    let (flags, strays) = parse_flags(args);
    for index in strays {
        verdict.refuse(
            format!("{EXTRA_ARGS}[{index}]"),
            format!(
                "{:?} is neither a flag nor the value of the flag before it, and the kube-apiserver refuses positional arguments; write it as --name=value",
                args[index]
            ),
        );
    }
    for flag in &flags {
        if let Some(message) = owned_flag_message(flag.name) {
            verdict.refuse(format!("{EXTRA_ARGS}[{}]", flag.index), message);
        } else if spec.oidc.mode != OidcMode::None && is_oidc_flag(flag.name) {
            verdict.refuse(
                format!("{EXTRA_ARGS}[{}]", flag.index),
                format!(
                    "{} cannot be set while spec.oidc.mode is {:?}: OIDC is configured through --authentication-config, and the kube-apiserver refuses to start with both; remove the entry, or set spec.oidc.mode: None to configure OIDC by flags",
                    flag.name, spec.oidc.mode
                ),
            );
        }
    }
    check_feature_gates(&flags, verdict);
    check_emulated_versions(&flags, verdict);
    check_disabled_admission_plugins(spec, &flags, verdict);
}

fn owned_flag_message(name: &str) -> Option<String> {
    if name == ENABLE_ADMISSION_PLUGINS_FLAG {
        return Some(format!(
            "{name} is rendered by the control plane from {ADMISSION_CONTROLLERS}; list the plugins there (each once) and remove this entry"
        ));
    }
    if name == KUBELET_PREFERRED_ADDRESS_TYPES_FLAG {
        return Some(format!(
            "{name} is rendered by the control plane from {PREFERRED_ADDRESS_TYPES}; list the address types there (each once) and remove this entry"
        ));
    }
    CONTROL_PLANE_OWNED_FLAGS.contains(&name).then(|| {
        format!(
            "{name} is set by the tenant control plane itself, which drops entries naming it; remove this entry"
        )
    })
}

fn is_oidc_flag(name: &str) -> bool {
    name.starts_with("--oidc-") || name.starts_with("--authentication-config")
}

/// A gate named bare (`Gate=true`) is a kube gate, like `kube:Gate=true`; the
/// apiserver refuses to start when one gate is spelled both ways.
fn check_feature_gates(flags: &[Flag<'_>], verdict: &mut Verdict) {
    let mut bare: BTreeMap<&str, usize> = BTreeMap::new();
    let mut prefixed: BTreeMap<&str, usize> = BTreeMap::new();
    for flag in flags.iter().filter(|f| f.name == "--feature-gates") {
        let Some(value) = flag.value else {
            verdict.refuse(
                format!("{EXTRA_ARGS}[{}]", flag.index),
                "--feature-gates needs a value: --feature-gates=Gate=true,kube:OtherGate=false",
            );
            continue;
        };
        for term in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let Some((key, setting)) = term.split_once('=') else {
                verdict.refuse(
                    format!("{EXTRA_ARGS}[{}]", flag.index),
                    format!("feature gate term {term:?} needs =true or =false"),
                );
                continue;
            };
            if setting.trim().parse::<bool>().is_err() {
                verdict.refuse(
                    format!("{EXTRA_ARGS}[{}]", flag.index),
                    format!("feature gate term {term:?} must be set to true or false"),
                );
            }
            let key = key.trim();
            let (spelling, gate) = match key.split_once(':') {
                Some(("kube", gate)) => (&mut prefixed, gate),
                Some(_) => continue,
                None => (&mut bare, key),
            };
            spelling.entry(gate).or_insert(flag.index);
        }
    }
    for (gate, &bare_index) in &bare {
        if let Some(&prefixed_index) = prefixed.get(gate) {
            verdict.refuse(
                format!("{EXTRA_ARGS}[{}]", bare_index.max(prefixed_index)),
                format!(
                    "feature gate {gate} is named both bare ({EXTRA_ARGS}[{bare_index}]) and kube:-prefixed ({EXTRA_ARGS}[{prefixed_index}]), and the kube-apiserver refuses to start with both spellings; name it once"
                ),
            );
        }
    }
    if !bare.is_empty()
        && !prefixed.is_empty()
        && !bare.keys().any(|gate| prefixed.contains_key(gate))
    {
        verdict.warnings.push(format!(
            "{EXTRA_ARGS} names kube feature gates both bare and kube:-prefixed; keep one spelling for all kube gates"
        ));
    }
}

/// `--emulated-version` takes `component=version` terms, a bare version being
/// kube's; the apiserver refuses to start when kube is named twice.
fn check_emulated_versions(flags: &[Flag<'_>], verdict: &mut Verdict) {
    let mut first_kube: Option<usize> = None;
    for flag in flags.iter().filter(|f| f.name == "--emulated-version") {
        let Some(value) = flag.value else {
            verdict.refuse(
                format!("{EXTRA_ARGS}[{}]", flag.index),
                "--emulated-version needs a value: --emulated-version=kube=1.34",
            );
            continue;
        };
        for term in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let component = term.split_once('=').map_or("kube", |(c, _)| c.trim());
            if component != "kube" {
                continue;
            }
            match first_kube {
                None => first_kube = Some(flag.index),
                Some(first) => verdict.refuse(
                    format!("{EXTRA_ARGS}[{}]", flag.index),
                    format!(
                        "--emulated-version names kube again (first in {EXTRA_ARGS}[{first}]), and the kube-apiserver refuses to start with two kube emulated versions; keep one"
                    ),
                ),
            }
        }
    }
}

/// The apiserver refuses to start with a plugin both enabled and disabled,
/// and the control plane enables its default set when admissionControllers
/// is empty.
fn check_disabled_admission_plugins(
    spec: &KubernetesSpec,
    flags: &[Flag<'_>],
    verdict: &mut Verdict,
) {
    let listed = &spec.control_plane.api_server.admission_controllers;
    let enabled: Vec<&str> = if listed.is_empty() {
        DEFAULT_ADMISSION_PLUGINS.to_vec()
    } else {
        listed.iter().map(String::as_str).collect()
    };
    for flag in flags
        .iter()
        .filter(|f| f.name == "--disable-admission-plugins")
    {
        for plugin in flag
            .value
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|p| enabled.contains(p))
        {
            let why = if listed.is_empty() {
                format!(
                    "the control plane enables {plugin} by default while {ADMISSION_CONTROLLERS} is empty; list the plugins you want there, without {plugin}"
                )
            } else {
                format!("{ADMISSION_CONTROLLERS} enables it; remove it from one of the two")
            };
            verdict.refuse(
                format!("{EXTRA_ARGS}[{}]", flag.index),
                format!(
                    "--disable-admission-plugins names {plugin}, and the kube-apiserver refuses to start with a plugin both enabled and disabled: {why}"
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Lists
// ---------------------------------------------------------------------------

/// Every entry of `values` is one of `allowed`, and none repeats. The CRD
/// checks the same; this catches what [`mutate`] moved, with a message about
/// where it came from.
fn check_listed_once(
    field: &str,
    values: &[String],
    allowed: &[&str],
    what: &str,
    allowed_description: &str,
    verdict: &mut Verdict,
) {
    for (index, value) in values.iter().enumerate() {
        if !allowed.contains(&value.as_str()) {
            verdict.refuse(
                format!("{field}[{index}]"),
                format!("{value:?} is not an {what} the control plane accepts; use {allowed_description}"),
            );
        }
        if let Some(first) = values[..index].iter().position(|v| v == value) {
            verdict.refuse(
                format!("{field}[{index}]"),
                format!(
                    "{value} is listed twice (first at {field}[{first}]); name each {what} once"
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

/// The (major, minor) of a Talos release such as `v1.13.6`.
fn talos_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.strip_prefix('v')?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The Talos minors whose window includes Kubernetes minor `kubernetes`.
fn talos_minors_supporting(kubernetes: u32) -> Vec<String> {
    TALOS_KUBERNETES_SUPPORT
        .iter()
        .filter(|(_, oldest, newest)| (*oldest..=*newest).contains(&kubernetes))
        .map(|(talos, _, _)| format!("v1.{talos}"))
        .collect()
}

fn check_talos_support(
    spec: &KubernetesSpec,
    old_spec: Option<&KubernetesSpec>,
    verdict: &mut Verdict,
) {
    let talos = spec.talos.version.as_str();
    let Some((major, minor)) = talos_minor(talos) else {
        // The CRD refuses a malformed version; nothing to look up.
        return;
    };
    let window = (major == 1)
        .then(|| {
            TALOS_KUBERNETES_SUPPORT
                .iter()
                .find(|(t, _, _)| *t == minor)
        })
        .flatten();
    let Some(&(_, oldest, newest)) = window else {
        verdict.warnings.push(format!(
            "{TALOS_VERSION} {talos} is not in tenantry's Talos support matrix (Talos v1.10 to v1.13), so whether it runs Kubernetes {} is not checked",
            spec.version
        ));
        return;
    };
    let kubernetes = spec.version.minor();
    if (oldest..=newest).contains(&kubernetes) {
        return;
    }
    // Blame the field the user changed: the Talos version when only it moved.
    let talos_changed = old_spec
        .is_some_and(|old| old.talos.version != spec.talos.version && old.version == spec.version);
    let field = if talos_changed {
        TALOS_VERSION
    } else {
        VERSION
    };
    let supporting = talos_minors_supporting(kubernetes);
    let talos_advice = match supporting.split_last() {
        None => String::new(),
        Some((last, [])) => format!(", or set {TALOS_VERSION} to a release of Talos {last}"),
        Some((last, others)) => format!(
            ", or set {TALOS_VERSION} to a release of Talos {} or {last}",
            others.join(", ")
        ),
    };
    verdict.refuse(
        field,
        format!(
            "Kubernetes {} is not supported by Talos {talos} (Talos v{major}.{minor} supports Kubernetes v1.{oldest} to v1.{newest}): set {VERSION} to one of those{talos_advice}",
            spec.version
        ),
    );
}

/// A control plane upgrades one minor at a time and never goes back: etcd
/// holds objects in the newer version's storage format.
fn check_version_change(old: KubernetesVersion, new: KubernetesVersion, verdict: &mut Verdict) {
    if new < old {
        verdict.refuse(
            VERSION,
            format!(
                "cannot go from {old} back to {new}: Kubernetes control planes do not support downgrades; keep {old}, or create a new cluster"
            ),
        );
    } else if new.minor() > old.minor() + 1 {
        let next = KubernetesVersion::ALL
            .into_iter()
            .find(|v| v.minor() == old.minor() + 1)
            .expect("a version between two supported versions is supported");
        verdict.refuse(
            VERSION,
            format!(
                "cannot go from {old} to {new} in one step: Kubernetes upgrades one minor version at a time; set {next} first, then {new} once the control plane runs it"
            ),
        );
    }
}

// ---------------------------------------------------------------------------
// Warnings
// ---------------------------------------------------------------------------

fn warn_about_ignored_fields(
    new: &Kubernetes,
    old: Option<&KubernetesSpec>,
    verdict: &mut Verdict,
) {
    let spec = &new.spec;
    let name = new.metadata.name.as_deref().unwrap_or("<name>");
    let removed = [
        ("nodeGroups", spec.node_groups.is_some()),
        ("nodeHealthCheck", spec.node_health_check.is_some()),
        (
            "maxNodeProvisionTime",
            spec.max_node_provision_time.is_some(),
        ),
    ];
    for (field, present) in removed {
        if present {
            verdict.warnings.push(format!(
                "spec.{field} has no effect: worker pools are KubernetesNodes objects now (one per pool, with spec.cluster: {name}); the field is kept as stored, and editing it changes nothing"
            ));
        }
    }
    if spec.oidc.mode != OidcMode::CustomConfig && spec.oidc.custom_config.is_some() {
        verdict.warnings.push(format!(
            "spec.oidc.customConfig is ignored while spec.oidc.mode is {:?}; it is used only with mode CustomConfig",
            spec.oidc.mode
        ));
    }
    let ingress_enabled = |spec: &KubernetesSpec| {
        spec.addons
            .ingress_nginx
            .as_ref()
            .is_some_and(|ingress| ingress.enabled)
    };
    if ingress_enabled(spec) && !old.is_some_and(ingress_enabled) {
        verdict.warnings.push(format!(
            "spec.addons.ingressNginx runs on workers with the role ingress-nginx: give one KubernetesNodes pool of {name} roles: [ingress-nginx], or the controller schedules nowhere"
        ));
    }
}

#[cfg(test)]
mod tests;
