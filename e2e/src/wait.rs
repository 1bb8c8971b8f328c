//! Waiting for a condition with a generous deadline. The deadline is an upper
//! bound for a broken system, never the thing a test measures.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use anyhow::bail;

/// Calls `check` until it returns `Ok(Some(value))`, backing off from 50 ms
/// to 500 ms between calls. `Ok(None)` and errors mean "not yet"; after
/// `timeout` the last error (if any) is reported along with `what`.
pub async fn until<T, F, Fut>(
    what: impl Display,
    timeout: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        let last_error = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => None,
            Err(error) => Some(error),
        };
        if tokio::time::Instant::now() >= deadline {
            match last_error {
                Some(error) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {error:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
