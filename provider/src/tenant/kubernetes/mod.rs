//! `Kubernetes` objects: a tenant cluster's control plane.

pub mod admission;
pub mod controller;
pub mod proxmox_controllers;
pub mod reconcile;
pub mod render;
pub mod storage;
