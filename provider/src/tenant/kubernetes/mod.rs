//! `Kubernetes` objects: a tenant cluster's control plane.

pub mod act;
pub mod admission;
pub mod controller;
pub mod decide;
pub mod exposure;
pub mod proxmox_controllers;
pub mod reconcile;
pub mod render;
pub mod status;
pub mod storage;
