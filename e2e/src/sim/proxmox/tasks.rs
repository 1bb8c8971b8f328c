//! Worker tasks: what PVE forks for every long operation, identified by a
//! UPID, `UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:` with
//! pid, pstart and starttime in uppercase hex of at least 8 digits. A task is
//! `running` until its worker exits, then `stopped` with `exitstatus` `OK` or
//! the error text (its log's last line is `TASK OK` / `TASK ERROR: …`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::faults::lock;
use super::params::{Kind, Schema, optional, required};
use super::permissions::split_token_id;
use super::router::{Call, Reply};
use super::server::Shared;
use super::state::Cluster;

/// A decoded UPID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upid {
    pub node: String,
    pub pid: u32,
    pub pstart: u64,
    pub starttime: i64,
    pub task_type: String,
    pub id: String,
    pub user: String,
}

impl Upid {
    pub fn encode(&self) -> String {
        format!(
            "UPID:{}:{:08X}:{:08X}:{:08X}:{}:{}:{}:",
            self.node, self.pid, self.pstart, self.starttime, self.task_type, self.id, self.user
        )
    }

    /// Parses a UPID as `PVE::UPID::decode` accepts it (pid and starttime
    /// 8 hex digits, pstart 8 or 9).
    pub fn parse(text: &str) -> Option<Self> {
        static FORMAT: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new(
                r"^UPID:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?:[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:[0-9A-Fa-f]{8}:[^:\s/]+:[^:\s/]*:[^:\s/]+:$",
            )
            .expect("valid regex")
        });
        if !FORMAT.is_match(text) {
            return None;
        }
        let rest = text.strip_prefix("UPID:")?.strip_suffix(':')?;
        let mut parts = rest.splitn(7, ':');
        let node = parts.next()?.to_string();
        let pid = u32::from_str_radix(parts.next()?, 16).ok()?;
        let pstart = u64::from_str_radix(parts.next()?, 16).ok()?;
        let starttime = i64::from_str_radix(parts.next()?, 16).ok()?;
        let task_type = parts.next()?.to_string();
        let id = parts.next()?.to_string();
        let user = parts.next()?.to_string();
        (!node.is_empty() && !task_type.is_empty() && !user.is_empty()).then_some(Self {
            node,
            pid,
            pstart,
            starttime,
            task_type,
            id,
            user,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskStatus {
    Running,
    Stopped { exitstatus: String, endtime: i64 },
}

/// A task and its log.
#[derive(Debug, Clone)]
pub struct Task {
    pub upid: Upid,
    pub status: TaskStatus,
    pub log: Vec<String>,
}

impl Task {
    pub fn is_running(&self) -> bool {
        self.status == TaskStatus::Running
    }

    pub fn exitstatus(&self) -> Option<&str> {
        match &self.status {
            TaskStatus::Stopped { exitstatus, .. } => Some(exitstatus),
            TaskStatus::Running => None,
        }
    }
}

/// What a task step gets: the cluster, the simulator (to start timers) and
/// the task's log.
pub struct StepContext<'a> {
    pub cluster: &'a mut Cluster,
    pub shared: &'a Arc<Shared>,
    pub log: &'a mut Vec<String>,
    pub warnings: &'a mut u32,
}

impl StepContext<'_> {
    /// A Perl `warn` inside a worker: logged as `WARN: …` and counted; a
    /// task that succeeds with warnings ends with `WARNINGS: <n>`.
    pub fn warn(&mut self, message: impl std::fmt::Display) {
        self.log.push(format!("WARN: {message}"));
        *self.warnings += 1;
    }
}

pub type Step = Box<dyn FnOnce(&mut StepContext<'_>) -> Result<(), String> + Send>;
pub type Rollback = Box<dyn FnOnce(&mut Cluster) + Send>;

/// The work of one task: steps spread over the task's duration by weight,
/// and what to undo when a step (or an injected fault) fails it.
#[derive(Default)]
pub struct TaskPlan {
    steps: Vec<(u32, Step)>,
    rollback: Option<Rollback>,
    extra: Duration,
}

impl TaskPlan {
    pub fn new() -> Self {
        Self::default()
    }

    /// A step run after `weight` shares of the task's duration.
    pub fn step(
        mut self,
        weight: u32,
        step: impl FnOnce(&mut StepContext<'_>) -> Result<(), String> + Send + 'static,
    ) -> Self {
        self.steps.push((weight, Box::new(step)));
        self
    }

    /// Time on top of the task type's duration (e.g. a shutdown timeout).
    pub fn extra_time(mut self, extra: Duration) -> Self {
        self.extra += extra;
        self
    }

    pub fn on_failure(mut self, rollback: impl FnOnce(&mut Cluster) + Send + 'static) -> Self {
        self.rollback = Some(Box::new(rollback));
        self
    }
}

/// Forks a worker: registers the task as running and spawns its steps.
/// Returns the UPID.
pub fn start(
    shared: &Arc<Shared>,
    cluster: &mut Cluster,
    node: &str,
    task_type: &str,
    id: &str,
    user: &str,
    plan: TaskPlan,
) -> String {
    let pid = cluster.next_pid();
    // pstart is the worker's start in clock ticks since boot (100 Hz).
    let pstart = 1_000_000 + cluster.started.elapsed().as_millis() as u64 / 10;
    let upid = Upid {
        node: node.to_string(),
        pid,
        pstart,
        starttime: Cluster::now_epoch(),
        task_type: task_type.to_string(),
        id: id.to_string(),
        user: user.to_string(),
    };
    let encoded = upid.encode();
    cluster.tasks.insert(
        encoded.clone(),
        Task {
            upid,
            status: TaskStatus::Running,
            log: Vec::new(),
        },
    );
    let faults = lock(&shared.faults).for_task(task_type);
    let duration = shared.config.timings.task_duration(task_type) + faults.extra + plan.extra;
    tracing::debug!(upid = %encoded, "pve-sim task started");
    tokio::spawn(run(
        Arc::downgrade(shared),
        encoded.clone(),
        plan,
        duration,
        faults.failure,
    ));
    encoded
}

async fn run(
    shared: Weak<Shared>,
    upid: String,
    plan: TaskPlan,
    duration: Duration,
    injected_failure: Option<String>,
) {
    let TaskPlan {
        steps,
        mut rollback,
        ..
    } = plan;
    let total_weight: u32 = steps.iter().map(|(w, _)| *w).sum::<u32>().max(1);
    let step_count = steps.len();
    let mut outcome: Result<(), String> = Ok(());
    let mut log = Vec::new();
    let mut warnings = 0;

    if step_count == 0 {
        tokio::time::sleep(duration).await;
    }
    for (index, (weight, step)) in steps.into_iter().enumerate() {
        tokio::time::sleep(duration.mul_f64(f64::from(weight) / f64::from(total_weight))).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut cluster = lock(&shared.cluster);
        if index + 1 == step_count
            && let Some(message) = &injected_failure
        {
            outcome = Err(message.clone());
            break;
        }
        let mut context = StepContext {
            cluster: &mut cluster,
            shared: &shared,
            log: &mut log,
            warnings: &mut warnings,
        };
        if let Err(error) = step(&mut context) {
            outcome = Err(error);
            break;
        }
    }
    if step_count == 0
        && let Some(message) = injected_failure
    {
        outcome = Err(message);
    }

    let Some(shared) = shared.upgrade() else {
        return;
    };
    let mut cluster = lock(&shared.cluster);
    if outcome.is_err()
        && let Some(rollback) = rollback.take()
    {
        rollback(&mut cluster);
    }
    let (exitstatus, last_line) = match &outcome {
        Ok(()) if warnings > 0 => (
            format!("WARNINGS: {warnings}"),
            format!("TASK WARNINGS: {warnings}"),
        ),
        Ok(()) => ("OK".to_string(), "TASK OK".to_string()),
        Err(error) => {
            let error = error.trim_end().to_string();
            (error.clone(), format!("TASK ERROR: {error}"))
        }
    };
    if let Some(task) = cluster.tasks.get_mut(&upid) {
        task.log.extend(log);
        task.log.push(last_line);
        task.status = TaskStatus::Stopped {
            exitstatus: exitstatus.clone(),
            endtime: Cluster::now_epoch(),
        };
    }
    tracing::debug!(%upid, %exitstatus, "pve-sim task finished");
}

/// `$check_task_user`: a token sees its own tasks, a user its own and its
/// tokens'; anyone else needs Sys.Audit on the node.
fn check_task_access(call: &Call<'_>, upid: &Upid, node: &str) -> ApiResult<()> {
    let caller = call.authid;
    let owner_ok = match split_token_id(&upid.user) {
        Some((user, _)) => caller == upid.user || caller == user,
        None => caller == upid.user,
    };
    if owner_ok {
        return Ok(());
    }
    call.perms()
        .check(&format!("/nodes/{node}"), &["Sys.Audit"])
}

fn find_task<'a>(call: &'a Call<'_>) -> ApiResult<(&'a Task, Upid)> {
    let text = call.params.str("upid").unwrap_or_default();
    let upid =
        Upid::parse(text).ok_or_else(|| ApiError::param("upid", "unable to parse worker upid"))?;
    let task = call
        .cluster
        .tasks
        .get(text)
        .filter(|t| t.upid.node == call.params.str("node").unwrap_or_default())
        .ok_or_else(|| ApiError::param("upid", "no such task"))?;
    Ok((task, upid))
}

fn task_json(task: &Task) -> Value {
    let upid = &task.upid;
    let mut value = json!({
        "upid": upid.encode(),
        "node": upid.node,
        "pid": upid.pid,
        "pstart": upid.pstart,
        "starttime": upid.starttime,
        "type": upid.task_type,
        "id": upid.id,
        "user": upid.user,
        "status": if task.is_running() { "running" } else { "stopped" },
    });
    // The status call splits a token owner into user and tokenid.
    if let Some((user, token)) = split_token_id(&upid.user) {
        value["user"] = json!(user);
        value["tokenid"] = json!(token);
    }
    if let TaskStatus::Stopped { exitstatus, .. } = &task.status {
        value["exitstatus"] = json!(exitstatus);
    }
    value
}

/// GET /nodes/{node}/tasks/{upid}/status
pub fn status(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("upid", Kind::String),
    ]))?;
    let (task, upid) = find_task(call)?;
    let node = upid.node.clone();
    let value = task_json(task);
    check_task_access(call, &upid, &node)?;
    Ok(value.into())
}

/// GET /nodes/{node}/tasks/{upid}/log
pub fn log(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        required("upid", Kind::String),
        optional("start", Kind::int_min(0)),
        optional("limit", Kind::int_min(0)),
        optional("download", Kind::Boolean),
    ]))?;
    let start = call.params.int("start").unwrap_or(0) as usize;
    let limit = call.params.int("limit").unwrap_or(50) as usize;
    let (task, upid) = find_task(call)?;
    let mut lines: Vec<String> = vec![format!(
        "{} {} started",
        upid.task_type,
        if upid.id.is_empty() { "-" } else { &upid.id }
    )];
    lines.extend(task.log.iter().cloned());
    let total = lines.len();
    let page: Vec<Value> = lines
        .into_iter()
        .enumerate()
        .skip(start)
        .take(limit)
        .map(|(index, text)| json!({"n": index + 1, "t": text}))
        .collect();
    let node = upid.node.clone();
    check_task_access(call, &upid, &node)?;
    Ok(Reply::with_total(Value::Array(page), total))
}

/// GET /nodes/{node}/tasks — the caller's tasks (all with Sys.Audit).
pub fn list(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        required("node", Kind::String),
        optional("start", Kind::int_min(0)),
        optional("limit", Kind::int_min(0)),
        optional("vmid", Kind::Vmid),
        optional("typefilter", Kind::String),
        optional("userfilter", Kind::String),
        optional("errors", Kind::Boolean),
        optional("source", Kind::String),
    ]))?;
    let node = call.params.string("node").unwrap_or_default();
    let auditor = call.perms().has(&format!("/nodes/{node}"), &["Sys.Audit"]);
    let start = call.params.int("start").unwrap_or(0) as usize;
    let limit = call.params.int("limit").unwrap_or(50) as usize;
    let vmid = call.params.string("vmid");
    let typefilter = call.params.string("typefilter");
    let errors_only = call.params.flag("errors");
    let mut tasks: Vec<&Task> = call
        .cluster
        .tasks
        .values()
        .filter(|t| t.upid.node == node)
        .filter(|t| {
            auditor || {
                let owner = split_token_id(&t.upid.user).map_or(t.upid.user.as_str(), |(u, _)| u);
                call.authid == t.upid.user || call.authid == owner
            }
        })
        .filter(|t| vmid.as_ref().is_none_or(|v| &t.upid.id == v))
        .filter(|t| typefilter.as_ref().is_none_or(|f| &t.upid.task_type == f))
        .filter(|t| !errors_only || t.exitstatus().is_some_and(|s| s != "OK"))
        .collect();
    tasks.sort_by_key(|t| std::cmp::Reverse((t.upid.starttime, t.upid.pid)));
    let total = tasks.len();
    let page: Vec<Value> = tasks
        .into_iter()
        .skip(start)
        .take(limit)
        .map(|task| {
            let mut value = task_json(task);
            value["status"] = match task.exitstatus() {
                Some(exit) => json!(exit),
                None => json!("running"),
            };
            if let TaskStatus::Stopped { endtime, .. } = task.status {
                value["endtime"] = json!(endtime);
            }
            value
        })
        .collect();
    Ok(Reply::with_total(Value::Array(page), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upid_round_trips_in_pve_format() {
        let upid = Upid {
            node: "pve".into(),
            pid: 0x1234,
            pstart: 0xABCDE,
            starttime: 0x6512_3456,
            task_type: "qmclone".into(),
            id: "100".into(),
            user: "capmox@pve!capi".into(),
        };
        let text = upid.encode();
        assert_eq!(
            text,
            "UPID:pve:00001234:000ABCDE:65123456:qmclone:100:capmox@pve!capi:"
        );
        assert_eq!(Upid::parse(&text), Some(upid));
        assert_eq!(Upid::parse("UPID:pve:zz"), None);
    }
}
