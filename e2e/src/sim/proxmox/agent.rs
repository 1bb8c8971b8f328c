//! `/nodes/{node}/qemu/{vmid}/agent/…`: the QEMU guest agent commands
//! capmox and the Proxmox CCM use. Every command first loads the config,
//! then needs an `agent` key in the current config ("No QEMU guest agent
//! configured"), a running VM ("VM N is not running") and an agent that
//! answers its ping ("QEMU guest agent is not running"): a disabled agent,
//! a guest still booting and a hung guest all answer the last.

use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::guest::{self, GuestState, agent_enabled};
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
/// command, `cloud-init status` (see [`cloud_init_status`]); anything else
/// runs and fails as a shell would.
pub fn exec(call: &mut Call<'_>) -> ApiResult<Reply> {
    let command = call.params.array("command");
    let has_cloud_init = call.cluster.guest_os.cloud_init;
    let cloud_init_time = call.shared.config.timings.cloud_init;
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
        // qemu-ga cannot spawn a program the image does not have; PVE
        // passes its error on.
        ["cloud-init", ..] if !has_cloud_init => {
            return Err(ApiError::internal(
                "Agent error: Failed to execute child process \"cloud-init\" (No such file or directory)",
            ));
        }
        ["cloud-init", "status", ..] => cloud_init_status(vm, cloud_init_time),
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

/// What `cloud-init status` prints: `disabled` when the guest found no
/// NoCloud seed at boot (no datasource, so cloud-init does not run),
/// `running` for `cloud_init` after the agent came up (the agent starts
/// before cloud-init's last stage ends), then `done`; exit code 0 each time.
fn cloud_init_status(vm: &Vm, cloud_init: std::time::Duration) -> ExecResult {
    let status = match (&vm.guest.nocloud, &vm.guest.state) {
        (None, _) => "disabled",
        (Some(_), GuestState::Up { since }) if since.elapsed() < cloud_init => "running",
        (Some(_), _) => "done",
    };
    ExecResult {
        exitcode: 0,
        out_data: format!("status: {status}\n"),
        err_data: String::new(),
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use super::super::cloud_init::{MetaData, NetworkConfig};
    use super::super::guest::NoCloud;
    use super::*;

    fn seed() -> NoCloud {
        NoCloud {
            volid: "local:iso/seed.iso".into(),
            label: "cidata".into(),
            user_data: "#cloud-config\n".into(),
            meta_data: String::new(),
            meta: MetaData::default(),
            network_config: None,
            network: Ok(NetworkConfig::default()),
        }
    }

    fn status(vm: &Vm, cloud_init: Duration) -> String {
        cloud_init_status(vm, cloud_init).out_data
    }

    #[test]
    fn cloud_init_runs_after_the_agent_answers_then_is_done() {
        let mut vm = Vm::new(100, "pve", BTreeMap::new());
        vm.guest.nocloud = Some(seed());
        vm.guest.state = GuestState::Up {
            since: Instant::now(),
        };
        assert_eq!(status(&vm, Duration::from_secs(60)), "status: running\n");
        assert_eq!(status(&vm, Duration::ZERO), "status: done\n");
    }

    #[test]
    fn cloud_init_without_a_seed_is_disabled() {
        let mut vm = Vm::new(100, "pve", BTreeMap::new());
        vm.guest.state = GuestState::Up {
            since: Instant::now(),
        };
        assert_eq!(status(&vm, Duration::ZERO), "status: disabled\n");
    }
}
