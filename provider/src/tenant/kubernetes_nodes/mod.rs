//! `KubernetesNodes` objects: a tenant cluster's worker pools.

pub mod act;
pub mod admission;
pub mod controller;
pub mod decide;
mod observe;
pub mod reconcile;
pub mod render;
pub mod status;
