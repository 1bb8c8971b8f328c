//! Pausing, as the contract asks: `Cluster.spec.paused` or the
//! `cluster.x-k8s.io/paused` annotation on the object stops every write except
//! the `Paused` condition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tenantry_api::contract::{PAUSED_ANNOTATION, PAUSED_CONDITION};

use super::Cluster;
use super::conditions::DesiredCondition;

/// Why an object is paused, if it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PausedBy {
    /// `Cluster.spec.paused` is true.
    Cluster,
    /// The object carries the paused annotation.
    Annotation,
}

/// Whether reconciliation of an object is paused.
pub fn paused_by(cluster: Option<&Cluster>, meta: &ObjectMeta) -> Option<PausedBy> {
    if cluster.and_then(|c| c.spec.paused).unwrap_or(false) {
        return Some(PausedBy::Cluster);
    }
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
    {
        return Some(PausedBy::Annotation);
    }
    None
}

/// The `Paused` condition for the state (reasons as CAPI's helper writes them).
pub fn paused_condition(paused: Option<PausedBy>) -> DesiredCondition {
    match paused {
        Some(PausedBy::Cluster) => DesiredCondition::true_(PAUSED_CONDITION, "Paused")
            .with_message("Cluster spec.paused is set"),
        Some(PausedBy::Annotation) => DesiredCondition::true_(PAUSED_CONDITION, "Paused")
            .with_message(format!("the object has the {PAUSED_ANNOTATION} annotation")),
        None => DesiredCondition::false_(PAUSED_CONDITION, "NotPaused", ""),
    }
}
