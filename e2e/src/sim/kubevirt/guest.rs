//! Simulated guests: the part of a VM's operating system a controller can
//! see from outside, for CAPK's ssh bootstrap check. When a VMI runs, its
//! guest reads the cloud-init user data (the `cloudInitConfigDrive` or
//! `cloudInitNoCloud` volume), creates the users it lists with their
//! `ssh_authorized_keys`, and runs an SSH server on the VMI's first IP that
//! accepts only those keys. Bootstrap "runs" for a while and then writes
//! CAPI's sentinel file, which `cat` over SSH reads.
//!
//! The servers really listen, so the VMI IPs must be local addresses: the
//! pool is in 127.0.0.0/8, all of which Linux routes to loopback. Each
//! first-interface address is claimed by binding its SSH port right away;
//! an address another simulator (or another process) already listens on is
//! skipped, so simulators can share one pool.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{PrivateKey, PublicKey};
use russh::server::{Auth, Msg, PublicKeyOffer, Server as _, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, MethodKind, MethodSet};
use serde_json::Value;
use tokio::task::JoinHandle;

use super::faults::VmiFaults;
use super::ip_pool::IpPool;
use super::resources::{array_at, name_of, namespace_of, str_at, uid_of};

/// CAPI's bootstrap sentinel: kubeadm's bootstrap data ends with
/// `echo success > /run/cluster-api/bootstrap-success.complete`.
pub const BOOTSTRAP_SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";
/// How many addresses are tried before giving up on finding a free one.
const CLAIM_ATTEMPTS: usize = 64;

/// SSH guests: what they do and how fast.
#[derive(Clone, Debug)]
pub struct SshGuestConfig {
    /// The port the guests' SSH servers listen on: 22, as sshd. Binding it
    /// needs root (or `CAP_NET_BIND_SERVICE`).
    pub port: u16,
    /// How long bootstrap takes from the guest's start until the sentinel
    /// is written (per VM: annotation `sim.tenantry.dev/bootstrap-duration`).
    pub bootstrap_duration: Duration,
}

impl Default for SshGuestConfig {
    fn default() -> Self {
        Self {
            port: 22,
            bootstrap_duration: Duration::from_secs(3),
        }
    }
}

/// A guest's console log: what cloud-init and sshd would print. Shared with
/// the SSH server's connections.
#[derive(Clone, Default)]
struct GuestLog(Arc<Mutex<Vec<String>>>);

impl GuestLog {
    fn line(&self, started: Instant, text: impl Into<String>) {
        let text = text.into();
        tracing::debug!(guest_log = %text);
        self.0
            .lock()
            .expect("guest log lock")
            .push(format!("[{:8.3}] {text}", started.elapsed().as_secs_f64()));
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("guest log lock").clone()
    }
}

/// An address claimed for a guest: its SSH port bound, or why that failed.
enum Claim {
    Bound(std::net::TcpListener),
    Failed(String),
}

/// What one running guest knows; its SSH connections read it.
struct Guest {
    started: Instant,
    users: HashMap<String, Vec<PublicKey>>,
    /// Whether the user data's bootstrap writes the sentinel at all.
    writes_sentinel: bool,
    faults: Mutex<VmiFaults>,
    bootstrap_duration: Duration,
    log: GuestLog,
}

impl Guest {
    fn authorized(&self, user: &str, key: &PublicKey) -> bool {
        self.users
            .get(user)
            .is_some_and(|keys| keys.iter().any(|k| k.key_data() == key.key_data()))
    }

    /// The sentinel's content now, if bootstrap has written it.
    fn sentinel(&self) -> Option<String> {
        let faults = self.faults.lock().expect("guest faults lock").clone();
        let duration = faults.bootstrap_duration.unwrap_or(self.bootstrap_duration);
        if faults.sentinel_absent || !self.writes_sentinel || self.started.elapsed() < duration {
            return None;
        }
        Some(faults.sentinel.unwrap_or_else(|| "success".into()))
    }

    /// Runs one command the way `sh -c` would for the few the guest knows.
    fn exec(&self, command: &str) -> (String, String, u32) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["cat", path] if *path == BOOTSTRAP_SENTINEL => match self.sentinel() {
                Some(content) => (format!("{content}\n"), String::new(), 0),
                None => (
                    String::new(),
                    format!("cat: {path}: No such file or directory\n"),
                    1,
                ),
            },
            ["cat", path] => (
                String::new(),
                format!("cat: {path}: No such file or directory\n"),
                1,
            ),
            [program, ..] => (String::new(), format!("sh: 1: {program}: not found\n"), 127),
            [] => (String::new(), String::new(), 0),
        }
    }
}

struct Running {
    namespace: String,
    name: String,
    guest: Arc<Guest>,
    task: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct State {
    claims: HashMap<Ipv4Addr, Claim>,
    /// By VMI UID.
    running: HashMap<String, Running>,
    /// By namespace/name, kept after a guest stops, for diagnostics.
    logs: HashMap<String, GuestLog>,
}

/// The simulator's guests. Disabled (no servers, no claims) without an
/// [`SshGuestConfig`].
pub(super) struct Guests {
    config: Option<SshGuestConfig>,
    state: Mutex<State>,
}

impl Guests {
    pub fn new(config: Option<SshGuestConfig>) -> Self {
        Self {
            config,
            state: Mutex::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.config.is_some()
    }

    /// Checks that the pool hands out addresses guests can listen on.
    pub fn check_pool(&self, cidr: &str) -> anyhow::Result<()> {
        if self.enabled() && !cidr.trim().starts_with("127.") {
            bail!(
                "SSH guests listen on their VMI's IP on this host, so ip_pool must be inside 127.0.0.0/8 (e.g. {}), not {cidr:?}",
                super::LOOPBACK_IP_POOL
            );
        }
        Ok(())
    }

    /// An address for a VMI's first interface whose SSH port is bound (or
    /// the reason it cannot be, which the guest will report).
    pub fn claim_address(&self, ips: &IpPool) -> anyhow::Result<Ipv4Addr> {
        let port = self.config.as_ref().map_or(22, |c| c.port);
        for _ in 0..CLAIM_ATTEMPTS {
            let ip = ips.allocate()?;
            let claim = match std::net::TcpListener::bind((ip, port)) {
                Ok(listener) => Claim::Bound(listener),
                // Another simulator's guest has it: take the next one.
                Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(error) => Claim::Failed(bind_failure(ip, port, &error)),
            };
            self.state
                .lock()
                .expect("guests lock")
                .claims
                .insert(ip, claim);
            return Ok(ip);
        }
        bail!(
            "no address of the IP pool has port {port} free after {CLAIM_ATTEMPTS} tries: does something listen on 0.0.0.0:{port}?"
        )
    }

    /// Starts the guest of a running VMI unless it runs, and hands it the
    /// faults in force. `status` is the VMI status being written.
    pub async fn ensure_running(
        &self,
        client: &kube::Client,
        vmi: &DynamicObject,
        status: &serde_json::Map<String, Value>,
        faults: &VmiFaults,
    ) {
        let Some(config) = &self.config else { return };
        let uid = uid_of(vmi).to_string();
        {
            let state = self.state.lock().expect("guests lock");
            if let Some(running) = state.running.get(&uid) {
                *running.guest.faults.lock().expect("guest faults lock") = faults.clone();
                return;
            }
        }
        let namespace = namespace_of(vmi).to_string();
        let name = name_of(vmi).to_string();
        let log = {
            let mut state = self.state.lock().expect("guests lock");
            // A new VMI of the same VM: its predecessor's guest is gone.
            let replaced: Vec<String> = state
                .running
                .iter()
                .filter(|(_, r)| r.namespace == namespace && r.name == name)
                .map(|(uid, _)| uid.clone())
                .collect();
            for old in replaced {
                if let Some(mut running) = state.running.remove(&old) {
                    stop(&mut running);
                }
            }
            state
                .logs
                .entry(format!("{namespace}/{name}"))
                .or_default()
                .clone()
        };
        let started = Instant::now();
        log.line(
            started,
            format!("---- guest of VMI {namespace}/{name} (uid {uid}) boots ----"),
        );
        let ip = status
            .get("interfaces")
            .and_then(Value::as_array)
            .and_then(|i| i.first())
            .and_then(|i| i["ipAddress"].as_str())
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let user_data = match read_user_data(client, vmi).await {
            Ok(user_data) => user_data,
            Err(error) => {
                log.line(
                    started,
                    format!("cloud-init: cannot read user data: {error:#}"),
                );
                None
            }
        };
        let cloud_config = user_data.as_deref().and_then(cloud_config_body);
        let mut users = HashMap::new();
        if let Some(body) = cloud_config {
            users = create_users(body, &log, started);
        } else {
            log.line(
                started,
                "cloud-init: the user data is not #cloud-config; no users, no sshd (a Talos guest has none)",
            );
        }
        let guest = Arc::new(Guest {
            started,
            users,
            writes_sentinel: user_data
                .as_deref()
                .is_some_and(|d| d.contains(BOOTSTRAP_SENTINEL)),
            faults: Mutex::new(faults.clone()),
            bootstrap_duration: config.bootstrap_duration,
            log: log.clone(),
        });
        if !guest.writes_sentinel && cloud_config.is_some() {
            log.line(
                started,
                format!("cloud-init: nothing in the user data writes {BOOTSTRAP_SENTINEL}"),
            );
        }
        let claim = ip.and_then(|ip| self.state.lock().expect("guests lock").claims.remove(&ip));
        let task = match (cloud_config, ip) {
            (Some(_), Some(ip)) => {
                let listener = match claim {
                    Some(Claim::Bound(listener)) => Ok(listener),
                    Some(Claim::Failed(reason)) => Err(reason),
                    // Claimed by an earlier simulator: bind again.
                    None => std::net::TcpListener::bind((ip, config.port))
                        .map_err(|e| bind_failure(ip, config.port, &e)),
                };
                match listener {
                    Ok(listener) => Some(tokio::spawn(serve(listener, guest.clone()))),
                    Err(reason) => {
                        log.line(started, format!("sshd: {reason}"));
                        tracing::warn!(vmi = %format!("{namespace}/{name}"), %reason, "simulated guest has no SSH server");
                        None
                    }
                }
            }
            (Some(_), None) => {
                log.line(started, "sshd: the VMI has no IPv4 address to listen on");
                None
            }
            (None, _) => None,
        };
        self.state.lock().expect("guests lock").running.insert(
            uid,
            Running {
                namespace,
                name,
                guest,
                task,
            },
        );
    }

    /// The guest of a VMI that stops running powers off, and its address's
    /// port is let go if no guest took it (e.g. a hung guest).
    pub fn stop(&self, vmi: &DynamicObject) {
        let mut state = self.state.lock().expect("guests lock");
        if let Some(mut running) = state.running.remove(uid_of(vmi)) {
            stop(&mut running);
        }
        let ip = str_at(&vmi.data, "/status/interfaces/0/ipAddress").and_then(|ip| ip.parse().ok());
        if let Some(ip) = ip {
            state.claims.remove(&ip);
        }
    }

    pub fn stop_all(&self) {
        let mut state = self.state.lock().expect("guests lock");
        for (_, mut running) in state.running.drain() {
            stop(&mut running);
        }
        state.claims.clear();
    }

    /// The console log of the VM's guests (all VMIs so far, oldest first).
    pub fn log(&self, namespace: &str, name: &str) -> Vec<String> {
        self.state
            .lock()
            .expect("guests lock")
            .logs
            .get(&format!("{namespace}/{name}"))
            .map(GuestLog::lines)
            .unwrap_or_default()
    }
}

fn stop(running: &mut Running) {
    if let Some(task) = running.task.take() {
        task.abort();
    }
    running
        .guest
        .log
        .line(running.guest.started, "---- guest powered off ----");
}

fn bind_failure(ip: Ipv4Addr, port: u16, error: &std::io::Error) -> String {
    let hint = if error.kind() == std::io::ErrorKind::PermissionDenied {
        format!(" (port {port} needs root or CAP_NET_BIND_SERVICE)")
    } else {
        String::new()
    };
    format!("cannot listen on {ip}:{port}: {error}{hint}")
}

/// The user data of the VMI's cloud-init volume, as KubeVirt hands it to
/// the guest: a Secret's `userdata` (or `userData`) key, or the inline
/// `userData`/`userDataBase64`.
async fn read_user_data(
    client: &kube::Client,
    vmi: &DynamicObject,
) -> anyhow::Result<Option<String>> {
    let volume = array_at(&vmi.data, "/spec/volumes").iter().find_map(|v| {
        v.get("cloudInitConfigDrive")
            .or_else(|| v.get("cloudInitNoCloud"))
    });
    let Some(volume) = volume else {
        return Ok(None);
    };
    if let Some(secret_name) = str_at(volume, "/secretRef/name") {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace_of(vmi));
        let secret = secrets
            .get_opt(secret_name)
            .await?
            .with_context(|| format!("Secret {secret_name} does not exist"))?;
        let data = secret.data.unwrap_or_default();
        let bytes = data
            .get("userdata")
            .or_else(|| data.get("userData"))
            .with_context(|| format!("Secret {secret_name} has no userdata key"))?;
        return Ok(Some(String::from_utf8_lossy(&bytes.0).into_owned()));
    }
    if let Some(inline) = str_at(volume, "/userData") {
        return Ok(Some(inline.to_string()));
    }
    if let Some(encoded) = str_at(volume, "/userDataBase64") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .context("userDataBase64 is not base64")?;
        return Ok(Some(String::from_utf8_lossy(&bytes).into_owned()));
    }
    Ok(None)
}

/// The YAML after the `#cloud-config` line (cloud-init's jinja marker may
/// come first), if this is cloud-config.
fn cloud_config_body(text: &str) -> Option<&str> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        offset += line.len();
        let trimmed = line.trim();
        if trimmed.starts_with("#cloud-config") {
            return Some(&text[offset..]);
        }
        if !(trimmed.is_empty() || trimmed.starts_with("## template:")) {
            return None;
        }
    }
    None
}

/// cloud-init's users module, as far as SSH logins go: each listed user
/// with its `ssh_authorized_keys`.
fn create_users(body: &str, log: &GuestLog, started: Instant) -> HashMap<String, Vec<PublicKey>> {
    let mut users = HashMap::new();
    let config: serde_norway::Value = match serde_norway::from_str(body) {
        Ok(config) => config,
        Err(error) => {
            log.line(
                started,
                format!("cloud-init: the cloud-config is not valid YAML: {error}"),
            );
            return users;
        }
    };
    let entries = match config.get("users") {
        Some(serde_norway::Value::Sequence(entries)) => entries.clone(),
        Some(serde_norway::Value::String(names)) => names
            .split(',')
            .map(|n| serde_norway::Value::String(n.trim().into()))
            .collect(),
        _ => vec![serde_norway::Value::String("default".into())],
    };
    for entry in entries {
        let (name, keys) = match &entry {
            serde_norway::Value::String(name) => (name.clone(), Vec::new()),
            serde_norway::Value::Mapping(fields) => {
                let name = fields
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_string();
                let keys = fields
                    .get("ssh_authorized_keys")
                    .or_else(|| fields.get("ssh-authorized-keys"))
                    .and_then(|k| k.as_sequence())
                    .cloned()
                    .unwrap_or_default();
                (name, keys)
            }
            _ => continue,
        };
        if name.is_empty() {
            continue;
        }
        let mut parsed = Vec::new();
        for key in keys.iter().filter_map(|k| k.as_str()) {
            match PublicKey::from_openssh(key.trim()) {
                Ok(key) => parsed.push(key),
                Err(error) => log.line(
                    started,
                    format!("cloud-init: user {name}: skipping an unreadable key: {error}"),
                ),
            }
        }
        log.line(
            started,
            format!(
                "cloud-init: created user {name} with {} authorized key(s)",
                parsed.len()
            ),
        );
        users.insert(name, parsed);
    }
    users
}

/// sshd: public keys of the guest's users only, and `exec` of the commands
/// [`Guest::exec`] knows.
async fn serve(listener: std::net::TcpListener, guest: Arc<Guest>) {
    let address = listener.local_addr().ok();
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(listener) => listener,
        Err(error) => {
            guest
                .log
                .line(guest.started, format!("sshd: cannot listen: {error}"));
            return;
        }
    };
    let mut seed = [0u8; 32];
    rand::Rng::fill(&mut rand::rng(), &mut seed);
    let config = Arc::new(russh::server::Config {
        methods: MethodSet::from(&[MethodKind::PublicKey][..]),
        // sshd's rejection delay, shortened: tests wait on it.
        auth_rejection_time: Duration::from_millis(100),
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: Some(Duration::from_secs(30)),
        keys: vec![PrivateKey::from(Ed25519Keypair::from_seed(&seed))],
        nodelay: true,
        ..Default::default()
    });
    if let Some(address) = address {
        guest
            .log
            .line(guest.started, format!("sshd: listening on {address}"));
    }
    let mut server = Sshd {
        guest: guest.clone(),
    };
    if let Err(error) = server.run_on_socket(config, &listener).await {
        guest
            .log
            .line(guest.started, format!("sshd: stopped: {error}"));
    }
}

#[derive(Clone)]
struct Sshd {
    guest: Arc<Guest>,
}

impl russh::server::Server for Sshd {
    type Handler = Connection;

    fn new_client(&mut self, peer: Option<SocketAddr>) -> Connection {
        Connection {
            guest: self.guest.clone(),
            peer: peer.map_or_else(|| "unknown".into(), |p| p.to_string()),
            user: None,
        }
    }
}

struct Connection {
    guest: Arc<Guest>,
    peer: String,
    user: Option<String>,
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        let guest = &self.guest;
        if guest.authorized(user, offer.public_key) {
            return Ok(Auth::Accept);
        }
        guest.log.line(
            guest.started,
            format!(
                "sshd: Failed publickey for {user} from {}: key not authorized",
                self.peer
            ),
        );
        Ok(Auth::reject())
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        let guest = &self.guest;
        if guest.authorized(user, key.public_key) {
            guest.log.line(
                guest.started,
                format!("sshd: Accepted publickey for {user} from {}", self.peer),
            );
            self.user = Some(user.to_string());
            Ok(Auth::Accept)
        } else {
            guest.log.line(
                guest.started,
                format!("sshd: Failed publickey for {user} from {}", self.peer),
            );
            Ok(Auth::reject())
        }
    }

    async fn channel_open_session(
        &mut self,
        _channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        reply.accept().await;
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(data).into_owned();
        let (stdout, stderr, status) = self.guest.exec(&command);
        self.guest.log.line(
            self.guest.started,
            format!(
                "sshd: {} ran {command:?}: exit {status}",
                self.user.as_deref().unwrap_or("?")
            ),
        );
        session.channel_success(channel)?;
        if !stdout.is_empty() {
            session.data(channel, stdout.into_bytes())?;
        }
        if !stderr.is_empty() {
            session.extended_data(channel, 1, stderr.into_bytes())?;
        }
        session.exit_status_request(channel, status)?;
        session.eof(channel)?;
        session.close(channel)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(user_data: &str, faults: VmiFaults, duration: Duration) -> Guest {
        let log = GuestLog::default();
        let started = Instant::now();
        Guest {
            started,
            users: create_users(cloud_config_body(user_data).unwrap(), &log, started),
            writes_sentinel: user_data.contains(BOOTSTRAP_SENTINEL),
            faults: Mutex::new(faults),
            bootstrap_duration: duration,
            log,
        }
    }

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZm test";
    const DATA: &str = "## template: jinja\n#cloud-config\nusers:\n  - default\n  - name: capk\n    ssh_authorized_keys:\n      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZm test\nruncmd:\n  - kubeadm join && echo success > /run/cluster-api/bootstrap-success.complete\n";

    #[test]
    fn users_get_their_keys_and_nobody_else_gets_in() {
        let guest = guest(DATA, VmiFaults::default(), Duration::ZERO);
        let key = PublicKey::from_openssh(KEY).unwrap();
        assert!(guest.authorized("capk", &key));
        assert!(!guest.authorized("root", &key));
        assert!(!guest.authorized("default", &key));
        assert!(
            guest
                .log
                .lines()
                .iter()
                .any(|l| l.contains("created user capk with 1"))
        );
    }

    #[test]
    fn the_sentinel_appears_after_bootstrap_unless_a_fault_says_otherwise() {
        let command = format!("cat {BOOTSTRAP_SENTINEL}");
        let slow = guest(DATA, VmiFaults::default(), Duration::from_secs(60));
        assert_eq!(slow.exec(&command).2, 1, "still bootstrapping");
        let done = guest(DATA, VmiFaults::default(), Duration::ZERO);
        assert_eq!(done.exec(&command), ("success\n".into(), String::new(), 0));
        let absent = guest(
            DATA,
            VmiFaults {
                sentinel_absent: true,
                ..Default::default()
            },
            Duration::ZERO,
        );
        assert_eq!(absent.exec(&command).2, 1);
        let odd = guest(
            DATA,
            VmiFaults {
                sentinel: Some("failed".into()),
                ..Default::default()
            },
            Duration::ZERO,
        );
        assert_eq!(odd.exec(&command).0, "failed\n");
        let no_runcmd = guest(
            "#cloud-config\nusers: [default]\n",
            VmiFaults::default(),
            Duration::ZERO,
        );
        assert_eq!(no_runcmd.exec(&command).2, 1, "nothing writes the sentinel");
        assert_eq!(done.exec("reboot").2, 127);
    }

    #[test]
    fn only_cloud_config_is_read_by_cloud_init() {
        assert!(cloud_config_body("version: v1alpha1\nmachine: {}\n").is_none());
        assert_eq!(cloud_config_body("\n#cloud-config\na: 1\n"), Some("a: 1\n"));
    }

    #[tokio::test]
    async fn sshd_lets_in_the_listed_key_only_and_answers_the_check() {
        use tenantry_provider::kubevirt::ssh::{
            ProbeError, SentinelReading, SshKeyPair, read_bootstrap_sentinel,
        };
        let keys = SshKeyPair::generate("test").unwrap();
        let data = format!(
            "#cloud-config\nusers:\n  - name: capk\n    ssh_authorized_keys: [{}]\nruncmd: [echo success > {BOOTSTRAP_SENTINEL}]\n",
            keys.authorized_key()
        );
        let start = |faults: VmiFaults| {
            let guest = Arc::new(guest(&data, faults, Duration::ZERO));
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            (tokio::spawn(serve(listener, guest.clone())), port, guest)
        };
        let ip = "127.0.0.1".parse().unwrap();
        let timeout = Duration::from_secs(5);

        let (server, port, guest) = start(VmiFaults::default());
        let reading = read_bootstrap_sentinel(ip, port, &keys, timeout).await;
        assert_eq!(reading.unwrap(), SentinelReading::Success);
        let stranger = SshKeyPair::generate("stranger").unwrap();
        let refused = read_bootstrap_sentinel(ip, port, &stranger, timeout).await;
        assert!(
            matches!(refused, Err(ProbeError::AuthenticationRejected { .. })),
            "{refused:?}"
        );
        let log = guest.log.lines().join("\n");
        assert!(log.contains("Accepted publickey for capk"), "{log}");
        assert!(log.contains("Failed publickey for capk"), "{log}");
        server.abort();

        let (server, port, _) = start(VmiFaults {
            sentinel_absent: true,
            ..Default::default()
        });
        let reading = read_bootstrap_sentinel(ip, port, &keys, timeout).await;
        assert_eq!(reading.unwrap(), SentinelReading::Absent);
        server.abort();
    }

    #[test]
    fn an_address_whose_port_is_taken_is_skipped() {
        // The pool hands out 127.66.0.10 first; something already listens there.
        let taken = std::net::TcpListener::bind("127.66.0.10:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let guests = Guests::new(Some(SshGuestConfig {
            port,
            ..Default::default()
        }));
        let pool = IpPool::parse("127.66.0.0/24").unwrap();
        let claimed = guests.claim_address(&pool).unwrap();
        assert_eq!(claimed, Ipv4Addr::new(127, 66, 0, 11));
        assert!(matches!(
            guests.state.lock().unwrap().claims.get(&claimed),
            Some(Claim::Bound(_))
        ));
        assert!(guests.check_pool("10.244.0.0/16").is_err());
        assert!(guests.check_pool("127.10.0.0/16").is_ok());
    }

    #[test]
    fn an_address_that_cannot_be_bound_keeps_the_reason_for_the_guest_log() {
        let guests = Guests::new(Some(SshGuestConfig::default()));
        // Not an address of this host (TEST-NET-1): the bind fails.
        let pool = IpPool::parse("192.0.2.0/24").unwrap();
        let claimed = guests.claim_address(&pool).unwrap();
        let state = guests.state.lock().unwrap();
        let Some(Claim::Failed(reason)) = state.claims.get(&claimed) else {
            panic!("the failure is kept");
        };
        assert!(
            reason.starts_with("cannot listen on 192.0.2.10:22: "),
            "{reason}"
        );
        let denied = bind_failure(
            claimed,
            22,
            &std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(
            denied.ends_with("(port 22 needs root or CAP_NET_BIND_SERVICE)"),
            "{denied}"
        );
    }
}
