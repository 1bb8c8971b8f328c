//! Everything this test process logs, kept in memory: tenantry's
//! reconcilers and the simulators run in it, so a test can check that no
//! secret reaches a log line.

use std::sync::{Mutex, OnceLock};

static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();

/// Starts capturing at debug level for tenantry and the harness (once per
/// process; later calls keep the first capture).
pub fn capture() {
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,tenantry_provider=debug,tenantry_e2e=debug",
            ))
            .with_ansi(false)
            .with_writer(move || LogWriter(logs))
            .try_init();
        logs
    });
}

/// What was logged since [`capture`] was first called.
pub fn captured() -> String {
    let logs = LOGS.get().expect("logs::capture() was not called");
    String::from_utf8_lossy(&logs.lock().expect("log buffer")).into_owned()
}

/// Logs to standard error with `RUST_LOG`'s filter, when it is set.
pub fn from_env() {
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .try_init();
    }
}

struct LogWriter(&'static Mutex<Vec<u8>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
