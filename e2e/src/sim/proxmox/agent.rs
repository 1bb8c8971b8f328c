//! `/nodes/{node}/qemu/{vmid}/agent/…`: the QEMU guest agent commands
//! capmox and the Proxmox CCM use. Every command first loads the config,
//! then needs an `agent` key in the current config ("No QEMU guest agent
//! configured"), a running VM ("VM N is not running") and an agent that
//! answers its ping ("QEMU guest agent is not running"): a disabled agent,
//! a guest still booting and a hung guest all answer the last.

use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::guest::{self, agent_enabled};
use super::params::{Kind, Schema, optional, required};
use super::router::{Call, Reply};
use super::state::Vm;

/// A finished `exec` as `exec-status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    pub exitcode: i32,
    pub out_data: String,
    pub err_data: String,
}

fn agent_call<'c>(
    call: &'c mut Call<'_>,
    privilege: &str,
    extra: &[super::params::Prop],
) -> ApiResult<&'c mut Vm> {
    let vmid = call.vmid();
    call.perms().check(&format!("/vms/{vmid}"), &[privilege])?;
    let mut props = vec![required("node", Kind::String), required("vmid", Kind::Vmid)];
    props.extend_from_slice(extra);
    call.params.verify(&Schema::new(&props))?;
    let node = call.node();
    let vm = call.cluster.vm_on_mut(&node, vmid)?;
    if !vm.config.contains_key("agent") {
        return Err(ApiError::internal("No QEMU guest agent configured"));
    }
    if !vm.is_running() {
        return Err(ApiError::internal(format!("VM {vmid} is not running")));
    }
    if !agent_enabled(vm) || !vm.guest.is_up() {
        return Err(ApiError::internal("QEMU guest agent is not running"));
    }
    Ok(vm)
}

fn result(value: Value) -> Reply {
    json!({ "result": value }).into()
}

/// GET …/agent/network-get-interfaces — VM.GuestAgent.Audit.
pub fn network_get_interfaces(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vm = agent_call(call, "VM.GuestAgent.Audit", &[])?;
    let interfaces: Vec<Value> = guest::interfaces(vm)
        .into_iter()
        .map(|interface| {
            let addresses: Vec<Value> = interface
                .addresses
                .iter()
                .map(|a| {
                    json!({
                        "ip-address-type": if a.address.is_ipv4() { "ipv4" } else { "ipv6" },
                        "ip-address": a.address.to_string(),
                        "prefix": a.prefix,
                    })
                })
                .collect();
            json!({
                "name": interface.name,
                "hardware-address": interface.mac,
                "ip-addresses": addresses,
                "statistics": {
                    "rx-bytes": 0, "rx-packets": 0, "rx-errs": 0, "rx-dropped": 0,
                    "tx-bytes": 0, "tx-packets": 0, "tx-errs": 0, "tx-dropped": 0,
                },
            })
        })
        .collect();
    Ok(result(Value::Array(interfaces)))
}

/// GET …/agent/get-osinfo — VM.GuestAgent.Audit.
pub fn get_osinfo(call: &mut Call<'_>) -> ApiResult<Reply> {
    agent_call(call, "VM.GuestAgent.Audit", &[])?;
    let os = &call.cluster.guest_os;
    Ok(result(json!({
        "id": os.id,
        "name": os.name,
        "pretty-name": os.pretty_name,
        "version": os.version,
        "version-id": os.version_id,
        "kernel-release": os.kernel_release,
        "kernel-version": "#1 SMP PREEMPT_DYNAMIC",
        "machine": "x86_64",
    })))
}

/// GET …/agent/get-host-name — VM.GuestAgent.Audit.
pub fn get_host_name(call: &mut Call<'_>) -> ApiResult<Reply> {
    let vm = agent_call(call, "VM.GuestAgent.Audit", &[])?;
    let hostname = vm
        .guest
        .nocloud
        .as_ref()
        .and_then(|n| n.meta.local_hostname.clone())
        .unwrap_or_else(|| "localhost".to_string());
    Ok(result(json!({ "host-name": hostname })))
}

/// POST …/agent/ping — VM.GuestAgent.Audit.
pub fn ping(call: &mut Call<'_>) -> ApiResult<Reply> {
    agent_call(call, "VM.GuestAgent.Audit", &[])?;
    Ok(result(json!({})))
}

/// POST …/agent/exec — VM.GuestAgent.Unrestricted. The guest knows one
/// command, `cloud-init status`, which reports done once it has booted.
pub fn exec(call: &mut Call<'_>) -> ApiResult<Reply> {
    let command = call.params.array("command");
    let vm = agent_call(
        call,
        "VM.GuestAgent.Unrestricted",
        &[
            optional("command", Kind::Array),
            optional("input-data", Kind::String),
        ],
    )?;
    if command.is_empty() {
        return Err(ApiError::internal(
            "command or input-data (or both) required",
        ));
    }
    let outcome = match command.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["cloud-init", "status", ..] => ExecResult {
            exitcode: 0,
            out_data: "status: done\n".into(),
            err_data: String::new(),
        },
        _ => ExecResult {
            exitcode: 127,
            out_data: String::new(),
            err_data: format!("{}: command not found\n", command[0]),
        },
    };
    let pid = 1000 + vm.guest.exec_results.len() as u32;
    vm.guest.exec_results.insert(pid, outcome);
    Ok(json!({ "pid": pid }).into())
}

/// GET …/agent/exec-status — VM.GuestAgent.Unrestricted.
pub fn exec_status(call: &mut Call<'_>) -> ApiResult<Reply> {
    let pid = call.params.int("pid");
    let vm = agent_call(
        call,
        "VM.GuestAgent.Unrestricted",
        &[required("pid", Kind::int())],
    )?;
    let outcome = pid
        .and_then(|p| u32::try_from(p).ok())
        .and_then(|p| vm.guest.exec_results.get(&p))
        .ok_or_else(|| ApiError::internal("Agent error: Invalid parameter 'pid'"))?;
    // Unlike the other commands, exec and exec-status are not wrapped in
    // `result`.
    Ok(json!({
        "exited": 1,
        "exitcode": outcome.exitcode,
        "out-data": outcome.out_data,
        "err-data": outcome.err_data,
    })
    .into())
}
