//! The tenant companion for `Kubernetes` objects (`apps.tenantry.dev`): a
//! tenant cluster's control plane on Kamaji, backed by the namespace's
//! etcd.
//!
//! - `admission`: the rules the CRD's schema and CEL cannot express, pure
//!   functions the validating and mutating webhooks call;
//! - `render`: the objects a `Kubernetes` becomes, as pure functions;
//! - `pki`: the etcd and Talos certificates and tokens tenantry issues;
//! - `reconcile` and `controller`: applying them, reporting status, and
//!   deleting in the safe order.

pub mod admission;
pub mod controller;
pub mod nodes_admission;
pub mod pki;
pub mod reconcile;
pub mod render;

pub use controller::run;
