//! Leader election, so that several manager replicas can run and only one
//! reconciles: the holder of a `coordination.k8s.io/v1` Lease runs the
//! controllers; the others serve webhooks and health endpoints and wait.
//!
//! Taking and renewing the Lease is `kube-lease-manager` (maintained, made
//! for kube 5, server-side apply so two replicas cannot both take it). What
//! it does not do is step down when renewing fails: it logs and retries,
//! still believing it leads. A leader cut off from the apiserver must stop
//! before its Lease expires and another replica takes over, so a guard here
//! reads the Lease every retry period and ends the leadership when the Lease
//! names someone else, or when it has not been seen renewed for the renew
//! deadline (then the Lease expires within `lease duration - renew
//! deadline` and the others can take it). The caller stops the controllers
//! and exits, as controller-runtime managers do ("leader election lost").

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube_lease_manager::LeaseManagerBuilder;

/// Leader election settings (the flags of controller-runtime managers).
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    /// The Lease's namespace and name.
    pub namespace: String,
    pub name: String,
    /// This replica, as written to `spec.holderIdentity`.
    pub identity: String,
    /// How long a Lease holds without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without seeing its renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is looked at.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// Checks the durations against each other, as controller-runtime does.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration.as_secs() < 2 {
            return Err("the lease duration must be at least 2s".into());
        }
        if self.renew_deadline >= self.lease_duration {
            return Err("the renew deadline must be shorter than the lease duration".into());
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err("the retry period must be shorter than the renew deadline".into());
        }
        Ok(())
    }

    /// The identity of this process: the pod name (or host) and a random
    /// suffix, so a restarted replica never mistakes the old one's Lease for
    /// its own.
    pub fn default_identity(instance: Option<&str>) -> String {
        let base = instance
            .map(str::to_string)
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "tenantry".into());
        format!("{base}_{}", uuid::Uuid::new_v4().simple())
    }
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeadershipLost {
    #[error("the Lease {0} names {1} as its holder now")]
    TakenOver(String, String),
    #[error(
        "the Lease {0} was not seen renewed for {1:?} (the apiserver is unreachable or refuses)"
    )]
    NotRenewed(String, Duration),
    #[error("the Lease {0} is gone")]
    Deleted(String),
    #[error("the lease manager stopped: {0}")]
    Stopped(String),
}

type LeaseTask =
    tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>;

/// Leadership held: the controllers run until [`Leadership::lost`] ends.
/// Dropped without [`Leadership::release`], it stops renewing and leaves
/// the Lease to expire, as a crashed process would.
pub struct Leadership {
    config: LeaderElectionConfig,
    leases: Api<Lease>,
    state: tokio::sync::watch::Receiver<bool>,
    task: Option<LeaseTask>,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Waits until this replica holds the Lease.
pub async fn acquire(
    client: kube::Client,
    config: LeaderElectionConfig,
) -> anyhow::Result<Leadership> {
    config.validate().map_err(anyhow::Error::msg)?;
    // The manager renews `grace` before expiry: halfway through the renew
    // deadline, so a failed renewal is retried before the guard gives up.
    let half_deadline = (config.renew_deadline.as_secs() / 2).max(1);
    let grace = config
        .lease_duration
        .as_secs()
        .saturating_sub(half_deadline)
        .max(1);
    let start_manager = || async {
        let manager = LeaseManagerBuilder::new(client.clone(), &config.name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(config.lease_duration.as_secs())
            .with_grace(grace)
            .build()
            .await?;
        anyhow::Ok(manager.watch().await)
    };
    let (mut state, mut task) = start_manager().await?;
    tracing::info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "waiting for leadership");
    // kube-lease-manager's follower sleeps until the holder's Lease would
    // expire, even when the holder released it on shutdown. Looking every
    // retry period, as client-go's followers do, and starting a fresh lease
    // manager (which takes a Lease without holder at once) when it is
    // released makes a handover immediate.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let mut look = tokio::time::interval(config.retry_period);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    look.tick().await;
    while !*state.borrow_and_update() {
        tokio::select! {
            changed = state.changed() => {
                if changed.is_err() {
                    let ended = (&mut task).await;
                    anyhow::bail!("the lease manager stopped before leading: {ended:?}");
                }
            }
            _ = look.tick() => {
                let released = matches!(
                    leases.get_opt(&config.name).await,
                    Ok(Some(lease)) if lease.spec.as_ref().is_none_or(|s| s.holder_identity.is_none())
                );
                if released {
                    tracing::debug!(lease = %config.name, "the Lease was released: taking it");
                    task.abort();
                    (state, task) = start_manager().await?;
                }
            }
        }
    }
    tracing::info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "leading");
    Ok(Leadership {
        leases: Api::namespaced(client, &config.namespace),
        config,
        state,
        task: Some(task),
    })
}

impl Leadership {
    fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    /// Ends when this replica no longer leads (never while it does).
    pub async fn lost(&mut self) -> LeadershipLost {
        // When the Lease was last seen renewed (by this process, on this
        // clock); leadership counts from the acquire.
        let mut renewed = Timestamp::now();
        let mut tick = tokio::time::interval(self.config.retry_period);
        loop {
            tokio::select! {
                changed = self.state.changed() => {
                    if changed.is_err() || !*self.state.borrow_and_update() {
                        return LeadershipLost::Stopped("it reports the lock released".into());
                    }
                }
                _ = tick.tick() => {
                    match self.leases.get_opt(&self.config.name).await {
                        Ok(Some(lease)) => {
                            let spec = lease.spec.unwrap_or_default();
                            let holder = spec.holder_identity.unwrap_or_default();
                            if holder != self.config.identity {
                                return LeadershipLost::TakenOver(self.lease_name(), holder);
                            }
                            if let Some(at) = spec.renew_time.map(|t| t.0)
                                && at > renewed
                            {
                                renewed = at;
                            }
                        }
                        Ok(None) => return LeadershipLost::Deleted(self.lease_name()),
                        Err(error) => {
                            tracing::warn!(%error, lease = %self.lease_name(), "cannot read the Lease");
                        }
                    }
                    // Stop before the Lease can expire (renewal + lease
                    // duration) and another replica take it.
                    let since = Timestamp::now().duration_since(renewed).unsigned_abs();
                    if since >= self.config.renew_deadline {
                        return LeadershipLost::NotRenewed(self.lease_name(), self.config.renew_deadline);
                    }
                }
            }
        }
    }

    /// Gives the Lease up (on shutdown), so another replica leads at once.
    pub async fn release(mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        // Closing the state channel makes the lease manager release and end.
        let (_, closed) = tokio::sync::watch::channel(false);
        drop(std::mem::replace(&mut self.state, closed));
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("released the leader Lease"),
            Ok(Ok(Err(error))) => tracing::warn!(%error, "releasing the leader Lease"),
            Ok(Err(error)) => tracing::warn!(%error, "the lease manager task failed"),
            Err(_) => tracing::warn!("releasing the leader Lease timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: u64, renew: u64, retry: u64) -> LeaderElectionConfig {
        LeaderElectionConfig {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn durations_must_nest() {
        assert!(config(15, 10, 2).validate().is_ok());
        assert!(config(10, 10, 2).validate().is_err());
        assert!(config(15, 10, 10).validate().is_err());
        assert!(config(15, 10, 0).validate().is_err());
        assert!(config(1, 0, 0).validate().is_err());
    }

    #[test]
    fn identities_differ_per_process_start() {
        let a = LeaderElectionConfig::default_identity(Some("pod-a"));
        let b = LeaderElectionConfig::default_identity(Some("pod-a"));
        assert!(a.starts_with("pod-a_"));
        assert_ne!(a, b);
    }
}
