//! Kubelet stand-ins: the Nodes that worker VMs register in their tenant
//! cluster.
//!
//! A real worker boots Talos, reads its machine config from the bootstrap
//! data, and its kubelet registers a Node with the control plane the config
//! names (`cluster.controlPlane.endpoint`), then posts status and renews its
//! Lease in `kube-node-lease` every few seconds while it runs. This
//! simulator follows the substrate simulators' guests and does the same:
//!
//! - KubeVirt: a VirtualMachine whose VMI is `Running` and `Ready` (the
//!   guest booted); the bootstrap data is the VMI's cloud-init volume
//!   (`cloudInitConfigDrive`/`cloudInitNoCloud`, Secret key `userdata` or
//!   inline). providerID `kubevirt://<vm name>`, what CAPK and the KubeVirt
//!   cloud provider set.
//! - Proxmox VE: a running VM whose guest is up; the bootstrap data is the
//!   NoCloud seed's `user-data` the guest read at boot. providerID
//!   `proxmox://<smbios uuid>`, what capmox and the Proxmox CCM set.
//!
//! The Node is named after the VM (Talos' hostname), reports the guest's
//! CPU, memory, addresses and Talos version, and is deleted when the VM is
//! gone (CAPI normally deletes it first). While the guest is down (between
//! a VMI's deletion and its successor's boot, a PVE reset, a hung guest)
//! the kubelet is silent, so the tenant's node lifecycle controller turns
//! `Ready` to `Unknown`, as in a real cluster.
//!
//! With [`NodeSimConfig::verify_join`], a kubelet also checks what its TLS
//! bootstrap needs before it registers, and otherwise stays out and says
//! why ([`NodeSimulator::join_refusals`]): the config's cluster CA
//! (`cluster.ca.crt`) must include the tenant's CA, which signs the
//! apiserver's serving certificate, and its bootstrap token
//! (`cluster.token`) must authenticate as the tenant apiserver's bootstrap
//! token authenticator checks it ([`check_bootstrap_token`]) and carry the
//! group Kamaji's kubeadm phase lets create node CSRs. Off by default, so
//! tests that hand-write trimmed configs keep working.
//!
//! With [`NodeSimConfig::validate_talos_config`], the guest first hands its
//! machine config to Talos's own loader and validator (the real machinery,
//! [`crate::talos_check`]) and, if Talos refuses it, never starts a kubelet;
//! the refusal, in Talos's words, is among the join refusals.
//!
//! Left out: pods, images, volumes, node leases' holder changes, kubelet
//! certificates (the CSRs and their approval: a kubelet that passes the
//! join checks registers directly), `usage-bootstrap-signing` and the
//! `cluster-info` discovery (Talos has the CA in its config) and the
//! cloud-provider taint. Faults: [`NodeFault`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::{TenantCluster, TenantClusters};
use crate::sim::proxmox::{GuestPhase, PveObserver, VmPower};

const FIELD_MANAGER: &str = "sim-kubelet";
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The Secret type the bootstrap token authenticator accepts.
pub const BOOTSTRAP_TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group kubeadm (and Kamaji's kubeadm phase) binds to
/// `system:node-bootstrapper` and node CSR auto-approval: a token without
/// it authenticates, but its kubelet may not ask for a certificate.
pub const NODE_BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// How the kubelets behave.
#[derive(Clone, Debug)]
pub struct NodeSimConfig {
    /// How often a running kubelet posts Node status and renews its Lease
    /// (kubelet: `nodeStatusUpdateFrequency` 10 s, lease renewal 10 s).
    pub heartbeat: Duration,
    /// How often the simulator looks at the substrates.
    pub poll: Duration,
    /// Whether a kubelet checks, before registering, that its config's
    /// cluster CA is the tenant's and its bootstrap token is a valid
    /// bootstrap-token Secret in the tenant, as a real kubelet's TLS
    /// bootstrap needs. Off by default: configs written for tests often
    /// carry neither.
    pub verify_join: bool,
    /// Whether a booting guest first has Talos's machinery
    /// ([`crate::talos_check`], the pinned Talos version, cloud mode: the
    /// workers boot prepared disk images) load and validate its machine
    /// config, and stays out with Talos's message if Talos refuses it. Off
    /// by default, like `verify_join`, for hand-trimmed test configs.
    pub validate_talos_config: bool,
}

impl Default for NodeSimConfig {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(2),
            poll: Duration::from_millis(500),
            verify_join: false,
            validate_talos_config: false,
        }
    }
}

/// What can go wrong with a Node, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeFault {
    /// The kubelet keeps posting, but `Ready=False` (reason
    /// `KubeletNotReady`), as when the container runtime's network broke.
    /// Stays until cleared.
    NotReady,
    /// Like [`NodeFault::NotReady`], but the guest's next boot clears it: a
    /// wedged runtime that a reboot fixes.
    NotReadyUntilReboot,
    /// The kubelet stops posting status and renewing its Lease; the tenant's
    /// node lifecycle controller turns `Ready` to `Unknown` after its grace
    /// period.
    Silent,
}

/// A Node the simulator registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedNode {
    pub name: String,
    /// `namespace/name` of the tenant's CAPI Cluster.
    pub cluster: String,
    pub provider_id: String,
    /// Identifies the guest's current boot (the VMI's UID, the PVE boot
    /// count): it changes when the VM restarts.
    pub boot_id: String,
}

/// What a kubelet needs from a Talos machine config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TalosJoin {
    /// `machine.type`: `worker`, `controlplane`, `init` or `join`.
    pub machine_type: String,
    /// `cluster.controlPlane.endpoint`.
    pub endpoint: String,
    /// The tag of `machine.kubelet.image`, when set.
    pub kubelet_version: Option<String>,
    /// `cluster.token`: the bootstrap token (`<id>.<secret>`) the kubelet
    /// authenticates with until it has a certificate.
    pub bootstrap_token: Option<String>,
    /// `cluster.ca.crt`, decoded: the PEM bundle the kubelet trusts for the
    /// apiserver. `None` when absent or not base64.
    pub cluster_ca_pem: Option<String>,
}

impl TalosJoin {
    /// Reads the `v1alpha1` document of a Talos machine config (Talos 1.5+
    /// configs may carry more documents). `None` for anything else, such as
    /// a cloud-config, which no simulated kubelet follows.
    pub fn parse(user_data: &str) -> Option<Self> {
        use serde::Deserialize as _;
        for document in serde_norway::Deserializer::from_str(user_data) {
            // A YAML error ends the stream: the deserializer would
            // otherwise yield the same error forever.
            let Ok(value) = Value::deserialize(document) else {
                return None;
            };
            if value["version"] != "v1alpha1" {
                continue;
            }
            let endpoint = value["cluster"]["controlPlane"]["endpoint"].as_str()?;
            let machine_type = value["machine"]["type"].as_str().unwrap_or("worker");
            let kubelet_version = value["machine"]["kubelet"]["image"]
                .as_str()
                .and_then(|image| image.rsplit_once(':'))
                .map(|(_, tag)| tag.to_string());
            let bootstrap_token = value["cluster"]["token"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            let cluster_ca_pem = value["cluster"]["ca"]["crt"]
                .as_str()
                .and_then(|crt| {
                    base64::engine::general_purpose::STANDARD
                        .decode(crt.trim())
                        .ok()
                })
                .and_then(|bytes| String::from_utf8(bytes).ok());
            return Some(Self {
                machine_type: machine_type.to_string(),
                endpoint: endpoint.to_string(),
                kubelet_version,
                bootstrap_token,
                cluster_ca_pem,
            });
        }
        None
    }
}

/// A guest as the kubelet sees it.
#[derive(Clone, Debug)]
struct Guest {
    /// Unique across substrates.
    key: String,
    node_name: String,
    provider_id: String,
    up: bool,
    boot_id: String,
    user_data: Option<String>,
    cpu: u64,
    memory: String,
    addresses: Vec<String>,
    os_image: String,
}

struct NodeRecord {
    node_name: String,
    tenant: TenantCluster,
    provider_id: String,
    boot_id: String,
    last_beat: Option<Instant>,
    /// The Ready status last posted and since when.
    ready: Option<(&'static str, String)>,
}

struct FaultState {
    fault: NodeFault,
    /// For faults a reboot clears: the boot they were injected in (set on
    /// the first tick that sees the node).
    armed_boot: Option<String>,
    /// When the kubelet noticed: the `lastTransitionTime` of its `Ready`.
    /// Faults injected together share it, as Nodes failing together would.
    since: String,
}

#[derive(Default)]
struct State {
    records: HashMap<String, NodeRecord>,
    faults: HashMap<String, FaultState>,
    /// Bootstrap data by KubeVirt VMI UID.
    user_data: HashMap<String, Option<String>>,
    /// Why kubelets that have not registered their Node have not, by node.
    join_refusals: BTreeMap<String, String>,
}

struct Shared {
    tenants: TenantClusters,
    config: NodeSimConfig,
    kubevirt: Mutex<Vec<kube::Client>>,
    proxmox: Mutex<Vec<PveObserver>>,
    state: Mutex<State>,
}

/// A running simulator. Dropping it stops every kubelet (their Nodes stay
/// until the tenant control plane goes, as after a power cut).
pub struct NodeSimulator {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl NodeSimulator {
    /// Starts the kubelets of every guest of the substrates added later
    /// with [`Self::follow_kubevirt`] and [`Self::follow_proxmox`].
    pub fn start(tenants: TenantClusters, config: NodeSimConfig) -> Self {
        let shared = Arc::new(Shared {
            tenants,
            config,
            kubevirt: Mutex::default(),
            proxmox: Mutex::default(),
            state: Mutex::default(),
        });
        let task = tokio::spawn(run(shared.clone()));
        Self { shared, task }
    }

    /// Follows the VirtualMachines of the KubeVirt (simulator) cluster
    /// behind `client`.
    pub fn follow_kubevirt(&self, client: kube::Client) {
        lock(&self.shared.kubevirt).push(client);
    }

    /// Follows the VMs of a PVE simulator.
    pub fn follow_proxmox(&self, observer: PveObserver) {
        lock(&self.shared.proxmox).push(observer);
    }

    /// Makes the kubelet of `node` misbehave until [`Self::clear_fault`]
    /// (or a reboot, for [`NodeFault::NotReadyUntilReboot`]).
    pub fn inject_fault(&self, node: &str, fault: NodeFault) {
        self.inject_faults(&[node], fault);
    }

    /// Makes several kubelets misbehave at the same moment.
    pub fn inject_faults(&self, nodes: &[&str], fault: NodeFault) {
        let since = rfc3339_now();
        let mut state = lock(&self.shared.state);
        for node in nodes {
            state.faults.insert(
                node.to_string(),
                FaultState {
                    fault,
                    armed_boot: None,
                    since: since.clone(),
                },
            );
        }
    }

    /// Lets the kubelet of `node` behave again.
    pub fn clear_fault(&self, node: &str) {
        lock(&self.shared.state).faults.remove(node);
    }

    /// The faults in force, by node name.
    pub fn faults(&self) -> BTreeMap<String, NodeFault> {
        lock(&self.shared.state)
            .faults
            .iter()
            .map(|(node, state)| (node.clone(), state.fault))
            .collect()
    }

    /// Why each running kubelet that has not registered its Node has not
    /// (no tenant answers at its endpoint, or, with
    /// [`NodeSimConfig::verify_join`], a failed join check), by node name.
    pub fn join_refusals(&self) -> BTreeMap<String, String> {
        lock(&self.shared.state).join_refusals.clone()
    }

    /// The Nodes registered now, by name.
    pub fn nodes(&self) -> Vec<SimulatedNode> {
        let mut nodes: Vec<SimulatedNode> = lock(&self.shared.state)
            .records
            .values()
            .map(|r| SimulatedNode {
                name: r.node_name.clone(),
                cluster: format!("{}/{}", r.tenant.namespace, r.tenant.name),
                provider_id: r.provider_id.clone(),
                boot_id: r.boot_id.clone(),
            })
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes
    }

    /// Stops every kubelet.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for NodeSimulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().expect("kubelet simulator lock")
}

async fn run(shared: Arc<Shared>) {
    loop {
        if let Err(error) = tick(&shared).await {
            tracing::debug!(error = format!("{error:#}"), "kubelet simulator");
        }
        tokio::time::sleep(shared.config.poll).await;
    }
}

async fn tick(shared: &Shared) -> anyhow::Result<()> {
    let mut guests = Vec::new();
    let clients = lock(&shared.kubevirt).clone();
    for (index, client) in clients.iter().enumerate() {
        guests.extend(kubevirt_guests(shared, index, client).await?);
    }
    let observers = lock(&shared.proxmox).clone();
    for (index, observer) in observers.iter().enumerate() {
        guests.extend(proxmox_guests(index, observer));
    }

    for guest in &guests {
        if let Err(error) = follow(shared, guest).await {
            tracing::debug!(node = %guest.node_name, error = format!("{error:#}"), "kubelet");
        }
    }
    lock(&shared.state)
        .join_refusals
        .retain(|node, _| guests.iter().any(|g| g.up && &g.node_name == node));

    // VMs that are gone take their Nodes with them.
    let gone: Vec<NodeRecord> = {
        let mut state = lock(&shared.state);
        let keys: Vec<String> = state
            .records
            .keys()
            .filter(|key| !guests.iter().any(|g| &g.key == *key))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|key| state.records.remove(&key))
            .collect()
    };
    for record in gone {
        if shared
            .tenants
            .by_endpoint(&record.tenant.endpoint)
            .is_none()
        {
            // The tenant control plane went first; its Nodes went with it.
            continue;
        }
        let nodes: Api<Node> = Api::all(record.tenant.client.clone());
        match nodes
            .delete(&record.node_name, &DeleteParams::default())
            .await
        {
            Ok(_) => tracing::info!(node = %record.node_name, "VM gone, Node removed"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                tracing::debug!(node = %record.node_name, %error, "Node not removed; retrying");
                // Try again next tick.
                lock(&shared.state)
                    .records
                    .insert(format!("gone:{}", record.node_name), record);
            }
        }
    }
    Ok(())
}

/// One kubelet's step: register, post status, renew the Lease.
async fn follow(shared: &Shared, guest: &Guest) -> anyhow::Result<()> {
    let (fault, due, existing) = {
        let mut state = lock(&shared.state);
        let rebooted = state
            .records
            .get(&guest.key)
            .is_some_and(|r| r.boot_id != guest.boot_id);
        if let Some(record) = state.records.get_mut(&guest.key) {
            record.boot_id = guest.boot_id.clone();
            if rebooted {
                // A fresh boot posts at once.
                record.last_beat = None;
            }
        }
        let mut rebooted_clean = false;
        let fault = match state.faults.get_mut(&guest.node_name) {
            Some(f) if f.fault == NodeFault::NotReadyUntilReboot => match &f.armed_boot {
                None => {
                    f.armed_boot = Some(guest.boot_id.clone());
                    Some((f.fault, f.since.clone()))
                }
                Some(boot) if *boot != guest.boot_id && guest.up => {
                    rebooted_clean = true;
                    None
                }
                Some(_) => Some((f.fault, f.since.clone())),
            },
            Some(f) => Some((f.fault, f.since.clone())),
            None => None,
        };
        if rebooted_clean {
            tracing::info!(node = %guest.node_name, "reboot cleared the kubelet's fault");
            state.faults.remove(&guest.node_name);
        }
        let record = state.records.get(&guest.key);
        let due = record
            .and_then(|r| r.last_beat)
            .is_none_or(|last| last.elapsed() >= shared.config.heartbeat);
        (fault, due, record.map(|r| r.tenant.clone()))
    };
    if !guest.up || matches!(fault, Some((NodeFault::Silent, _))) || !due {
        return Ok(());
    }

    let tenant = match existing {
        Some(tenant) => tenant,
        None => {
            let Some(user_data) = guest.user_data.as_deref() else {
                return Ok(());
            };
            if shared.config.validate_talos_config {
                match crate::talos_check::validate(user_data, crate::talos_check::TalosMode::Cloud)
                    .await
                    .context("run Talos's config validator")?
                {
                    Ok(()) => {}
                    Err(message) => {
                        refuse_join(
                            shared,
                            &guest.node_name,
                            format!("Talos refuses the machine config: {message}"),
                        );
                        return Ok(());
                    }
                }
            }
            let Some(join) = TalosJoin::parse(user_data) else {
                return Ok(());
            };
            let Some(tenant) = shared.tenants.by_endpoint(&join.endpoint) else {
                refuse_join(
                    shared,
                    &guest.node_name,
                    format!("no tenant control plane answers at {}", join.endpoint),
                );
                return Ok(());
            };
            if shared.config.verify_join
                && let Err(reason) = verify_join(&join, &tenant).await
            {
                refuse_join(shared, &guest.node_name, reason);
                return Ok(());
            }
            tenant
        }
    };
    let kubelet_version = guest
        .user_data
        .as_deref()
        .and_then(TalosJoin::parse)
        .and_then(|j| j.kubelet_version)
        .unwrap_or_else(|| "v0.0.0-unknown".to_string());

    let nodes: Api<Node> = Api::all(tenant.client.clone());
    register(&nodes, guest).await?;
    let ready_status = if fault.is_some() { "False" } else { "True" };
    let since = {
        let state = lock(&shared.state);
        state
            .records
            .get(&guest.key)
            .and_then(|r| r.ready.as_ref())
            .filter(|(status, _)| *status == ready_status)
            .map(|(_, since)| since.clone())
    }
    .or_else(|| fault.map(|(_, since)| since))
    .unwrap_or_else(rfc3339_now);
    let status = node_status(guest, &kubelet_version, ready_status, &since);
    let patched = nodes
        .patch_status(
            &guest.node_name,
            &PatchParams::default(),
            &Patch::Strategic(json!({ "status": status })),
        )
        .await;
    match patched {
        Ok(_) => {}
        // Deleted between registration and status (CAPI deletes Nodes of
        // deleted Machines): register again next time, as kubelet does.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(error) => return Err(error).context("post Node status"),
    }
    renew_lease(&tenant.client, &guest.node_name).await?;

    let mut state = lock(&shared.state);
    state.join_refusals.remove(&guest.node_name);
    let record = state.records.entry(guest.key.clone()).or_insert_with(|| {
        tracing::info!(node = %guest.node_name, cluster = %tenant.name, "Node registered");
        NodeRecord {
            node_name: guest.node_name.clone(),
            tenant: tenant.clone(),
            provider_id: guest.provider_id.clone(),
            boot_id: guest.boot_id.clone(),
            last_beat: None,
            ready: None,
        }
    });
    record.last_beat = Some(Instant::now());
    record.ready = Some((ready_status, since));
    Ok(())
}

/// Records why a kubelet does not join, logging when the reason changes.
fn refuse_join(shared: &Shared, node: &str, reason: String) {
    let mut state = lock(&shared.state);
    if state.join_refusals.get(node) != Some(&reason) {
        tracing::info!(%node, %reason, "kubelet does not join");
        state.join_refusals.insert(node.to_string(), reason);
    }
}

/// What the kubelet's TLS bootstrap against `tenant` needs from its
/// config: trust in the tenant's CA and a bootstrap token the tenant
/// accepts.
async fn verify_join(join: &TalosJoin, tenant: &TenantCluster) -> Result<(), String> {
    check_cluster_ca(join.cluster_ca_pem.as_deref(), &tenant.ca_pem)?;
    let Some(token) = join.bootstrap_token.as_deref() else {
        return Err("the machine config has no cluster.token".into());
    };
    let (id, _) = parse_bootstrap_token(token)?;
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), "kube-system");
    let secret = secrets
        .get_opt(&format!("bootstrap-token-{id}"))
        .await
        .map_err(|error| format!("reading the bootstrap token Secret: {error}"))?;
    check_bootstrap_token(token, secret.as_ref(), chrono::Utc::now())
}

/// Whether a config's cluster CA bundle (`cluster.ca.crt`, decoded) holds
/// the tenant's CA certificate, so the kubelet trusts the apiserver's
/// serving certificate. Compared as DER, whatever the PEM layout.
pub fn check_cluster_ca(config_ca_pem: Option<&str>, tenant_ca_pem: &str) -> Result<(), String> {
    let Some(config_ca_pem) = config_ca_pem else {
        return Err("the machine config has no (base64) cluster.ca.crt".into());
    };
    let certificates = |pem: &str| -> Vec<Vec<u8>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .filter_map(Result::ok)
            .map(|der| der.as_ref().to_vec())
            .collect()
    };
    let trusted = certificates(config_ca_pem);
    if trusted.is_empty() {
        return Err("cluster.ca.crt holds no PEM certificate".into());
    }
    let tenant = certificates(tenant_ca_pem);
    if tenant.iter().any(|ca| trusted.contains(ca)) {
        Ok(())
    } else {
        Err("cluster.ca.crt is not the tenant's CA: the kubelet would not trust the apiserver's serving certificate".into())
    }
}

/// `(id, secret)` of a bootstrap token, which must match
/// `[a-z0-9]{6}.[a-z0-9]{16}` (kubeadm's and the authenticator's format).
fn parse_bootstrap_token(token: &str) -> Result<(&str, &str), String> {
    let valid = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    match token.split_once('.') {
        Some((id, secret)) if valid(id, 6) && valid(secret, 16) => Ok((id, secret)),
        _ => {
            Err("cluster.token is not a bootstrap token (<6 chars>.<16 chars> of [a-z0-9])".into())
        }
    }
}

/// Whether the tenant's bootstrap token authenticator accepts `token`
/// given the Secret `kube-system/bootstrap-token-<id>` (`None`: absent) at
/// `now`, and the token may ask for a node certificate. Copies the
/// authenticator's checks (`plugin/pkg/auth/authenticator/token/bootstrap`):
/// not being deleted, type `bootstrap.kubernetes.io/token`, `token-secret`
/// and `token-id` matching, `expiration` absent or in the future (an
/// unparseable one counts as expired), `usage-bootstrap-authentication`
/// `"true"`, every `auth-extra-groups` entry a `system:bootstrappers:`
/// group; then [`NODE_BOOTSTRAP_GROUP`] among them.
pub fn check_bootstrap_token(
    token: &str,
    secret: Option<&Secret>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), String> {
    let (id, token_secret) = parse_bootstrap_token(token)?;
    let name = format!("kube-system/bootstrap-token-{id}");
    let Some(secret) = secret else {
        return Err(format!("bootstrap token {id}: no Secret {name}"));
    };
    if secret.metadata.deletion_timestamp.is_some() {
        return Err(format!("bootstrap token {id}: {name} is being deleted"));
    }
    if secret.type_.as_deref() != Some(BOOTSTRAP_TOKEN_SECRET_TYPE) {
        return Err(format!(
            "bootstrap token {id}: {name} is not of type {BOOTSTRAP_TOKEN_SECRET_TYPE}"
        ));
    }
    let data = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .cloned()
            })
            .unwrap_or_default()
    };
    if data("token-secret") != token_secret {
        return Err(format!(
            "bootstrap token {id}: token-secret in {name} does not match"
        ));
    }
    if data("token-id") != id {
        return Err(format!(
            "bootstrap token {id}: token-id in {name} does not match"
        ));
    }
    let expiration = data("expiration");
    if !expiration.is_empty() {
        match chrono::DateTime::parse_from_rfc3339(&expiration) {
            Ok(at) if at > now => {}
            Ok(_) => return Err(format!("bootstrap token {id} expired at {expiration}")),
            Err(_) => {
                return Err(format!(
                    "bootstrap token {id}: unparseable expiration {expiration:?} (counts as expired)"
                ));
            }
        }
    }
    if data("usage-bootstrap-authentication") != "true" {
        return Err(format!(
            "bootstrap token {id}: {name} is not marked usage-bootstrap-authentication=true"
        ));
    }
    let groups = data("auth-extra-groups");
    let groups: Vec<&str> = groups
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    if let Some(invalid) = groups.iter().find(|g| !is_bootstrap_group(g)) {
        return Err(format!(
            "bootstrap token {id}: auth-extra-groups entry {invalid:?} is not a system:bootstrappers: group"
        ));
    }
    if !groups.contains(&NODE_BOOTSTRAP_GROUP) {
        return Err(format!(
            "bootstrap token {id}: auth-extra-groups lacks {NODE_BOOTSTRAP_GROUP}, the group allowed to request node certificates"
        ));
    }
    Ok(())
}

/// `^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$`, the groups a
/// bootstrap token may add.
fn is_bootstrap_group(group: &str) -> bool {
    let Some(rest) = group.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    !rest.is_empty()
        && rest.len() <= 256
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
        && rest
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Creates the Node unless it exists (kubelet's registration).
async fn register(nodes: &Api<Node>, guest: &Guest) -> anyhow::Result<()> {
    if nodes.get_opt(&guest.node_name).await?.is_some() {
        return Ok(());
    }
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": guest.node_name,
            "labels": {
                "kubernetes.io/hostname": guest.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
            },
        },
        "spec": { "providerID": guest.provider_id },
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error).context("register Node"),
    }
}

fn node_status(guest: &Guest, kubelet_version: &str, ready: &str, since: &str) -> Value {
    let now = rfc3339_now();
    let (reason, message) = if ready == "True" {
        ("KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady",
        )
    };
    let pressure = |kind: &str, reason: &str, message: &str| {
        json!({
            "type": kind, "status": "False", "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": since,
        })
    };
    let capacity = json!({
        "cpu": guest.cpu.to_string(),
        "memory": guest.memory,
        "pods": "110",
        "ephemeral-storage": "20Gi",
    });
    let mut addresses: Vec<Value> = guest
        .addresses
        .iter()
        .map(|ip| json!({ "type": "InternalIP", "address": ip }))
        .collect();
    addresses.push(json!({ "type": "Hostname", "address": guest.node_name }));
    json!({
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": addresses,
        "nodeInfo": {
            "machineID": guest.key.replace([':', '/'], "-"),
            "systemUUID": guest.provider_id.rsplit('/').next().unwrap_or_default(),
            "bootID": guest.boot_id,
            "kernelVersion": "6.12.0-talos",
            "osImage": guest.os_image,
            "containerRuntimeVersion": "containerd://2.1.0",
            "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "conditions": [
            pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            {
                "type": "Ready", "status": ready, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": since,
            },
        ],
    })
}

/// Renews the Node's Lease, which the node lifecycle controller reads as
/// the kubelet's heartbeat.
async fn renew_lease(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    let leases: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NODE_LEASE_NAMESPACE,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
            "leases",
        ),
    );
    let renew_time = chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    leases
        .patch(
            node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": { "name": node, "namespace": NODE_LEASE_NAMESPACE },
                "spec": { "holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renew_time },
            })),
        )
        .await
        .context("renew node Lease")?;
    Ok(())
}

fn rfc3339_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn kubevirt_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubevirt.io", "v1", kind), plural)
}

async fn kubevirt_guests(
    shared: &Shared,
    index: usize,
    client: &kube::Client,
) -> anyhow::Result<Vec<Guest>> {
    let vms: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kubevirt_resource("VirtualMachine", "virtualmachines"),
    );
    let vmis: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kubevirt_resource("VirtualMachineInstance", "virtualmachineinstances"),
    );
    let vms = vms.list(&ListParams::default()).await?.items;
    let vmis = vmis.list(&ListParams::default()).await?.items;
    let mut guests = Vec::new();
    for vm in vms
        .iter()
        .filter(|vm| vm.metadata.deletion_timestamp.is_none())
    {
        let namespace = vm.metadata.namespace.clone().unwrap_or_default();
        let name = vm.metadata.name.clone().unwrap_or_default();
        let vmi = vmis.iter().find(|i| {
            i.metadata.namespace.as_deref() == Some(&namespace)
                && i.metadata.name.as_deref() == Some(&name)
        });
        let up = vmi.is_some_and(|i| {
            i.metadata.deletion_timestamp.is_none()
                && i.data["status"]["phase"] == "Running"
                && i.data["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        });
        let boot_id = vmi.and_then(|i| i.metadata.uid.clone()).unwrap_or_default();
        let user_data = match vmi {
            Some(vmi) => vmi_user_data(shared, client, vmi).await,
            None => None,
        };
        let domain = &vm.data["spec"]["template"]["spec"]["domain"];
        let cpu = ["cores", "sockets", "threads"]
            .iter()
            .map(|k| domain["cpu"][k].as_u64().unwrap_or(1))
            .product();
        let memory = domain["memory"]["guest"]
            .as_str()
            .or_else(|| domain["resources"]["requests"]["memory"].as_str())
            .unwrap_or("1Gi")
            .to_string();
        let addresses = vmi
            .and_then(|i| i.data["status"]["interfaces"].as_array())
            .map(|interfaces| {
                interfaces
                    .iter()
                    .filter_map(|i| i["ipAddress"].as_str())
                    .map(str::to_string)
                    .take(1)
                    .collect()
            })
            .unwrap_or_default();
        guests.push(Guest {
            key: format!("kubevirt:{index}:{namespace}/{name}"),
            node_name: name.clone(),
            provider_id: format!("kubevirt://{name}"),
            up,
            boot_id,
            user_data,
            cpu,
            memory,
            addresses,
            os_image: talos_os_image(&vm.data),
        });
    }
    Ok(guests)
}

/// `Talos (<version>)` from the image factory URL of the VM's boot disk.
fn talos_os_image(vm: &Value) -> String {
    let version = vm["spec"]["dataVolumeTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|dv| dv["spec"]["source"]["http"]["url"].as_str())
        .find_map(|url| {
            let mut parts = url.split('/').skip_while(|p| *p != "image");
            parts.next()?;
            parts.next()?;
            parts.next().map(str::to_string)
        });
    match version {
        Some(version) => format!("Talos ({version})"),
        None => "Talos".to_string(),
    }
}

/// The user data of a VMI's cloud-init volume (cached per VMI: it cannot
/// change while the VMI lives).
async fn vmi_user_data(
    shared: &Shared,
    client: &kube::Client,
    vmi: &DynamicObject,
) -> Option<String> {
    let uid = vmi.metadata.uid.clone()?;
    if let Some(cached) = lock(&shared.state).user_data.get(&uid) {
        return cached.clone();
    }
    let namespace = vmi.metadata.namespace.clone().unwrap_or_default();
    let volume = vmi.data["spec"]["volumes"]
        .as_array()?
        .iter()
        .find_map(|v| {
            v.get("cloudInitConfigDrive")
                .or_else(|| v.get("cloudInitNoCloud"))
        })?
        .clone();
    let data = if let Some(text) = volume["userData"].as_str() {
        Some(text.to_string())
    } else if let Some(encoded) = volume["userDataBase64"].as_str() {
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    } else {
        let secret = volume["secretRef"]["name"]
            .as_str()
            .or_else(|| volume["userDataSecretRef"]["name"].as_str())?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        // Not there yet: try again next tick (nothing cached).
        let secret = secrets.get_opt(secret).await.ok()??;
        let data = secret.data.unwrap_or_default();
        let bytes = data.get("userdata").or_else(|| data.get("userData"))?;
        Some(String::from_utf8_lossy(&bytes.0).into_owned())
    };
    lock(&shared.state).user_data.insert(uid, data.clone());
    data
}

fn proxmox_guests(index: usize, observer: &PveObserver) -> Vec<Guest> {
    observer
        .snapshot()
        .vms
        .into_iter()
        .filter(|vm| !vm.template)
        .filter_map(|vm| {
            let uuid = vm.smbios_uuid.clone()?;
            let cores: u64 = vm
                .config
                .get("cores")
                .and_then(|c| c.parse().ok())
                .unwrap_or(1);
            let sockets: u64 = vm
                .config
                .get("sockets")
                .and_then(|c| c.parse().ok())
                .unwrap_or(1);
            let memory_mib: u64 = vm
                .config
                .get("memory")
                .and_then(|c| c.parse().ok())
                .unwrap_or(512);
            Some(Guest {
                key: format!("proxmox:{index}:{}", vm.vmid),
                node_name: vm.name.clone(),
                provider_id: format!("proxmox://{uuid}"),
                up: vm.power == VmPower::Running && vm.guest == GuestPhase::Up,
                boot_id: vm.boots.to_string(),
                user_data: vm.seed_read.as_ref().map(|s| s.user_data.clone()),
                cpu: cores * sockets,
                memory: format!("{memory_mib}Mi"),
                addresses: vm
                    .ip_addresses
                    .iter()
                    .filter(|ip| ip.is_ipv4())
                    .map(ToString::to_string)
                    .take(1)
                    .collect(),
                os_image: "Talos".to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn talos_worker_config_names_its_endpoint() {
        let config = "version: v1alpha1\nmachine:\n  type: worker\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.35.0\ncluster:\n  controlPlane:\n    endpoint: https://127.0.0.1:6443\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n";
        assert_eq!(
            TalosJoin::parse(config),
            Some(TalosJoin {
                machine_type: "worker".into(),
                endpoint: "https://127.0.0.1:6443".into(),
                kubelet_version: Some("v1.35.0".into()),
                bootstrap_token: None,
                cluster_ca_pem: None,
            })
        );
    }

    fn ca_pem(name: &str) -> String {
        crate::pki::CertificateAuthority::new(name)
            .unwrap()
            .cert_pem()
    }

    #[test]
    fn talos_config_carries_the_token_and_the_cluster_ca() {
        let ca = ca_pem("tenant-ca");
        let config = format!(
            "version: v1alpha1\nmachine:\n  type: worker\ncluster:\n  controlPlane:\n    endpoint: https://kubernetes-demo.tenant-a.svc:6443\n  token: abcdef.0123456789abcdef\n  ca:\n    crt: {}\n    key: \"\"\n",
            base64::engine::general_purpose::STANDARD.encode(&ca)
        );
        let join = TalosJoin::parse(&config).unwrap();
        assert_eq!(
            join.bootstrap_token.as_deref(),
            Some("abcdef.0123456789abcdef")
        );
        assert_eq!(join.cluster_ca_pem.as_deref(), Some(ca.as_str()));
        assert_eq!(
            check_cluster_ca(join.cluster_ca_pem.as_deref(), &ca),
            Ok(())
        );

        let broken = config.replace("crt: ", "crt: not-base64!");
        assert_eq!(TalosJoin::parse(&broken).unwrap().cluster_ca_pem, None);
    }

    #[test]
    fn a_foreign_or_missing_cluster_ca_is_refused() {
        let tenant = ca_pem("tenant-ca");
        let other = ca_pem("other-ca");
        let message = check_cluster_ca(Some(&other), &tenant).unwrap_err();
        assert!(message.contains("not the tenant's CA"), "{message}");
        assert!(check_cluster_ca(None, &tenant).is_err());
        assert!(check_cluster_ca(Some("garbage"), &tenant).is_err());
        // A bundle that includes the tenant's CA is trusted.
        let bundle = format!("{other}{tenant}");
        assert_eq!(check_cluster_ca(Some(&bundle), &tenant), Ok(()));
    }

    const TOKEN: &str = "abcdef.0123456789abcdef";

    /// The Secret tenantry writes for a pool's bootstrap token.
    fn token_secret(extra: &[(&str, &str)]) -> Secret {
        let mut data = BTreeMap::from([
            ("token-id", "abcdef"),
            ("token-secret", "0123456789abcdef"),
            ("usage-bootstrap-authentication", "true"),
            ("usage-bootstrap-signing", "true"),
            ("auth-extra-groups", NODE_BOOTSTRAP_GROUP),
        ]);
        data.extend(extra.iter().copied());
        serde_json::from_value(json!({
            "metadata": { "name": "bootstrap-token-abcdef", "namespace": "kube-system" },
            "type": BOOTSTRAP_TOKEN_SECRET_TYPE,
            "data": data
                .iter()
                .map(|(k, v)| (k.to_string(), base64::engine::general_purpose::STANDARD.encode(v)))
                .collect::<BTreeMap<_, _>>(),
        }))
        .unwrap()
    }

    fn at(rfc3339: &str) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .into()
    }

    #[test]
    fn a_valid_bootstrap_token_joins() {
        let now = at("2026-05-01T12:00:00Z");
        assert_eq!(
            check_bootstrap_token(TOKEN, Some(&token_secret(&[])), now),
            Ok(())
        );
        let later = token_secret(&[("expiration", "2026-05-02T00:00:00Z")]);
        assert_eq!(check_bootstrap_token(TOKEN, Some(&later), now), Ok(()));
    }

    #[test]
    fn bootstrap_tokens_the_authenticator_rejects_do_not_join() {
        let now = at("2026-05-01T12:00:00Z");
        let refused = |token: &str, secret: Option<Secret>| {
            check_bootstrap_token(token, secret.as_ref(), now).unwrap_err()
        };
        for (token, secret, expect) in [
            ("abcdef", Some(token_secret(&[])), "not a bootstrap token"),
            (
                "ABCDEF.0123456789abcdef",
                Some(token_secret(&[])),
                "not a bootstrap token",
            ),
            (TOKEN, None, "no Secret kube-system/bootstrap-token-abcdef"),
            (
                "abcdef.ffffffffffffffff",
                Some(token_secret(&[])),
                "token-secret",
            ),
            (
                TOKEN,
                Some(token_secret(&[("token-id", "zzzzzz")])),
                "token-id",
            ),
            (
                TOKEN,
                Some(token_secret(&[("expiration", "2026-05-01T11:59:59Z")])),
                "expired",
            ),
            (
                TOKEN,
                Some(token_secret(&[("expiration", "tomorrow")])),
                "unparseable expiration",
            ),
            (
                TOKEN,
                Some(token_secret(&[("usage-bootstrap-authentication", "false")])),
                "usage-bootstrap-authentication",
            ),
            (
                TOKEN,
                Some(token_secret(&[("auth-extra-groups", "system:masters")])),
                "not a system:bootstrappers: group",
            ),
            (
                TOKEN,
                Some(token_secret(&[(
                    "auth-extra-groups",
                    "system:bootstrappers:other",
                )])),
                "lacks system:bootstrappers:kubeadm:default-node-token",
            ),
        ] {
            let message = refused(token, secret);
            assert!(
                message.contains(expect),
                "{token}: {message} (want {expect:?})"
            );
        }

        let mut opaque = token_secret(&[]);
        opaque.type_ = Some("Opaque".into());
        assert!(refused(TOKEN, Some(opaque)).contains("not of type"));
        let mut deleting = serde_json::to_value(token_secret(&[])).unwrap();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-05-01T11:00:00Z");
        let deleting: Secret = serde_json::from_value(deleting).unwrap();
        assert!(refused(TOKEN, Some(deleting)).contains("being deleted"));
    }

    #[test]
    fn cloud_config_is_not_talos() {
        assert_eq!(TalosJoin::parse("#cloud-config\nruncmd: [echo]\n"), None);
        assert_eq!(TalosJoin::parse("not: [valid"), None);
    }

    #[test]
    fn os_image_comes_from_the_factory_url() {
        let vm = json!({ "spec": { "dataVolumeTemplates": [{ "spec": { "source": { "http": {
            "url": "http://127.0.0.1:1234/image/abc123/v1.13.1/openstack-amd64.raw.xz"
        }}}}]}});
        assert_eq!(talos_os_image(&vm), "Talos (v1.13.1)");
        assert_eq!(talos_os_image(&json!({})), "Talos");
    }
}
