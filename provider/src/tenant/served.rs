//! The API versions the companion writes its Cluster API and Kamaji objects
//! in, as the management cluster serves them: Cluster API v1beta2 or only
//! v1beta1 (found when the manager starts, [`CapiGeneration`]), and
//! `KamajiControlPlane` v1alpha2 or only v1alpha1 (the control plane
//! provider v0.19, which platforms hold back because later releases rename
//! the API without a conversion). Objects are rendered once, in the newest
//! shape, and written in the older one where that is what is served.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource};
use serde_json::Value;

use crate::capi::{CapiGeneration, CapiKind, convert, downgrade};
use crate::reconciler::Context;

const KAMAJI_CONTROL_PLANE_CRD: &str = "kamajicontrolplanes.controlplane.cluster.x-k8s.io";

/// A `KamajiControlPlane` API version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KamajiApi {
    /// Control plane provider ≤ v0.19 (Cluster API's v1beta1 contract).
    V1alpha1,
    /// Later releases (the v1beta2 contract).
    V1alpha2,
}

impl KamajiApi {
    pub fn version(self) -> &'static str {
        match self {
            KamajiApi::V1alpha1 => "v1alpha1",
            KamajiApi::V1alpha2 => "v1alpha2",
        }
    }

    /// The newest of the versions a CRD serves, if it serves a known one.
    pub fn newest_served(crd: &CustomResourceDefinition) -> Option<Self> {
        let served = |name: &str| {
            crd.spec
                .versions
                .iter()
                .any(|version| version.served && version.name == name)
        };
        if served("v1alpha2") {
            Some(KamajiApi::V1alpha2)
        } else if served("v1alpha1") {
            Some(KamajiApi::V1alpha1)
        } else {
            None
        }
    }

    /// The version the installed control plane provider serves; `None`
    /// while its CRD is not installed.
    pub async fn discover(client: &kube::Client) -> kube::Result<Option<Self>> {
        Ok(Api::<CustomResourceDefinition>::all(client.clone())
            .get_opt(KAMAJI_CONTROL_PLANE_CRD)
            .await?
            .as_ref()
            .and_then(Self::newest_served))
    }
}

/// What a reconcile writes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    pub capi: CapiGeneration,
    pub kamaji: KamajiApi,
}

/// Why the companion cannot write its objects yet.
#[derive(Debug, thiserror::Error)]
pub enum ServedError {
    #[error(
        "the KamajiControlPlane CRD ({KAMAJI_CONTROL_PLANE_CRD}) is not installed or serves neither v1alpha1 nor v1alpha2"
    )]
    NoKamaji,
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl<E: crate::reconciler::OwnError> From<ServedError> for crate::reconciler::Error<E> {
    fn from(error: ServedError) -> Self {
        match error {
            ServedError::NoKamaji => crate::reconciler::Error::Waiting(
                ServedError::NoKamaji.to_string(),
                std::time::Duration::from_secs(10),
            ),
            ServedError::Kube(error) => crate::reconciler::Error::Kube(error),
        }
    }
}

impl Served {
    /// The versions for `ctx`'s manager: Cluster API's from start-up, the
    /// Kamaji provider's from its CRD the first time it is found.
    pub async fn of(ctx: &Context) -> Result<Self, ServedError> {
        let kamaji = ctx
            .kamaji
            .get_or_try_init(|| async {
                match KamajiApi::discover(&ctx.client).await? {
                    Some(api) => {
                        tracing::info!(
                            version = api.version(),
                            "KamajiControlPlanes are written in this version"
                        );
                        Ok(api)
                    }
                    None => Err(ServedError::NoKamaji),
                }
            })
            .await?;
        Ok(Self {
            capi: ctx.capi,
            kamaji: *kamaji,
        })
    }

    /// The API version of a kind a v1beta1 reference names.
    pub fn version_of(&self, group: &str, kind: &str) -> String {
        let version = match kind {
            "KamajiControlPlane" => self.kamaji.version(),
            "TalosConfigTemplate" | "TalosConfig" => "v1alpha3",
            "ProxmoxCluster" | "ProxmoxMachineTemplate" | "ProxmoxRemediationTemplate" => {
                "v1alpha2"
            }
            _ => "v1alpha1",
        };
        format!("{group}/{version}")
    }

    pub fn resource(&self, kind: CapiKind) -> ApiResource {
        self.capi.resource(kind)
    }

    pub fn kamaji_control_plane_resource(&self) -> ApiResource {
        kamaji_control_plane_resource(self.kamaji)
    }

    /// A rendered (v1beta2) Cluster API object of `kind`, as served.
    pub fn capi_object(&self, kind: CapiKind, rendered: Value) -> Value {
        if self.capi == CapiGeneration::V1beta2 {
            return rendered;
        }
        let version_of = |group: &str, kind: &str| self.version_of(group, kind);
        match kind {
            CapiKind::Cluster => downgrade::cluster(rendered, &version_of),
            CapiKind::MachineDeployment => downgrade::machine_deployment(rendered, &version_of),
            CapiKind::MachineHealthCheck => downgrade::machine_health_check(rendered, &version_of),
            CapiKind::Machine | CapiKind::MachineSet => rendered,
        }
    }

    /// A MachineDeployment as read, in the v1beta2 shape.
    pub fn read_machine_deployment(&self, object: Value) -> Value {
        match self.capi {
            CapiGeneration::V1beta1 => convert::machine_deployment(object),
            CapiGeneration::V1beta2 => object,
        }
    }

    /// A rendered (v1alpha2) KamajiControlPlane, as served: the spec tenantry
    /// writes has the same fields in v1alpha1 (as the platform deploys
    /// it, with `network.additionalServicePorts`).
    pub fn kamaji_control_plane(&self, mut rendered: Value) -> Value {
        rendered["apiVersion"] = Value::String(format!(
            "controlplane.cluster.x-k8s.io/{}",
            self.kamaji.version()
        ));
        rendered
    }
}

pub fn kamaji_control_plane_resource(api: KamajiApi) -> ApiResource {
    crate::tenant::kubernetes::act::resource(
        "controlplane.cluster.x-k8s.io",
        api.version(),
        "KamajiControlPlane",
        "kamajicontrolplanes",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(versions: &[(&str, bool)]) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": KAMAJI_CONTROL_PLANE_CRD },
            "spec": {
                "group": "controlplane.cluster.x-k8s.io",
                "names": { "kind": "KamajiControlPlane", "plural": "kamajicontrolplanes" },
                "scope": "Namespaced",
                "versions": versions.iter().map(|(name, served)| serde_json::json!({
                    "name": name, "served": served, "storage": true
                })).collect::<Vec<_>>()
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_newest_served_kamaji_api_is_written() {
        assert_eq!(
            KamajiApi::newest_served(&crd(&[("v1alpha1", true)])),
            Some(KamajiApi::V1alpha1)
        );
        assert_eq!(
            KamajiApi::newest_served(&crd(&[("v1alpha1", true), ("v1alpha2", true)])),
            Some(KamajiApi::V1alpha2)
        );
        assert_eq!(
            KamajiApi::newest_served(&crd(&[("v1alpha1", false), ("v1alpha2", true)])),
            Some(KamajiApi::V1alpha2)
        );
        assert_eq!(KamajiApi::newest_served(&crd(&[("v1alpha3", true)])), None);
    }

    #[test]
    fn references_name_the_served_versions() {
        let served = Served {
            capi: CapiGeneration::V1beta1,
            kamaji: KamajiApi::V1alpha1,
        };
        assert_eq!(
            served.version_of("controlplane.cluster.x-k8s.io", "KamajiControlPlane"),
            "controlplane.cluster.x-k8s.io/v1alpha1"
        );
        assert_eq!(
            served.version_of("infrastructure.cluster.x-k8s.io", "ProxmoxMachineTemplate"),
            "infrastructure.cluster.x-k8s.io/v1alpha2"
        );
        let kcp = served.kamaji_control_plane(serde_json::json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha2", "kind": "KamajiControlPlane"
        }));
        assert_eq!(kcp["apiVersion"], "controlplane.cluster.x-k8s.io/v1alpha1");
    }
}
