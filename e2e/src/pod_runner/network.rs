//! The node's network: the part a CNI plugin plays on a real node.
//!
//! A node network owns `10.200.<k>.0/24` for one `k` (1–250) that no other
//! test process on this machine holds (an exclusive `flock` on
//! `/run/tenantry-e2e/node-<k>.lock`, released by the kernel even if the
//! process dies):
//!
//! - the node address `10.200.<k>.1` on the host's loopback interface
//!   (labelled `lo:tn<k>`; these machines' kernels have no dummy
//!   interfaces): pods reach the apiserver (which listens on all
//!   addresses), the DNS server and the host's simulators there;
//! - per pod a network namespace `tnode<k>-p<n>` holding `lo` and `eth0`,
//!   one end of a veth pair whose host end is `tn<k>p<n>`, with the pod
//!   address `10.200.<k>.<n>/32` and a default route via the node address
//!   (a /32 per pod and a host route to it, as Calico and the ptp CNI
//!   plugin do); so two pods listen on the same port, as they do in a
//!   cluster;
//! - the Services' ClusterIPs of this node's cluster (`10.201.<k>.0/24`,
//!   see [`NodeNetwork::service_cidr`]) as loopback addresses with the same
//!   label, where the service proxy listens.
//!
//! Everything is made with iproute2's `ip` and needs root. Leftovers of a
//! crashed run of the same `k` are removed when it is taken again.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context as _, bail};

const STATE_DIR: &str = "/run/tenantry-e2e";
const MAX_NODES: u8 = 250;

/// One node's addresses, interfaces and pod namespaces.
pub struct NodeNetwork {
    index: u8,
    /// The label of the node's loopback addresses.
    label: String,
    free_pod_addresses: Mutex<Vec<u8>>,
    // Last: the lock outlives the cleanup in Drop.
    _lock: File,
}

impl std::fmt::Debug for NodeNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeNetwork")
            .field("node_ip", &self.node_ip())
            .finish_non_exhaustive()
    }
}

impl NodeNetwork {
    /// Takes the first free node network and sets it up.
    pub fn acquire() -> anyhow::Result<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!(
                "running pods needs root (network namespaces, veth pairs, mounts); run the deployed tests as root"
            );
        }
        std::fs::create_dir_all(STATE_DIR).with_context(|| format!("create {STATE_DIR}"))?;
        for index in 1..=MAX_NODES {
            let path = format!("{STATE_DIR}/node-{index}.lock");
            let lock = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .with_context(|| format!("open {path}"))?;
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            let network = Self {
                index,
                label: format!("lo:tn{index}"),
                free_pod_addresses: Mutex::new((2..=254).rev().collect()),
                _lock: lock,
            };
            network.remove_leftovers();
            network.set_up()?;
            return Ok(network);
        }
        bail!("all {MAX_NODES} node networks are taken")
    }

    /// The node's address: where pods reach the host.
    pub fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 200, self.index, 1)
    }

    /// The ClusterIP range of this node's cluster.
    pub fn service_cidr(&self) -> String {
        format!("10.201.{}.0/24", self.index)
    }

    /// A network namespace with its own address for one pod.
    pub fn create_sandbox(&self) -> anyhow::Result<PodSandbox> {
        let host = self
            .free_pod_addresses
            .lock()
            .expect("address list lock")
            .pop()
            .context("no pod address left on this node")?;
        let k = self.index;
        let sandbox = PodSandbox {
            netns: format!("tnode{k}-p{host}"),
            host_interface: format!("tn{k}p{host}"),
            ip: Ipv4Addr::new(10, 200, k, host),
        };
        let node_ip = self.node_ip().to_string();
        let pod_ip = sandbox.ip.to_string();
        let peer = format!("tn{k}c{host}");
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", &sandbox.netns],
            vec![
                "link",
                "add",
                &sandbox.host_interface,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
                "netns",
                &sandbox.netns,
            ],
            vec!["link", "set", &sandbox.host_interface, "up"],
            vec![
                "route",
                "add",
                &pod_ip,
                "dev",
                &sandbox.host_interface,
                "src",
                &node_ip,
            ],
            vec!["-n", &sandbox.netns, "link", "set", "lo", "up"],
            vec!["-n", &sandbox.netns, "link", "set", &peer, "name", "eth0"],
            vec!["-n", &sandbox.netns, "addr", "add", &pod_ip, "dev", "eth0"],
            vec!["-n", &sandbox.netns, "link", "set", "eth0", "up"],
            vec![
                "-n",
                &sandbox.netns,
                "route",
                "add",
                &node_ip,
                "dev",
                "eth0",
            ],
            vec![
                "-n",
                &sandbox.netns,
                "route",
                "add",
                "default",
                "via",
                &node_ip,
                "dev",
                "eth0",
            ],
        ];
        for step in steps {
            if let Err(error) = ip(&step) {
                let _ = ip(&["netns", "del", &sandbox.netns]);
                self.release(host);
                return Err(error);
            }
        }
        Ok(sandbox)
    }

    /// Removes a pod's namespace (its veth pair and route go with it) and
    /// frees its address.
    pub fn remove_sandbox(&self, sandbox: &PodSandbox) {
        if let Err(error) = ip(&["netns", "del", &sandbox.netns]) {
            tracing::warn!(%error, netns = %sandbox.netns, "could not remove a pod network namespace");
        }
        self.release(sandbox.ip.octets()[3]);
    }

    fn release(&self, host: u8) {
        self.free_pod_addresses
            .lock()
            .expect("address list lock")
            .insert(0, host);
    }

    /// Makes a ClusterIP an address of the node, for the service proxy.
    pub fn add_service_ip(&self, address: Ipv4Addr) -> anyhow::Result<()> {
        let cidr = format!("{address}/32");
        match ip(&["addr", "add", &cidr, "dev", "lo", "label", &self.label]) {
            // A second port of the same ClusterIP: the address is there.
            // Older iproute2 says "File exists", newer "Address already
            // assigned".
            Err(error)
                if error.to_string().contains("File exists")
                    || error.to_string().contains("already assigned") =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// Takes a ClusterIP away again.
    pub fn remove_service_ip(&self, address: Ipv4Addr) {
        let cidr = format!("{address}/32");
        let _ = ip(&["addr", "del", &cidr, "dev", "lo"]);
    }

    fn set_up(&self) -> anyhow::Result<()> {
        let node = format!("{}/32", self.node_ip());
        ip(&["addr", "add", &node, "dev", "lo", "label", &self.label])
    }

    /// What a run of this node network that died without cleaning up left.
    fn remove_leftovers(&self) {
        let prefix = format!("tnode{}-", self.index);
        if let Ok(list) = ip_output(&["netns", "list"]) {
            for line in list.lines() {
                if let Some(name) = line.split_whitespace().next()
                    && name.starts_with(&prefix)
                {
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
        let _ = ip(&["addr", "flush", "dev", "lo", "label", &self.label]);
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        self.remove_leftovers();
    }
}

/// A pod's network namespace and address.
#[derive(Clone, Debug)]
pub struct PodSandbox {
    /// The namespace's name (`/run/netns/<name>`).
    pub netns: String,
    pub host_interface: String,
    pub ip: Ipv4Addr,
}

impl PodSandbox {
    /// `/run/netns/<name>`, what `setns` opens.
    pub fn netns_path(&self) -> String {
        format!("/run/netns/{}", self.netns)
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    ip_output(args).map(|_| ())
}

fn ip_output(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("run ip (iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
