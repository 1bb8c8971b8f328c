//! A Proxmox VE lab for tests: the PVE simulator set up through its API as
//! a platform operator would with `pveum`/`qm` (see `docs/proxmox.md`): a
//! Talos template in a `templates` pool, and per tenant a pool, a user and
//! a privilege-separated token with the least privileges tenantry needs.

use std::time::Duration;

use serde_json::{Value, json};
use tenantry_provider::proxmox::client::{
    ApiUrl, ClientConfig, Credentials, ProxmoxClient, TlsVerification,
};

use crate::pki::http_trusting;
use crate::sim::proxmox::{
    ApiToken, NodeSpec, PveSimConfig, PveSimulator, StorageSpec, StorageType,
};
use crate::wait;

const DEADLINE: Duration = Duration::from_secs(180);
/// The VMID of the Talos template.
pub const TEMPLATE: u32 = 9000;
/// The node the template lives on.
pub const TEMPLATE_NODE: &str = "pve1";

/// The PVE simulator and a root client for setting it up.
pub struct PveLab {
    pub sim: PveSimulator,
    http: reqwest::Client,
    auth: String,
}

/// Two nodes of different sizes; per tenant a disk storage `<tenant>-disks`
/// and an ISO storage `<tenant>-iso` (shared, so clones may land on either
/// node); the templates on a shared storage of their own.
pub fn lab_config(tenants: &[&str]) -> PveSimConfig {
    let mut config = PveSimConfig::for_tests();
    config.cluster_name = Some("lab".into());
    config.nodes = vec![NodeSpec::new("pve1", 16, 64), NodeSpec::new("pve2", 8, 32)];
    config.storages = vec![
        StorageSpec::new("local", StorageType::Dir, &["iso", "vztmpl", "images"]),
        StorageSpec::new("templates", StorageType::Rbd, &["images"]),
    ];
    for tenant in tenants {
        config.storages.push(StorageSpec::new(
            format!("{tenant}-disks"),
            StorageType::Rbd,
            &["images"],
        ));
        config.storages.push(StorageSpec::new(
            format!("{tenant}-iso"),
            StorageType::Nfs,
            &["iso"],
        ));
    }
    config
}

impl PveLab {
    pub async fn start(config: PveSimConfig) -> Self {
        let sim = PveSimulator::start(config)
            .await
            .expect("start the PVE simulator");
        let http = http_trusting(sim.ca_pem());
        let auth = sim.root_token().authorization();
        let pve = Self { sim, http, auth };
        pve.setup_hypervisor().await;
        pve
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.sim.api_url(), path.trim_start_matches('/'))
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> Value {
        let response = request
            .header("Authorization", &self.auth)
            .send()
            .await
            .expect("PVE setup request");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(
            status.is_success(),
            "PVE setup call failed: {status} {body}"
        );
        body["data"].clone()
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        self.send(self.http.post(self.url(path)).json(&body)).await
    }

    pub async fn put(&self, path: &str, form: &[(&str, &str)]) -> Value {
        self.send(self.http.put(self.url(path)).form(form)).await
    }

    pub async fn wait_task(&self, upid: &Value) {
        let upid = upid.as_str().expect("a UPID").to_string();
        let node = upid.split(':').nth(1).expect("UPID node").to_string();
        let path = format!("/nodes/{node}/tasks/{upid}/status");
        let status = wait::until(format!("task {upid}"), DEADLINE, || {
            let path = path.clone();
            async move {
                let status = self.send(self.http.get(self.url(&path))).await;
                Ok((status["status"] == "stopped").then_some(status))
            }
        })
        .await
        .expect("task ends");
        assert_eq!(status["exitstatus"], "OK", "task {upid}");
    }

    /// `pveum pool add templates`, a template VM 9000 in it, and a role for
    /// node auditing and one for the seed ISO storage.
    async fn setup_hypervisor(&self) {
        self.post(
            "/pools",
            json!({ "poolid": "templates", "comment": "VM templates" }),
        )
        .await;
        let created = self
            .post(
                &format!("/nodes/{TEMPLATE_NODE}/qemu"),
                json!({
                    "vmid": TEMPLATE, "name": "talos-template", "cores": 2, "memory": 2048,
                    "scsihw": "virtio-scsi-single", "scsi0": "templates:8", "net0": "virtio,bridge=vmbr0",
                    "agent": 1, "pool": "templates", "tags": "talos",
                }),
            )
            .await;
        self.wait_task(&created).await;
        let converted = self
            .post(
                &format!("/nodes/{TEMPLATE_NODE}/qemu/{TEMPLATE}/template"),
                json!({}),
            )
            .await;
        if converted.is_string() {
            self.wait_task(&converted).await;
        }
        self.post(
            "/access/roles",
            json!({ "roleid": "TenantryNodeAudit", "privs": "Sys.Audit" }),
        )
        .await;
        self.post(
            "/access/roles",
            json!({ "roleid": "TenantrySeedStore", "privs": "Datastore.AllocateTemplate,Datastore.Allocate,Datastore.Audit" }),
        )
        .await;
    }

    /// A tenant as `docs/proxmox.md` makes one: pool `<tenant>` holding the
    /// tenant's storages, user `<tenant>@pve` and its privilege-separated
    /// token `capi`, each ACL granted to both. `skip` leaves grants out by path.
    pub async fn tenant(&self, tenant: &str, skip: &[&str]) -> ApiToken {
        let disks = format!("{tenant}-disks");
        let iso = format!("{tenant}-iso");
        self.post(
            "/pools",
            json!({ "poolid": tenant, "comment": format!("{tenant} workers") }),
        )
        .await;
        self.put(
            "/pools",
            &[("poolid", tenant), ("storage", &format!("{disks},{iso}"))],
        )
        .await;
        let user = format!("{tenant}@pve");
        self.post("/access/users", json!({ "userid": user })).await;
        let created = self
            .post(
                &format!("/access/users/{user}/token/capi"),
                json!({ "privsep": 1 }),
            )
            .await;
        let token = ApiToken {
            id: created["full-tokenid"]
                .as_str()
                .expect("token id")
                .to_string(),
            secret: created["value"].as_str().expect("token secret").to_string(),
        };
        let grants = [
            ("/nodes".to_string(), "TenantryNodeAudit"),
            (format!("/pool/{tenant}"), "PVEVMAdmin"),
            ("/pool/templates".to_string(), "PVETemplateUser"),
            (format!("/storage/{disks}"), "PVEDatastoreUser"),
            (format!("/storage/{iso}"), "TenantrySeedStore"),
            ("/sdn/zones/localnetwork/vmbr0".to_string(), "PVESDNUser"),
        ];
        for (path, role) in grants
            .iter()
            .filter(|(path, _)| !skip.contains(&path.as_str()))
        {
            self.grant(path, role, &user, &token.id).await;
        }
        token
    }

    pub async fn grant(&self, path: &str, role: &str, user: &str, token: &str) {
        for (kind, id) in [("users", user), ("tokens", token)] {
            self.put(
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

    /// A PVE client with a tenant's token, as a tenant would hold it.
    pub fn client(&self, token: &ApiToken) -> ProxmoxClient {
        let credentials = Credentials::parse(&token.id, &token.secret).expect("token");
        let url = ApiUrl::parse(self.sim.url().as_str()).expect("URL");
        let config = ClientConfig::new(url, credentials).with_tls(TlsVerification::HypervisorCa {
            pem: self.sim.ca_pem().to_string(),
        });
        ProxmoxClient::new(config).expect("client")
    }
}

/// A worker of a tenant: cloned from the template into the tenant's pool
/// and storages, sized, with a grown boot disk.
pub fn worker_spec(tenant: &str) -> Value {
    json!({
        "sourceNode": TEMPLATE_NODE, "templateID": TEMPLATE,
        "pool": tenant, "full": true, "storage": format!("{tenant}-disks"), "isoStorage": format!("{tenant}-iso"),
        "numSockets": 1, "numCores": 2, "memoryMiB": 2048,
        "disks": { "bootVolume": { "disk": "scsi0", "sizeGb": 10 } },
        "description": format!("{tenant} worker"),
        "network": { "networkDevices": [{ "name": "net0", "bridge": "vmbr0", "model": "virtio" }] },
    })
}
