//! Worker tasks: what a UPID-returning call started, and waiting for it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ProxmoxClient;
use super::error::{ProxmoxError, Result};
use super::serde_helpers::{opt_number, opt_string_lenient};
use super::upid::Upid;

/// How [`ProxmoxClient::wait_for_task`] polls.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskWaitConfig {
    /// First pause between two status polls.
    pub initial_interval: Duration,
    /// Longest pause between two polls.
    pub max_interval: Duration,
    /// Growth of the pause per poll.
    pub factor: f32,
    /// Randomise pauses so many reconcilers do not poll in lock-step.
    pub jitter: bool,
    /// Give up (with [`ProxmoxError::TaskTimeout`]) after this long; the task
    /// keeps running on PVE.
    pub timeout: Duration,
    /// How many task log lines a [`ProxmoxError::TaskFailed`] carries.
    pub log_tail_lines: usize,
}

impl Default for TaskWaitConfig {
    fn default() -> Self {
        Self {
            initial_interval: Duration::from_millis(500),
            max_interval: Duration::from_secs(5),
            factor: 1.5,
            jitter: true,
            // A full clone of a large template on slow storage takes minutes.
            timeout: Duration::from_secs(10 * 60),
            log_tail_lines: 10,
        }
    }
}

impl TaskWaitConfig {
    /// The pauses between polls. Unbounded in count: the deadline is
    /// [`TaskWaitConfig::timeout`], enforced around the whole wait.
    pub fn backoff(&self) -> ExponentialBuilder {
        let builder = ExponentialBuilder::new()
            .with_min_delay(self.initial_interval)
            .with_max_delay(self.max_interval)
            .with_factor(self.factor)
            .without_max_times();
        if self.jitter {
            builder.with_jitter()
        } else {
            builder
        }
    }
}

/// `running` or `stopped`, from `GET /nodes/{node}/tasks/{upid}/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Running,
    Stopped,
    /// Anything a future release might add; treated as still running.
    #[serde(other)]
    Unknown,
}

/// A task's status.
#[derive(Debug, Clone, Deserialize)]
pub struct TaskStatus {
    pub status: TaskState,
    /// Set once stopped: `OK`, `WARNINGS: N`, or the error text.
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub exitstatus: Option<String>,
    #[serde(default, rename = "type")]
    pub task_type: Option<String>,
    #[serde(default, deserialize_with = "opt_string_lenient")]
    pub id: Option<String>,
    #[serde(default)]
    pub node: Option<String>,
    /// The owning user; for token tasks PVE splits the token name into `tokenid`.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub tokenid: Option<String>,
    #[serde(default, deserialize_with = "opt_number")]
    pub starttime: Option<i64>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl TaskStatus {
    /// How the task ended, once it has.
    pub fn exit(&self) -> Option<TaskExit> {
        match self.status {
            TaskState::Stopped => Some(TaskExit::parse(
                self.exitstatus.as_deref().unwrap_or("unexpected status"),
            )),
            _ => None,
        }
    }
}

/// A stopped task's exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskExit {
    Ok,
    /// `WARNINGS: N`. PVE counts this as success (pve-common
    /// `upid_status_is_error` is false for it, and the GUI shows the task as
    /// completed): the work was done, something non-fatal was logged — e.g. a
    /// clone that could not apply a cosmetic option.
    Warnings(u32),
    /// Anything else: the error text the worker died with.
    Failed(String),
}

impl TaskExit {
    pub fn parse(exitstatus: &str) -> Self {
        let exitstatus = exitstatus.trim();
        if exitstatus == "OK" {
            return Self::Ok;
        }
        if let Some(n) = exitstatus.strip_prefix("WARNINGS: ")
            && let Ok(n) = n.parse()
        {
            return Self::Warnings(n);
        }
        Self::Failed(exitstatus.to_owned())
    }

    pub fn is_success(&self) -> bool {
        !matches!(self, Self::Failed(_))
    }
}

/// A task that completed successfully.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutcome {
    pub upid: Upid,
    /// Warnings PVE logged (`WARNINGS: N`); 0 for a clean `OK`.
    pub warnings: u32,
}

/// One line of a task log (`GET …/tasks/{upid}/log`).
#[derive(Debug, Clone, Deserialize)]
struct LogLine {
    #[serde(default, deserialize_with = "opt_number")]
    n: Option<u64>,
    #[serde(default)]
    t: String,
}

#[derive(Serialize)]
struct LogQuery {
    start: u64,
    limit: u64,
}

/// Why one poll did not finish the wait.
enum Poll {
    Running,
    Failed(ProxmoxError),
}

impl ProxmoxClient {
    /// `GET /nodes/{node}/tasks/{upid}/status`.
    pub async fn task_status(&self, upid: &Upid) -> Result<TaskStatus> {
        let path = super::api_path(&["nodes", upid.node(), "tasks", upid.as_str(), "status"]);
        self.get(&path, &()).await
    }

    /// The last `lines` lines of a task's log, oldest first.
    pub async fn task_log_tail(&self, upid: &Upid, lines: usize) -> Result<Vec<String>> {
        let path = super::api_path(&["nodes", upid.node(), "tasks", upid.as_str(), "log"]);
        let lines = lines as u64;
        // PVE pages the log from the front and reports the line count as the
        // envelope's `total`, so read the count first, then the tail.
        let (first, total) = self
            .get_with_total::<Vec<LogLine>>(
                &path,
                &LogQuery {
                    start: 0,
                    limit: lines,
                },
            )
            .await?;
        let page = match total {
            Some(total) if total > lines => {
                let query = LogQuery {
                    start: total - lines,
                    limit: lines,
                };
                self.get::<Vec<LogLine>>(&path, &query).await?
            }
            _ => first,
        };
        let mut page = page;
        page.sort_by_key(|l| l.n);
        let skip = page.len().saturating_sub(lines as usize);
        Ok(page.into_iter().skip(skip).map(|l| l.t).collect())
    }

    /// Waits for a task with the client's [`TaskWaitConfig`].
    pub async fn wait_for_task(&self, upid: &Upid) -> Result<TaskOutcome> {
        let config = self.inner.tasks.clone();
        self.wait_for_task_with(upid, &config).await
    }

    /// Polls the task's status with backoff until it stops. Transient errors
    /// while polling (a node briefly unreachable) are retried; `OK` and
    /// `WARNINGS: N` are success; anything else is
    /// [`ProxmoxError::TaskFailed`] with the end of the task log.
    pub async fn wait_for_task_with(
        &self,
        upid: &Upid,
        config: &TaskWaitConfig,
    ) -> Result<TaskOutcome> {
        let started = Instant::now();
        let poll = || async {
            match self.task_status(upid).await {
                Ok(status) => match status.exit() {
                    Some(exit) => Ok(exit),
                    None => Err(Poll::Running),
                },
                Err(error) => Err(Poll::Failed(error)),
            }
        };
        let waiting = poll
            .retry(config.backoff())
            .sleep(tokio::time::sleep)
            .when(|p| match p {
                Poll::Running => true,
                Poll::Failed(error) => error.is_transient(),
            })
            .notify(|p, pause| match p {
                Poll::Running => {
                    tracing::debug!(upid = %upid, ?pause, "task still running");
                }
                Poll::Failed(error) => {
                    tracing::debug!(upid = %upid, ?pause, %error, "polling task failed; retrying");
                }
            });
        let exit = match tokio::time::timeout(config.timeout, waiting).await {
            Ok(Ok(exit)) => exit,
            Ok(Err(Poll::Failed(error))) => return Err(error),
            Ok(Err(Poll::Running)) | Err(_) => {
                return Err(ProxmoxError::TaskTimeout {
                    upid: upid.clone(),
                    waited: started.elapsed(),
                });
            }
        };
        record_task_end(upid, &exit);
        match exit {
            TaskExit::Ok => Ok(TaskOutcome {
                upid: upid.clone(),
                warnings: 0,
            }),
            TaskExit::Warnings(warnings) => {
                tracing::debug!(upid = %upid, warnings, "task completed with warnings");
                Ok(TaskOutcome {
                    upid: upid.clone(),
                    warnings,
                })
            }
            TaskExit::Failed(exit_status) => {
                // Best effort: the failure matters more than its log.
                let log_tail = match self.task_log_tail(upid, config.log_tail_lines).await {
                    Ok(lines) => lines,
                    Err(error) => {
                        tracing::debug!(upid = %upid, %error, "could not read the task log");
                        Vec::new()
                    }
                };
                Err(ProxmoxError::TaskFailed {
                    upid: upid.clone(),
                    exit_status,
                    log_tail,
                })
            }
        }
    }
}

/// The task's duration by type, from its start (the UPID's, PVE's clock)
/// to now.
fn record_task_end(upid: &Upid, exit: &TaskExit) {
    use crate::metrics::proxmox::TaskResult;
    let result = if exit.is_success() {
        TaskResult::Ok
    } else {
        TaskResult::Failed
    };
    let started = std::time::UNIX_EPOCH + Duration::from_secs(u64::from(upid.starttime()));
    let took = std::time::SystemTime::now()
        .duration_since(started)
        .unwrap_or_default();
    crate::metrics::global()
        .proxmox
        .task(upid.task_type(), result, took);
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;

    #[test]
    fn exit_statuses() {
        assert_eq!(TaskExit::parse("OK"), TaskExit::Ok);
        assert_eq!(TaskExit::parse("WARNINGS: 3"), TaskExit::Warnings(3));
        assert!(TaskExit::parse("WARNINGS: 3").is_success());
        assert_eq!(
            TaskExit::parse("clone failed: command 'qemu-img convert …' failed: exit code 1"),
            TaskExit::Failed(
                "clone failed: command 'qemu-img convert …' failed: exit code 1".into()
            )
        );
        // Not PVE's exact form, so not a success.
        assert!(!TaskExit::parse("WARNINGS: many").is_success());
        assert!(!TaskExit::parse("ok").is_success());
        assert!(!TaskExit::parse("unexpected status").is_success());
    }

    #[test]
    fn running_task_status_has_no_exit() {
        let status: TaskStatus = serde_json::from_str(
            r#"{"upid":"UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:tenantry@pve!capi:",
                "node":"pve1","pid":662316,"pstart":1234567,"starttime":1716580771,
                "type":"qmclone","id":"9000","user":"tenantry@pve","tokenid":"capi",
                "status":"running"}"#,
        )
        .unwrap();
        assert_eq!(status.status, TaskState::Running);
        assert_eq!(status.exit(), None);
        assert_eq!(status.tokenid.as_deref(), Some("capi"));
        assert_eq!(status.task_type.as_deref(), Some("qmclone"));
        assert_eq!(status.starttime, Some(1_716_580_771));
    }

    #[test]
    fn stopped_task_status_carries_the_exit() {
        let status: TaskStatus = serde_json::from_str(
            r#"{"status":"stopped","exitstatus":"WARNINGS: 1","type":"qmclone","id":9000}"#,
        )
        .unwrap();
        assert_eq!(status.exit(), Some(TaskExit::Warnings(1)));
        assert_eq!(status.id.as_deref(), Some("9000"));

        let status: TaskStatus = serde_json::from_str(r#"{"status":"stopped"}"#).unwrap();
        assert_eq!(
            status.exit(),
            Some(TaskExit::Failed("unexpected status".into()))
        );

        let status: TaskStatus = serde_json::from_str(r#"{"status":"paused"}"#).unwrap();
        assert_eq!(status.status, TaskState::Unknown);
        assert_eq!(status.exit(), None);
    }

    #[test]
    fn backoff_grows_from_initial_to_max_and_never_stops() {
        let config = TaskWaitConfig {
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_millis(400),
            factor: 2.0,
            jitter: false,
            ..TaskWaitConfig::default()
        };
        // backon computes in f32, so compare whole milliseconds.
        let pauses: Vec<u128> = config
            .backoff()
            .build()
            .take(6)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(pauses, [100, 200, 400, 400, 400, 400]);
        assert_eq!(config.backoff().build().take(1000).count(), 1000);
    }

    #[test]
    fn jittered_backoff_stays_within_twice_the_max() {
        let config = TaskWaitConfig::default();
        assert!(config.jitter);
        for pause in config.backoff().build().take(50) {
            assert!(pause >= config.initial_interval);
            assert!(pause <= config.max_interval * 2, "{pause:?}");
        }
    }

    #[test]
    fn default_wait_is_generous_enough_for_a_full_clone() {
        let config = TaskWaitConfig::default();
        assert!(config.timeout >= Duration::from_secs(300));
        assert!(config.initial_interval < config.max_interval);
    }
}
