//! Which generation of the Cluster API core API the management cluster
//! serves: `cluster.x-k8s.io/v1beta2` (Cluster API ≥ 1.11) or only
//! `v1beta1` (1.10 and older, as platforms holding Cluster API back run
//! it). Found by discovery when the manager starts, never guessed: a
//! request in a version the server does not serve answers 404, which a read
//! would take for "absent".

use std::time::Duration;

use kube::api::ApiResource;
use kube::core::GroupVersionKind;

use super::owner::CAPI_GROUP;

/// A Cluster API core API generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapiGeneration {
    /// `cluster.x-k8s.io/v1beta1` (the v1beta1 contract).
    V1beta1,
    /// `cluster.x-k8s.io/v1beta2` (the v1beta2 contract).
    V1beta2,
}

/// A Cluster API core kind tenantry reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapiKind {
    Cluster,
    Machine,
    MachineSet,
    MachineDeployment,
    MachineHealthCheck,
}

impl CapiKind {
    fn names(self) -> (&'static str, &'static str) {
        match self {
            CapiKind::Cluster => ("Cluster", "clusters"),
            CapiKind::Machine => ("Machine", "machines"),
            CapiKind::MachineSet => ("MachineSet", "machinesets"),
            CapiKind::MachineDeployment => ("MachineDeployment", "machinedeployments"),
            CapiKind::MachineHealthCheck => ("MachineHealthCheck", "machinehealthchecks"),
        }
    }
}

impl CapiGeneration {
    /// The API version of the core kinds.
    pub fn version(self) -> &'static str {
        match self {
            CapiGeneration::V1beta1 => "v1beta1",
            CapiGeneration::V1beta2 => "v1beta2",
        }
    }

    /// `cluster.x-k8s.io/<version>`.
    pub fn api_version(self) -> String {
        format!("{CAPI_GROUP}/{}", self.version())
    }

    /// The resource of `kind` in this generation.
    pub fn resource(self, kind: CapiKind) -> ApiResource {
        let (kind, plural) = kind.names();
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(CAPI_GROUP, self.version(), kind),
            plural,
        )
    }

    /// The newest generation among served `versions`, if any is known.
    pub fn newest_of<'a>(versions: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        versions
            .into_iter()
            .filter_map(|version| match version {
                "v1beta2" => Some(CapiGeneration::V1beta2),
                "v1beta1" => Some(CapiGeneration::V1beta1),
                _ => None,
            })
            .max_by_key(|generation| *generation == CapiGeneration::V1beta2)
    }

    /// What the apiserver serves now; `None` while Cluster API is not
    /// installed.
    pub async fn discover(client: &kube::Client) -> kube::Result<Option<Self>> {
        let groups = client.list_api_groups().await?;
        Ok(groups
            .groups
            .iter()
            .find(|group| group.name == CAPI_GROUP)
            .and_then(|group| Self::newest_of(group.versions.iter().map(|v| v.version.as_str()))))
    }

    /// Waits until Cluster API is served and returns its generation. Until
    /// then the machine controllers have nothing to reconcile: CAPI owns
    /// every object they act on.
    pub async fn wait_until_served(client: &kube::Client) -> Self {
        let mut delay = Duration::from_millis(250);
        let mut said = false;
        loop {
            match Self::discover(client).await {
                Ok(Some(generation)) => {
                    tracing::info!(
                        version = generation.version(),
                        "Cluster API core kinds are read and written in this version"
                    );
                    return generation;
                }
                Ok(None) if !said => {
                    tracing::warn!(
                        "Cluster API is not installed (no {CAPI_GROUP} API group); waiting for it"
                    );
                    said = true;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "API discovery failed; trying again"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }
}

/// How often a running manager asks which generation is served.
const RECHECK: Duration = Duration::from_secs(30);

impl CapiGeneration {
    /// Returns once discovery says another generation than `current` is
    /// served (Cluster API upgraded from v1.10 to v1.11 or later, or
    /// downgraded), for the manager to start over in it. A failed discovery
    /// or a missing group is not a change: Cluster API may be mid-upgrade.
    pub async fn changed_from(client: &kube::Client, current: Self) -> Self {
        loop {
            tokio::time::sleep(RECHECK).await;
            if let Ok(Some(served)) = Self::discover(client).await
                && served != current
            {
                return served;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_served_generation_wins_and_unknown_versions_are_ignored() {
        assert_eq!(
            CapiGeneration::newest_of(["v1beta1", "v1beta2", "v1alpha4"]),
            Some(CapiGeneration::V1beta2)
        );
        assert_eq!(
            CapiGeneration::newest_of(["v1alpha4", "v1beta1"]),
            Some(CapiGeneration::V1beta1)
        );
        assert_eq!(CapiGeneration::newest_of(["v1alpha3"]), None);
    }

    #[test]
    fn resources_name_the_generation() {
        let resource = CapiGeneration::V1beta1.resource(CapiKind::MachineHealthCheck);
        assert_eq!(resource.api_version, "cluster.x-k8s.io/v1beta1");
        assert_eq!(resource.plural, "machinehealthchecks");
        assert_eq!(
            CapiGeneration::V1beta2.api_version(),
            "cluster.x-k8s.io/v1beta2"
        );
    }
}
