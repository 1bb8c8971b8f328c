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
mod tests {
    use super::*;
    use serde_json::json;
    use tenantry_api::tenant::{
        Addons, IngressNginxAddon, OidcCustomConfig, OidcSecretRef, Substrate,
    };

    fn cluster(edit: impl FnOnce(&mut KubernetesSpec)) -> Kubernetes {
        let mut spec = KubernetesSpec::default();
        edit(&mut spec);
        Kubernetes::new("demo", spec)
    }

    fn with_args(args: &[&str]) -> Kubernetes {
        cluster(|spec| {
            spec.control_plane.api_server.extra_args = strings(args);
        })
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    /// The fields of the errors, in order.
    fn error_fields(verdict: &Verdict) -> Vec<&str> {
        verdict.errors.iter().map(|e| e.field.as_str()).collect()
    }

    // --- mutate ---------------------------------------------------------

    #[test]
    fn mutate_moves_the_flags_the_control_plane_renders_from_fields() {
        struct Case {
            name: &'static str,
            args: &'static [&'static str],
            plugins: &'static [&'static str],
            address_types: &'static [&'static str],
            want_args: &'static [&'static str],
            want_plugins: &'static [&'static str],
            want_address_types: &'static [&'static str],
            notes: usize,
        }
        let cases = [
            Case {
                name: "both flags move while their fields are empty",
                args: &[
                    "--audit-log-maxage=3",
                    "--enable-admission-plugins=NodeRestriction,PodSecurity",
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    "--v=2",
                ],
                plugins: &[],
                address_types: &[],
                want_args: &["--audit-log-maxage=3", "--v=2"],
                want_plugins: &["NodeRestriction", "PodSecurity"],
                want_address_types: &["InternalIP", "Hostname"],
                notes: 2,
            },
            Case {
                name: "nothing moves into a field that is set",
                args: &["--enable-admission-plugins=PodSecurity"],
                plugins: &["NodeRestriction"],
                address_types: &[],
                want_args: &["--enable-admission-plugins=PodSecurity"],
                want_plugins: &["NodeRestriction"],
                want_address_types: &[],
                notes: 0,
            },
            Case {
                name: "only the first entry moves",
                args: &[
                    "--kubelet-preferred-address-types=InternalIP",
                    "--kubelet-preferred-address-types=Hostname",
                ],
                plugins: &[],
                address_types: &[],
                want_args: &["--kubelet-preferred-address-types=Hostname"],
                want_plugins: &[],
                want_address_types: &["InternalIP"],
                notes: 1,
            },
            Case {
                name: "repeats and blanks are dropped when moving",
                args: &[
                    "--enable-admission-plugins= NodeRestriction,,NodeRestriction ,PodSecurity",
                ],
                plugins: &[],
                address_types: &[],
                want_args: &[],
                want_plugins: &["NodeRestriction", "PodSecurity"],
                want_address_types: &[],
                notes: 1,
            },
            Case {
                name: "an empty value does not move",
                args: &["--enable-admission-plugins="],
                plugins: &[],
                address_types: &[],
                want_args: &["--enable-admission-plugins="],
                want_plugins: &[],
                want_address_types: &[],
                notes: 0,
            },
            Case {
                name: "the value in the next entry does not move",
                args: &["--enable-admission-plugins", "NodeRestriction"],
                plugins: &[],
                address_types: &[],
                want_args: &["--enable-admission-plugins", "NodeRestriction"],
                want_plugins: &[],
                want_address_types: &[],
                notes: 0,
            },
            Case {
                name: "a longer flag with the same prefix is not it",
                args: &["--enable-admission-plugins-extra=x"],
                plugins: &[],
                address_types: &[],
                want_args: &["--enable-admission-plugins-extra=x"],
                want_plugins: &[],
                want_address_types: &[],
                notes: 0,
            },
        ];
        for case in cases {
            let mut obj = cluster(|spec| {
                spec.control_plane.api_server.extra_args = strings(case.args);
                spec.control_plane.api_server.admission_controllers = strings(case.plugins);
                spec.control_plane.kubelet.preferred_address_types = strings(case.address_types);
            });
            let notes = mutate(&mut obj);
            let api_server = &obj.spec.control_plane.api_server;
            assert_eq!(
                api_server.extra_args,
                strings(case.want_args),
                "{}",
                case.name
            );
            assert_eq!(
                api_server.admission_controllers,
                strings(case.want_plugins),
                "{}",
                case.name
            );
            assert_eq!(
                obj.spec.control_plane.kubelet.preferred_address_types,
                strings(case.want_address_types),
                "{}",
                case.name
            );
            assert_eq!(notes.len(), case.notes, "{}: {notes:?}", case.name);
        }
    }

    #[test]
    fn mutate_notes_name_the_entry_and_the_field() {
        let mut obj = with_args(&["--v=2", "--enable-admission-plugins=NodeRestriction"]);
        let notes = mutate(&mut obj);
        assert_eq!(
            notes,
            [
                "moved spec.controlPlane.apiServer.extraArgs[1] (--enable-admission-plugins) into spec.controlPlane.apiServer.admissionControllers: the control plane renders that flag from the field"
            ]
        );
    }

    #[test]
    fn mutate_then_validate_admits_a_moved_entry() {
        let mut obj = with_args(&[
            "--enable-admission-plugins=NodeRestriction",
            "--kubelet-preferred-address-types=InternalIP,ExternalIP",
        ]);
        assert!(!validate(&obj, None).allowed());
        mutate(&mut obj);
        let verdict = validate(&obj, None);
        assert!(verdict.allowed(), "{verdict:?}");
    }

    #[test]
    fn mutate_leaves_an_unknown_plugin_for_validation_to_name() {
        let mut obj =
            with_args(&["--enable-admission-plugins=NodeRestriction,ClusterTrustBundleAttest"]);
        mutate(&mut obj);
        let verdict = validate(&obj, None);
        assert_eq!(
            error_fields(&verdict),
            ["spec.controlPlane.apiServer.admissionControllers[1]"]
        );
        assert!(
            verdict.errors[0]
                .message
                .contains("\"ClusterTrustBundleAttest\" is not an admission plugin"),
            "{verdict:?}"
        );
    }

    // --- validate: extraArgs --------------------------------------------

    struct ArgsCase {
        name: &'static str,
        args: &'static [&'static str],
        oidc: OidcMode,
        /// (field, a phrase of its message)
        errors: &'static [(&'static str, &'static str)],
    }

    #[test]
    fn extra_args_rules() {
        let cases = [
            ArgsCase {
                name: "ordinary flags pass, in both value forms",
                args: &[
                    "--audit-log-path=/var/log/audit.log",
                    "--audit-log-maxage",
                    "30",
                    "--profiling",
                    "--v=4",
                    "-v=4",
                ],
                oidc: OidcMode::None,
                errors: &[],
            },
            ArgsCase {
                name: "a flag the control plane owns is refused",
                args: &["--v=2", "--etcd-servers=https://etcd:2379"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[1]",
                    "--etcd-servers is set by the tenant control plane itself",
                )],
            },
            ArgsCase {
                name: "an owned flag is refused with its value in the next entry",
                args: &["--secure-port", "6444"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "--secure-port is set by the tenant control plane itself",
                )],
            },
            ArgsCase {
                name: "an admission plugins entry that did not move points at the field",
                args: &["--enable-admission-plugins", "NodeRestriction"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "list the plugins there",
                )],
            },
            ArgsCase {
                name: "an address types entry that did not move points at the field",
                args: &["--kubelet-preferred-address-types="],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "rendered by the control plane from spec.controlPlane.kubelet.preferredAddressTypes",
                )],
            },
            ArgsCase {
                name: "a stray value is refused",
                args: &["--v=2", "debug"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[1]",
                    "refuses positional arguments",
                )],
            },
            ArgsCase {
                name: "oidc flags pass without OIDC",
                args: &["--oidc-issuer-url=https://issuer", "--oidc-client-id=k8s"],
                oidc: OidcMode::None,
                errors: &[],
            },
            ArgsCase {
                name: "oidc flags are refused with OIDC",
                args: &[
                    "--oidc-issuer-url=https://issuer",
                    "--v=2",
                    "--oidc-client-id=k8s",
                ],
                oidc: OidcMode::System,
                errors: &[
                    (
                        "spec.controlPlane.apiServer.extraArgs[0]",
                        "--oidc-issuer-url cannot be set while spec.oidc.mode is System",
                    ),
                    (
                        "spec.controlPlane.apiServer.extraArgs[2]",
                        "--oidc-client-id cannot be set",
                    ),
                ],
            },
            ArgsCase {
                name: "authentication-config is refused with OIDC",
                args: &["--authentication-config=/etc/authn.yaml"],
                oidc: OidcMode::CustomConfig,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "refuses to start with both",
                )],
            },
            ArgsCase {
                name: "one gate spelled bare and kube-prefixed across entries is refused",
                args: &[
                    "--feature-gates=AnonymousAuthConfigurableEndpoints=true",
                    "--v=2",
                    "--feature-gates=kube:AnonymousAuthConfigurableEndpoints=false",
                ],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[2]",
                    "feature gate AnonymousAuthConfigurableEndpoints is named both bare (spec.controlPlane.apiServer.extraArgs[0]) and kube:-prefixed (spec.controlPlane.apiServer.extraArgs[2])",
                )],
            },
            ArgsCase {
                name: "one gate spelled both ways in one entry is refused",
                args: &["--feature-gates=kube:A=true,A=true"],
                oidc: OidcMode::None,
                errors: &[("spec.controlPlane.apiServer.extraArgs[0]", "feature gate A")],
            },
            ArgsCase {
                name: "gates of other components and one spelling pass",
                args: &[
                    "--feature-gates=kube:A=true,wardle:A=false",
                    "--feature-gates=kube:B=false",
                ],
                oidc: OidcMode::None,
                errors: &[],
            },
            ArgsCase {
                name: "a gate without a setting is refused",
                args: &["--feature-gates=A"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "needs =true or =false",
                )],
            },
            ArgsCase {
                name: "a gate set to something else than a boolean is refused",
                args: &["--feature-gates=A=yes"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "must be set to true or false",
                )],
            },
            ArgsCase {
                name: "two emulated versions for kube are refused",
                args: &["--emulated-version=kube=1.34", "--emulated-version=1.33"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[1]",
                    "--emulated-version names kube again (first in spec.controlPlane.apiServer.extraArgs[0])",
                )],
            },
            ArgsCase {
                name: "one emulated version for kube and others pass",
                args: &[
                    "--emulated-version=kube=1.34,wardle=1.2",
                    "--emulated-version=sample=1.0",
                ],
                oidc: OidcMode::None,
                errors: &[],
            },
            ArgsCase {
                name: "disabling a plugin of the default set is refused",
                args: &["--disable-admission-plugins=LimitRanger,AlwaysPullImages"],
                oidc: OidcMode::None,
                errors: &[(
                    "spec.controlPlane.apiServer.extraArgs[0]",
                    "--disable-admission-plugins names LimitRanger",
                )],
            },
        ];
        for case in cases {
            let obj = cluster(|spec| {
                spec.control_plane.api_server.extra_args = strings(case.args);
                spec.oidc.mode = case.oidc;
                if case.oidc == OidcMode::CustomConfig {
                    spec.oidc.custom_config = Some(OidcCustomConfig {
                        config: None,
                        secret_ref: Some(OidcSecretRef {
                            name: Some("authn".into()),
                        }),
                    });
                }
            });
            let verdict = validate(&obj, None);
            let got: Vec<&str> = error_fields(&verdict);
            let want: Vec<&str> = case.errors.iter().map(|(field, _)| *field).collect();
            assert_eq!(got, want, "{}: {verdict:#?}", case.name);
            for (error, (_, phrase)) in verdict.errors.iter().zip(case.errors) {
                assert!(
                    error.message.contains(phrase),
                    "{}: {:?} lacks {phrase:?}",
                    case.name,
                    error.message
                );
            }
        }
    }

    #[test]
    fn every_owned_flag_is_refused() {
        for flag in CONTROL_PLANE_OWNED_FLAGS {
            let verdict = validate(&with_args(&[&format!("{flag}=x")]), None);
            assert_eq!(
                error_fields(&verdict),
                ["spec.controlPlane.apiServer.extraArgs[0]"],
                "{flag}"
            );
            assert!(verdict.errors[0].message.starts_with(flag), "{verdict:?}");
        }
    }

    #[test]
    fn disabling_a_plugin_listed_in_admission_controllers_is_refused() {
        let obj = cluster(|spec| {
            spec.control_plane.api_server.admission_controllers = strings(&["NodeRestriction"]);
            spec.control_plane.api_server.extra_args =
                strings(&["--disable-admission-plugins=NodeRestriction"]);
        });
        let verdict = validate(&obj, None);
        assert_eq!(
            error_fields(&verdict),
            ["spec.controlPlane.apiServer.extraArgs[0]"]
        );
        assert!(
            verdict.errors[0]
                .message
                .contains("remove it from one of the two")
        );

        // With its own list, a plugin of the default set may be disabled.
        let obj = cluster(|spec| {
            spec.control_plane.api_server.admission_controllers = strings(&["NodeRestriction"]);
            spec.control_plane.api_server.extra_args =
                strings(&["--disable-admission-plugins=LimitRanger"]);
        });
        assert!(validate(&obj, None).allowed());
    }

    #[test]
    fn mixing_gate_spellings_for_different_gates_warns() {
        let verdict = validate(&with_args(&["--feature-gates=A=true,kube:B=true"]), None);
        assert!(verdict.allowed(), "{verdict:?}");
        assert!(
            verdict
                .warnings
                .iter()
                .any(|w| w.contains("keep one spelling")),
            "{verdict:?}"
        );
    }

    #[test]
    fn parse_flags_reads_entries_like_pflag() {
        let args = strings(&["--a=1", "--b", "2", "--c", "--d", "x", "y", "-v=3", "--"]);
        let (flags, strays) = parse_flags(&args);
        let read: Vec<(usize, &str, Option<&str>)> =
            flags.iter().map(|f| (f.index, f.name, f.value)).collect();
        assert_eq!(
            read,
            [
                (0, "--a", Some("1")),
                (1, "--b", Some("2")),
                (3, "--c", None),
                (4, "--d", Some("x")),
                (7, "-v", Some("3")),
            ]
        );
        assert_eq!(strays, [6, 8]);
    }

    // --- validate: lists ------------------------------------------------

    #[test]
    fn repeated_list_entries_are_refused_where_they_repeat() {
        let obj = cluster(|spec| {
            spec.control_plane.api_server.admission_controllers =
                strings(&["NodeRestriction", "PodSecurity", "NodeRestriction"]);
            spec.control_plane.kubelet.preferred_address_types =
                strings(&["InternalIP", "InternalIP", "Hostname", "InternalIPv6"]);
        });
        let verdict = validate(&obj, None);
        assert_eq!(
            error_fields(&verdict),
            [
                "spec.controlPlane.apiServer.admissionControllers[2]",
                "spec.controlPlane.kubelet.preferredAddressTypes[1]",
                "spec.controlPlane.kubelet.preferredAddressTypes[3]",
            ]
        );
        assert!(
            verdict.errors[0].message.contains(
                "listed twice (first at spec.controlPlane.apiServer.admissionControllers[0])"
            ),
            "{verdict:?}"
        );
        assert!(verdict.errors[2].message.contains("InternalIPv6"));
    }

    // --- validate: versions ---------------------------------------------

    struct VersionCase {
        name: &'static str,
        old: Option<(KubernetesVersion, &'static str)>,
        new: (KubernetesVersion, &'static str),
        errors: &'static [(&'static str, &'static str)],
        warns: bool,
    }

    #[test]
    fn version_rules() {
        use KubernetesVersion::*;
        let cases = [
            VersionCase {
                name: "the defaults fit",
                old: None,
                new: (V1_35, "v1.13.6"),
                errors: &[],
                warns: false,
            },
            VersionCase {
                name: "every supported version runs on Talos v1.13",
                old: None,
                new: (V1_31, "v1.13.0"),
                errors: &[],
                warns: false,
            },
            VersionCase {
                name: "Talos v1.11 does not run Kubernetes v1.35",
                old: None,
                new: (V1_35, "v1.11.5"),
                errors: &[(
                    "spec.version",
                    "Kubernetes v1.35 is not supported by Talos v1.11.5 (Talos v1.11 supports Kubernetes v1.29 to v1.34): set spec.version to one of those, or set spec.talos.version to a release of Talos v1.12 or v1.13",
                )],
                warns: false,
            },
            VersionCase {
                name: "Talos v1.10 does not run Kubernetes v1.34",
                old: None,
                new: (V1_34, "v1.10.7"),
                errors: &[(
                    "spec.version",
                    "Talos v1.10 supports Kubernetes v1.28 to v1.33",
                )],
                warns: false,
            },
            VersionCase {
                name: "a Talos change is blamed on the Talos version",
                old: Some((V1_35, "v1.13.6")),
                new: (V1_35, "v1.11.0"),
                errors: &[("spec.talos.version", "not supported by Talos v1.11.0")],
                warns: false,
            },
            VersionCase {
                name: "an unknown Talos minor warns",
                old: None,
                new: (V1_35, "v1.14.0"),
                errors: &[],
                warns: true,
            },
            VersionCase {
                name: "one minor up is an upgrade",
                old: Some((V1_34, "v1.13.6")),
                new: (V1_35, "v1.13.6"),
                errors: &[],
                warns: false,
            },
            VersionCase {
                name: "two minors up at once are refused",
                old: Some((V1_33, "v1.13.6")),
                new: (V1_35, "v1.13.6"),
                errors: &[(
                    "spec.version",
                    "cannot go from v1.33 to v1.35 in one step: Kubernetes upgrades one minor version at a time; set v1.34 first",
                )],
                warns: false,
            },
            VersionCase {
                name: "a downgrade is refused",
                old: Some((V1_35, "v1.13.6")),
                new: (V1_34, "v1.13.6"),
                errors: &[("spec.version", "cannot go from v1.35 back to v1.34")],
                warns: false,
            },
        ];
        for case in cases {
            let make = |(version, talos): (KubernetesVersion, &str)| {
                cluster(|spec| {
                    spec.version = version;
                    spec.talos.version = talos.to_string();
                })
            };
            let old = case.old.map(make);
            let verdict = validate(&make(case.new), old.as_ref());
            let want: Vec<&str> = case.errors.iter().map(|(field, _)| *field).collect();
            assert_eq!(error_fields(&verdict), want, "{}: {verdict:#?}", case.name);
            for (error, (_, phrase)) in verdict.errors.iter().zip(case.errors) {
                assert!(
                    error.message.contains(phrase),
                    "{}: {:?} lacks {phrase:?}",
                    case.name,
                    error.message
                );
            }
            assert_eq!(
                !verdict.warnings.is_empty(),
                case.warns,
                "{}: {verdict:?}",
                case.name
            );
        }
    }

    #[test]
    fn the_talos_table_covers_every_supported_version_on_v1_13() {
        for version in KubernetesVersion::ALL {
            assert!(
                talos_minors_supporting(version.minor()).contains(&"v1.13".to_string()),
                "{version}"
            );
        }
        assert_eq!(talos_minor("v1.13.0-beta.1"), Some((1, 13)));
        assert_eq!(talos_minor("1.13.0"), None);
    }

    // --- validate: warnings ---------------------------------------------

    #[test]
    fn removed_fields_are_admitted_with_a_warning_pointing_at_kubernetes_nodes() {
        let obj = cluster(|spec| {
            spec.node_groups = Some(json!({ "md0": { "minReplicas": 1 } }));
            spec.node_health_check = Some(json!({ "maxUnhealthy": "50%" }));
            spec.max_node_provision_time = Some("30m".into());
        });
        let verdict = validate(&obj, Some(&obj));
        assert!(verdict.allowed(), "{verdict:?}");
        assert_eq!(verdict.warnings.len(), 3, "{verdict:?}");
        for (warning, field) in
            verdict
                .warnings
                .iter()
                .zip(["nodeGroups", "nodeHealthCheck", "maxNodeProvisionTime"])
        {
            assert!(
                warning.starts_with(&format!("spec.{field} has no effect"))
                    && warning.contains("KubernetesNodes")
                    && warning.contains("spec.cluster: demo"),
                "{warning}"
            );
        }
    }

    #[test]
    fn a_plain_cluster_is_admitted_without_warnings() {
        let obj = cluster(|spec| spec.substrate = Substrate::Kubevirt);
        assert_eq!(validate(&obj, None), Verdict::default());
        assert_eq!(validate(&obj, Some(&obj)), Verdict::default());
    }

    #[test]
    fn ignored_settings_warn() {
        let obj = cluster(|spec| {
            spec.oidc.custom_config = Some(OidcCustomConfig {
                config: Some("apiVersion: apiserver.config.k8s.io/v1beta1".into()),
                secret_ref: None,
            });
            spec.addons = Addons {
                ingress_nginx: Some(IngressNginxAddon {
                    enabled: true,
                    ..Default::default()
                }),
                ..Default::default()
            };
        });
        let verdict = validate(&obj, None);
        assert!(verdict.allowed());
        assert_eq!(verdict.warnings.len(), 2, "{verdict:?}");
        assert!(verdict.warnings[0].contains("spec.oidc.customConfig is ignored"));
        assert!(verdict.warnings[1].contains("roles: [ingress-nginx]"));
        // Enabled before: no new warning about the pool.
        assert_eq!(validate(&obj, Some(&obj)).warnings.len(), 1);
    }

    #[test]
    fn field_errors_print_as_field_and_message() {
        let error = FieldError {
            field: "spec.version".into(),
            message: "is wrong".into(),
        };
        assert_eq!(error.to_string(), "spec.version: is wrong");
    }
}
