//! Whose a VM is, and which VM ID a new clone takes.

use std::collections::BTreeSet;

use crate::proxmox::machine::status::Reason;

/// The line of a VM's description that names the ProxmoxMachine it belongs
/// to. PVE shows descriptions as the VM's notes, so an operator sees it too.
pub const IDENTITY_PREFIX: &str = "tenantry.dev/proxmoxmachine:";

/// The description a clone gets: the user's, then the identity line.
pub fn vm_description(user: Option<&str>, namespace: &str, name: &str, uid: &str) -> String {
    let identity = format!("{IDENTITY_PREFIX} {namespace}/{name} uid={uid}");
    match user.map(str::trim).filter(|d| !d.is_empty()) {
        Some(user) => format!("{user}\n\n{identity}"),
        None => identity,
    }
}

/// The `namespace/name` a description's identity line names, if it has one.
pub fn described_owner(description: &str) -> Option<&str> {
    description.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(IDENTITY_PREFIX)?;
        rest.split_whitespace().next()
    })
}

/// Whose a VM in the machine's pool is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Named after the machine and (if it says so) made for it.
    Ours,
    /// Another machine's (or nobody's).
    Other { name: String, owner: Option<String> },
}

/// Judges a VM in the machine's pool by its name and description. A VM
/// without identity line but with the machine's name is adopted: capmox
/// names clones after their machine and writes no such line.
pub fn ownership(
    namespace: &str,
    name: &str,
    vm_name: Option<&str>,
    description: Option<&str>,
) -> Ownership {
    let owner = description.and_then(described_owner);
    let expected = format!("{namespace}/{name}");
    let name_matches = vm_name == Some(name);
    match owner {
        Some(owner) if owner == expected && name_matches => Ownership::Ours,
        None if name_matches => Ownership::Ours,
        owner => Ownership::Other {
            name: vm_name.unwrap_or_default().to_string(),
            owner: owner.map(str::to_string),
        },
    }
}

/// Where the VM ID a machine works with came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmidSource {
    /// Reserved by tenantry for its own clone (`status.virtualMachineID`).
    Reserved,
    /// Named in `spec.virtualMachineID` (by tenantry after a clone, by
    /// capmox, or by a user).
    Spec,
}

/// What PVE says about a VM ID, from the machine's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmPresence {
    /// No VM has the ID.
    Free,
    /// A VM has it, but it is not in the machine's pool (or the token cannot
    /// see it, which for a pool-scoped token is the same).
    Elsewhere,
    /// A member of the machine's pool, with this name and description.
    InPool {
        name: Option<String>,
        description: Option<String>,
    },
}

/// The next move for a machine's VM ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmVerdict {
    /// The VM is the machine's: go on with it.
    Ours,
    /// No VM: clone one, keeping a reserved ID (a retry must use the same
    /// ID, so a clone that went through unnoticed can never be doubled).
    Clone,
    /// A clone of this machine's token may still be running: PVE adds the
    /// VM to the pool only when the clone ends, so until then it is hidden.
    WaitForClone,
    /// The reserved ID went to someone else (two machines drew the same
    /// free ID): forget it and reserve another.
    Repick { message: String },
    /// The VM named by the spec is not the machine's: never act on it.
    Refuse { reason: Reason, message: String },
    /// The VM named by the spec is gone.
    Missing { message: String },
}

/// Decides about a machine's VM ID.
#[allow(clippy::too_many_arguments)]
pub fn judge_vm(
    namespace: &str,
    name: &str,
    pool: Option<&str>,
    vmid: u32,
    source: VmidSource,
    presence: &VmPresence,
    own_clone_running: bool,
) -> VmVerdict {
    let pool_text = pool.map_or("no pool".to_string(), |p| format!("pool {p}"));
    match presence {
        VmPresence::Free => match source {
            VmidSource::Reserved => VmVerdict::Clone,
            VmidSource::Spec => VmVerdict::Missing {
                message: format!("VM {vmid} (spec.virtualMachineID) does not exist"),
            },
        },
        VmPresence::Elsewhere => match source {
            VmidSource::Reserved if own_clone_running => VmVerdict::WaitForClone,
            VmidSource::Reserved => VmVerdict::Repick {
                message: format!("VM ID {vmid} was taken by a VM outside {pool_text}"),
            },
            VmidSource::Spec => VmVerdict::Refuse {
                reason: Reason::VmOutsidePool,
                message: match pool {
                    Some(pool) => format!(
                        "VM {vmid} is not in pool {pool} (or not visible to the credentials): tenantry acts only on VMs in the machine's pool"
                    ),
                    None => format!(
                        "VM {vmid} is in a resource pool (or not visible to the credentials), and the machine has none: tenantry does not act on it"
                    ),
                },
            },
        },
        VmPresence::InPool {
            name: vm_name,
            description,
        } => match ownership(namespace, name, vm_name.as_deref(), description.as_deref()) {
            Ownership::Ours => VmVerdict::Ours,
            Ownership::Other { name: other, owner } => {
                let whose = match owner {
                    Some(owner) => format!(
                        "VM {vmid} ({other}) in {pool_text} belongs to ProxmoxMachine {owner}"
                    ),
                    None => format!("VM {vmid} in {pool_text} is named {other:?}, not {name:?}"),
                };
                match source {
                    VmidSource::Reserved => VmVerdict::Repick { message: whose },
                    VmidSource::Spec => VmVerdict::Refuse {
                        reason: Reason::VmNotOwned,
                        message: format!("{whose}: tenantry does not act on another machine's VM"),
                    },
                }
            }
        },
    }
}

// ------------------------------------------------------------- VM ID choice

/// Where to start looking for a free VM ID and where to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmidSearch {
    pub first: u32,
    pub last: u32,
}

impl VmidSearch {
    /// From `vmIDRange`, or from PVE's next free ID up to the largest ID.
    pub fn new(range: Option<(i64, i64)>, next_free: Option<u32>) -> Self {
        match range {
            Some((start, end)) => Self {
                first: u32::try_from(start.max(100)).unwrap_or(u32::MAX),
                last: u32::try_from(end.max(100)).unwrap_or(u32::MAX),
            },
            None => Self {
                first: next_free.unwrap_or(100).max(100),
                last: 999_999_999,
            },
        }
    }

    /// The IDs to probe, lowest first, skipping those other machines have
    /// reserved (PVE does not know them yet: their clones may be a request
    /// away). At most `limit` of them.
    pub fn candidates(&self, reserved: &BTreeSet<u32>, limit: usize) -> Vec<u32> {
        (self.first..=self.last)
            .filter(|id| !reserved.contains(id))
            .take(limit)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_carry_the_identity_and_keep_the_users_text() {
        let description = vm_description(Some("tenant A worker"), "tenant-a", "w-1", "1234");
        assert_eq!(
            description,
            "tenant A worker\n\ntenantry.dev/proxmoxmachine: tenant-a/w-1 uid=1234"
        );
        assert_eq!(described_owner(&description), Some("tenant-a/w-1"));
        assert_eq!(
            described_owner(&vm_description(None, "a", "b", "c")),
            Some("a/b")
        );
        assert_eq!(described_owner("just notes"), None);
    }

    #[test]
    fn a_vm_is_ours_by_name_and_identity() {
        let ours = vm_description(None, "ns", "w-1", "u");
        assert_eq!(
            ownership("ns", "w-1", Some("w-1"), Some(&ours)),
            Ownership::Ours
        );
        // capmox's clones: the name only.
        assert_eq!(ownership("ns", "w-1", Some("w-1"), None), Ownership::Ours);
        // Same name, other machine (another namespace).
        let theirs = vm_description(None, "other", "w-1", "u");
        assert!(matches!(
            ownership("ns", "w-1", Some("w-1"), Some(&theirs)),
            Ownership::Other { owner: Some(_), .. }
        ));
        assert!(matches!(
            ownership("ns", "w-1", Some("w-2"), None),
            Ownership::Other { owner: None, .. }
        ));
    }

    #[test]
    fn a_reserved_id_is_cloned_into_waited_for_or_given_up() {
        let judge = |presence: &VmPresence, running: bool| {
            judge_vm(
                "ns",
                "w-1",
                Some("pool-a"),
                105,
                VmidSource::Reserved,
                presence,
                running,
            )
        };
        assert_eq!(judge(&VmPresence::Free, false), VmVerdict::Clone);
        assert_eq!(judge(&VmPresence::Elsewhere, true), VmVerdict::WaitForClone);
        assert!(matches!(
            judge(&VmPresence::Elsewhere, false),
            VmVerdict::Repick { .. }
        ));
        let other = VmPresence::InPool {
            name: Some("w-2".into()),
            description: Some(vm_description(None, "ns", "w-2", "u")),
        };
        match judge(&other, true) {
            VmVerdict::Repick { message } => assert!(
                message.contains("belongs to ProxmoxMachine ns/w-2"),
                "{message}"
            ),
            verdict => panic!("{verdict:?}"),
        }
        let ours = VmPresence::InPool {
            name: Some("w-1".into()),
            description: Some(vm_description(None, "ns", "w-1", "u")),
        };
        assert_eq!(judge(&ours, false), VmVerdict::Ours);
    }

    #[test]
    fn a_vm_named_in_the_spec_outside_the_pool_is_refused() {
        let verdict = judge_vm(
            "ns",
            "w-1",
            Some("tenant-a"),
            201,
            VmidSource::Spec,
            &VmPresence::Elsewhere,
            true,
        );
        match verdict {
            VmVerdict::Refuse { reason, message } => {
                assert_eq!(reason, Reason::VmOutsidePool);
                assert!(
                    message.contains("VM 201 is not in pool tenant-a"),
                    "{message}"
                );
            }
            verdict => panic!("{verdict:?}"),
        }
        let other = VmPresence::InPool {
            name: Some("x".into()),
            description: None,
        };
        assert!(matches!(
            judge_vm(
                "ns",
                "w-1",
                Some("tenant-a"),
                201,
                VmidSource::Spec,
                &other,
                false
            ),
            VmVerdict::Refuse {
                reason: Reason::VmNotOwned,
                ..
            }
        ));
        assert!(matches!(
            judge_vm(
                "ns",
                "w-1",
                None,
                201,
                VmidSource::Spec,
                &VmPresence::Free,
                false
            ),
            VmVerdict::Missing { .. }
        ));
    }

    #[test]
    fn vmid_candidates_skip_reserved_ids_and_stay_in_range() {
        let reserved = BTreeSet::from([105, 106]);
        assert_eq!(
            VmidSearch::new(None, Some(104)).candidates(&reserved, 3),
            [104, 107, 108]
        );
        assert_eq!(
            VmidSearch::new(Some((105, 107)), Some(100)).candidates(&reserved, 10),
            [107]
        );
        assert!(
            VmidSearch::new(Some((105, 106)), None)
                .candidates(&reserved, 10)
                .is_empty()
        );
    }
}
