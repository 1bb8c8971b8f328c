//! The simulated guest: what runs inside a started VM.
//!
//! After `qmstart` the guest boots for `Timings::guest_boot`, then reads its
//! NoCloud seed the way cloud-init does — the first CD-ROM drive holding an
//! ISO 9660 image labelled `cidata` — configures the static addresses of its
//! `network-config`, and starts its QEMU guest agent (when the VM config
//! enables one). A guest can be made to hang (see `faults::GuestHang`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

use super::agent::ExecResult;
use super::cloud_init::{self, IpCidr, MetaData, NetworkConfig};
use super::faults::{GuestHang, lock};
use super::iso9660;
use super::server::Shared;
use super::state::{Cluster, Power, Vm};
use super::vm_config::{Drive, NetDevice, PropertyString, drive_keys, is_net_key};

/// Where the guest is in its life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GuestState {
    #[default]
    Off,
    Booting,
    /// Booted: its agent (if configured) answers.
    Up {
        since: Instant,
    },
    /// Not answering anything (never booted, or stopped answering).
    Hung,
}

/// The NoCloud seed the guest found at its last boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoCloud {
    pub volid: String,
    pub label: String,
    pub user_data: String,
    pub meta_data: String,
    pub meta: MetaData,
    pub network_config: Option<String>,
    /// The parsed network config, or why it could not be used.
    pub network: Result<NetworkConfig, String>,
}

#[derive(Debug, Clone, Default)]
pub struct Guest {
    pub state: GuestState,
    pub nocloud: Option<NoCloud>,
    pub boots: u32,
    /// Finished `exec` commands by pid.
    pub exec_results: BTreeMap<u32, ExecResult>,
}

impl Guest {
    pub fn is_up(&self) -> bool {
        matches!(self.state, GuestState::Up { .. })
    }

    pub fn hang(&mut self) {
        if self.state != GuestState::Off {
            self.state = GuestState::Hung;
        }
    }

    pub fn power_off(&mut self) {
        self.state = GuestState::Off;
    }
}

/// Powers the VM on (QEMU process started) and schedules the guest's boot.
pub fn power_on(shared: &Arc<Shared>, cluster: &mut Cluster, vmid: u32) {
    let pid = cluster.next_pid();
    let Some(vm) = cluster.vms.get_mut(&vmid) else {
        return;
    };
    vm.apply_pending();
    vm.power = Power::Running {
        pid,
        since: Instant::now(),
        paused: false,
    };
    begin_boot(shared, vm);
}

/// Powers the VM off: the QEMU process is gone.
pub fn power_off(vm: &mut Vm) {
    vm.power = Power::Stopped;
    vm.guest.power_off();
    vm.boot_generation += 1;
}

/// Starts a (re)boot of the guest of a running VM.
pub fn begin_boot(shared: &Arc<Shared>, vm: &mut Vm) {
    vm.boot_generation += 1;
    vm.guest.boots += 1;
    let hangs = {
        let mut faults = lock(&shared.faults);
        match faults.guest_hangs.get(&vm.vmid).copied() {
            Some(GuestHang::NeverBoots) => true,
            // "Works until its next reboot": this boot is that reboot.
            Some(GuestHang::AfterReboot) => {
                faults.guest_hangs.insert(vm.vmid, GuestHang::NeverBoots);
                true
            }
            Some(GuestHang::Now) | None => false,
        }
    };
    if hangs {
        vm.guest.state = GuestState::Hung;
        return;
    }
    vm.guest.state = GuestState::Booting;
    let generation = vm.boot_generation;
    let vmid = vm.vmid;
    let weak = Arc::downgrade(shared);
    let delay = shared.config.timings.guest_boot;
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let Some(shared) = weak.upgrade() else { return };
        let mut cluster = lock(&shared.cluster);
        let nocloud = match cluster.vms.get(&vmid) {
            Some(vm)
                if vm.boot_generation == generation && vm.guest.state == GuestState::Booting =>
            {
                read_nocloud(&cluster, vm)
            }
            _ => return,
        };
        if let Some(vm) = cluster.vms.get_mut(&vmid) {
            tracing::debug!(vmid, seed = ?nocloud.as_ref().map(|n| &n.volid), "pve-sim guest booted");
            vm.guest.nocloud = nocloud;
            vm.guest.state = GuestState::Up {
                since: Instant::now(),
            };
        }
    });
}

/// CD-ROM drives in the order the guest probes them, with their ISO volume.
fn cdrom_volumes(vm: &Vm) -> Vec<String> {
    drive_keys()
        .filter_map(|key| vm.config.get(&key))
        .filter_map(|value| Drive::parse(value))
        .filter(|drive| drive.is_cdrom() && drive.file.contains(':'))
        .map(|drive| drive.file)
        .collect()
}

/// What cloud-init would find: the first CD-ROM image labelled `cidata`.
pub fn read_nocloud(cluster: &Cluster, vm: &Vm) -> Option<NoCloud> {
    cdrom_volumes(vm).into_iter().find_map(|volid| {
        let volume = cluster.volume(&vm.node, &volid)?;
        let data = volume.data.as_ref()?;
        let image = iso9660::parse(data).ok()?;
        if !image.label().eq_ignore_ascii_case("cidata") {
            return None;
        }
        Some(nocloud_from_image(&volid, &image))
    })
}

/// The seed of an attached ISO, or why it is not one (for snapshots).
pub fn inspect_iso(cluster: &Cluster, vm: &Vm) -> Option<Result<NoCloud, String>> {
    let volid = cdrom_volumes(vm).into_iter().next()?;
    let Some(volume) = cluster.volume(&vm.node, &volid) else {
        return Some(Err(format!("volume {volid} does not exist")));
    };
    let Some(data) = &volume.data else {
        return Some(Err(format!("volume {volid} has no contents")));
    };
    Some(match iso9660::parse(data) {
        Ok(image) if image.label().eq_ignore_ascii_case("cidata") => {
            Ok(nocloud_from_image(&volid, &image))
        }
        Ok(image) => Err(format!(
            "volume label is {:?}, not \"cidata\"",
            image.label()
        )),
        Err(error) => Err(error.to_string()),
    })
}

fn nocloud_from_image(volid: &str, image: &iso9660::IsoImage) -> NoCloud {
    let meta_data = image.file_text("meta-data").unwrap_or_default();
    let network_config = image.file_text("network-config");
    let network = match &network_config {
        Some(text) => cloud_init::parse_network_config(text).map_err(|e| e.to_string()),
        None => Ok(NetworkConfig::default()),
    };
    NoCloud {
        volid: volid.to_string(),
        label: image.label().to_string(),
        user_data: image.file_text("user-data").unwrap_or_default(),
        meta: cloud_init::parse_meta_data(&meta_data),
        meta_data,
        network_config,
        network,
    }
}

/// One interface as the guest agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestInterface {
    pub name: String,
    pub mac: String,
    pub addresses: Vec<IpCidr>,
}

/// The guest's interfaces: loopback, then one per `netN` in order, named by
/// the network config (`set-name`) or `eth<index>`, with the configured
/// static addresses and an EUI-64 link-local IPv6 address.
pub fn interfaces(vm: &Vm) -> Vec<GuestInterface> {
    let mut result = vec![GuestInterface {
        name: "lo".into(),
        mac: "00:00:00:00:00:00".into(),
        addresses: vec![
            IpCidr {
                address: IpAddr::from([127, 0, 0, 1]),
                prefix: 8,
            },
            IpCidr {
                address: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ],
    }];
    let network = vm
        .guest
        .nocloud
        .as_ref()
        .and_then(|n| n.network.as_ref().ok());
    let mut nets: Vec<(u32, String)> = vm
        .config
        .iter()
        .filter(|(k, _)| is_net_key(k))
        .filter_map(|(k, v)| {
            let index = k.strip_prefix("net")?.parse().ok()?;
            let mac = NetDevice::parse(v).ok()?.mac?;
            Some((index, mac.to_ascii_lowercase()))
        })
        .collect();
    nets.sort();
    for (position, (_, mac)) in nets.into_iter().enumerate() {
        let kernel_name = format!("eth{position}");
        let config = network.and_then(|n| n.for_nic(&mac, &kernel_name));
        let mut addresses: Vec<IpCidr> = config.map(|c| c.addresses.clone()).unwrap_or_default();
        if let Some(link_local) = link_local(&mac) {
            addresses.push(IpCidr {
                address: IpAddr::V6(link_local),
                prefix: 64,
            });
        }
        result.push(GuestInterface {
            name: config
                .and_then(|c| c.set_name.clone())
                .unwrap_or(kernel_name),
            mac,
            addresses,
        });
    }
    result
}

fn link_local(mac: &str) -> Option<Ipv6Addr> {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect::<Option<_>>()?;
    let [a, b, c, d, e, f] = bytes[..] else {
        return None;
    };
    Some(Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        u16::from_be_bytes([a ^ 0x02, b]),
        u16::from_be_bytes([c, 0xff]),
        u16::from_be_bytes([0xfe, d]),
        u16::from_be_bytes([e, f]),
    ))
}

/// Whether the VM's current (not pending) config enables the agent.
pub fn agent_enabled(vm: &Vm) -> bool {
    vm.config.get("agent").is_some_and(|value| {
        let props = PropertyString::parse(value);
        let enabled = props.first.as_deref().or(props.get("enabled"));
        enabled.and_then(super::params::parse_bool).unwrap_or(false)
    })
}

/// The addresses the agent would report, without loopback and link-local.
pub fn reported_addresses(vm: &Vm) -> Vec<IpAddr> {
    if !vm.guest.is_up() || !agent_enabled(vm) {
        return Vec::new();
    }
    interfaces(vm)
        .into_iter()
        .filter(|i| i.name != "lo")
        .flat_map(|i| i.addresses)
        .map(|a| a.address)
        .filter(|a| match a {
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
            IpAddr::V4(_) => true,
        })
        .collect()
}
