//! Fault injection: what a flaky PVE cluster does to its clients.
//!
//! Request faults match a method (or any) and a path glob relative to
//! `/api2/json` — `{name}` matches one segment, `*` part of one, `**` the
//! rest — e.g. `POST /nodes/{node}/qemu/{vmid}/clone`. Each fires always,
//! a number of times, or with a probability (drawn from the seeded RNG).
//! Task faults match a task type (`qmclone`, `qmstart`…). Node and guest
//! faults change the simulated machines themselves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use regex::Regex;
use serde::Deserialize;

use super::server::Shared;

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    #[default]
    Always,
    /// The next `n` matching calls or tasks.
    Times(u32),
    /// Each matching call or task with this probability (0.0–1.0).
    Probability(f64),
}

/// Which requests a fault applies to.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RequestMatch {
    /// `GET`, `POST`…; `None` matches every method.
    #[serde(default)]
    pub method: Option<String>,
    /// A path glob relative to `/api2/json`, e.g. `/nodes/{node}/qemu/**`.
    #[serde(default = "any_path")]
    pub path: String,
}

fn any_path() -> String {
    "/**".into()
}

impl RequestMatch {
    pub fn new(method: &str, path: &str) -> Self {
        Self {
            method: Some(method.to_ascii_uppercase()),
            path: path.into(),
        }
    }

    pub fn any_method(path: &str) -> Self {
        Self {
            method: None,
            path: path.into(),
        }
    }

    pub fn everything() -> Self {
        Self::any_method("/**")
    }

    fn compile(&self) -> anyhow::Result<Regex> {
        let mut pattern = String::from("^");
        let mut chars = self.path.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' => {
                    for inner in chars.by_ref() {
                        if inner == '}' {
                            break;
                        }
                    }
                    pattern.push_str("[^/]+");
                }
                '*' if chars.peek() == Some(&'*') => {
                    chars.next();
                    pattern.push_str(".*");
                }
                '*' => pattern.push_str("[^/]*"),
                other => pattern.push_str(&regex::escape(&other.to_string())),
            }
        }
        pattern.push('$');
        Ok(Regex::new(&pattern)?)
    }
}

/// How a dropped connection goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DropMode {
    /// The request is read, then the connection closes without an answer.
    #[default]
    BeforeResponse,
    /// Status and headers are sent, then the body stops halfway.
    MidResponse,
}

/// A guest that stops cooperating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuestHang {
    /// The guest never finishes booting: no NoCloud read, no agent.
    NeverBoots,
    /// The guest works until its next reboot/reset/start, then never
    /// comes back.
    AfterReboot,
    /// The guest hangs now: its agent stops answering.
    Now,
}

/// One fault, as written in the standalone config file or built in Rust.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(
    tag = "fault",
    rename_all = "kebab-case",
    rename_all_fields = "kebab-case"
)]
pub enum FaultSpec {
    /// Answer with this status and message instead of handling the call.
    HttpError {
        #[serde(flatten)]
        on: RequestMatch,
        status: u16,
        #[serde(default = "default_error_message")]
        message: String,
        #[serde(default)]
        trigger: Trigger,
    },
    /// Close the connection.
    DropConnection {
        #[serde(flatten)]
        on: RequestMatch,
        #[serde(default)]
        mode: DropMode,
        #[serde(default)]
        trigger: Trigger,
    },
    /// Delay the answer.
    Latency {
        #[serde(flatten)]
        on: RequestMatch,
        #[serde(with = "millis")]
        delay: Duration,
        #[serde(default)]
        trigger: Trigger,
    },
    /// Tasks of this type end with `exitstatus` = message (after running
    /// their usual time, and rolling back what they did).
    TaskFailure {
        task_type: String,
        message: String,
        #[serde(default)]
        trigger: Trigger,
    },
    /// Tasks of this type take this much longer.
    SlowTask {
        task_type: String,
        #[serde(with = "millis")]
        extra: Duration,
        #[serde(default)]
        trigger: Trigger,
    },
    /// The node drops out of the cluster: its API calls answer 595 and its
    /// VMs' status becomes `unknown`.
    NodeOffline { node: String },
    /// A guest stops cooperating.
    GuestHang { vmid: u32, hang: GuestHang },
}

fn default_error_message() -> String {
    "Internal Server Error".into()
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Identifies an installed fault, to remove it or ask how often it fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FaultId(u64);

struct ActiveFault {
    id: FaultId,
    spec: FaultSpec,
    method: Option<String>,
    path: Option<Regex>,
    remaining: Option<u32>,
    fired: u64,
}

/// What request faults do to one call.
#[derive(Debug, Default)]
pub(crate) struct RequestFaults {
    pub latency: Duration,
    pub action: Option<RequestAction>,
}

#[derive(Debug)]
pub(crate) enum RequestAction {
    Error { status: u16, message: String },
    Drop(DropMode),
}

/// What task faults do to one task.
#[derive(Debug, Default)]
pub(crate) struct TaskFaults {
    pub extra: Duration,
    pub failure: Option<String>,
}

/// All installed faults.
pub(crate) struct FaultPlan {
    faults: Vec<ActiveFault>,
    next_id: u64,
    rng: StdRng,
    pub guest_hangs: BTreeMap<u32, GuestHang>,
}

impl FaultPlan {
    pub fn new(seed: u64) -> Self {
        Self {
            faults: Vec::new(),
            next_id: 1,
            rng: StdRng::seed_from_u64(seed ^ 0xfa17),
            guest_hangs: BTreeMap::new(),
        }
    }

    fn install(&mut self, spec: FaultSpec) -> anyhow::Result<FaultId> {
        let id = FaultId(self.next_id);
        self.next_id += 1;
        let (method, path, trigger) = match &spec {
            FaultSpec::HttpError { on, trigger, .. }
            | FaultSpec::DropConnection { on, trigger, .. }
            | FaultSpec::Latency { on, trigger, .. } => {
                (on.method.clone(), Some(on.compile()?), *trigger)
            }
            FaultSpec::TaskFailure { trigger, .. } | FaultSpec::SlowTask { trigger, .. } => {
                (None, None, *trigger)
            }
            FaultSpec::NodeOffline { .. } | FaultSpec::GuestHang { .. } => {
                (None, None, Trigger::Always)
            }
        };
        if let Trigger::Probability(p) = trigger
            && !(0.0..=1.0).contains(&p)
        {
            anyhow::bail!("fault probability {p} is not between 0 and 1");
        }
        self.faults.push(ActiveFault {
            id,
            spec,
            method,
            path,
            remaining: match trigger {
                Trigger::Times(n) => Some(n),
                _ => None,
            },
            fired: 0,
        });
        Ok(id)
    }

    /// Whether a fault fires now; consumes one of its times.
    fn fires(rng: &mut StdRng, fault: &mut ActiveFault) -> bool {
        let trigger = match &fault.spec {
            FaultSpec::HttpError { trigger, .. }
            | FaultSpec::DropConnection { trigger, .. }
            | FaultSpec::Latency { trigger, .. }
            | FaultSpec::TaskFailure { trigger, .. }
            | FaultSpec::SlowTask { trigger, .. } => *trigger,
            _ => Trigger::Always,
        };
        let fires = match trigger {
            Trigger::Always => true,
            Trigger::Times(_) => match &mut fault.remaining {
                Some(0) => false,
                Some(n) => {
                    *n -= 1;
                    true
                }
                None => true,
            },
            Trigger::Probability(p) => rng.random_bool(p),
        };
        if fires {
            fault.fired += 1;
        }
        fires
    }

    pub fn for_request(&mut self, method: &str, path: &str) -> RequestFaults {
        let mut result = RequestFaults::default();
        for fault in &mut self.faults {
            let Some(glob) = &fault.path else { continue };
            if fault.method.as_deref().is_some_and(|m| m != method) || !glob.is_match(path) {
                continue;
            }
            // Latency adds up; the first error or drop wins.
            let is_latency = matches!(fault.spec, FaultSpec::Latency { .. });
            if !is_latency && result.action.is_some() {
                continue;
            }
            if !Self::fires(&mut self.rng, fault) {
                continue;
            }
            match &fault.spec {
                FaultSpec::Latency { delay, .. } => result.latency += *delay,
                FaultSpec::HttpError {
                    status, message, ..
                } => {
                    result.action = Some(RequestAction::Error {
                        status: *status,
                        message: message.clone(),
                    })
                }
                FaultSpec::DropConnection { mode, .. } => {
                    result.action = Some(RequestAction::Drop(*mode))
                }
                _ => {}
            }
        }
        result
    }

    pub fn for_task(&mut self, task_type: &str) -> TaskFaults {
        let mut result = TaskFaults::default();
        for fault in &mut self.faults {
            let matches = match &fault.spec {
                FaultSpec::TaskFailure { task_type: t, .. } => {
                    t == task_type && result.failure.is_none()
                }
                FaultSpec::SlowTask { task_type: t, .. } => t == task_type,
                _ => false,
            };
            if !matches || !Self::fires(&mut self.rng, fault) {
                continue;
            }
            match &fault.spec {
                FaultSpec::TaskFailure { message, .. } => result.failure = Some(message.clone()),
                FaultSpec::SlowTask { extra, .. } => result.extra += *extra,
                _ => {}
            }
        }
        result
    }

    fn fired(&self, id: FaultId) -> u64 {
        self.faults
            .iter()
            .find(|f| f.id == id)
            .map_or(0, |f| f.fired)
    }

    fn remove(&mut self, id: FaultId) {
        self.faults.retain(|f| f.id != id);
    }
}

/// The handle tests (and the standalone binary) use to inject faults.
#[derive(Clone)]
pub struct Faults {
    pub(crate) shared: Arc<Shared>,
}

impl Faults {
    fn plan(&self) -> std::sync::MutexGuard<'_, FaultPlan> {
        lock(&self.shared.faults)
    }

    /// Installs any fault; node and guest faults take effect at once.
    pub fn add(&self, spec: FaultSpec) -> anyhow::Result<FaultId> {
        match &spec {
            FaultSpec::NodeOffline { node } => self.set_node_online(node, false)?,
            FaultSpec::GuestHang { vmid, hang } => self.hang_guest(*vmid, *hang),
            _ => {}
        }
        self.plan().install(spec)
    }

    /// Answers matching calls with `status` and `message` (in the reason
    /// phrase and the body, like a PVE error).
    pub fn http_error(
        &self,
        on: RequestMatch,
        status: u16,
        message: &str,
        trigger: Trigger,
    ) -> FaultId {
        self.add(FaultSpec::HttpError {
            on,
            status,
            message: message.into(),
            trigger,
        })
        .expect("valid fault")
    }

    pub fn drop_connection(&self, on: RequestMatch, mode: DropMode, trigger: Trigger) -> FaultId {
        self.add(FaultSpec::DropConnection { on, mode, trigger })
            .expect("valid fault")
    }

    pub fn latency(&self, on: RequestMatch, delay: Duration, trigger: Trigger) -> FaultId {
        self.add(FaultSpec::Latency { on, delay, trigger })
            .expect("valid fault")
    }

    pub fn fail_tasks(&self, task_type: &str, message: &str, trigger: Trigger) -> FaultId {
        self.add(FaultSpec::TaskFailure {
            task_type: task_type.into(),
            message: message.into(),
            trigger,
        })
        .expect("valid fault")
    }

    pub fn slow_tasks(&self, task_type: &str, extra: Duration, trigger: Trigger) -> FaultId {
        self.add(FaultSpec::SlowTask {
            task_type: task_type.into(),
            extra,
            trigger,
        })
        .expect("valid fault")
    }

    /// Takes a node out of (or back into) the cluster.
    pub fn set_node_online(&self, node: &str, online: bool) -> anyhow::Result<()> {
        let mut cluster = lock(&self.shared.cluster);
        let entry = cluster
            .nodes
            .get_mut(node)
            .ok_or_else(|| anyhow::anyhow!("no node {node}"))?;
        entry.online = online;
        tracing::info!(node, online, "pve-sim node membership changed");
        Ok(())
    }

    /// Makes a guest hang; may be set before the VM exists (e.g. for the
    /// vmid a clone will get).
    pub fn hang_guest(&self, vmid: u32, hang: GuestHang) {
        self.plan().guest_hangs.insert(vmid, hang);
        if hang == GuestHang::Now {
            let mut cluster = lock(&self.shared.cluster);
            if let Some(vm) = cluster.vms.get_mut(&vmid) {
                vm.guest.hang();
            }
        }
    }

    /// Lets a guest behave again from its next boot on.
    pub fn release_guest(&self, vmid: u32) {
        self.plan().guest_hangs.remove(&vmid);
    }

    /// How often a fault has fired.
    pub fn fired(&self, id: FaultId) -> u64 {
        self.plan().fired(id)
    }

    pub fn remove(&self, id: FaultId) {
        self.plan().remove(id);
    }

    /// Removes every fault and brings every node back online.
    pub fn clear(&self) {
        {
            let mut plan = self.plan();
            plan.faults.clear();
            plan.guest_hangs.clear();
        }
        let mut cluster = lock(&self.shared.cluster);
        for node in cluster.nodes.values_mut() {
            node.online = true;
        }
    }
}

/// Locks a mutex, recovering from a poisoned one (a panicking test must not
/// take the simulator down with it).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_globs_match_segments() {
        let clone = RequestMatch::new("POST", "/nodes/{node}/qemu/{vmid}/clone")
            .compile()
            .unwrap();
        assert!(clone.is_match("/nodes/pve/qemu/100/clone"));
        assert!(!clone.is_match("/nodes/pve/qemu/100/config"));
        let all = RequestMatch::everything().compile().unwrap();
        assert!(all.is_match("/version"));
    }

    #[test]
    fn counted_faults_fire_that_many_times() {
        let mut plan = FaultPlan::new(1);
        plan.install(FaultSpec::HttpError {
            on: RequestMatch::new("GET", "/version"),
            status: 503,
            message: "busy".into(),
            trigger: Trigger::Times(2),
        })
        .unwrap();
        let fired: Vec<bool> = (0..3)
            .map(|_| plan.for_request("GET", "/version").action.is_some())
            .collect();
        assert_eq!(fired, vec![true, true, false]);
    }

    #[test]
    fn fault_specs_read_from_yaml() {
        let spec: FaultSpec = serde_norway::from_str(
            "fault: http-error\nmethod: POST\npath: /nodes/{node}/qemu/{vmid}/clone\nstatus: 500\ntrigger: {times: 1}\n",
        )
        .unwrap();
        assert!(matches!(
            spec,
            FaultSpec::HttpError {
                status: 500,
                trigger: Trigger::Times(1),
                ..
            }
        ));
        let task: FaultSpec = serde_norway::from_str(
            "fault: task-failure\ntask-type: qmclone\nmessage: boom\ntrigger: {probability: 0.5}\n",
        )
        .unwrap();
        assert!(
            matches!(task, FaultSpec::TaskFailure { ref task_type, .. } if task_type == "qmclone")
        );
        let hang: FaultSpec =
            serde_norway::from_str("fault: guest-hang\nvmid: 105\nhang: after-reboot\n").unwrap();
        assert_eq!(
            hang,
            FaultSpec::GuestHang {
                vmid: 105,
                hang: GuestHang::AfterReboot
            }
        );
    }
}
