//! KubeVirt + CDI simulator (virt-controller, virt-handler, CDI importer).
