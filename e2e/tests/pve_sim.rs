//! The Proxmox VE simulator, driven over HTTPS the way a PVE client drives a
//! real cluster: everything is set up through the API with the one root
//! token the simulator starts with, and the assertions are on what PVE
//! answers (status, reason phrase, body) and on what exists in the cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenantry_e2e::pki::http_trusting;
use tenantry_e2e::sim::proxmox::{
    ApiToken, DropMode, GuestHang, GuestPhase, NodeSpec, PveSimConfig, PveSimulator, RequestMatch,
    StorageSpec, StorageType, Trigger, VmPower,
};
use tenantry_e2e::wait;

const DEADLINE: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------ client

/// One PVE answer: status, reason phrase and JSON body (if any).
#[derive(Debug)]
struct Answer {
    status: u16,
    reason: String,
    body: Value,
}

impl Answer {
    fn data(&self) -> &Value {
        &self.body["data"]
    }

    #[track_caller]
    fn ok(self) -> Value {
        assert_eq!(self.status, 200, "expected success, got {self:?}");
        self.body["data"].clone()
    }

    #[track_caller]
    fn upid(self) -> String {
        let data = self.ok();
        data.as_str()
            .unwrap_or_else(|| panic!("expected a UPID, got {data}"))
            .to_string()
    }

    #[track_caller]
    fn fails(&self, status: u16, reason: &str) {
        assert_eq!(
            (self.status, self.reason.as_str()),
            (status, reason),
            "unexpected answer {self:?}"
        );
    }
}

#[derive(Clone)]
struct Pve {
    sim: Arc<PveSimulator>,
    http: reqwest::Client,
}

impl Pve {
    async fn start() -> Self {
        Self::start_with(PveSimConfig::for_tests()).await
    }

    async fn start_with(config: PveSimConfig) -> Self {
        let sim = PveSimulator::start(config).await.expect("start simulator");
        let http = http_trusting(sim.ca_pem());
        Self {
            sim: Arc::new(sim),
            http,
        }
    }

    fn root(&self) -> ApiToken {
        self.sim.root_token().clone()
    }

    fn as_root(&self) -> Caller {
        self.caller(self.root())
    }

    fn caller(&self, token: ApiToken) -> Caller {
        Caller {
            pve: self.clone(),
            authorization: Some(token.authorization()),
        }
    }

    fn anonymous(&self) -> Caller {
        Caller {
            pve: self.clone(),
            authorization: None,
        }
    }

    /// Polls a task until it stops; returns its exit status.
    async fn wait_task(&self, upid: &str) -> String {
        let node = upid.split(':').nth(1).expect("node in UPID").to_string();
        let root = self.as_root();
        wait::until(format!("task {upid}"), DEADLINE, || {
            let root = root.clone();
            let node = node.clone();
            async move {
                let status = root
                    .get(&format!("/nodes/{node}/tasks/{upid}/status"), &[])
                    .await
                    .ok();
                Ok(match status["status"].as_str() {
                    Some("stopped") => {
                        Some(status["exitstatus"].as_str().unwrap_or("").to_string())
                    }
                    _ => None,
                })
            }
        })
        .await
        .expect("task stops")
    }

    async fn wait_task_ok(&self, upid: &str) {
        assert_eq!(self.wait_task(upid).await, "OK", "task {upid}");
    }
}

#[derive(Clone)]
struct Caller {
    pve: Pve,
    authorization: Option<String>,
}

impl Caller {
    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let request = match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        };
        let response = request.send().await.expect("request reaches the simulator");
        let status = response.status().as_u16();
        let reason = response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
            .unwrap_or_else(|| {
                response
                    .status()
                    .canonical_reason()
                    .unwrap_or_default()
                    .to_string()
            });
        let text = response.text().await.expect("response body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            reason,
            body,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.pve.sim.api_url(), path.trim_start_matches('/'))
    }

    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Answer {
        self.send(self.pve.http.get(self.url(path)).query(query))
            .await
    }

    /// POST with a JSON body, as go-proxmox sends it.
    async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(self.pve.http.post(self.url(path)).json(&body))
            .await
    }

    /// PUT with a form body, as pvesh and proxmoxer send it.
    async fn put(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        self.send(self.pve.http.put(self.url(path)).form(form))
            .await
    }

    async fn delete(&self, path: &str, query: &[(&str, &str)]) -> Answer {
        self.send(self.pve.http.delete(self.url(path)).query(query))
            .await
    }
}

// ------------------------------------------------------------- world setup

/// Creates a user and a token for it through the API; returns the token.
async fn user_with_token(root: &Caller, userid: &str, token: &str, privsep: bool) -> ApiToken {
    root.post("/access/users", json!({ "userid": userid }))
        .await
        .ok();
    let created = root
        .post(
            &format!("/access/users/{userid}/token/{token}"),
            json!({ "privsep": privsep }),
        )
        .await
        .ok();
    ApiToken {
        id: created["full-tokenid"].as_str().unwrap().to_string(),
        secret: created["value"].as_str().unwrap().to_string(),
    }
}

async fn grant(root: &Caller, path: &str, subject: (&str, &str), role: &str, propagate: bool) {
    let (kind, id) = subject;
    root.put(
        "/access/acl",
        &[
            ("path", path),
            (kind, id),
            ("roles", role),
            ("propagate", if propagate { "1" } else { "0" }),
        ],
    )
    .await
    .ok();
}

/// A stopped VM created through the API (`POST /nodes/{node}/qemu`).
async fn create_vm(pve: &Pve, vmid: u32, extra: Value) -> Value {
    let root = pve.as_root();
    let mut body = json!({
        "vmid": vmid,
        "name": format!("vm-{vmid}"),
        "cores": 2,
        "memory": 2048,
        "scsihw": "virtio-scsi-single",
        "scsi0": "local-lvm:8",
        "net0": "virtio,bridge=vmbr0",
        "agent": 1,
    });
    for (key, value) in extra.as_object().into_iter().flatten() {
        body[key] = value.clone();
    }
    let upid = root.post("/nodes/pve/qemu", body).await.upid();
    pve.wait_task_ok(&upid).await;
    root.get(&format!("/nodes/pve/qemu/{vmid}/config"), &[])
        .await
        .ok()
}

/// A template made the way operators make one: create, then convert.
async fn create_template(pve: &Pve, vmid: u32) {
    create_vm(pve, vmid, json!({})).await;
    let upid = pve
        .as_root()
        .post(&format!("/nodes/pve/qemu/{vmid}/template"), json!({}))
        .await
        .upid();
    pve.wait_task_ok(&upid).await;
}

async fn create_pool(root: &Caller, pool: &str) {
    root.post("/pools", json!({ "poolid": pool })).await.ok();
}

fn privileges(answer: Answer, path: &str) -> Vec<String> {
    let data = answer.ok();
    let mut privileges: Vec<String> = data[path]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    privileges.sort();
    privileges
}

async fn permissions_of(root: &Caller, userid: &str, path: &str) -> Vec<String> {
    privileges(
        root.get("/access/permissions", &[("userid", userid), ("path", path)])
            .await,
        path,
    )
}

// ------------------------------------------------------------------- ISO

/// A minimal ISO 9660 writer for test seeds (independent of the provider's
/// NoCloud builder and of the simulator's reader): a primary descriptor with
/// ISO names (`USER-DATA.;1`) and optionally a Joliet one with real names.
fn build_iso(label: &str, files: &[(&str, &[u8])], joliet: bool) -> Vec<u8> {
    const SECTOR: usize = 2048;
    let descriptors = if joliet { 3 } else { 2 };
    let root_sector = 16 + descriptors;
    let joliet_root_sector = root_sector + 1;
    let mut next = joliet_root_sector + 1;
    let mut extents = Vec::new();
    for (_, data) in files {
        extents.push(next);
        next += data.len().div_ceil(SECTOR).max(1);
    }
    let total = next;
    let mut image = vec![0u8; total * SECTOR];

    fn both16(v: u16) -> [u8; 4] {
        let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
        [l[0], l[1], b[0], b[1]]
    }
    fn both32(v: u32) -> [u8; 8] {
        let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
        [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
    }
    fn record(name: &[u8], extent: usize, size: usize, dir: bool) -> Vec<u8> {
        let pad = usize::from(name.len().is_multiple_of(2));
        let mut r = vec![0u8; 33 + name.len() + pad];
        r[0] = r.len() as u8;
        r[2..10].copy_from_slice(&both32(extent as u32));
        r[10..18].copy_from_slice(&both32(size as u32));
        r[25] = if dir { 2 } else { 0 };
        r[28..32].copy_from_slice(&both16(1));
        r[32] = name.len() as u8;
        r[33..33 + name.len()].copy_from_slice(name);
        r
    }
    fn ucs2(text: &str) -> Vec<u8> {
        text.encode_utf16().flat_map(|u| u.to_be_bytes()).collect()
    }
    let mut descriptor = |sector: usize, kind: u8, id: &[u8], root: usize| {
        let d = &mut image[sector * SECTOR..(sector + 1) * SECTOR];
        d[0] = kind;
        d[1..6].copy_from_slice(b"CD001");
        d[6] = 1;
        d[8..40].fill(b' ');
        d[40..72].fill(if kind == 1 { b' ' } else { 0 });
        d[40..40 + id.len()].copy_from_slice(id);
        d[80..88].copy_from_slice(&both32(total as u32));
        if kind == 2 {
            d[88..91].copy_from_slice(b"%/E");
        }
        d[120..124].copy_from_slice(&both16(1));
        d[124..128].copy_from_slice(&both16(1));
        d[128..132].copy_from_slice(&both16(SECTOR as u16));
        let root_record = record(&[0], root, SECTOR, true);
        d[156..156 + 34].copy_from_slice(&root_record);
        d[881] = 1;
    };
    descriptor(16, 1, label.to_uppercase().as_bytes(), root_sector);
    if joliet {
        descriptor(17, 2, &ucs2(label), joliet_root_sector);
    }
    image[(16 + descriptors - 1) * SECTOR] = 255;
    image[(16 + descriptors - 1) * SECTOR + 1..(16 + descriptors - 1) * SECTOR + 6]
        .copy_from_slice(b"CD001");

    for (dir_sector, names_joliet) in [(root_sector, false), (joliet_root_sector, true)] {
        let mut entries = vec![
            record(&[0], dir_sector, SECTOR, true),
            record(&[1], dir_sector, SECTOR, true),
        ];
        for ((name, data), extent) in files.iter().zip(&extents) {
            let encoded = if names_joliet {
                ucs2(name)
            } else {
                format!("{}.;1", name.to_uppercase()).into_bytes()
            };
            entries.push(record(&encoded, *extent, data.len(), false));
        }
        let mut offset = dir_sector * SECTOR;
        for entry in entries {
            image[offset..offset + entry.len()].copy_from_slice(&entry);
            offset += entry.len();
        }
    }
    for ((_, data), extent) in files.iter().zip(&extents) {
        image[extent * SECTOR..extent * SECTOR + data.len()].copy_from_slice(data);
    }
    image
}

async fn upload_iso(caller: &Caller, storage: &str, name: &str, image: Vec<u8>) -> Answer {
    let form = reqwest::multipart::Form::new().text("content", "iso").part(
        "filename",
        reqwest::multipart::Part::bytes(image)
            .file_name(name.to_string())
            .mime_str("application/octet-stream")
            .unwrap(),
    );
    let url = caller.url(&format!("/nodes/pve/storage/{storage}/upload"));
    caller.send(caller.pve.http.post(url).multipart(form)).await
}

fn mac_of(config: &Value, key: &str) -> String {
    let net = config[key].as_str().expect("net config");
    net.split(',')
        .next()
        .and_then(|first| first.split_once('='))
        .map(|(_, mac)| mac.to_string())
        .expect("MAC in net config")
}

async fn wait_guest_up(pve: &Pve, vmid: u32) {
    let sim = pve.sim.clone();
    wait::until(format!("guest {vmid} boots"), DEADLINE, || {
        let up = sim
            .snapshot()
            .vm(vmid)
            .is_some_and(|vm| vm.guest == GuestPhase::Up);
        async move { Ok(up.then_some(())) }
    })
    .await
    .expect("guest boots");
}

async fn start_vm(pve: &Pve, vmid: u32) {
    let upid = pve
        .as_root()
        .post(&format!("/nodes/pve/qemu/{vmid}/status/start"), json!({}))
        .await
        .upid();
    pve.wait_task_ok(&upid).await;
}

// -------------------------------------------------------------------- auth

#[tokio::test]
async fn root_token_authenticates_and_failures_are_delayed() {
    let pve = Pve::start().await;
    let version = pve.as_root().get("/version", &[]).await.ok();
    assert_eq!(version["release"], "9.0");

    let started = Instant::now();
    let answer = pve.anonymous().get("/version", &[]).await;
    answer.fails(401, "No ticket");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "401 is delayed"
    );

    let wrong = ApiToken {
        id: pve.root().id,
        secret: "00000000-0000-0000-0000-000000000000".into(),
    };
    let started = Instant::now();
    pve.caller(wrong)
        .get("/version", &[])
        .await
        .fails(401, "Authentication failed!");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "401 is delayed"
    );

    let unknown = pve.as_root().get("/nodes/pve/no-such-thing", &[]).await;
    unknown.fails(501, "Method 'GET /nodes/pve/no-such-thing' not implemented");
    assert_eq!(
        unknown.body["message"],
        "Method 'GET /nodes/pve/no-such-thing' not implemented\n"
    );
}

#[tokio::test]
async fn parameter_errors_name_each_parameter() {
    let pve = Pve::start().await;
    create_template(&pve, 100).await;
    let answer = pve
        .as_root()
        .post(
            "/nodes/pve/qemu/100/clone",
            json!({ "full": "maybe", "bogus": 1 }),
        )
        .await;
    answer.fails(400, "Parameter verification failed.");
    let errors = &answer.body["errors"];
    assert_eq!(
        errors["newid"],
        "property is missing and it is not optional"
    );
    assert_eq!(
        errors["full"],
        "type check ('boolean') failed - got 'maybe'"
    );
    assert!(
        errors["bogus"]
            .as_str()
            .unwrap()
            .contains("not defined in schema")
    );

    let taken = pve
        .as_root()
        .get("/cluster/nextid", &[("vmid", "100")])
        .await;
    taken.fails(400, "Parameter verification failed.");
    assert_eq!(taken.body["errors"]["vmid"], "VM 100 already exists");
    // nextid answers a JSON string.
    assert_eq!(
        pve.as_root().get("/cluster/nextid", &[]).await.ok(),
        json!("101")
    );
}

// -------------------------------------------------------------------- ACLs

#[tokio::test]
async fn non_propagating_acl_stays_on_its_path_and_deeper_levels_replace() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    user_with_token(&root, "ops@pve", "ops", true).await;
    grant(&root, "/", ("users", "ops@pve"), "PVEAuditor", false).await;
    grant(&root, "/vms", ("users", "ops@pve"), "PVEVMUser", true).await;
    grant(&root, "/vms/103", ("users", "ops@pve"), "PVEAuditor", false).await;

    assert!(
        permissions_of(&root, "ops@pve", "/")
            .await
            .contains(&"Sys.Audit".to_string())
    );
    assert!(
        permissions_of(&root, "ops@pve", "/nodes/pve")
            .await
            .is_empty()
    );

    let on_102 = permissions_of(&root, "ops@pve", "/vms/102").await;
    assert!(on_102.contains(&"VM.PowerMgmt".to_string()));
    // The role on /vms/103 replaces the propagated one from /vms.
    let on_103 = permissions_of(&root, "ops@pve", "/vms/103").await;
    assert!(on_103.contains(&"VM.Audit".to_string()));
    assert!(!on_103.contains(&"VM.PowerMgmt".to_string()));
}

#[tokio::test]
async fn no_access_cancels_every_other_role() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    user_with_token(&root, "ops@pve", "ops", true).await;
    grant(&root, "/", ("users", "ops@pve"), "Administrator", true).await;
    grant(&root, "/vms/150", ("users", "ops@pve"), "NoAccess", false).await;
    assert!(
        permissions_of(&root, "ops@pve", "/vms/150")
            .await
            .is_empty()
    );
    assert!(
        !permissions_of(&root, "ops@pve", "/vms/151")
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn root_has_every_privilege_everywhere() {
    let pve = Pve::start().await;
    let on_any_vm = permissions_of(&pve.as_root(), "root@pam", "/vms/4242").await;
    for privilege in ["VM.Allocate", "Permissions.Modify", "Sys.Modify"] {
        assert!(on_any_vm.contains(&privilege.to_string()), "{privilege}");
    }
}

#[tokio::test]
async fn pool_acl_reaches_pool_members_only() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    create_pool(&root, "tenant-a").await;
    create_vm(&pve, 200, json!({ "pool": "tenant-a" })).await;
    create_vm(&pve, 201, json!({})).await;
    let token = user_with_token(&root, "tenant@pve", "ops", false).await;
    grant(
        &root,
        "/pool/tenant-a",
        ("users", "tenant@pve"),
        "PVEVMAdmin",
        true,
    )
    .await;
    let tenant = pve.caller(token);

    assert_eq!(
        pve.sim.snapshot().vm(200).unwrap().pool.as_deref(),
        Some("tenant-a")
    );
    let upid = tenant
        .post("/nodes/pve/qemu/200/status/start", json!({}))
        .await
        .upid();
    pve.wait_task_ok(&upid).await;

    tenant
        .post("/nodes/pve/qemu/201/status/start", json!({}))
        .await
        .fails(403, "Permission check failed (/vms/201, VM.PowerMgmt)");
    tenant
        .get("/nodes/pve/qemu/201/config", &[])
        .await
        .fails(403, "Permission check failed (/vms/201, VM.Audit)");

    // Listings leave out what the caller cannot audit.
    let listed: Vec<u64> = tenant
        .get("/cluster/resources", &[("type", "vm")])
        .await
        .ok()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["vmid"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, vec![200]);
}

#[tokio::test]
async fn privilege_separated_token_is_capped_by_its_user() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    create_vm(&pve, 300, json!({})).await;
    let capped = user_with_token(&root, "capmox@pve", "capi", true).await;
    // The token is granted everything; its user can only audit.
    grant(&root, "/", ("tokens", &capped.id), "PVEVMAdmin", true).await;
    grant(&root, "/vms", ("users", "capmox@pve"), "PVEAuditor", true).await;

    let token_privileges = permissions_of(&root, &capped.id, "/vms/300").await;
    assert_eq!(token_privileges, vec!["VM.Audit", "VM.GuestAgent.Audit"]);
    let token = pve.caller(capped.clone());
    token.get("/nodes/pve/qemu/300/config", &[]).await.ok();
    token
        .delete("/nodes/pve/qemu/300", &[])
        .await
        .fails(403, "Permission check failed (/vms/300, VM.Allocate)");

    // A token without privilege separation has exactly its user's rights,
    // whatever ACLs name the token.
    let shared = root
        .post(
            "/access/users/capmox@pve/token/shared",
            json!({ "privsep": 0 }),
        )
        .await
        .ok();
    assert_eq!(shared["info"]["privsep"], 0);
    let shared_id = shared["full-tokenid"].as_str().unwrap();
    grant(&root, "/", ("tokens", shared_id), "Administrator", true).await;
    let user_privileges = permissions_of(&root, "capmox@pve", "/vms/300").await;
    assert!(user_privileges.contains(&"Sys.Audit".to_string()));
    assert_eq!(
        permissions_of(&root, shared_id, "/vms/300").await,
        user_privileges
    );
    // The secret is shown once only.
    let info = root
        .get("/access/users/capmox@pve/token/shared", &[])
        .await
        .ok();
    assert!(info.get("value").is_none());
    // A token can dump its own permissions.
    let own = token
        .get("/access/permissions", &[("path", "/vms/300")])
        .await;
    assert_eq!(
        privileges(own, "/vms/300"),
        vec!["VM.Audit", "VM.GuestAgent.Audit"]
    );
}

#[tokio::test]
async fn custom_roles_and_acl_changes_need_permission_to_modify() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    root.post(
        "/access/roles",
        json!({ "roleid": "CcmRole", "privs": "VM.Audit,VM.GuestAgent.Audit,Sys.Audit" }),
    )
    .await
    .ok();
    // PVE 9 removed VM.Monitor.
    let stale = root
        .post(
            "/access/roles",
            json!({ "roleid": "Old", "privs": "VM.Monitor" }),
        )
        .await;
    stale.fails(500, "create role failed: invalid privilege 'VM.Monitor'");
    root.post("/access/roles", json!({ "roleid": "PVEMine" }))
        .await
        .fails(400, "Parameter verification failed.");

    let token = user_with_token(&root, "ccm@pve", "ccm", false).await;
    grant(&root, "/", ("users", "ccm@pve"), "CcmRole", true).await;
    let acl = root.get("/access/acl", &[]).await.ok();
    assert!(
        acl.as_array()
            .unwrap()
            .iter()
            .any(|e| e["roleid"] == "CcmRole"
                && e["path"] == "/"
                && e["type"] == "user"
                && e["propagate"] == 1)
    );
    let ccm = pve.caller(token);
    ccm.put(
        "/access/acl",
        &[
            ("path", "/"),
            ("users", "ccm@pve"),
            ("roles", "Administrator"),
        ],
    )
    .await
    .fails(403, "Permission check failed (/, Permissions.Modify)");

    // `delete` removes the entry.
    root.put(
        "/access/acl",
        &[
            ("path", "/"),
            ("users", "ccm@pve"),
            ("roles", "CcmRole"),
            ("delete", "1"),
        ],
    )
    .await
    .ok();
    assert!(pve.sim.snapshot().acl.is_empty());
}

// ------------------------------------------------------------------- clone

/// The capmox least-privilege recipe: Sys.Audit on / and /nodes, the
/// tenant pool as PVEVMAdmin, the template pool as PVETemplateUser, the
/// bridge as PVESDNUser, the disk storage as PVEDatastoreUser.
async fn capmox_token(pve: &Pve) -> ApiToken {
    let root = pve.as_root();
    create_pool(&root, "capi").await;
    create_pool(&root, "templates").await;
    root.put("/pools", &[("poolid", "templates"), ("vms", "100")])
        .await
        .ok();
    let token = user_with_token(&root, "capmox@pve", "capi", true).await;
    root.post(
        "/access/roles",
        json!({ "roleid": "Auditor", "privs": "Sys.Audit" }),
    )
    .await
    .ok();
    for subject in [("users", "capmox@pve"), ("tokens", token.id.as_str())] {
        grant(&root, "/", subject, "Auditor", false).await;
        grant(&root, "/nodes", subject, "Auditor", true).await;
        grant(&root, "/pool/capi", subject, "PVEVMAdmin", true).await;
        grant(&root, "/pool/templates", subject, "PVETemplateUser", true).await;
        grant(
            &root,
            "/sdn/zones/localnetwork/vmbr0",
            subject,
            "PVESDNUser",
            true,
        )
        .await;
        grant(
            &root,
            "/storage/local-lvm",
            subject,
            "PVEDatastoreUser",
            true,
        )
        .await;
        grant(&root, "/storage/local", subject, "PVEDatastoreAdmin", true).await;
    }
    token
}

#[tokio::test]
async fn clone_into_pool_is_locked_until_the_task_ends_and_gets_a_new_identity() {
    let mut config = PveSimConfig::for_tests();
    config
        .timings
        .tasks
        .insert("qmclone".into(), Duration::from_secs(3));
    let pve = Pve::start_with(config).await;
    create_template(&pve, 100).await;
    let token = capmox_token(&pve).await;
    let capmox = pve.caller(token.clone());
    let template = pve
        .as_root()
        .get("/nodes/pve/qemu/100/config", &[])
        .await
        .ok();

    let upid = capmox
        .post(
            "/nodes/pve/qemu/100/clone",
            json!({ "newid": 105, "name": "worker-a", "full": true, "pool": "capi", "storage": "local-lvm" }),
        )
        .await
        .upid();
    let upid_format = regex::Regex::new(
        r"^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:qmclone:100:capmox@pve!capi:$",
    )
    .unwrap();
    assert!(upid_format.is_match(&upid), "{upid}");

    // While the task runs: the VMID is taken, the VM is locked, not yet in
    // the pool, and locked operations fail.
    pve.as_root()
        .get("/cluster/nextid", &[("vmid", "105")])
        .await
        .fails(400, "Parameter verification failed.");
    let during = pve.sim.snapshot();
    let vm = during.vm(105).expect("clone config exists");
    assert_eq!(vm.lock.as_deref(), Some("clone"));
    assert_eq!(vm.pool, None);
    let status = capmox.get("/nodes/pve/qemu/105/status/current", &[]).await;
    // The new VM is not yet in the pool, so the tenant token cannot see it.
    status.fails(403, "Permission check failed (/vms/105, VM.Audit)");
    let root_status = pve
        .as_root()
        .get("/nodes/pve/qemu/105/status/current", &[])
        .await
        .ok();
    assert_eq!(root_status["lock"], "clone");
    pve.as_root()
        .post("/nodes/pve/qemu/105/config", json!({ "cores": 4 }))
        .await
        .fails(500, "VM is locked (clone)");
    let running = pve
        .as_root()
        .get(&format!("/nodes/pve/tasks/{upid}/status"), &[])
        .await
        .ok();
    assert_eq!(running["status"], "running");
    assert!(running.get("exitstatus").is_none());

    pve.wait_task_ok(&upid).await;
    let log = capmox
        .get(&format!("/nodes/pve/tasks/{upid}/log"), &[])
        .await;
    assert_eq!(log.body["total"], log.data().as_array().unwrap().len());
    assert_eq!(
        log.data().as_array().unwrap().last().unwrap()["t"],
        "TASK OK"
    );

    let clone = capmox.get("/nodes/pve/qemu/105/config", &[]).await.ok();
    assert!(clone.get("lock").is_none());
    assert!(clone.get("template").is_none());
    assert_eq!(clone["name"], "worker-a");
    assert_ne!(clone["smbios1"], template["smbios1"]);
    assert_ne!(mac_of(&clone, "net0"), mac_of(&template, "net0"));
    assert!(
        clone["scsi0"]
            .as_str()
            .unwrap()
            .starts_with("local-lvm:vm-105-disk-0,")
    );
    let after = pve.sim.snapshot();
    assert_eq!(after.vm(105).unwrap().pool.as_deref(), Some("capi"));
    assert_eq!(after.pool("capi").unwrap().vms, vec![105]);

    // Without VM.Allocate on the target pool the clone is refused.
    pve.as_root()
        .post("/pools", json!({ "poolid": "other" }))
        .await
        .ok();
    capmox
        .post(
            "/nodes/pve/qemu/100/clone",
            json!({ "newid": 106, "pool": "other" }),
        )
        .await
        .fails(403, "Permission check failed");
}

#[tokio::test]
async fn capmox_flow_runs_on_a_least_privilege_token() {
    let pve = Pve::start().await;
    create_template(&pve, 100).await;
    let capmox = pve.caller(capmox_token(&pve).await);
    let clone = capmox
        .post(
            "/nodes/pve/qemu/100/clone",
            json!({ "newid": 107, "name": "worker-b", "full": 1, "pool": "capi", "storage": "local-lvm" }),
        )
        .await
        .upid();
    pve.wait_task_ok(&clone).await;

    // Configure while stopped: a NIC without MAC gets a fresh one.
    let configure = capmox
        .post(
            "/nodes/pve/qemu/107/config",
            json!({ "cores": 4, "memory": 4096, "net0": "virtio,bridge=vmbr0", "tags": "capi;ip_net0_10.10.0.70" }),
        )
        .await
        .upid();
    pve.wait_task_ok(&configure).await;
    let resize = capmox
        .send(
            pve.http
                .put(capmox.url("/nodes/pve/qemu/107/resize"))
                .json(&json!({ "disk": "scsi0", "size": "+2G" })),
        )
        .await
        .upid();
    pve.wait_task_ok(&resize).await;
    let config = capmox.get("/nodes/pve/qemu/107/config", &[]).await.ok();
    assert_eq!(config["cores"], 4);
    assert_eq!(config["memory"], "4096");
    assert_eq!(config["tags"], "capi;ip_net0_10.10.0.70");
    assert!(
        config["scsi0"].as_str().unwrap().contains("size=10G"),
        "{config}"
    );

    // Shrinking fails inside the task, as in PVE.
    let shrink = capmox
        .send(
            pve.http
                .put(capmox.url("/nodes/pve/qemu/107/resize"))
                .json(&json!({ "disk": "scsi0", "size": "4G" })),
        )
        .await
        .upid();
    assert_eq!(
        pve.wait_task(&shrink).await,
        "shrinking disks is not supported"
    );

    // Bootstrap data as a NoCloud ISO on the ISO storage, attached as ide0.
    let mac = mac_of(&config, "net0");
    let files = seed_files(&mac, "10.10.0.70", true);
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let upload = upload_iso(
        &capmox,
        "local",
        "user-data-107.iso",
        build_iso("cidata", &refs, true),
    )
    .await
    .upid();
    pve.wait_task_ok(&upload).await;
    let attach = capmox
        .post(
            "/nodes/pve/qemu/107/config",
            json!({ "ide0": "local:iso/user-data-107.iso,media=cdrom", "boot": "order=scsi0;ide0" }),
        )
        .await
        .upid();
    pve.wait_task_ok(&attach).await;
    let start = capmox
        .post("/nodes/pve/qemu/107/status/start", json!({}))
        .await
        .upid();
    pve.wait_task_ok(&start).await;
    wait_guest_up(&pve, 107).await;
    let interfaces = capmox
        .get("/nodes/pve/qemu/107/agent/network-get-interfaces", &[])
        .await
        .ok();
    assert!(interfaces.to_string().contains("10.10.0.70"));

    // Detach and delete the seed, stop, destroy.
    capmox
        .put(
            "/nodes/pve/qemu/107/config",
            &[("ide0", "none,media=cdrom")],
        )
        .await
        .ok();
    let delete_iso = capmox
        .delete(
            "/nodes/pve/storage/local/content/local:iso/user-data-107.iso",
            &[],
        )
        .await
        .upid();
    pve.wait_task_ok(&delete_iso).await;
    // Freeing it again only warns, as PVE's file plugins do.
    let again = capmox
        .delete(
            "/nodes/pve/storage/local/content/local:iso/user-data-107.iso",
            &[],
        )
        .await
        .upid();
    assert_eq!(pve.wait_task(&again).await, "WARNINGS: 1");
    let stop = capmox
        .post("/nodes/pve/qemu/107/status/stop", json!({}))
        .await
        .upid();
    pve.wait_task_ok(&stop).await;
    let destroy = capmox.delete("/nodes/pve/qemu/107", &[]).await.upid();
    pve.wait_task_ok(&destroy).await;
    let after = pve.sim.snapshot();
    assert!(after.vm(107).is_none());
    assert!(after.pool("capi").unwrap().vms.is_empty());
    assert!(after.volume("local:iso/user-data-107.iso").is_none());
}

#[tokio::test]
async fn cdrom_change_without_its_privilege_fails_where_pve_fails_it() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    create_vm(&pve, 180, json!({})).await;
    root.post(
        "/access/roles",
        json!({ "roleid": "OptionsOnly", "privs": "VM.Config.Options,VM.Audit" }),
    )
    .await
    .ok();
    let token = user_with_token(&root, "opts@pve", "opts", false).await;
    grant(
        &root,
        "/vms/180",
        ("users", "opts@pve"),
        "OptionsOnly",
        false,
    )
    .await;
    grant(
        &root,
        "/storage/local",
        ("users", "opts@pve"),
        "PVEDatastoreUser",
        false,
    )
    .await;
    let user = pve.caller(token);

    // The asynchronous API accepts the call and fails its task...
    let upid = user
        .post(
            "/nodes/pve/qemu/180/config",
            json!({ "ide2": "none,media=cdrom", "description": "x" }),
        )
        .await
        .upid();
    assert_eq!(
        pve.wait_task(&upid).await,
        "Permission check failed (/vms/180, VM.Config.CDROM)"
    );
    // ...the synchronous one answers 403.
    user.put(
        "/nodes/pve/qemu/180/config",
        &[("ide2", "none,media=cdrom")],
    )
    .await
    .fails(403, "Permission check failed (/vms/180, VM.Config.CDROM)");
    // Keys checked before forking fail the call itself.
    user.post("/nodes/pve/qemu/180/config", json!({ "cores": 8 }))
        .await
        .fails(403, "Permission check failed (/vms/180, VM.Config.CPU)");
    user.put("/nodes/pve/qemu/180/config", &[("description", "ok")])
        .await
        .ok();
}

#[tokio::test]
async fn clone_to_another_node_needs_shared_storage() {
    let config = PveSimConfig::for_tests()
        .with_nodes(vec![
            NodeSpec::new("pve", 8, 32),
            NodeSpec::new("pve2", 8, 32),
        ])
        .with_storages(vec![
            StorageSpec::new("local", StorageType::Dir, &["iso", "images"]),
            StorageSpec::new("local-lvm", StorageType::Lvmthin, &["images"]),
            StorageSpec::new("ceph", StorageType::Rbd, &["images"]),
        ]);
    let pve = Pve::start_with(config).await;
    let root = pve.as_root();
    create_template(&pve, 100).await;
    root.post(
        "/nodes/pve/qemu/100/clone",
        json!({ "newid": 190, "target": "pve2" }),
    )
    .await
    .fails(500, "can't clone VM to node 'pve2' (VM uses local storage)");

    let upid = root
        .post(
            "/nodes/pve/qemu",
            json!({ "vmid": 101, "scsi0": "ceph:4", "net0": "virtio,bridge=vmbr0" }),
        )
        .await
        .upid();
    pve.wait_task_ok(&upid).await;
    let upid = root
        .post(
            "/nodes/pve/qemu/101/clone",
            json!({ "newid": 191, "target": "pve2", "full": 1 }),
        )
        .await
        .upid();
    pve.wait_task_ok(&upid).await;
    assert_eq!(pve.sim.snapshot().vm(191).unwrap().node, "pve2");
    root.get("/nodes/pve2/qemu/191/config", &[]).await.ok();
    root.get("/nodes/pve/qemu/191/config", &[]).await.fails(
        500,
        "Configuration file 'nodes/pve/qemu-server/191.conf' does not exist",
    );
}

#[tokio::test]
async fn linked_clone_of_a_template_needs_no_storage_parameter() {
    let pve = Pve::start().await;
    create_template(&pve, 100).await;
    let root = pve.as_root();
    root.post(
        "/nodes/pve/qemu/100/clone",
        json!({ "newid": 110, "full": 0, "storage": "local-lvm" }),
    )
    .await
    .fails(500, "parameter 'storage' not allowed for linked clones");
    let upid = root
        .post("/nodes/pve/qemu/100/clone", json!({ "newid": 110 }))
        .await
        .upid();
    pve.wait_task_ok(&upid).await;
    let clone = root.get("/nodes/pve/qemu/110/config", &[]).await.ok();
    assert_eq!(clone["name"], "Copy-of-VM-vm-100");
    assert!(
        clone["scsi0"]
            .as_str()
            .unwrap()
            .starts_with("local-lvm:vm-110-disk-0,")
    );
    // The template's disk is a base image now, still there.
    assert!(
        pve.sim
            .snapshot()
            .volume("local-lvm:base-100-disk-0")
            .is_some()
    );
}

#[tokio::test]
async fn running_vm_is_not_destroyed() {
    let pve = Pve::start().await;
    create_vm(&pve, 120, json!({})).await;
    start_vm(&pve, 120).await;
    let answer = pve.as_root().delete("/nodes/pve/qemu/120", &[]).await;
    answer.fails(500, "VM 120 is running - destroy failed");
    assert_eq!(
        answer.body["message"],
        "VM 120 is running - destroy failed\n"
    );
    assert_eq!(answer.body["data"], Value::Null);

    let stop = pve
        .as_root()
        .post("/nodes/pve/qemu/120/status/stop", json!({}))
        .await
        .upid();
    pve.wait_task_ok(&stop).await;
    let destroy = pve
        .as_root()
        .delete(
            "/nodes/pve/qemu/120",
            &[("purge", "1"), ("destroy-unreferenced-disks", "1")],
        )
        .await
        .upid();
    pve.wait_task_ok(&destroy).await;
    let after = pve.sim.snapshot();
    assert!(after.vm(120).is_none());
    assert!(after.volumes.iter().all(|v| v.vmid != Some(120)));
    pve.as_root()
        .get("/nodes/pve/qemu/120/config", &[])
        .await
        .fails(
            500,
            "Configuration file 'nodes/pve/qemu-server/120.conf' does not exist",
        );
}

#[tokio::test]
async fn failing_task_reports_its_error_and_rolls_back() {
    let pve = Pve::start().await;
    create_template(&pve, 100).await;
    pve.sim.faults().fail_tasks(
        "qmclone",
        "clone failed: simulated storage error",
        Trigger::Times(1),
    );
    let upid = pve
        .as_root()
        .post("/nodes/pve/qemu/100/clone", json!({ "newid": 130 }))
        .await
        .upid();
    assert_eq!(
        pve.wait_task(&upid).await,
        "clone failed: simulated storage error"
    );
    let log = pve
        .as_root()
        .get(&format!("/nodes/pve/tasks/{upid}/log"), &[])
        .await
        .ok();
    assert_eq!(
        log.as_array().unwrap().last().unwrap()["t"],
        "TASK ERROR: clone failed: simulated storage error"
    );
    let after = pve.sim.snapshot();
    assert!(after.vm(130).is_none(), "a failed clone leaves no VM");
    assert!(after.volumes.iter().all(|v| v.vmid != Some(130)));
    pve.as_root()
        .get(
            "/nodes/pve/tasks/UPID:pve:00000001:00000001:00000001:qmclone:1:root@pam:/status",
            &[],
        )
        .await
        .fails(400, "Parameter verification failed.");
}

// ------------------------------------------------------------------- guest

fn seed_files(mac: &str, ip: &str, v2: bool) -> Vec<(String, Vec<u8>)> {
    let network = if v2 {
        format!(
            "network:\n  version: 2\n  ethernets:\n    eth0:\n      match:\n        macaddress: \"{}\"\n      set-name: eth0\n      addresses: [\"{ip}/24\"]\n      gateway4: 10.10.0.1\n",
            mac.to_ascii_lowercase()
        )
    } else {
        format!(
            "version: 1\nconfig:\n  - type: physical\n    name: eth0\n    mac_address: \"{}\"\n    subnets:\n      - type: static\n        address: {ip}\n        netmask: 255.255.255.0\n        gateway: 10.10.0.1\n",
            mac.to_ascii_lowercase()
        )
    };
    vec![
        (
            "user-data".into(),
            b"#cloud-config\nhostname: worker\n".to_vec(),
        ),
        (
            "meta-data".into(),
            b"instance-id: abc\nlocal-hostname: worker\n".to_vec(),
        ),
        ("network-config".into(), network.into_bytes()),
    ]
}

async fn guest_reports(pve: &Pve, vmid: u32, v2: bool, joliet: bool, ip: &str) {
    let config = create_vm(pve, vmid, json!({})).await;
    let mac = mac_of(&config, "net0");
    let files = seed_files(&mac, ip, v2);
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let image = build_iso("cidata", &refs, joliet);
    let root = pve.as_root();
    let upload = upload_iso(&root, "local", &format!("user-data-{vmid}.iso"), image).await;
    let upid = upload.upid();
    assert!(upid.contains(":imgcopy::"), "{upid}");
    pve.wait_task_ok(&upid).await;
    let upid = root
        .post(
            &format!("/nodes/pve/qemu/{vmid}/config"),
            json!({
                "ide2": format!("local:iso/user-data-{vmid}.iso,media=cdrom"),
                "boot": "order=scsi0;ide2",
            }),
        )
        .await
        .upid();
    pve.wait_task_ok(&upid).await;

    let agent = format!("/nodes/pve/qemu/{vmid}/agent/network-get-interfaces");
    root.get(&agent, &[])
        .await
        .fails(500, &format!("VM {vmid} is not running"));
    start_vm(pve, vmid).await;
    wait_guest_up(pve, vmid).await;

    let interfaces = root.get(&agent, &[]).await.ok();
    let eth0 = interfaces["result"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "eth0")
        .expect("eth0 reported")
        .clone();
    assert_eq!(eth0["hardware-address"], mac.to_ascii_lowercase());
    assert!(
        eth0["ip-addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["ip-address"] == ip && a["prefix"] == 24 && a["ip-address-type"] == "ipv4"),
        "{eth0}"
    );
    let osinfo = root
        .get(&format!("/nodes/pve/qemu/{vmid}/agent/get-osinfo"), &[])
        .await
        .ok();
    assert_eq!(osinfo["result"]["id"], "talos");

    let vm = pve.sim.snapshot().vm(vmid).cloned().unwrap();
    assert_eq!(
        vm.ip_addresses,
        vec![ip.parse::<std::net::IpAddr>().unwrap()]
    );
    let seed = vm.seed_read.expect("guest read its seed");
    assert_eq!(seed.label.to_lowercase(), "cidata");
    assert!(seed.user_data.starts_with("#cloud-config"));
    assert!(seed.network_config.unwrap().contains(ip));
}

#[tokio::test]
async fn guest_reports_the_static_ip_of_its_nocloud_network_config_v2() {
    let pve = Pve::start().await;
    guest_reports(&pve, 140, true, true, "10.10.0.40").await;
}

#[tokio::test]
async fn guest_reports_the_static_ip_of_its_nocloud_network_config_v1() {
    let pve = Pve::start().await;
    guest_reports(&pve, 141, false, false, "10.10.0.41").await;
}

#[tokio::test]
async fn guest_agent_errors_follow_pve() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    create_vm(&pve, 150, json!({})).await;
    root.post("/nodes/pve/qemu/150/config", json!({ "delete": "agent" }))
        .await
        .upid();
    create_vm(&pve, 151, json!({})).await;
    wait::until("config applied", DEADLINE, || {
        let has_agent = pve
            .sim
            .snapshot()
            .vm(150)
            .unwrap()
            .config
            .contains_key("agent");
        async move { Ok((!has_agent).then_some(())) }
    })
    .await
    .unwrap();
    root.get("/nodes/pve/qemu/150/agent/get-osinfo", &[])
        .await
        .fails(500, "No QEMU guest agent configured");

    // A guest that never boots never answers.
    pve.sim.faults().hang_guest(151, GuestHang::NeverBoots);
    start_vm(&pve, 151).await;
    root.get("/nodes/pve/qemu/151/agent/get-osinfo", &[])
        .await
        .fails(500, "QEMU guest agent is not running");
    // ...and ignores ACPI: shutdown fails after the timeout unless forced.
    let shutdown = root
        .post("/nodes/pve/qemu/151/status/shutdown", json!({}))
        .await
        .upid();
    assert_eq!(
        pve.wait_task(&shutdown).await,
        "VM quit/powerdown failed - got timeout"
    );
    let forced = root
        .post(
            "/nodes/pve/qemu/151/status/shutdown",
            json!({ "forceStop": 1 }),
        )
        .await
        .upid();
    pve.wait_task_ok(&forced).await;
    assert_eq!(pve.sim.snapshot().vm(151).unwrap().power, VmPower::Stopped);
}

#[tokio::test]
async fn guest_that_hangs_after_reboot_stops_answering() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    create_vm(&pve, 160, json!({})).await;
    start_vm(&pve, 160).await;
    wait_guest_up(&pve, 160).await;
    root.post("/nodes/pve/qemu/160/agent/ping", json!({}))
        .await
        .ok();

    pve.sim.faults().hang_guest(160, GuestHang::AfterReboot);
    let reboot = root
        .post("/nodes/pve/qemu/160/status/reboot", json!({}))
        .await
        .upid();
    pve.wait_task_ok(&reboot).await;
    assert_eq!(pve.sim.snapshot().vm(160).unwrap().guest, GuestPhase::Hung);
    root.post("/nodes/pve/qemu/160/agent/ping", json!({}))
        .await
        .fails(500, "QEMU guest agent is not running");
}

#[tokio::test]
async fn iso_upload_needs_allocate_template_and_a_file_storage() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    let token = user_with_token(&root, "csi@pve", "csi", false).await;
    grant(
        &root,
        "/storage/local",
        ("users", "csi@pve"),
        "PVEDatastoreUser",
        true,
    )
    .await;
    let image = build_iso("cidata", &[("meta-data", b"instance-id: x\n")], true);
    upload_iso(&pve.caller(token), "local", "seed.iso", image.clone())
        .await
        .fails(
            403,
            "Permission check failed (/storage/local, Datastore.AllocateTemplate)",
        );
    upload_iso(&root, "local-lvm", "seed.iso", image.clone())
        .await
        .fails(500, "can't upload to storage type 'lvmthin'");
    let wrong_name = upload_iso(&root, "local", "seed.txt", image).await;
    wrong_name.fails(400, "Parameter verification failed.");
    assert_eq!(
        wrong_name.body["errors"]["filename"],
        "wrong file extension"
    );
}

// ------------------------------------------------------------------ faults

#[tokio::test]
async fn injected_http_errors_and_dropped_connections() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    let faults = pve.sim.faults();
    let fault = faults.http_error(
        RequestMatch::new("GET", "/nodes/{node}/qemu"),
        503,
        "Service Unavailable (simulated)",
        Trigger::Times(1),
    );
    let failed = root.get("/nodes/pve/qemu", &[]).await;
    failed.fails(503, "Service Unavailable (simulated)");
    assert_eq!(failed.body["message"], "Service Unavailable (simulated)\n");
    root.get("/nodes/pve/qemu", &[]).await.ok();
    assert_eq!(faults.fired(fault), 1);

    faults.drop_connection(
        RequestMatch::new("GET", "/cluster/resources"),
        DropMode::BeforeResponse,
        Trigger::Times(1),
    );
    let url = format!("{}cluster/resources", pve.sim.api_url());
    let dropped = pve
        .http
        .get(&url)
        .header("Authorization", pve.root().authorization())
        .send()
        .await;
    assert!(dropped.is_err(), "connection is dropped: {dropped:?}");
    faults.drop_connection(
        RequestMatch::new("GET", "/cluster/resources"),
        DropMode::MidResponse,
        Trigger::Times(1),
    );
    let truncated = async {
        let response = pve
            .http
            .get(&url)
            .header("Authorization", pve.root().authorization())
            .send()
            .await?;
        response.bytes().await
    }
    .await;
    assert!(truncated.is_err(), "body is cut: {truncated:?}");
    root.get("/cluster/resources", &[]).await.ok();

    faults.latency(
        RequestMatch::new("GET", "/version"),
        Duration::from_millis(300),
        Trigger::Always,
    );
    let started = Instant::now();
    root.get("/version", &[]).await.ok();
    assert!(started.elapsed() >= Duration::from_millis(300));
    faults.clear();
}

#[tokio::test]
async fn offline_node_answers_595_and_its_vms_become_unknown() {
    let config = PveSimConfig::for_tests()
        .with_nodes(vec![
            NodeSpec::new("pve", 8, 32),
            NodeSpec::new("pve2", 8, 32),
        ])
        .with_storages(vec![
            StorageSpec::new("local", StorageType::Dir, &["iso", "images"]),
            StorageSpec::new("local-lvm", StorageType::Lvmthin, &["images"]),
            StorageSpec::new("ceph", StorageType::Rbd, &["images"]),
        ]);
    let pve = Pve::start_with(config).await;
    let root = pve.as_root();
    let upid = root
        .post(
            "/nodes/pve2/qemu",
            json!({ "vmid": 170, "scsi0": "ceph:4", "net0": "virtio,bridge=vmbr0" }),
        )
        .await
        .upid();
    pve.wait_task_ok(&upid).await;

    pve.sim.faults().set_node_online("pve2", false).unwrap();
    let answer = root.get("/nodes/pve2/qemu/170/status/current", &[]).await;
    assert_eq!(answer.status, 595);
    let resources = root.get("/cluster/resources", &[("type", "vm")]).await.ok();
    assert_eq!(resources[0]["status"], "unknown");
    let nodes = root.get("/nodes", &[]).await.ok();
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["node"] == "pve2" && n["status"] == "offline")
    );

    pve.sim.faults().set_node_online("pve2", true).unwrap();
    root.get("/nodes/pve2/qemu/170/status/current", &[])
        .await
        .ok();
}

// ---------------------------------------------------------------- counters

#[tokio::test]
async fn calls_are_counted_by_endpoint_and_caller() {
    let pve = Pve::start().await;
    let root = pve.as_root();
    let token = user_with_token(&root, "bench@pve", "bench", false).await;
    pve.sim.reset_call_counts();
    let bench = pve.caller(token.clone());
    for _ in 0..3 {
        bench
            .get("/cluster/resources", &[("type", "vm")])
            .await
            .ok();
    }
    bench.get("/nodes/pve/qemu", &[]).await.ok();
    pve.anonymous().get("/version", &[]).await;

    let counts = pve.sim.call_counts();
    assert_eq!(counts.count("GET", "/cluster/resources"), 3);
    assert_eq!(counts.count("GET", "/nodes/{node}/qemu"), 1);
    assert_eq!(counts.by(&token.id), 4);
    assert_eq!(counts.count_by(&token.id, "GET", "/cluster/resources"), 3);
    assert_eq!(counts.by(tenantry_e2e::sim::proxmox::UNAUTHENTICATED), 1);
    assert_eq!(counts.total, 5);
}
