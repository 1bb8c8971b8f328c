use super::*;
use serde_json::json;
use tenantry_api::tenant::{Addons, IngressNginxAddon, OidcCustomConfig, OidcSecretRef, Substrate};

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
            args: &["--enable-admission-plugins= NodeRestriction,,NodeRestriction ,PodSecurity"],
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
        verdict.assert_errors(case.name, case.errors);
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

mod versions;
