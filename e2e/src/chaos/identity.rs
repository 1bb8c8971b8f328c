//! Tenantry as a user of its own, with only the permissions its release
//! grants: the ClusterRoles of `infrastructure-components.yaml`, bound to a
//! user whose client certificate the control plane's CA issues (in a real
//! cluster, the manager's ServiceAccount). Revoking deletes that binding;
//! restoring creates it again, as an operator repairing RBAC would.

use anyhow::Context as _;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

/// The release's binding of the manager's ClusterRole (to its
/// ServiceAccount), from `infrastructure-components.yaml`.
fn release_binding() -> anyhow::Result<Value> {
    tenantry_provider::components::infrastructure_components()
        .into_iter()
        .find(|d| {
            d["kind"] == "ClusterRoleBinding"
                && d["subjects"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["kind"] == "ServiceAccount"))
        })
        .context("infrastructure-components.yaml has no ClusterRoleBinding for the manager")
}

/// The name of the binding that grants `user` the manager's ClusterRole.
pub(crate) fn binding_name(user: &str) -> String {
    format!("chaos-{user}")
}

/// Installs the release's ClusterRoles (server-side apply) and binds the
/// manager's to `user`.
pub(crate) async fn grant_release_role(client: &kube::Client, user: &str) -> anyhow::Result<()> {
    for role in tenantry_provider::components::infrastructure_components()
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
    {
        crate::manifests::apply_object(client, role, "default").await?;
    }
    restore(client, user).await
}

/// Binds the manager's ClusterRole to `user` (again).
pub(crate) async fn restore(client: &kube::Client, user: &str) -> anyhow::Result<()> {
    let release = release_binding()?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": binding_name(user) },
        "roleRef": release["roleRef"],
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .with_context(|| format!("bind the manager's ClusterRole to {user}"))?;
    Ok(())
}

/// Takes the manager's ClusterRole away from `user`: every request it
/// makes from now on is answered 403 (watches already open stay open, as
/// kube-apiserver authorizes a request once, when it starts).
pub(crate) async fn revoke(client: &kube::Client, user: &str) -> anyhow::Result<()> {
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete(&binding_name(user), &DeleteParams::default())
        .await
        .with_context(|| format!("delete the binding of {user}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_binds_the_manager_role_to_its_service_account() {
        let binding = release_binding().unwrap();
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
        assert!(
            binding["roleRef"]["name"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
        );
    }
}
