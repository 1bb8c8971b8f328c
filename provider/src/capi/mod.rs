//! The Cluster API contract as seen from an infrastructure provider: finding
//! the owner Machine and the Cluster, pausing, bootstrap data, conditions, the machine templates' capacity.
//! Shared by both substrates.

pub mod access;
pub mod bootstrap;
pub mod conditions;
pub mod convert;
pub mod downgrade;
pub mod generation;
pub mod owner;
pub mod pause;
pub mod stores;
pub mod template_capacity;

pub use generation::{CapiGeneration, CapiKind};
pub use tenantry_api::generated::capi::cluster::Cluster;
pub use tenantry_api::generated::capi::machine::Machine;
