//! Admission webhooks served by the `tenantry` binary: what CRD schemas and
//! CEL rules cannot express. Today: infrastructure and remediation templates
//! (KubeVirt and Proxmox) are immutable except for the dry-run requests of CAPI's
//! topology controller; `Kubernetes` objects are defaulted (mutating) and
//! validated against the rules of `tenant::kubernetes::admission`; `KubernetesNodes` pools
//! are validated against `tenant::kubernetes_nodes::admission` with their parent looked
//! up in the API.

pub mod configuration;
pub mod kubernetes;
pub mod kubernetes_nodes;
pub mod server;
pub mod templates;

pub use server::{WebhookConfig, serve};
