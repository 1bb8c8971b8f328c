//! Version pairs (Kubernetes and Talos, upgrades), removed and ignored
//! fields, and how errors print.

use super::*;

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
        verdict.assert_errors(case.name, case.errors);
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
