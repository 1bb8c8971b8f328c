//! Proxmox VE API client.
