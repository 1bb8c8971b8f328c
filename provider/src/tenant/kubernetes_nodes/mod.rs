//! `KubernetesNodes` objects: a tenant cluster's worker pools.

pub mod admission;
pub mod controller;
pub mod reconcile;
pub mod render;
