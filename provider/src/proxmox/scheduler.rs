//! Choosing the Proxmox node a new machine is cloned to.
//!
//! capmox sums the `maxmem` of every non-template guest per node, takes the
//! node's memory times `schedulerHints.memoryAdjustment` percent, refuses
//! when the machine does not fit on the roomiest node, and otherwise takes
//! the fitting node with the fewest machines already placed. It never looks
//! at CPUs, so a node full of 16-vCPU VMs with memory to spare keeps getting
//! more (capmox #724, #214). Tenantry checks both:
//!
//! 1. **Candidates.** The machine's `allowedNodes` if it has any, else the
//!    cluster's, else every node. Offline nodes and names that are no node
//!    of the PVE cluster are skipped (and reported if nothing fits).
//! 2. **Capacity.** Memory capacity is the node's memory × memory adjustment
//!    %, CPU capacity its logical CPUs × CPU adjustment %; both default to
//!    100 (no overcommit). An adjustment of 0 switches that check off, as
//!    capmox's `memoryAdjustment: 0` does. Every non-template guest counts
//!    with its configured `maxmem` and vCPUs, running or not: a stopped VM
//!    can be started at any time.
//! 3. **Fit.** A node fits when the machine's memory **and** vCPUs fit in
//!    what is free.
//! 4. **Score.** For each fitting node and each checked resource, the share
//!    of the node's capacity still free after placing the machine; the
//!    node's score is the smaller of the two (the resource that will run out
//!    first decides). The highest score wins, so machines go where the most
//!    room stays, which spreads them across nodes of different sizes. Ties
//!    go to the node with fewer machines of the same cluster already on it
//!    (so identical nodes share a cluster's machines), then to the
//!    alphabetically first node name, so the choice never depends on the
//!    order PVE lists nodes in.
//!
//! When nothing fits, [`NoNodeFits`] says per node what is missing and by
//! how much; its message is meant for a condition a human acts on.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One guest on a node, as `GET /nodes/{node}/qemu` (and `/lxc`) lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guest {
    pub vmid: u32,
    /// Configured memory in bytes (`maxmem`).
    pub maxmem: u64,
    /// Configured vCPUs (`cpus`: sockets × cores, or `vcpus` when set);
    /// a fractional container CPU limit is rounded up.
    pub cpus: u32,
    /// Templates never run, so they hold no memory or CPU.
    pub template: bool,
}

/// What the scheduler needs to know about one PVE node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCapacity {
    pub name: String,
    /// `status: online` in `GET /nodes`.
    pub online: bool,
    /// Logical CPUs (`maxcpu`).
    pub maxcpu: u32,
    /// Memory in bytes (`maxmem`, or `memory.total` of the node status).
    pub maxmem: u64,
    pub guests: Vec<Guest>,
}

/// How far a node may be allocated, in percent of its real capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerHints {
    /// capmox's `schedulerHints.memoryAdjustment`: 100 allocates the node's
    /// memory once, 300 three times over, 0 does not check memory.
    pub memory_adjustment: u32,
    /// The same for CPUs: 100 (the default) gives each vCPU a logical CPU.
    pub cpu_adjustment: u32,
}

impl Default for SchedulerHints {
    fn default() -> Self {
        Self {
            memory_adjustment: 100,
            cpu_adjustment: 100,
        }
    }
}

/// The machine to place and where it may go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlacementRequest {
    /// Memory in bytes (`memoryMiB` × 1 MiB).
    pub memory: u64,
    /// `numSockets` × `numCores`.
    pub vcpus: u32,
    /// ProxmoxMachine `allowedNodes`; when set they override the cluster's.
    pub machine_allowed_nodes: Vec<String>,
    /// ProxmoxCluster `allowedNodes`.
    pub cluster_allowed_nodes: Vec<String>,
    pub hints: SchedulerHints,
    /// Machines of the same cluster already on each node (the
    /// ProxmoxCluster's node locations), for breaking ties.
    pub placements: BTreeMap<String, u32>,
}

/// The chosen node and what stays free on it after the machine is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeChoice {
    pub node: String,
    /// Bytes of (adjusted) memory left; `None` when memory is not checked.
    pub memory_free_after: Option<u64>,
    /// vCPUs of (adjusted) CPU capacity left; `None` when CPUs are not checked.
    pub vcpus_free_after: Option<u64>,
}

/// Why one node could not take the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Listed in `allowedNodes` but not a node of the PVE cluster.
    UnknownNode,
    Offline,
    /// At least one of the two is set.
    Insufficient {
        memory: Option<Shortage>,
        vcpus: Option<Shortage>,
    },
}

/// A resource a node has too little of (memory in bytes, CPUs in vCPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortage {
    /// How much more capacity (or how much less allocation) the machine
    /// needs to fit.
    pub missing: u64,
    /// Free now; 0 when the node is already allocated beyond its capacity.
    pub free: u64,
    /// The node's capacity after the adjustment.
    pub capacity: u64,
}

/// No allowed node can take the machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct NoNodeFits {
    pub memory: u64,
    pub vcpus: u32,
    pub hints: SchedulerHints,
    /// Every candidate node, by name.
    pub rejections: Vec<(String, Rejection)>,
}

impl NoNodeFits {
    /// Only offline nodes stood in the way: they come back by themselves.
    pub fn is_transient(&self) -> bool {
        !self.rejections.is_empty()
            && self
                .rejections
                .iter()
                .all(|(_, rejection)| *rejection == Rejection::Offline)
    }

    pub fn needs_human(&self) -> bool {
        !self.is_transient()
    }

    /// CamelCase name for condition reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        let short = self
            .rejections
            .iter()
            .any(|(_, rejection)| matches!(rejection, Rejection::Insufficient { .. }));
        if short {
            "InsufficientResources"
        } else {
            "NoNodeAvailable"
        }
    }
}

impl fmt::Display for NoNodeFits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no Proxmox node has room for {} and {} of memory",
            vcpus(u64::from(self.vcpus)),
            bytes(self.memory, Rounding::Up)
        )?;
        if self.rejections.is_empty() {
            return write!(f, ": the Proxmox cluster lists no nodes");
        }
        for (index, (node, rejection)) in self.rejections.iter().enumerate() {
            f.write_str(if index == 0 { ": " } else { "; " })?;
            write!(f, "{node}: ")?;
            match rejection {
                Rejection::UnknownNode => f.write_str("not a node of this Proxmox cluster")?,
                Rejection::Offline => f.write_str("offline")?,
                Rejection::Insufficient {
                    memory,
                    vcpus: cpus,
                } => {
                    let mut parts = Vec::new();
                    if let Some(cpus) = cpus {
                        parts.push(format!(
                            "{} short ({} of {} free at {}% CPU allocation)",
                            vcpus(cpus.missing),
                            cpus.free,
                            cpus.capacity,
                            self.hints.cpu_adjustment
                        ));
                    }
                    if let Some(memory) = memory {
                        parts.push(format!(
                            "{} memory short ({} of {} free at {}% memory allocation)",
                            bytes(memory.missing, Rounding::Up),
                            bytes(memory.free, Rounding::Down),
                            bytes(memory.capacity, Rounding::Down),
                            self.hints.memory_adjustment
                        ));
                    }
                    f.write_str(&parts.join(", "))?;
                }
            }
        }
        Ok(())
    }
}

/// Picks the node for a machine; see the module documentation for the rule.
pub fn choose_node(
    nodes: &[NodeCapacity],
    request: &PlacementRequest,
) -> Result<NodeChoice, NoNodeFits> {
    let allowed: Option<BTreeSet<&str>> = [
        &request.machine_allowed_nodes,
        &request.cluster_allowed_nodes,
    ]
    .into_iter()
    .find(|list| !list.is_empty())
    .map(|list| list.iter().map(String::as_str).collect());

    let by_name: BTreeMap<&str, &NodeCapacity> = nodes
        .iter()
        .map(|node| (node.name.as_str(), node))
        .collect();
    let candidates: Vec<(&str, Option<&NodeCapacity>)> = match &allowed {
        Some(allowed) => allowed
            .iter()
            .map(|name| (*name, by_name.get(name).copied()))
            .collect(),
        None => by_name
            .iter()
            .map(|(name, node)| (*name, Some(*node)))
            .collect(),
    };

    let mut rejections = Vec::new();
    let mut fitting = Vec::new();
    for (name, node) in candidates {
        let Some(node) = node else {
            rejections.push((name.to_string(), Rejection::UnknownNode));
            continue;
        };
        if !node.online {
            rejections.push((name.to_string(), Rejection::Offline));
            continue;
        }
        let memory = Dimension::measure(
            node.maxmem,
            request.hints.memory_adjustment,
            allocated(node, |guest| guest.maxmem),
            request.memory,
        );
        let cpus = Dimension::measure(
            u64::from(node.maxcpu),
            request.hints.cpu_adjustment,
            allocated(node, |guest| u64::from(guest.cpus)),
            u64::from(request.vcpus),
        );
        if memory.shortage().is_some() || cpus.shortage().is_some() {
            let rejection = Rejection::Insufficient {
                memory: memory.shortage(),
                vcpus: cpus.shortage(),
            };
            rejections.push((name.to_string(), rejection));
            continue;
        }
        fitting.push(Candidate {
            name,
            score: [memory.headroom(), cpus.headroom()]
                .into_iter()
                .flatten()
                .min(),
            placed: request.placements.get(name).copied().unwrap_or(0),
            memory_free_after: memory.free_after(),
            vcpus_free_after: cpus.free_after(),
        });
    }

    // Highest score first, then fewer machines of this cluster, then name.
    fitting.sort_by(|a, b| {
        b.score
            .cmp(&a.score)
            .then(a.placed.cmp(&b.placed))
            .then(a.name.cmp(b.name))
    });
    match fitting.first() {
        Some(best) => Ok(NodeChoice {
            node: best.name.to_string(),
            memory_free_after: best.memory_free_after,
            vcpus_free_after: best.vcpus_free_after,
        }),
        None => Err(NoNodeFits {
            memory: request.memory,
            vcpus: request.vcpus,
            hints: request.hints,
            rejections,
        }),
    }
}

/// What every non-template guest on the node holds of one resource.
fn allocated(node: &NodeCapacity, amount: impl Fn(&Guest) -> u64) -> u64 {
    node.guests
        .iter()
        .filter(|guest| !guest.template)
        .fold(0u64, |sum, guest| sum.saturating_add(amount(guest)))
}

#[derive(Debug)]
struct Candidate<'a> {
    name: &'a str,
    /// `None` when neither resource is checked.
    score: Option<Share>,
    placed: u32,
    memory_free_after: Option<u64>,
    vcpus_free_after: Option<u64>,
}

/// One resource of one node, measured against the request.
#[derive(Debug, Clone, Copy)]
enum Dimension {
    /// The adjustment is 0: not checked, no part of the score.
    Unchecked,
    Fits {
        free_after: u64,
        capacity: u64,
    },
    Short(Shortage),
}

impl Dimension {
    fn measure(total: u64, adjustment_percent: u32, allocated: u64, requested: u64) -> Self {
        if adjustment_percent == 0 {
            return Self::Unchecked;
        }
        let capacity = u128::from(total) * u128::from(adjustment_percent) / 100;
        let capacity = u64::try_from(capacity).unwrap_or(u64::MAX);
        let free = i128::from(capacity) - i128::from(allocated);
        let free_after = free - i128::from(requested);
        if free_after < 0 {
            Self::Short(Shortage {
                missing: u64::try_from(-free_after).unwrap_or(u64::MAX),
                free: u64::try_from(free.max(0)).unwrap_or(u64::MAX),
                capacity,
            })
        } else {
            Self::Fits {
                free_after: u64::try_from(free_after).unwrap_or(u64::MAX),
                capacity,
            }
        }
    }

    fn shortage(self) -> Option<Shortage> {
        match self {
            Self::Short(shortage) => Some(shortage),
            _ => None,
        }
    }

    fn free_after(self) -> Option<u64> {
        match self {
            Self::Fits { free_after, .. } => Some(free_after),
            _ => None,
        }
    }

    fn headroom(self) -> Option<Share> {
        match self {
            Self::Fits {
                free_after,
                capacity,
            } => Some(Share::new(free_after, capacity)),
            _ => None,
        }
    }
}

/// A share of a node's capacity, `part / whole`, compared exactly (by
/// cross-multiplying in 128 bits) so equal shares tie for real and the
/// choice does not hinge on floating-point rounding.
#[derive(Debug, Clone, Copy)]
struct Share {
    part: u64,
    whole: u64,
}

impl Share {
    fn new(part: u64, whole: u64) -> Self {
        if whole == 0 {
            // Only a request of nothing fits a node of no capacity.
            Self { part: 0, whole: 1 }
        } else {
            Self { part, whole }
        }
    }
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> Ordering {
        (u128::from(self.part) * u128::from(other.whole))
            .cmp(&(u128::from(other.part) * u128::from(self.whole)))
    }
}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Share {}

fn vcpus(count: u64) -> String {
    if count == 1 {
        "1 vCPU".to_string()
    } else {
        format!("{count} vCPUs")
    }
}

#[derive(Clone, Copy)]
enum Rounding {
    /// For what is missing: never tell a human to add too little.
    Up,
    /// For what is free: never promise too much.
    Down,
}

/// Bytes for a human: whole GiB, else GiB with one decimal, else MiB.
fn bytes(amount: u64, rounding: Rounding) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    // In 128 bits so that tenths of a GiB are exact.
    let divide = |scaled: u128, unit: u64| match rounding {
        Rounding::Up => scaled.div_ceil(u128::from(unit)),
        Rounding::Down => scaled / u128::from(unit),
    };
    if amount.is_multiple_of(GIB) {
        format!("{} GiB", amount / GIB)
    } else if amount >= GIB {
        let tenths = divide(u128::from(amount) * 10, GIB);
        format!("{}.{} GiB", tenths / 10, tenths % 10)
    } else {
        format!("{} MiB", divide(u128::from(amount), MIB))
    }
}

#[cfg(test)]
mod tests;
