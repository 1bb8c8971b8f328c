//! Variable substitution in clusterctl templates, as clusterctl does it
//! (drone/envsubst syntax): `${VAR}`, `${VAR:=default}`, `${VAR=default}`,
//! `${VAR:-default}`, `${VAR-default}`, and `$$` for a literal `$`.

use std::collections::BTreeMap;

use anyhow::bail;

/// Replaces every variable in `template` from `values`, or from the default
/// the template gives. Unset variables without a default are an error that
/// lists them all, as `clusterctl generate cluster` reports them.
pub fn substitute(template: &str, values: &BTreeMap<String, String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut missing = Vec::new();
    let mut rest = template;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            // `$$` escapes a dollar sign.
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                bail!(
                    "unterminated variable near {:?}",
                    &rest[..rest.len().min(40)]
                );
            };
            let expression = &body[..end];
            match evaluate(expression, values) {
                Some(value) => out.push_str(&value),
                None => {
                    missing.push(expression.to_string());
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        bail!("value for variables [{}] is not set", missing.join(", "));
    }
    Ok(out)
}

fn evaluate(expression: &str, values: &BTreeMap<String, String>) -> Option<String> {
    let name_end = expression
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(expression.len());
    let (name, operator) = expression.split_at(name_end);
    let value = values.get(name);
    // `:=`/`:-` also replace an empty value; `=`/`-` only an unset one.
    if let Some(default) = operator
        .strip_prefix(":=")
        .or_else(|| operator.strip_prefix(":-"))
    {
        return Some(
            value
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| default.to_string()),
        );
    }
    if let Some(default) = operator
        .strip_prefix('=')
        .or_else(|| operator.strip_prefix('-'))
    {
        return Some(value.cloned().unwrap_or_else(|| default.to_string()));
    }
    value.cloned()
}

/// Values for the variables the CAPK and capmox templates use, for tests
/// that apply those templates.
pub fn test_variables(cluster_name: &str, namespace: &str) -> BTreeMap<String, String> {
    [
        ("CLUSTER_NAME", cluster_name),
        ("NAMESPACE", namespace),
        ("KUBERNETES_VERSION", "v1.35.4"),
        ("CONTROL_PLANE_MACHINE_COUNT", "1"),
        ("WORKER_MACHINE_COUNT", "2"),
        (
            "NODE_VM_IMAGE_TEMPLATE",
            "quay.io/capk/ubuntu-2404-container-disk:v1.34.1",
        ),
        ("CRI_PATH", "/var/run/containerd/containerd.sock"),
        ("TALOS_CODE", "a1b2c3"),
        ("TALOS_VERSION", "v1.13.0"),
        ("STORAGE_CLASS_NAME", "replicated"),
        ("ROOT_VOLUME_SIZE", "20Gi"),
        ("INSTANCE_TYPE", "u1.medium"),
        ("INSTANCE_PREFERENCE", "ubuntu"),
        (
            "SSH_AUTHORIZED_KEY",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test@example",
        ),
        (
            "VM_SSH_KEYS",
            "\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITest test@example\"",
        ),
        ("COREOS_CUSTOM_HOSTNAME", "node"),
        ("COREOS_CUSTOM_INSTANCE_ID", "i-1"),
        ("METALLB_IPV4_RANGE", "10.0.10.100-10.0.10.120"),
        ("METALLB_IPV6_RANGE", "fd00:10::100-fd00:10::120"),
        ("METALLB_IPV4_ASN", "64512"),
        ("METALLB_IPV6_ASN", "64513"),
        ("METALLB_IPV4_BGP_PEER", "10.0.0.1"),
        ("METALLB_IPV4_BGP_PEER2", "10.0.0.2"),
        ("METALLB_IPV4_BGP_PEER_ASN", "64520"),
        ("METALLB_IPV4_BGP_PEER2_ASN", "64521"),
        ("METALLB_IPV4_BGP_SECRET", "secret"),
        ("METALLB_IPV6_BGP_PEER", "fd00::1"),
        ("METALLB_IPV6_BGP_PEER2", "fd00::2"),
        ("METALLB_IPV6_BGP_PEER_ASN", "64522"),
        ("METALLB_IPV6_BGP_PEER2_ASN", "64523"),
        ("METALLB_IPV6_BGP_SECRET", "secret"),
        // capmox
        ("CONTROL_PLANE_ENDPOINT_IP", "10.10.10.9"),
        ("NODE_IP_RANGES", "[10.10.10.10-10.10.10.100]"),
        ("NODE_IPV6_RANGES", "[2001:db8::10-2001:db8::100]"),
        ("SECONDARY_IP_RANGES", "[10.20.10.10-10.20.10.100]"),
        ("LB_BGP_IPV4_RANGES", "[10.30.10.10-10.30.10.100]"),
        ("LB_BGP_IPV4_PREFIX", "24"),
        ("LB_BGP_IPV6_RANGE", "2001:db8:30::10-2001:db8:30::100"),
        ("LB_BGP_IPV6_PREFIX", "64"),
        ("LOAD_BALANCER_MACHINE_COUNT", "2"),
        ("IP_PREFIX", "24"),
        ("IPV6_PREFIX", "64"),
        ("SECONDARY_IP_PREFIX", "24"),
        ("GATEWAY", "10.10.10.1"),
        ("IPV6_GATEWAY", "2001:db8::1"),
        ("SECONDARY_GATEWAY", "10.20.10.1"),
        ("DNS_SERVERS", "[8.8.8.8, 8.8.4.4]"),
        ("ALLOWED_NODES", "[pve1, pve2]"),
        ("BRIDGE", "vmbr0"),
        ("SECONDARY_BRIDGE", "vmbr1"),
        ("EXT_SERVICE_BRIDGE", "vmbr2"),
        ("PROXMOX_SOURCENODE", "pve1"),
        ("TEMPLATE_VMID", "9000"),
        ("TEMPLATE_TAGS", "capi, ubuntu"),
        ("BOOT_VOLUME_DEVICE", "scsi0"),
        ("PROXMOX_URL", "https://pve.example:8006"),
        ("PROXMOX_TOKEN", "capmox@pve!capi"),
        ("PROXMOX_SECRET", "00000000-0000-0000-0000-000000000000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// CAPK's cluster templates (`e2e/fixtures/upstream/capk/templates`), in
/// name order.
pub fn capk_templates() -> Vec<std::path::PathBuf> {
    let folder =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream/capk/templates");
    let mut files: Vec<_> = std::fs::read_dir(&folder)
        .expect("read CAPK templates")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn substitutes_plain_and_defaulted_variables() {
        let vars = values(&[("NAME", "demo"), ("EMPTY", "")]);
        let out = substitute(
            "${NAME} ${SIZE:=100} ${EMPTY:=x} ${EMPTY=y} ${UNSET=z} ${UNSET:-w}",
            &vars,
        )
        .unwrap();
        assert_eq!(out, "demo 100 x  z w");
    }

    #[test]
    fn double_dollar_is_a_literal_dollar() {
        let out = substitute("echo \"$${HOST}\" costs $5", &values(&[])).unwrap();
        assert_eq!(out, "echo \"${HOST}\" costs $5");
    }

    #[test]
    fn missing_variables_are_listed() {
        let error = substitute("${B} ${A} ${B}", &values(&[])).unwrap_err();
        assert_eq!(error.to_string(), "value for variables [A, B] is not set");
    }
}
