//! Where the NoCloud seed goes: its storage and the CD-ROM drive.

use crate::proxmox::client::{StorageSummary, VmConfig};

/// The storage the seed ISO goes to: the spec's, else the first enabled
/// ISO storage of the node in name order (capmox takes PVE's first, whose
/// order changes between calls, #569).
pub fn iso_storage(explicit: Option<&str>, storages: &[StorageSummary]) -> Result<String, String> {
    if let Some(explicit) = explicit {
        return Ok(explicit.to_string());
    }
    let mut candidates: Vec<&str> = storages
        .iter()
        .filter(|s| s.is_enabled() && s.holds("iso"))
        .map(|s| s.storage.as_str())
        .collect();
    candidates.sort();
    candidates
        .first()
        .map(|s| s.to_string())
        .ok_or_else(|| "no enabled storage on the node accepts ISO images that the credentials can see: set spec.isoStorage".to_string())
}

/// Where the seed CD-ROM is, or goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedDrive {
    /// Attached as this drive.
    Attached(String),
    /// To be attached as this drive.
    Attach(String),
    /// Every IDE and SATA slot is taken.
    NoFreeSlot,
}

/// Drive slots a CD-ROM can take, in the order tried.
const CDROM_SLOTS: [&str; 10] = [
    "ide0", "ide1", "ide2", "ide3", "sata0", "sata1", "sata2", "sata3", "sata4", "sata5",
];

/// Finds the seed's drive: the drive holding `volid`, else an empty CD-ROM
/// drive, else a free slot. The boot order is left alone: the seed is read,
/// not booted (capmox rewrote `boot` and broke legacy orders, #225).
pub fn seed_drive(config: &VmConfig, volid: &str) -> SeedDrive {
    let value = |slot: &str| config.get(slot);
    if let Some(slot) = CDROM_SLOTS
        .iter()
        .find(|slot| value(slot).is_some_and(|v| v.split(',').next() == Some(volid)))
    {
        return SeedDrive::Attached(slot.to_string());
    }
    if let Some(slot) = CDROM_SLOTS.iter().find(|slot| {
        value(slot).is_some_and(|v| {
            let mut parts = v.split(',');
            matches!(parts.next(), Some("none" | "cdrom")) && v.contains("media=cdrom")
        })
    }) {
        return SeedDrive::Attach(slot.to_string());
    }
    match CDROM_SLOTS.iter().find(|slot| value(slot).is_none()) {
        Some(slot) => SeedDrive::Attach(slot.to_string()),
        None => SeedDrive::NoFreeSlot,
    }
}

/// The value of an attached seed drive, and of an emptied one.
pub fn cdrom_value(volid: Option<&str>) -> String {
    format!("{},media=cdrom", volid.unwrap_or("none"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: serde_json::Value) -> VmConfig {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn iso_storage_is_explicit_or_the_first_by_name() {
        let storages: Vec<StorageSummary> = serde_json::from_value(json!([
            { "storage": "zeta", "content": "iso", "enabled": 1 },
            { "storage": "local-lvm", "content": "images" },
            { "storage": "local", "content": "iso,vztmpl" },
            { "storage": "alpha", "content": "iso", "enabled": 0 },
        ]))
        .unwrap();
        assert_eq!(iso_storage(None, &storages).unwrap(), "local");
        assert_eq!(
            iso_storage(Some("tenant-iso"), &storages).unwrap(),
            "tenant-iso"
        );
        assert!(
            iso_storage(None, &[])
                .unwrap_err()
                .contains("spec.isoStorage")
        );
    }

    #[test]
    fn the_seed_takes_an_empty_cdrom_else_a_free_slot() {
        let volid = "local:iso/tenantry-u.iso";
        let attached = config(json!({ "ide2": "local:iso/tenantry-u.iso,media=cdrom" }));
        assert_eq!(
            seed_drive(&attached, volid),
            SeedDrive::Attached("ide2".into())
        );
        let empty = config(
            json!({ "ide0": "local-lvm:vm-1-cloudinit,media=cdrom", "ide2": "none,media=cdrom" }),
        );
        assert_eq!(seed_drive(&empty, volid), SeedDrive::Attach("ide2".into()));
        let busy = config(json!({ "ide0": "local-lvm:vm-1-disk-1", "ide1": "x" }));
        assert_eq!(seed_drive(&busy, volid), SeedDrive::Attach("ide2".into()));
        assert_eq!(
            cdrom_value(Some(volid)),
            "local:iso/tenantry-u.iso,media=cdrom"
        );
        assert_eq!(cdrom_value(None), "none,media=cdrom");
    }
}
