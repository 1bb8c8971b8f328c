//! Fair turns for a controller's reconciles.

/// Turns for a controller's reconciles, given first come, first served.
///
/// kube's runner bounds concurrency itself, but while every slot is busy it
/// parks the objects that fall due in a hash set and takes them out in hash
/// order, so under a steady load some objects starve (docs/performance.md).
/// A controller whose runner is unbounded and whose reconciles take a turn
/// here first keeps the bound and serves objects in the order they fell
/// due (tokio's semaphore is fair).
pub struct Turns {
    /// `None`: no bound.
    semaphore: Option<tokio::sync::Semaphore>,
}

impl Turns {
    /// `limit` reconciles at once; 0 for no bound.
    pub fn new(limit: u16) -> Self {
        Self {
            semaphore: (limit > 0).then(|| tokio::sync::Semaphore::new(usize::from(limit))),
        }
    }

    /// Waits for a turn; it lasts as long as the returned guard.
    pub async fn take(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match &self.semaphore {
            // Never closed, so acquiring cannot fail.
            Some(semaphore) => semaphore.acquire().await.ok(),
            None => None,
        }
    }
}
