//! The Secrets Kamaji and its provider write for a tenant: the admin
//! kubeconfigs and the CAPI Secrets copied from them.

use super::*;

/// The four keys of Kamaji's `<tcp>-admin-kubeconfig`: `*.conf` against the
/// public endpoint, `*.svc` against the TCP Service in the management
/// cluster, for `kubernetes-admin` and `kubernetes-super-admin`.
pub(super) fn admin_kubeconfig_data(
    kcp: &str,
    namespace: &str,
    public_server: &str,
    service_port: u16,
    ca: &CertificateAuthority,
) -> anyhow::Result<BTreeMap<String, String>> {
    let service_server = format!("https://{kcp}.{namespace}.svc:{service_port}");
    let ca_pem = ca.cert_pem();
    let mut data = BTreeMap::new();
    for (stem, user, group) in [
        ("admin", "kubernetes-admin", "kubeadm:cluster-admins"),
        ("super-admin", "kubernetes-super-admin", "system:masters"),
    ] {
        let certificate = ca.issue_client(user, &[group])?;
        let credentials = ClientCredentials {
            user,
            cert_pem: &certificate.cert_pem,
            key_pem: &certificate.key_pem,
        };
        data.insert(
            format!("{stem}.conf"),
            render_kubeconfig(kcp, public_server, &ca_pem, &credentials),
        );
        data.insert(
            format!("{stem}.svc"),
            render_kubeconfig(kcp, &service_server, &ca_pem, &credentials),
        );
    }
    Ok(data)
}

pub(super) struct ClientCredentials<'a> {
    user: &'a str,
    cert_pem: &'a str,
    key_pem: &'a str,
}

/// A kubeconfig as kubeadm writes one: the cluster named after the TCP
/// (kubeadm's `clusterName`), the context `<user>@<cluster>`.
pub(super) fn render_kubeconfig(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    credentials: &ClientCredentials<'_>,
) -> String {
    let user = credentials.user;
    format!(
        "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: {server}
  name: {cluster}
contexts:
- context:
    cluster: {cluster}
    user: {user}
  name: {user}@{cluster}
current-context: {user}@{cluster}
kind: Config
preferences: {{}}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
",
        ca = BASE64.encode(ca_pem),
        cert = BASE64.encode(credentials.cert_pem),
        key = BASE64.encode(credentials.key_pem),
    )
}

/// Labels Kamaji puts on the TCP's Secrets (`utilities.KamajiLabels`).
pub(super) fn kamaji_labels(tcp: &str, resource: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kamaji.clastix.io/project".into(), "kamaji".into()),
        ("kamaji.clastix.io/name".into(), tcp.into()),
        ("kamaji.clastix.io/component".into(), resource.into()),
        (
            "kamaji.clastix.io/certificate_lifecycle_controller".into(),
            "kubeconfig".into(),
        ),
    ])
}

/// Labels the provider puts on the CAPI Secrets it copies.
pub(super) fn capi_labels(cluster: &str, tcp: &str, secret: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cluster.x-k8s.io/cluster-name".into(), cluster.into()),
        ("kamaji.clastix.io/component".into(), "capi".into()),
        ("kamaji.clastix.io/secret".into(), secret.into()),
        ("kamaji.clastix.io/cluster".into(), cluster.into()),
        ("kamaji.clastix.io/tcp".into(), tcp.into()),
    ])
}

/// Writes Secrets owned (controller reference) by a KamajiControlPlane.
pub(super) struct Secrets<'a> {
    pub(super) client: &'a kube::Client,
    /// The owner's API version, for the owner references.
    pub(super) api: KamajiApi,
    pub(super) owner: &'a DynamicObject,
    pub(super) namespace: &'a str,
}

impl Secrets<'_> {
    /// Creates the Secret, or updates its data when it differs.
    pub(super) async fn ensure(
        &self,
        name: &str,
        type_: Option<&str>,
        labels: BTreeMap<String, String>,
        data: &BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), self.namespace);
        if let Some(existing) = secrets.get_opt(name).await? {
            let current = existing.data.unwrap_or_default();
            let same = data.len() == current.len()
                && data
                    .iter()
                    .all(|(k, v)| current.get(k).map(|c| c.0.as_slice()) == Some(v.as_bytes()));
            if !same {
                secrets
                    .patch(
                        name,
                        &patch_params(),
                        &Patch::Merge(json!({ "stringData": data })),
                    )
                    .await
                    .with_context(|| format!("update Secret {name}"))?;
            }
            return Ok(());
        }
        let mut secret = json!({
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": self.api.api_version(),
                    "kind": KAMAJI_CONTROL_PLANE_KIND,
                    "name": self.owner.metadata.name,
                    "uid": self.owner.metadata.uid,
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "stringData": data,
        });
        if let Some(type_) = type_ {
            secret["type"] = json!(type_);
        }
        let secret: Secret = serde_json::from_value(secret)?;
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .with_context(|| format!("create Secret {name}"))?;
        Ok(())
    }
}
