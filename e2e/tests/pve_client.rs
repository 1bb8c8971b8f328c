//! tenantry's PVE API client against the PVE simulator over real HTTPS:
//! authentication, typed errors from what PVE says, tasks, clone into a
//! pool, config, ISO upload, deletion rules and the guest agent.
//!
//! The world (users, tokens, ACLs, a template) is built with the
//! simulator's root token through the API, as an operator would with
//! `pveum`/`qm`; the client under test then acts with a least-privilege
//! token like the one capmox documents.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tenantry_e2e::pki::http_trusting;
use tenantry_e2e::sim::proxmox::{PveSimConfig, PveSimulator, RequestMatch, Trigger};
use tenantry_e2e::wait;
use tenantry_provider::proxmox::client::{
    ApiUrl, ClientConfig, CloneParams, Credentials, DeleteParams, DiskSize, ProxmoxClient,
    ProxmoxError, ResourceFilter, TaskWaitConfig, TlsVerification, Upid, VmConfigUpdate,
};

const NODE: &str = "pve";
const TEMPLATE: u32 = 9000;
const POOL: &str = "tenant-a";
const TENANT_TOKEN: &str = "tenantry@pve!capi";
const DEADLINE: Duration = Duration::from_secs(30);

/// Fast polling: the simulator's tasks take tens to hundreds of milliseconds.
fn quick_tasks() -> TaskWaitConfig {
    TaskWaitConfig {
        initial_interval: Duration::from_millis(20),
        max_interval: Duration::from_millis(200),
        timeout: DEADLINE,
        ..TaskWaitConfig::default()
    }
}

struct World {
    sim: Arc<PveSimulator>,
    /// The simulator's `root@pam` token, through the client under test.
    root: ProxmoxClient,
    /// Setup calls the client has no endpoint for (users, ACLs, VM create).
    setup: Setup,
    tenant_secret: String,
}

impl World {
    /// One node `pve`, a template 9000 (agent enabled, one disk, one NIC),
    /// a pool `tenant-a`, and a privilege-separated token `tenantry@pve!capi`
    /// with capmox's least-privilege roles — except on the template.
    async fn start() -> Self {
        let sim = PveSimulator::start(PveSimConfig::for_tests())
            .await
            .expect("simulator starts");
        let sim = Arc::new(sim);
        let root_token = sim.root_token().clone();
        let root = client(&sim, &root_token.id, &root_token.secret);
        let setup = Setup {
            http: http_trusting(sim.ca_pem()),
            sim: sim.clone(),
            auth: root_token.authorization(),
        };
        let mut world = Self {
            sim,
            root,
            setup,
            tenant_secret: String::new(),
        };

        let upid = world
            .setup
            .post(
                &format!("/nodes/{NODE}/qemu"),
                json!({
                    "vmid": TEMPLATE, "name": "talos-template", "cores": 2, "memory": 2048,
                    "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:8",
                    "net0": "virtio,bridge=vmbr0", "agent": 1,
                }),
            )
            .await;
        world
            .root
            .wait_for_task(&upid_of(&upid))
            .await
            .expect("template VM created");
        let converted = world
            .root
            .qemu(NODE, TEMPLATE)
            .convert_to_template()
            .await
            .unwrap();
        if let Some(upid) = converted {
            world
                .root
                .wait_for_task(&upid)
                .await
                .expect("converted to template");
        }
        world
            .root
            .pools()
            .create(POOL, Some("tenant A workers"))
            .await
            .expect("pool created");

        world
            .setup
            .post("/access/users", json!({ "userid": "tenantry@pve" }))
            .await;
        let created = world
            .setup
            .post(
                "/access/users/tenantry@pve/token/capi",
                json!({ "privsep": 1 }),
            )
            .await;
        assert_eq!(created["full-tokenid"], TENANT_TOKEN);
        world.tenant_secret = created["value"].as_str().unwrap().to_string();
        for (path, role) in [
            (format!("/pool/{POOL}"), "PVEVMAdmin"),
            ("/storage/local-lvm".to_string(), "PVEDatastoreUser"),
            ("/storage/local".to_string(), "PVEDatastoreAdmin"),
            ("/sdn/zones/localnetwork/vmbr0".to_string(), "PVESDNUser"),
        ] {
            world.grant(&path, role).await;
        }
        world
    }

    /// The privilege-separated token `tenantry@pve!capi` (every ACL is
    /// granted to both the user and the token).
    fn tenant(&self) -> ProxmoxClient {
        client(&self.sim, TENANT_TOKEN, &self.tenant_secret)
    }

    async fn grant(&self, path: &str, role: &str) {
        for (kind, id) in [("users", "tenantry@pve"), ("tokens", TENANT_TOKEN)] {
            self.setup
                .put(
                    "/access/acl",
                    &[
                        ("path", path),
                        (kind, id),
                        ("roles", role),
                        ("propagate", "1"),
                    ],
                )
                .await;
        }
    }

    /// Clones the template into the pool as `vmid` and waits for it.
    async fn clone_worker(&self, tenant: &ProxmoxClient, vmid: u32) -> Upid {
        let params = CloneParams::new(vmid)
            .name(format!("worker-{vmid}"))
            .pool(POOL)
            .full(true)
            .storage("local-lvm");
        let upid = tenant
            .qemu(NODE, TEMPLATE)
            .clone_to(&params)
            .await
            .expect("clone accepted");
        tenant
            .wait_for_task(&upid)
            .await
            .expect("clone task succeeds");
        upid
    }
}

fn client(sim: &PveSimulator, token_id: &str, secret: &str) -> ProxmoxClient {
    let credentials = Credentials::parse(token_id, secret).expect("valid token");
    // capmox secrets hold the base URL without `/api2/json`.
    let url = ApiUrl::parse(sim.url().as_str()).expect("simulator URL");
    let config = ClientConfig::new(url, credentials)
        .with_tls(TlsVerification::HypervisorCa {
            pem: sim.ca_pem().to_string(),
        })
        .with_task_wait(quick_tasks());
    ProxmoxClient::new(config).expect("client builds")
}

fn upid_of(value: &Value) -> Upid {
    value
        .as_str()
        .expect("a UPID")
        .parse()
        .expect("a valid UPID")
}

/// A bare HTTPS client for world setup only.
struct Setup {
    sim: Arc<PveSimulator>,
    http: reqwest::Client,
    auth: String,
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.sim.api_url(), path.trim_start_matches('/'))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Value {
        let response = request
            .header("Authorization", &self.auth)
            .send()
            .await
            .expect("setup request");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "setup call failed: {status} {body}");
        body["data"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.send(self.http.post(self.url(path)).json(&body)).await
    }

    async fn put(&self, path: &str, form: &[(&str, &str)]) -> Value {
        self.send(self.http.put(self.url(path)).form(form)).await
    }
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_works_with_either_url_form() {
    let world = World::start().await;
    let version = world.root.version().await.expect("version");
    assert!(version.major().is_some(), "{version:?}");

    // The CSI/CCM form of the URL, already ending in /api2/json.
    let token = world.sim.root_token();
    let credentials = Credentials::parse(&token.id, &token.secret).unwrap();
    let url = ApiUrl::parse(world.sim.api_url().as_str()).unwrap();
    assert_eq!(url, world.root.url().clone());
    let csi_style = ProxmoxClient::new(ClientConfig::new(url, credentials).with_tls(
        TlsVerification::HypervisorCa {
            pem: world.sim.ca_pem().to_string(),
        },
    ))
    .unwrap();
    let nodes = csi_style.nodes().await.expect("nodes");
    assert_eq!(
        nodes.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
        [NODE]
    );
    assert!(nodes[0].is_online());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answered_503_is_tried_again_a_write_is_not() {
    let world = World::start().await;
    let faults = world.sim.faults();

    let hiccup = faults.http_error(
        RequestMatch::new("GET", "/nodes"),
        503,
        "Service Unavailable",
        Trigger::Times(2),
    );
    let nodes = world.root.nodes().await.expect("the third try answers");
    assert_eq!(nodes.len(), 1);
    assert_eq!(faults.fired(hiccup), 2);

    let outage = faults.http_error(
        RequestMatch::new("GET", "/nodes"),
        503,
        "Service Unavailable",
        Trigger::Always,
    );
    let error = world
        .root
        .nodes()
        .await
        .expect_err("an outage outlasts the tries");
    assert!(
        matches!(error, ProxmoxError::Unavailable { status: 503, .. }),
        "{error:?}"
    );
    assert_eq!(faults.fired(outage), 3, "one try and two more");
    faults.remove(outage);

    let refused_clone = faults.http_error(
        RequestMatch::new("POST", "/nodes/{node}/qemu/{vmid}/clone"),
        503,
        "Service Unavailable",
        Trigger::Always,
    );
    let error = world
        .root
        .qemu(NODE, TEMPLATE)
        .clone_to(&CloneParams::new(170).name("worker-170"))
        .await
        .expect_err("the clone is refused");
    assert!(error.is_transient(), "{error:?}");
    assert_eq!(faults.fired(refused_clone), 1, "a write is sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_unauthorized_and_needs_a_human() {
    let world = World::start().await;
    let wrong = client(
        &world.sim,
        &world.sim.root_token().id,
        "00000000-0000-0000-0000-000000000000",
    );
    let error = wrong
        .version()
        .await
        .expect_err("a wrong secret is refused");
    assert!(
        matches!(error, ProxmoxError::Unauthorized { .. }),
        "{error:?}"
    );
    assert!(error.needs_human());
    assert_eq!(error.reason(), "Unauthorized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_certificate_is_a_tls_error_not_a_retry() {
    let world = World::start().await;
    let token = world.sim.root_token();
    let credentials = Credentials::parse(&token.id, &token.secret).unwrap();
    let url = ApiUrl::parse(world.sim.url().as_str()).unwrap();
    // The simulator's CA is in no system store.
    let strict = ProxmoxClient::new(ClientConfig::new(url.clone(), credentials.clone())).unwrap();
    let error = strict
        .version()
        .await
        .expect_err("self-signed CA is not trusted");
    assert!(matches!(error, ProxmoxError::Tls { .. }), "{error:?}");
    assert!(error.needs_human());

    let insecure =
        ProxmoxClient::new(ClientConfig::new(url, credentials).with_tls(TlsVerification::Insecure))
            .unwrap();
    insecure
        .version()
        .await
        .expect("insecure skips verification");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_without_template_privilege_names_path_and_privilege() {
    let world = World::start().await;
    let tenant = world.tenant();
    let error = tenant
        .qemu(NODE, TEMPLATE)
        .clone_to(
            &CloneParams::new(105)
                .name("worker-105")
                .pool(POOL)
                .full(true),
        )
        .await
        .expect_err("no VM.Clone on the template");
    let ProxmoxError::PermissionDenied {
        path, privilege, ..
    } = &error
    else {
        panic!("expected PermissionDenied, got {error:?}");
    };
    assert_eq!(path.as_deref(), Some(&*format!("/vms/{TEMPLATE}")));
    assert_eq!(privilege.as_deref(), Some("VM.Clone"));
    assert!(error.needs_human());

    // What the token may do where, as PVE computes it.
    let permissions = tenant
        .access()
        .permissions(Some(&format!("/pool/{POOL}")), None)
        .await
        .unwrap();
    assert!(
        permissions.has(&format!("/pool/{POOL}"), "VM.Allocate"),
        "{permissions:?}"
    );
    let acl = world.root.access().acl().await.unwrap();
    assert!(
        acl.iter()
            .any(|e| e.ugid == TENANT_TOKEN && e.path == format!("/pool/{POOL}"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_into_pool_waits_for_the_task_and_reads_the_config() {
    let world = World::start().await;
    world
        .grant(&format!("/vms/{TEMPLATE}"), "PVETemplateUser")
        .await;
    let tenant = world.tenant();

    let vmid = tenant.cluster().next_id().await.expect("next free vmid");
    assert!(tenant.cluster().is_vmid_free(vmid).await.unwrap());
    let upid = world.clone_worker(&tenant, vmid).await;
    assert_eq!(upid.task_type(), "qmclone");
    assert_eq!(upid.id(), TEMPLATE.to_string());
    assert_eq!(upid.user(), TENANT_TOKEN);
    assert_eq!(upid.node(), NODE);
    assert!(!tenant.cluster().is_vmid_free(vmid).await.unwrap());

    // PVE adds the VM to the pool at the end of the clone task.
    let pool = tenant.pools().get(POOL).await.expect("pool readable");
    assert!(pool.contains_vm(vmid), "{pool:?}");

    let vm = tenant.qemu(NODE, vmid);
    let config = vm.config().await.expect("config");
    assert_eq!(config.name.as_deref(), Some(&*format!("worker-{vmid}")));
    assert!(!config.template);
    assert!(config.agent_enabled());
    assert!(
        config.smbios_uuid().is_some_and(|u| u.len() == 36),
        "{config:?}"
    );
    let nets = config.network_devices();
    assert_eq!(nets.len(), 1);
    assert!(nets[0].1.mac.is_some(), "PVE generated a MAC: {nets:?}");
    assert_eq!(nets[0].1.bridge.as_deref(), Some("vmbr0"));

    let status = vm.status().await.expect("status");
    assert!(!status.is_running());
    assert_eq!(
        status.lock, None,
        "the clone lock is gone once the task stopped"
    );

    let resources = tenant
        .cluster()
        .resources(Some(ResourceFilter::Vm))
        .await
        .unwrap();
    assert!(resources.iter().any(|r| r.vmid == Some(vmid) && r.is_vm()));
    // The row names the pool only for who may audit the pool.
    let resources = world
        .root
        .cluster()
        .resources(Some(ResourceFilter::Vm))
        .await
        .unwrap();
    let row = resources
        .iter()
        .find(|r| r.vmid == Some(vmid))
        .expect("VM in cluster resources");
    assert_eq!(row.pool.as_deref(), Some(POOL));
    let listed = tenant.node(NODE).qemu_list().await.unwrap();
    assert!(listed.iter().any(|v| v.vmid == vmid));

    // Cloning onto a taken vmid.
    let again = tenant
        .qemu(NODE, TEMPLATE)
        .clone_to(&CloneParams::new(vmid).pool(POOL).full(true))
        .await
        .expect_err("vmid taken");
    assert!(again.is_already_exists(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_updates_resize_and_a_failed_task_with_its_log() {
    let world = World::start().await;
    world
        .grant(&format!("/vms/{TEMPLATE}"), "PVETemplateUser")
        .await;
    let tenant = world.tenant();
    world.clone_worker(&tenant, 120).await;
    let vm = tenant.qemu(NODE, 120);

    let digest = vm.config().await.unwrap().digest;
    let mut update = VmConfigUpdate::new()
        .cores(4)
        .memory_mib(4096)
        .tags(&["tenant-a", "worker"]);
    if let Some(digest) = digest {
        update = update.if_digest(digest);
    }
    let upid = vm
        .update_config(&update)
        .await
        .expect("config update accepted");
    assert_eq!(upid.task_type(), "qmconfig");
    tenant
        .wait_for_task(&upid)
        .await
        .expect("config task succeeds");
    vm.update_config_sync(&VmConfigUpdate::new().description("managed by tenantry"))
        .await
        .unwrap();
    let config = vm.config().await.unwrap();
    assert_eq!((config.cores, config.memory), (Some(4), Some(4096)));
    assert_eq!(config.tag_list(), ["tenant-a", "worker"]);
    assert_eq!(config.description.as_deref(), Some("managed by tenantry"));

    if let Some(upid) = vm
        .resize("scsi0", &DiskSize::Gib(10))
        .await
        .expect("resize accepted")
    {
        tenant.wait_for_task(&upid).await.expect("grown");
    }
    assert!(
        vm.config()
            .await
            .unwrap()
            .get("scsi0")
            .unwrap()
            .contains("size=10G")
    );

    // Shrinking is refused inside the task: TaskFailed with the exit text.
    let upid = vm
        .resize("scsi0", &DiskSize::Gib(5))
        .await
        .unwrap()
        .expect("resize is a task");
    let error = tenant
        .wait_for_task(&upid)
        .await
        .expect_err("shrinking fails");
    let ProxmoxError::TaskFailed {
        upid: failed,
        exit_status,
        log_tail,
    } = &error
    else {
        panic!("expected TaskFailed, got {error:?}");
    };
    assert_eq!(failed, &upid);
    // PVE's task log ends with the error, as `TASK ERROR: <exit status>`.
    assert!(
        log_tail
            .last()
            .is_some_and(|l| l.contains(exit_status.as_str())),
        "{log_tail:?}"
    );
    assert!(
        exit_status.contains("shrinking disks is not supported"),
        "{exit_status}"
    );
    assert!(error.needs_human());

    // A parameter PVE cannot parse: per-parameter errors.
    let error = vm
        .update_config(&VmConfigUpdate::new().set("cores", "many"))
        .await
        .expect_err("bad cores");
    let ProxmoxError::ParameterVerification { errors } = &error else {
        panic!("expected ParameterVerification, got {error:?}");
    };
    assert!(errors.contains_key("cores"), "{errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iso_upload_is_listed_and_deleted() {
    let world = World::start().await;
    let tenant = world.tenant();
    let storages = tenant.node(NODE).storage_list(Some("iso")).await.unwrap();
    assert!(
        storages
            .iter()
            .any(|s| s.storage == "local" && s.holds("iso")),
        "{storages:?}"
    );

    let storage = tenant.storage(NODE, "local");
    let upid = storage
        .upload_iso("user-data-120.iso", vec![0u8; 4096])
        .await
        .expect("upload accepted");
    assert_eq!(upid.task_type(), "imgcopy");
    tenant
        .wait_for_task(&upid)
        .await
        .expect("upload task succeeds");

    let volid = storage.iso_volume_id("user-data-120.iso");
    let isos = storage.content(Some("iso")).await.unwrap();
    let uploaded = isos.iter().find(|v| v.volid == volid).expect("ISO listed");
    assert_eq!(uploaded.size, Some(4096));

    if let Some(upid) = storage
        .delete_volume(&volid)
        .await
        .expect("delete accepted")
    {
        tenant.wait_for_task(&upid).await.expect("volume deleted");
    }
    assert!(
        !storage
            .content(Some("iso"))
            .await
            .unwrap()
            .iter()
            .any(|v| v.volid == volid)
    );

    // Deleting it again is harmless: PVE's worker only warns that the file
    // does not exist, so the task completes with `WARNINGS: 1` — a success.
    match storage.delete_volume(&volid).await {
        Ok(Some(upid)) => {
            let outcome = tenant
                .wait_for_task(&upid)
                .await
                .expect("a repeated delete completes");
            assert!(outcome.warnings >= 1, "{outcome:?}");
        }
        Ok(None) => {}
        Err(error) => assert!(error.is_not_found(), "{error:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_vm_refuses_delete_and_reports_agent_addresses() {
    let world = World::start().await;
    world
        .grant(&format!("/vms/{TEMPLATE}"), "PVETemplateUser")
        .await;
    let tenant = world.tenant();
    world.clone_worker(&tenant, 130).await;
    let vm = tenant.qemu(NODE, 130);
    let mac = vm.config().await.unwrap().network_devices()[0]
        .1
        .mac
        .clone()
        .unwrap();

    // The agent of a stopped VM.
    let error = vm.agent().ping().await.expect_err("VM is off");
    assert!(
        matches!(error, ProxmoxError::VmNotRunning { .. }),
        "{error:?}"
    );
    assert!(error.is_transient());

    let upid = vm.start().await.expect("start accepted");
    assert_eq!(upid.task_type(), "qmstart");
    tenant.wait_for_task(&upid).await.expect("started");
    assert!(vm.status().await.unwrap().is_running());

    let error = vm
        .delete(&DeleteParams::thorough())
        .await
        .expect_err("running VMs are not destroyed");
    let ProxmoxError::VmRunning { vmid, .. } = &error else {
        panic!("expected VmRunning, got {error:?}");
    };
    assert_eq!(*vmid, Some(130));
    assert!(error.is_transient());

    // The guest boots, then its agent answers.
    let vm_ref = &vm;
    wait::until("guest agent answers", DEADLINE, || async move {
        match vm_ref.agent().ping().await {
            Ok(()) => Ok(Some(())),
            Err(ProxmoxError::GuestAgentNotRunning { .. }) => Ok(None),
            Err(other) => Err(other.into()),
        }
    })
    .await
    .unwrap();
    let interfaces = vm.agent().network_interfaces().await.expect("interfaces");
    assert!(interfaces.iter().any(|i| i.is_loopback()));
    let nic = interfaces
        .iter()
        .find(|i| {
            i.mac
                .as_deref()
                .is_some_and(|m| m.eq_ignore_ascii_case(&mac))
        })
        .unwrap_or_else(|| panic!("no interface with MAC {mac}: {interfaces:?}"));
    assert!(
        nic.addresses
            .iter()
            .any(|a| a.ip.is_ipv6() && a.prefix == 64),
        "link-local address with its prefix: {nic:?}"
    );
    let os = vm.agent().os_info().await.expect("os info");
    assert!(os.id.is_some(), "{os:?}");

    tenant
        .wait_for_task(&vm.stop().await.unwrap())
        .await
        .expect("stopped");
    let upid = vm
        .delete(&DeleteParams::thorough())
        .await
        .expect("delete accepted");
    assert_eq!(upid.task_type(), "qmdestroy");
    tenant.wait_for_task(&upid).await.expect("destroyed");
    // PVE checks privileges before existence: once the VM has left the pool,
    // a pool-scoped token gets 403, not "does not exist". Deletion is
    // confirmed with /cluster/nextid, which anyone may call.
    let hidden = vm.status().await.expect_err("VM is gone");
    let ProxmoxError::PermissionDenied { path, .. } = &hidden else {
        panic!("expected PermissionDenied, got {hidden:?}");
    };
    assert_eq!(path.as_deref(), Some("/vms/130"));
    let gone = world
        .root
        .qemu(NODE, 130)
        .status()
        .await
        .expect_err("VM is gone");
    assert!(gone.is_not_found(), "{gone:?}");
    assert!(tenant.cluster().is_vmid_free(130).await.unwrap());
    assert!(!tenant.pools().get(POOL).await.unwrap().contains_vm(130));
}
