//! What every reconciler shares, one concern per module: the manager's
//! settings ([`config`]), how controllers watch ([`watch`]), the context of
//! a controller ([`context`]), running it ([`mod@run`]), the one error type ([`mod@error`]), fair turns ([`turns`]), the per-object
//! backoff ([`backoff`]) and error policy ([`mod@error_policy`]), reconciles
//! under a finalizer ([`finalizer`]), status writes ([`status_write`]) and
//! trigger throttling ([`throttle`]), and condition reasons with their
//! severity ([`reasons`]). (Named so, not `runtime`, to stay
//! apart from `kube::runtime`.)

pub mod backoff;
pub mod config;
pub mod context;
pub mod error;
pub mod error_policy;
pub mod finalizer;
pub mod reasons;
pub mod run;
pub mod status_write;
pub mod throttle;
pub mod turns;
pub mod watch;

pub use backoff::{Backoff, object_key};
pub use config::{DEFAULT_MAX_CONCURRENT_RECONCILES, ManagerConfig};
pub use context::Context;
pub use error::{Error, OwnError};
pub use error_policy::{ReconcileError, error_policy};
pub use finalizer::{finalizer_wait, reconcile_with_finalizer};
pub use run::run;
pub use status_write::{
    FIELD_MANAGER, RECENT_STATUS, apply_status, apply_status_at_version, status_fingerprint,
};
pub use throttle::throttle_triggers;
pub use turns::Turns;
pub use watch::{
    CLIENT_READ_TIMEOUT, RESPONSE_TIMEOUT, WATCH_TIMEOUT_SECONDS, cache_watch, slim_controller,
    slim_for_cache, trigger_backoff, watch_backoff, watch_config,
};
