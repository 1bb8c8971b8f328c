//! The `extraArgs` rules of the tenant `Kubernetes` kind:
//! `tenantry_provider::tenant::kubernetes::admission::{mutate, validate}` (flag parsing,
//! owned flags, feature gates, emulated versions, disabled admission
//! plugins, the moves into `admissionControllers` and
//! `kubelet.preferredAddressTypes`), and the webhooks serving them over
//! AdmissionReview (`tenantry_provider::webhook::kubernetes`).
//!
//! The input is an `Input` built by `arbitrary`: one of the realistic specs
//! in `base` (its index is the input's first byte, so a one-byte file is that
//! spec as it is), with more extraArgs entries, list entries and versions
//! appended. The committed corpus holds one file per base.
//!
//! Invariants:
//! - mutate only removes entries, one per note, and moves them into empty
//!   fields as trimmed, distinct, non-empty names; a second mutate changes
//!   nothing;
//! - validate is deterministic, names only fields that exist, and refuses
//!   every entry naming a flag the control plane owns and every bare `-` or
//!   `--`; an update that changes nothing is never refused for its version;
//! - the mutating webhook's JSON patch, applied to the object as sent, gives
//!   the fields `mutate` computed; the validating webhook denies exactly
//!   when `validate` refuses, naming every refused field.

#![no_main]

use arbitrary::Arbitrary;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use tenantry_api::tenant::{
    ADMISSION_PLUGINS, CONTROL_PLANE_OWNED_FLAGS, ENABLE_ADMISSION_PLUGINS_FLAG,
    KUBELET_PREFERRED_ADDRESS_TYPES_FLAG, Kubernetes, KubernetesSpec, KubernetesVersion,
    NODE_ADDRESS_TYPES, OidcMode,
};
use tenantry_provider::tenant::kubernetes::admission::{self, Verdict};
use tenantry_provider::webhook::kubernetes as webhook;

const EXTRA_ARGS: &str = "spec.controlPlane.apiServer.extraArgs";

#[derive(Arbitrary, Debug)]
struct Input {
    base: u8,
    args: Vec<Arg>,
    admission_controllers: Vec<Name>,
    preferred_address_types: Vec<Name>,
    oidc_mode: Option<u8>,
    version: Option<u8>,
    talos_version: Option<Talos>,
    /// Validate as an UPDATE from this.
    old: Option<Old>,
}

#[derive(Arbitrary, Debug)]
enum Arg {
    /// `--name=value`, or `--name` and `value` as two entries.
    Flag {
        name: FlagName,
        value: Option<FlagValue>,
        separate: bool,
    },
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum FlagName {
    /// One of `FLAGS`.
    Known(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum FlagValue {
    /// Comma-joined admission plugin names.
    Plugins(Vec<u8>),
    /// Comma-joined feature gate terms.
    Gates(Vec<Gate>),
    /// Comma-joined `component=version` terms.
    Emulated(Vec<(bool, u8)>),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Gate {
    /// 0: bare, 1: `kube:`, else another component's prefix.
    prefix: u8,
    name: u8,
    /// true, false, or something else.
    setting: u8,
}

#[derive(Arbitrary, Debug)]
enum Name {
    Plugin(u8),
    AddressType(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Talos {
    /// `v1.<minor>.3`.
    Minor(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Old {
    version: u8,
    talos_version: Option<Talos>,
}

/// Flags the rules look at, and some they do not.
const FLAGS: &[&str] = &[
    "--feature-gates",
    "--emulated-version",
    "--disable-admission-plugins",
    "--oidc-issuer-url",
    "--oidc-client-id",
    "--authentication-config",
    "--audit-log-maxage",
    "--request-timeout",
    "--v",
    "-v",
    "--",
    "-",
];

const GATES: &[&str] = &[
    "InPlacePodVerticalScaling",
    "StructuredAuthenticationConfiguration",
    "AllAlpha",
    "CoordinatedLeaderElection",
];

fn pick<'a>(items: &[&'a str], index: u8) -> &'a str {
    items[usize::from(index) % items.len()]
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

/// The realistic specs the corpus starts from (`fuzz/corpus/extra_args/seed-<n>`);
/// the second value is the spec to update from, if any.
fn base(index: u8) -> (KubernetesSpec, Option<KubernetesSpec>) {
    let mut spec = KubernetesSpec::default();
    let api_server = &mut spec.control_plane.api_server;
    let mut old = None;
    match index % 6 {
        // Defaults: no entries.
        0 => {}
        // Typical tuning, a value in its own entry.
        1 => {
            api_server.extra_args = strings(&[
                "--audit-log-maxage=7",
                "--feature-gates=kube:InPlacePodVerticalScaling=true,StructuredAuthenticationConfiguration=true",
                "--v",
                "2",
            ]);
        }
        // Entries the mutating webhook moves into fields.
        2 => {
            api_server.extra_args = strings(&[
                "--enable-admission-plugins=NodeRestriction, PodSecurity,NodeRestriction",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--request-timeout=2m",
            ]);
        }
        // OIDC by the platform next to OIDC flags, a plugin both enabled
        // and disabled.
        3 => {
            spec.oidc.mode = OidcMode::System;
            let api_server = &mut spec.control_plane.api_server;
            api_server.extra_args = strings(&[
                "--oidc-issuer-url=https://id.example/realms/tenant-a",
                "--disable-admission-plugins=PodSecurity",
            ]);
            api_server.admission_controllers = strings(&["NodeRestriction", "PodSecurity"]);
        }
        // An upgrade skipping a minor, on an old Talos, kube emulated twice.
        4 => {
            api_server.extra_args =
                strings(&["--emulated-version=kube=1.34", "--emulated-version", "1.33"]);
            spec.version = KubernetesVersion::V1_35;
            spec.talos.version = "v1.10.6".into();
            let mut previous = spec.clone();
            previous.version = KubernetesVersion::V1_33;
            old = Some(previous);
        }
        // Positional entries, a bare `--`, an owned flag, a gate spelled
        // both ways.
        _ => {
            api_server.extra_args = strings(&[
                "positional",
                "--",
                "--secure-port=6444",
                "--feature-gates=AllAlpha=true,kube:AllAlpha=false",
                "--feature-gates",
            ]);
        }
    }
    (spec, old)
}

fn flag_value(value: FlagValue) -> String {
    let join = |terms: Vec<String>| terms.join(",");
    match value {
        FlagValue::Plugins(indices) => join(
            indices
                .into_iter()
                .map(|i| pick(ADMISSION_PLUGINS, i).to_string())
                .collect(),
        ),
        FlagValue::Gates(gates) => join(
            gates
                .into_iter()
                .map(|gate| {
                    let prefix = match gate.prefix % 3 {
                        0 => "",
                        1 => "kube:",
                        _ => "etcd:",
                    };
                    let setting = match gate.setting % 3 {
                        0 => "true",
                        1 => "false",
                        _ => "maybe",
                    };
                    format!("{prefix}{}={setting}", pick(GATES, gate.name))
                })
                .collect(),
        ),
        FlagValue::Emulated(terms) => join(
            terms
                .into_iter()
                .map(|(named, minor)| {
                    let component = if minor % 2 == 0 { "kube" } else { "wardle" };
                    let version = format!("1.{}", 30 + minor % 8);
                    if named {
                        format!("{component}={version}")
                    } else {
                        version
                    }
                })
                .collect(),
        ),
        FlagValue::Raw(text) => text,
    }
}

fn args(input: Vec<Arg>) -> Vec<String> {
    let mut out = Vec::new();
    for arg in input {
        match arg {
            Arg::Raw(text) => out.push(text),
            Arg::Flag {
                name,
                value,
                separate,
            } => {
                let name = match name {
                    FlagName::Known(i) if usize::from(i) < CONTROL_PLANE_OWNED_FLAGS.len() => {
                        CONTROL_PLANE_OWNED_FLAGS[usize::from(i)].to_string()
                    }
                    FlagName::Known(i) => pick(FLAGS, i).to_string(),
                    FlagName::Raw(name) => name,
                };
                match (value.map(flag_value), separate) {
                    (None, _) => out.push(name),
                    (Some(value), true) => out.extend([name, value]),
                    (Some(value), false) => out.push(format!("{name}={value}")),
                }
            }
        }
    }
    out
}

fn name(input: Name) -> String {
    match input {
        Name::Plugin(i) => pick(ADMISSION_PLUGINS, i).to_string(),
        Name::AddressType(i) => pick(NODE_ADDRESS_TYPES, i).to_string(),
        Name::Raw(text) => text,
    }
}

fn version(index: u8) -> KubernetesVersion {
    KubernetesVersion::ALL[usize::from(index) % KubernetesVersion::ALL.len()]
}

fn talos(input: Talos) -> String {
    match input {
        Talos::Minor(minor) => format!("v1.{}.3", minor % 16),
        Talos::Raw(text) => text,
    }
}

fuzz_target!(|input: Input| {
    let (mut spec, mut old) = base(input.base);
    let api_server = &mut spec.control_plane.api_server;
    api_server.extra_args.extend(args(input.args));
    api_server
        .admission_controllers
        .extend(input.admission_controllers.into_iter().map(name));
    spec.control_plane
        .kubelet
        .preferred_address_types
        .extend(input.preferred_address_types.into_iter().map(name));
    if let Some(mode) = input.oidc_mode {
        spec.oidc.mode =
            [OidcMode::None, OidcMode::System, OidcMode::CustomConfig][usize::from(mode) % 3];
    }
    if let Some(index) = input.version {
        spec.version = version(index);
    }
    if let Some(version) = input.talos_version {
        spec.talos.version = talos(version);
    }
    if let Some(from) = input.old {
        let mut previous = spec.clone();
        previous.version = version(from.version);
        if let Some(version) = from.talos_version {
            previous.talos.version = talos(version);
        }
        old = Some(previous);
    }
    let object = Kubernetes::new("demo", spec);
    let old = old.map(|spec| Kubernetes::new("demo", spec));

    check_validate(&object, old.as_ref());
    let mutated = check_mutate(&object);
    check_validate(&mutated, old.as_ref());
    check_webhooks(&object, old.as_ref(), &mutated);
});

fn check_mutate(object: &Kubernetes) -> Kubernetes {
    let before = &object.spec.control_plane;
    let mut mutated = object.clone();
    let notes = admission::mutate(&mut mutated);
    let after = &mutated.spec.control_plane;

    let removed = before.api_server.extra_args.len() - after.api_server.extra_args.len();
    assert_eq!(notes.len(), removed, "one note per moved entry: {notes:?}");
    assert!(
        is_subsequence(&after.api_server.extra_args, &before.api_server.extra_args),
        "mutate only removes entries"
    );
    check_moved(
        &before.api_server.admission_controllers,
        &after.api_server.admission_controllers,
        &before.api_server.extra_args,
        ENABLE_ADMISSION_PLUGINS_FLAG,
    );
    check_moved(
        &before.kubelet.preferred_address_types,
        &after.kubelet.preferred_address_types,
        &before.api_server.extra_args,
        KUBELET_PREFERRED_ADDRESS_TYPES_FLAG,
    );
    let mut again = mutated.clone();
    assert!(
        admission::mutate(&mut again).is_empty(),
        "a second mutate moves nothing"
    );
    assert_eq!(again.spec, mutated.spec);
    assert_eq!(
        mutated.spec.version, object.spec.version,
        "mutate leaves the rest alone"
    );
    mutated
}

fn is_subsequence(short: &[String], long: &[String]) -> bool {
    let mut long = long.iter();
    short.iter().all(|item| long.any(|l| l == item))
}

fn check_moved(before: &[String], after: &[String], args: &[String], flag: &str) {
    if before == after {
        return;
    }
    assert!(before.is_empty(), "{flag}: only an empty field is filled");
    assert!(!after.is_empty());
    for (index, name) in after.iter().enumerate() {
        assert!(!name.is_empty() && name.trim() == name, "{name:?}");
        assert!(!after[..index].contains(name), "{name} moved twice");
    }
    let prefix = format!("{flag}=");
    assert!(
        args.iter().any(|a| a.starts_with(&prefix)),
        "{flag}: names came from an entry"
    );
}

fn check_validate(object: &Kubernetes, old: Option<&Kubernetes>) -> Verdict {
    let verdict = admission::validate(object, old);
    assert_eq!(verdict, admission::validate(object, old), "deterministic");
    assert_eq!(verdict.allowed(), verdict.errors.is_empty());
    let args = &object.spec.control_plane.api_server.extra_args;
    for error in &verdict.errors {
        assert!(error.field.starts_with("spec."), "{error}");
        assert!(!error.message.is_empty(), "{error}");
        if let Some(index) = error.field.strip_prefix(&format!("{EXTRA_ARGS}[")) {
            let index: usize = index
                .strip_suffix(']')
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("{error}"));
            assert!(index < args.len(), "{error}");
        }
    }
    let refused = |index: usize| {
        let field = format!("{EXTRA_ARGS}[{index}]");
        verdict.errors.iter().any(|e| e.field == field)
    };
    for (index, arg) in args.iter().enumerate() {
        // An entry starting with '-' is always read as a flag, never as
        // the value of the one before.
        let flag_name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        let owned = arg.starts_with('-')
            && (CONTROL_PLANE_OWNED_FLAGS.contains(&flag_name)
                || flag_name == ENABLE_ADMISSION_PLUGINS_FLAG
                || flag_name == KUBELET_PREFERRED_ADDRESS_TYPES_FLAG);
        if owned || arg == "-" || arg == "--" {
            assert!(refused(index), "{arg:?} at [{index}] admitted: {verdict:?}");
        }
    }
    // An update that changes nothing is refused for its version only as
    // its creation would be (a Talos release not supporting it).
    let created = admission::validate(object, None);
    let unchanged = admission::validate(object, Some(object));
    assert!(
        unchanged
            .errors
            .iter()
            .all(|e| e.field != "spec.version" || created.errors.contains(e)),
        "{unchanged:?}"
    );
    verdict
}

fn request(
    operation: &str,
    object: &Kubernetes,
    old: Option<&Kubernetes>,
) -> AdmissionRequest<DynamicObject> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000001",
            "kind": { "group": "apps.tenantry.dev", "version": "v1alpha1", "kind": "Kubernetes" },
            "resource": { "group": "apps.tenantry.dev", "version": "v1alpha1", "resource": "kuberneteses" },
            "name": "demo",
            "namespace": "tenant-a",
            "operation": operation,
            "userInfo": {},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    }))
    .expect("an AdmissionReview");
    review.try_into().expect("a request")
}

fn check_webhooks(object: &Kubernetes, old: Option<&Kubernetes>, mutated: &Kubernetes) {
    let (patch, notes) =
        webhook::mutate(&request("CREATE", object, None)).expect("a Kubernetes object mutates");
    let mut patched = serde_json::to_value(object).expect("serializes");
    json_patch::patch(&mut patched, &patch).expect("the patch applies to the object as sent");
    let patched: Kubernetes = serde_json::from_value(patched).expect("still a Kubernetes");
    assert_eq!(
        patched.spec.control_plane, mutated.spec.control_plane,
        "the patch gives what mutate computed"
    );
    assert_eq!(notes.is_empty(), patch.0.is_empty());

    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    let decision = webhook::validate(&request(operation, object, old));
    let verdict = admission::validate(object, old);
    assert_eq!(decision.denied.is_some(), !verdict.allowed());
    assert_eq!(decision.warnings, verdict.warnings);
    if let Some(denied) = decision.denied {
        for error in &verdict.errors {
            assert!(denied.contains(&error.field), "{denied}");
        }
    }
}
