//! Proxmox VE API simulator: a real HTTPS server speaking the PVE JSON API
//! (`/api2/json`) for what tenantry, capmox, the Proxmox CSI plugin and the
//! Proxmox CCM call, with PVE's token authentication, permission model,
//! tasks, storage, pools, a simulated guest that reads its NoCloud ISO, and
//! fault injection. `README.md` next to this file lists what it copies from
//! PVE and what it leaves out.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use tenantry_e2e::sim::proxmox::{PveSimConfig, PveSimulator};
//! let pve = PveSimulator::start(PveSimConfig::for_tests()).await?;
//! let token = pve.root_token(); // root@pam!sim, without privilege separation
//! println!("{} {}", pve.api_url(), token.authorization());
//! # Ok(()) }
//! ```

mod access;
mod agent;
mod auth;
pub mod cloud_init;
mod cluster_api;
mod config;
mod counters;
mod error;
mod faults;
mod guest;
pub mod iso9660;
mod params;
mod permissions;
mod pools;
mod qemu;
mod router;
mod server;
mod snapshot;
mod state;
mod storage;
mod tasks;
mod vm_config;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::sync::watch;

pub use config::{GuestOsInfo, NodeSpec, PveSimConfig, StorageSpec, StorageType, Timings};
pub use counters::{CallCounts, UNAUTHENTICATED, UNKNOWN_PATH};
pub use faults::{DropMode, FaultId, FaultSpec, Faults, GuestHang, RequestMatch, Trigger};
pub use permissions::builtin_roles;
pub use snapshot::{
    AclSnapshot, ClusterSnapshot, GuestPhase, NodeSnapshot, PoolSnapshot, SeedSnapshot,
    TaskSnapshot, UserSnapshot, VmPower, VmSnapshot, VolumeSnapshot,
};

use crate::pki::CertificateAuthority;
use faults::{FaultPlan, lock};
use server::Shared;

/// An API token: its full id (`user@realm!name`) and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    pub id: String,
    pub secret: String,
}

impl ApiToken {
    /// The `Authorization` header value PVE expects.
    pub fn authorization(&self) -> String {
        format!("PVEAPIToken={}={}", self.id, self.secret)
    }
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiToken")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Reads the simulated cluster's state; see [`PveSimulator::observer`].
#[derive(Clone)]
pub struct PveObserver {
    shared: Arc<Shared>,
}

impl PveObserver {
    pub fn snapshot(&self) -> ClusterSnapshot {
        snapshot::take(&lock(&self.shared.cluster))
    }
}

/// A running simulator. Dropping it stops the server and its tasks.
pub struct PveSimulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    ca_pem: String,
    root_token: ApiToken,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl PveSimulator {
    /// Binds the listener, issues a serving certificate from a fresh CA and
    /// starts serving. Must run inside a Tokio runtime.
    pub async fn start(config: PveSimConfig) -> anyhow::Result<Self> {
        config.validate()?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("bind {}", config.listen))?;
        let addr = listener.local_addr()?;

        let ca = CertificateAuthority::new("pve-sim CA")?;
        let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
        if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
            names.push(addr.ip().to_string());
        }
        names.extend(config.nodes.iter().map(|n| n.name.clone()));
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let serving = ca.issue_server("pve-sim", &name_refs)?;
        let acceptor = server::tls_acceptor(&serving.cert_pem, &serving.key_pem)?;

        let (cluster, token_id, secret) = state::Cluster::new(&config);
        let initial_faults = config.faults.clone();
        let shared = Arc::new(Shared {
            cluster: Mutex::new(cluster),
            faults: Mutex::new(FaultPlan::new(config.seed)),
            counters: Mutex::new(counters::CallCounters::default()),
            config,
        });
        let faults = Faults {
            shared: shared.clone(),
        };
        for spec in initial_faults {
            faults.add(spec)?;
        }

        let (shutdown, shutdown_rx) = watch::channel(false);
        let server = tokio::spawn(server::serve(
            listener,
            acceptor,
            shared.clone(),
            shutdown_rx,
        ));
        tracing::info!(%addr, "pve-sim listening");
        Ok(Self {
            shared,
            addr,
            ca_pem: ca.cert_pem(),
            root_token: ApiToken {
                id: token_id,
                secret,
            },
            shutdown,
            server,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>/` — what capmox's `url` secret key holds
    /// (it appends `/api2/json` itself).
    pub fn url(&self) -> url::Url {
        let host = match self.addr.ip() {
            ip if ip.is_unspecified() => IpAddr::from([127, 0, 0, 1]),
            ip => ip,
        };
        let authority = SocketAddr::new(host, self.addr.port());
        url::Url::parse(&format!("https://{authority}/")).expect("valid URL")
    }

    /// `https://127.0.0.1:<port>/api2/json/` — the API base (what the
    /// Proxmox CSI plugin and CCM configs hold).
    pub fn api_url(&self) -> url::Url {
        self.url()
            .join(&format!("{}/", server::BASE_PATH.trim_start_matches('/')))
            .expect("valid URL")
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The one token the simulator starts with: `root@pam!<name>`, without
    /// privilege separation.
    pub fn root_token(&self) -> &ApiToken {
        &self.root_token
    }

    pub fn faults(&self) -> Faults {
        Faults {
            shared: self.shared.clone(),
        }
    }

    pub fn snapshot(&self) -> ClusterSnapshot {
        snapshot::take(&lock(&self.shared.cluster))
    }

    /// A handle that reads snapshots while the simulator runs, for other
    /// simulators (the tenant nodes' kubelets) that follow its guests.
    pub fn observer(&self) -> PveObserver {
        PveObserver {
            shared: self.shared.clone(),
        }
    }

    pub fn call_counts(&self) -> CallCounts {
        lock(&self.shared.counters).snapshot()
    }

    pub fn reset_call_counts(&self) {
        lock(&self.shared.counters).reset();
    }

    /// Every endpoint the simulator serves, as `METHOD /path/{template}`.
    pub fn endpoints() -> Vec<String> {
        router::endpoints()
    }
}

impl Drop for PveSimulator {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.server.abort();
    }
}
