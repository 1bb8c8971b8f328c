//! The tenant companion for `Kubernetes` objects (`apps.tenantry.dev`).
//! Today: the admission rules the CRD's schema and CEL cannot express
//! (`admission.rs`), pure functions the validating and mutating webhooks
//! call.

pub mod admission;
