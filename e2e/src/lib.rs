//! Tenantry's test harness.
//!
//! Real parts where they can run here: [`ControlPlane`] starts etcd,
//! kube-apiserver and kube-controller-manager built from the upstream Go
//! modules (see `hack/upstream/`); [`ClusterApiManager`] runs the real Cluster
//! API core manager against it. Simulators for what cannot run here (KubeVirt,
//! CDI, Proxmox VE, Kamaji, tenant nodes) live in their own modules, each
//! documenting the upstream behaviour it copies.

pub mod bench;
pub mod cert_manager;
pub mod chaos;
pub mod cluster_api;
pub mod cluster_api_operator;
pub mod clusterctl;
pub mod clusterctl_template;
pub mod control_plane;
pub mod demo;
pub mod fixtures;
pub mod kubevirt_upstream;
pub mod logs;
pub mod management;
pub mod manifests;
pub mod pki;
pub mod pod_runner;
pub mod process;
pub mod promcheck;
pub mod pve_lab;
pub mod scrape;
pub mod sim;
pub mod talos_check;
pub mod tenantry;
pub mod upstream;
pub mod wait;
pub mod world;

pub use cluster_api::{ClusterApiManager, UpstreamManager};
pub use control_plane::{ControlPlane, ControlPlaneOptions, PodSupport};
pub use upstream::{Binary, Upstream};
pub use world::{Kubevirt, World, WorldBuilder};
