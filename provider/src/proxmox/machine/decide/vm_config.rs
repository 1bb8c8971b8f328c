//! What a clone's configuration must become: CPU, memory, network devices
//! and the boot disk's size.

use std::collections::BTreeSet;

use tenantry_api::proxmox::{NetworkDevice as DeviceSpec, ProxmoxMachineSpec};

use crate::proxmox::client::{NetDevice, VmConfig, VmConfigUpdate};

/// The network devices of a machine: its own list, else `net0` alone (which
/// then keeps the template's bridge and model).
pub fn network_devices(spec: &ProxmoxMachineSpec) -> Vec<DeviceSpec> {
    if spec.network.network_devices.is_empty() {
        vec![DeviceSpec::default()]
    } else {
        spec.network.network_devices.clone()
    }
}

fn model_name(model: tenantry_api::proxmox::NetworkModel) -> &'static str {
    use tenantry_api::proxmox::NetworkModel::*;
    match model {
        E1000 => "e1000",
        Virtio => "virtio",
        Rtl8139 => "rtl8139",
        Vmxnet3 => "vmxnet3",
    }
}

/// The `netN` value a device must have, keeping the MAC PVE gave it (a new
/// MAC would make the guest a stranger to its DHCP leases and the seed's
/// network-config), or `None` when the current value already says it.
pub fn net_value(
    device: &DeviceSpec,
    current: Option<&NetDevice>,
) -> Result<Option<String>, String> {
    let model = device
        .model
        .map(model_name)
        .map(str::to_string)
        .or_else(|| current.map(|c| c.model.clone()))
        .unwrap_or_else(|| "virtio".to_string());
    let bridge = device
        .bridge
        .clone()
        .or_else(|| current.and_then(|c| c.bridge.clone()))
        .ok_or_else(|| {
            format!(
                "network device {} has no bridge, and the template has no such device",
                device.name
            )
        })?;
    let vlan = device
        .vlan
        .map(|v| v.to_string())
        .or_else(|| current.and_then(|c| c.vlan.map(|v| v.to_string())));
    let mtu = device
        .mtu
        .map(|v| v.to_string())
        .or_else(|| current.and_then(|c| c.mtu.map(|v| v.to_string())));
    let queues = device
        .queues
        .map(|v| v.to_string())
        .or_else(|| current.and_then(|c| c.properties.get("queues").cloned()));
    if let Some(current) = current {
        let same = current.model == model
            && current.bridge.as_deref() == Some(bridge.as_str())
            && current.vlan.map(|v| v.to_string()) == vlan
            && current.mtu.map(|v| v.to_string()) == mtu
            && current.properties.get("queues").cloned() == queues;
        if same {
            return Ok(None);
        }
    }
    let mut parts = vec![match current.and_then(|c| c.mac.as_deref()) {
        Some(mac) => format!("{model}={mac}"),
        None => model.clone(),
    }];
    parts.push(format!("bridge={bridge}"));
    // Keep what the template set that the spec does not speak about
    // (firewall, rate, link_down…).
    if let Some(current) = current {
        for (key, value) in &current.properties {
            let ours = [
                "bridge",
                "tag",
                "mtu",
                "queues",
                "macaddr",
                "model",
                current.model.as_str(),
            ];
            if !ours.contains(&key.as_str()) {
                parts.push(if value.is_empty() {
                    key.clone()
                } else {
                    format!("{key}={value}")
                });
            }
        }
    }
    for (key, value) in [("mtu", mtu), ("queues", queues), ("tag", vlan)] {
        if let Some(value) = value {
            parts.push(format!("{key}={value}"));
        }
    }
    Ok(Some(parts.join(",")))
}

/// The config changes a stopped clone needs: CPU, memory, network devices
/// (MACs kept) and tags. Empty when it already matches.
pub fn config_update(
    spec: &ProxmoxMachineSpec,
    config: &VmConfig,
) -> Result<VmConfigUpdate, String> {
    let mut update = VmConfigUpdate::new();
    if let Some(cores) = spec.num_cores
        && Some(cores as u32) != config.cores.or(Some(1))
    {
        update = update.cores(cores as u32);
    }
    if let Some(sockets) = spec.num_sockets
        && Some(sockets as u32) != config.sockets.or(Some(1))
    {
        update = update.sockets(sockets as u32);
    }
    if let Some(memory) = spec.memory_mib
        && Some(memory as u64) != config.memory
    {
        update = update.memory_mib(memory as u64);
    }
    let current = config.network_devices();
    for device in network_devices(spec) {
        let existing = current
            .iter()
            .find(|(key, _)| *key == device.name)
            .map(|(_, d)| d);
        if let Some(value) = net_value(&device, existing)? {
            update = update.set(device.name.clone(), value);
        }
    }
    if let Some(tags) = spec.tags.as_ref().filter(|t| !t.is_empty()) {
        let mut present = config.tag_list();
        let lower: BTreeSet<String> = present.iter().map(|t| t.to_ascii_lowercase()).collect();
        let missing: Vec<&String> = tags
            .iter()
            .filter(|t| !lower.contains(&t.to_ascii_lowercase()))
            .collect();
        if !missing.is_empty() {
            present.extend(missing.into_iter().cloned());
            update = update.tags(&present);
        }
    }
    Ok(update)
}

/// The size in bytes of a disk from its config value (`…,size=20G`).
pub fn disk_size(value: &str) -> Option<u64> {
    let size = value
        .split(',')
        .find_map(|part| part.trim().strip_prefix("size="))?;
    let (number, unit) = size.split_at(
        size.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(size.len()),
    );
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match unit {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((number * factor) as u64)
}

/// The boot disk and the size (GiB) it must be grown to, if it is smaller.
/// PVE cannot shrink a disk, so a larger disk is left alone.
pub fn boot_disk_growth(
    spec: &ProxmoxMachineSpec,
    config: &VmConfig,
) -> Result<Option<(String, u64)>, String> {
    let Some(volume) = spec.disks.as_ref().and_then(|d| d.boot_volume.as_ref()) else {
        return Ok(None);
    };
    let value = config.get(&volume.disk).ok_or_else(|| {
        format!(
            "the VM has no disk {} (spec.disks.bootVolume.disk)",
            volume.disk
        )
    })?;
    let wanted = u64::try_from(volume.size_gb).unwrap_or_default();
    let current = disk_size(&value)
        .ok_or_else(|| format!("disk {} has no readable size: {value}", volume.disk))?;
    Ok((current < wanted << 30).then(|| (volume.disk.clone(), wanted)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tenantry_api::proxmox::{DiskSize, NetworkModel, Storage};

    fn config(value: serde_json::Value) -> VmConfig {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn config_update_sizes_the_clone_and_keeps_the_mac() {
        let current = config(json!({
            "cores": 2, "sockets": 1, "memory": "2048",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1",
        }));
        let spec = ProxmoxMachineSpec {
            num_cores: Some(4),
            num_sockets: Some(1),
            memory_mib: Some(4096),
            network: tenantry_api::proxmox::NetworkSpec {
                network_devices: vec![DeviceSpec {
                    vlan: Some(20),
                    ..DeviceSpec::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let update = config_update(&spec, &current).unwrap();
        let body = serde_json::to_value(&update).unwrap();
        assert_eq!(body["cores"], "4");
        assert_eq!(body["memory"], "4096");
        assert!(body.get("sockets").is_none(), "already 1");
        assert_eq!(
            body["net0"],
            "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20"
        );
        let done = config(json!({
            "cores": 4, "memory": "4096",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20",
        }));
        assert!(
            config_update(&spec, &done).unwrap().is_empty(),
            "nothing left to change"
        );
    }

    #[test]
    fn a_new_device_needs_a_bridge() {
        let spec = ProxmoxMachineSpec {
            network: tenantry_api::proxmox::NetworkSpec {
                network_devices: vec![
                    DeviceSpec::default(),
                    DeviceSpec {
                        name: "net1".into(),
                        model: Some(NetworkModel::E1000),
                        ..DeviceSpec::default()
                    },
                ],
                ..Default::default()
            },
            ..Default::default()
        };
        let current = config(json!({ "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0" }));
        assert!(
            config_update(&spec, &current)
                .unwrap_err()
                .contains("net1 has no bridge")
        );
        let mut with_bridge = spec.clone();
        with_bridge.network.network_devices[1].bridge = Some("vmbr1".into());
        let body = serde_json::to_value(config_update(&with_bridge, &current).unwrap()).unwrap();
        assert_eq!(body["net1"], "e1000,bridge=vmbr1");
        assert!(body.get("net0").is_none());
    }

    #[test]
    fn the_boot_disk_only_grows() {
        let spec = ProxmoxMachineSpec {
            disks: Some(Storage {
                boot_volume: Some(DiskSize {
                    disk: "scsi0".into(),
                    size_gb: 20,
                }),
            }),
            ..Default::default()
        };
        let small = config(json!({ "scsi0": "local-lvm:vm-105-disk-0,iothread=1,size=8G" }));
        assert_eq!(
            boot_disk_growth(&spec, &small).unwrap(),
            Some(("scsi0".into(), 20))
        );
        let big = config(json!({ "scsi0": "local-lvm:vm-105-disk-0,size=20480M" }));
        assert_eq!(boot_disk_growth(&spec, &big).unwrap(), None);
        assert!(
            boot_disk_growth(&spec, &config(json!({})))
                .unwrap_err()
                .contains("no disk scsi0")
        );
        assert_eq!(disk_size("x,size=1.5G"), Some(1_610_612_736));
    }
}
