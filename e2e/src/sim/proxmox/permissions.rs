//! PVE's permission model: privileges, built-in roles, the ACL tree and how
//! a user's or token's privileges on a path are computed.
//!
//! What this copies from pve-access-control (facts, re-expressed here):
//! - Built-in roles are derived from privilege groups: `PVE<Group>Admin` has a
//!   group's admin, user and audit privileges, `PVE<Group>User` its user and
//!   audit ones (only for groups that have user privileges), `PVEAuditor`
//!   every audit privilege, `PVEAdmin` every non-root privilege (not
//!   `Mapping.Modify`, not `Permissions.Modify`), `Administrator` all of them,
//!   `NoAccess` none, `PVETemplateUser` = `VM.Clone` + `VM.Audit`.
//! - Roles on a path: walk from `/` to the path; at each level the token's
//!   own ACL entries, else the user's, else the union of its groups' apply
//!   (a role counts at a level if it is the final one or propagates); a level
//!   that yields any role replaces what was inherited. `NoAccess` wins.
//! - Pools: roles a caller has on `/pool/<p>` are added, non-propagating and
//!   without overriding explicit ACLs, to `/vms/<id>` and `/storage/<id>` of
//!   the pool's members; a pool `NoAccess` wins over regular roles.
//! - A privilege-separated token has its own ACL roles intersected with its
//!   user's privileges on the same path; a token without privilege
//!   separation has exactly its user's privileges. `root@pam` has all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use regex::Regex;

use super::error::{ApiError, ApiResult};

/// Privileges grouped as pve-access-control groups them (PVE 9: the
/// `VM.GuestAgent.*` privileges replaced `VM.Monitor`).
struct PrivilegeGroup {
    name: &'static str,
    root: &'static [&'static str],
    admin: &'static [&'static str],
    user: &'static [&'static str],
    audit: &'static [&'static str],
}

const PRIVILEGE_GROUPS: &[PrivilegeGroup] = &[
    PrivilegeGroup {
        name: "VM",
        root: &[],
        admin: &[
            "VM.Config.Disk",
            "VM.Config.CPU",
            "VM.Config.Memory",
            "VM.Config.Network",
            "VM.Config.HWType",
            "VM.Config.Options",
            "VM.Allocate",
            "VM.Clone",
            "VM.GuestAgent.Unrestricted",
            "VM.Migrate",
            "VM.Replicate",
            "VM.Snapshot",
            "VM.Snapshot.Rollback",
        ],
        user: &[
            "VM.Config.CDROM",
            "VM.Config.Cloudinit",
            "VM.Console",
            "VM.Backup",
            "VM.GuestAgent.FileRead",
            "VM.GuestAgent.FileSystemMgmt",
            "VM.GuestAgent.FileWrite",
            "VM.PowerMgmt",
        ],
        audit: &["VM.Audit", "VM.GuestAgent.Audit"],
    },
    PrivilegeGroup {
        name: "Sys",
        root: &[
            "Sys.PowerMgmt",
            "Sys.Modify",
            "Sys.Incoming",
            "Sys.AccessNetwork",
        ],
        admin: &["Sys.Console", "Sys.Syslog"],
        user: &[],
        audit: &["Sys.Audit"],
    },
    PrivilegeGroup {
        name: "Datastore",
        root: &[],
        admin: &["Datastore.Allocate", "Datastore.AllocateTemplate"],
        user: &["Datastore.AllocateSpace"],
        audit: &["Datastore.Audit"],
    },
    PrivilegeGroup {
        name: "SDN",
        root: &[],
        admin: &["SDN.Allocate", "SDN.Audit"],
        user: &["SDN.Use"],
        audit: &["SDN.Audit"],
    },
    PrivilegeGroup {
        name: "User",
        root: &["Realm.Allocate"],
        admin: &["User.Modify", "Group.Allocate", "Realm.AllocateUser"],
        user: &[],
        audit: &[],
    },
    PrivilegeGroup {
        name: "Pool",
        root: &[],
        admin: &["Pool.Allocate"],
        user: &["Pool.Audit"],
        audit: &["Pool.Audit"],
    },
    PrivilegeGroup {
        name: "Mapping",
        root: &[],
        admin: &["Mapping.Modify"],
        user: &["Mapping.Use"],
        audit: &["Mapping.Audit"],
    },
];

/// A privilege in no group, held only by `Administrator` (and root).
const PERMISSIONS_MODIFY: &str = "Permissions.Modify";

/// Every privilege PVE knows; a custom role may only name these.
pub fn valid_privileges() -> &'static BTreeSet<&'static str> {
    static VALID: LazyLock<BTreeSet<&'static str>> = LazyLock::new(|| {
        let mut all = BTreeSet::from([PERMISSIONS_MODIFY]);
        for group in PRIVILEGE_GROUPS {
            for list in [group.root, group.admin, group.user, group.audit] {
                all.extend(list.iter().copied());
            }
        }
        all
    });
    &VALID
}

/// The built-in ("special") roles and their privileges.
pub fn builtin_roles() -> &'static BTreeMap<String, BTreeSet<String>> {
    static ROLES: LazyLock<BTreeMap<String, BTreeSet<String>>> = LazyLock::new(|| {
        let mut roles: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        roles.insert("NoAccess".into(), BTreeSet::new());
        roles.insert(
            "Administrator".into(),
            valid_privileges().iter().map(|p| p.to_string()).collect(),
        );
        for group in PRIVILEGE_GROUPS {
            let non_root = group.admin.iter().chain(group.user).chain(group.audit);
            for privilege in non_root.clone() {
                roles
                    .entry(format!("PVE{}Admin", group.name))
                    .or_default()
                    .insert(privilege.to_string());
                roles
                    .entry("PVEAdmin".into())
                    .or_default()
                    .insert(privilege.to_string());
            }
            if !group.user.is_empty() {
                for privilege in group.user.iter().chain(group.audit) {
                    roles
                        .entry(format!("PVE{}User", group.name))
                        .or_default()
                        .insert(privilege.to_string());
                }
            }
            for privilege in group.audit {
                roles
                    .entry("PVEAuditor".into())
                    .or_default()
                    .insert(privilege.to_string());
            }
        }
        // Mapping.Modify is kept for Administrator and PVEMappingAdmin only.
        roles
            .get_mut("PVEAdmin")
            .expect("PVEAdmin is built")
            .remove("Mapping.Modify");
        roles.insert(
            "PVETemplateUser".into(),
            ["VM.Clone", "VM.Audit"].map(String::from).into(),
        );
        roles
    });
    &ROLES
}

pub fn is_builtin_role(role: &str) -> bool {
    builtin_roles().contains_key(role)
}

/// `user@realm!tokenid` split into user and token name.
pub fn split_token_id(authid: &str) -> Option<(&str, &str)> {
    let (user, token) = authid.rsplit_once('!')?;
    if user.contains('@') && !token.is_empty() {
        Some((user, token))
    } else {
        None
    }
}

pub fn valid_userid(userid: &str) -> bool {
    static USERID: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^[^\s:/!@]{1,60}@[A-Za-z][A-Za-z0-9\.\-_]+$").expect("valid regex")
    });
    USERID.is_match(userid)
}

pub fn valid_token_name(name: &str) -> bool {
    static TOKEN: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^[A-Za-z][A-Za-z0-9\.\-_]+$").expect("valid regex"));
    TOKEN.is_match(name)
}

/// Roles per subject on one ACL path: subject -> role -> propagate.
#[derive(Debug, Clone, Default)]
pub struct AclNode {
    pub users: BTreeMap<String, BTreeMap<String, bool>>,
    pub groups: BTreeMap<String, BTreeMap<String, bool>>,
    pub tokens: BTreeMap<String, BTreeMap<String, bool>>,
}

impl AclNode {
    fn is_empty(&self) -> bool {
        [&self.users, &self.groups, &self.tokens]
            .iter()
            .all(|m| m.values().all(BTreeMap::is_empty))
    }
}

#[derive(Debug, Clone)]
pub struct User {
    pub enable: bool,
    pub expire: i64,
    pub comment: Option<String>,
    pub firstname: Option<String>,
    pub lastname: Option<String>,
    pub email: Option<String>,
    pub tokens: BTreeMap<String, Token>,
}

#[derive(Clone)]
pub struct Token {
    pub privsep: bool,
    pub expire: i64,
    pub comment: Option<String>,
    /// The secret, a UUID as PVE generates them; shown once at creation.
    pub secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("privsep", &self.privsep)
            .field("expire", &self.expire)
            .field("secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Default)]
pub struct Group {
    pub comment: Option<String>,
    pub users: BTreeSet<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Pool {
    pub comment: Option<String>,
    pub vms: BTreeSet<u32>,
    pub storage: BTreeSet<String>,
}

/// What PVE keeps in `user.cfg`: users with their tokens, groups, roles,
/// ACLs and pools.
#[derive(Debug, Clone)]
pub struct UserConfig {
    pub users: BTreeMap<String, User>,
    pub groups: BTreeMap<String, Group>,
    pub roles: BTreeMap<String, BTreeSet<String>>,
    pub acl: BTreeMap<String, AclNode>,
    pub pools: BTreeMap<String, Pool>,
}

/// Privileges on a path: privilege -> whether it propagates (informational).
pub type Privileges = BTreeMap<String, bool>;

pub const ROOT: &str = "root@pam";

impl UserConfig {
    /// A fresh install: only `root@pam`, the built-in roles, no ACL, no pool.
    pub fn new() -> Self {
        let mut users = BTreeMap::new();
        users.insert(
            ROOT.to_string(),
            User {
                enable: true,
                expire: 0,
                comment: None,
                firstname: None,
                lastname: None,
                email: None,
                tokens: BTreeMap::new(),
            },
        );
        Self {
            users,
            groups: BTreeMap::new(),
            roles: builtin_roles().clone(),
            acl: BTreeMap::new(),
            pools: BTreeMap::new(),
        }
    }

    pub fn token(&self, authid: &str) -> Option<&Token> {
        let (user, token) = split_token_id(authid)?;
        self.users.get(user)?.tokens.get(token)
    }

    pub fn pool_of_vm(&self, vmid: u32) -> Option<&str> {
        self.pools
            .iter()
            .find(|(_, pool)| pool.vms.contains(&vmid))
            .map(|(name, _)| name.as_str())
    }

    /// Removes the VM from its pool and drops the ACLs on `/vms/<id>`, as
    /// PVE does when a VM is destroyed.
    pub fn remove_vm_access(&mut self, vmid: u32) {
        self.acl.remove(&format!("/vms/{vmid}"));
        for pool in self.pools.values_mut() {
            pool.vms.remove(&vmid);
        }
    }

    fn is_group_member(&self, group: &str, authid: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|g| g.users.contains(authid))
    }

    /// The roles `authid` has on `path` from explicit ACLs only (no pools).
    pub fn roles(&self, authid: &str, path: &str) -> BTreeMap<String, bool> {
        if authid == ROOT {
            return BTreeMap::from([("Administrator".to_string(), true)]);
        }
        if let Some((user, _)) = split_token_id(authid) {
            let Some(token) = self.token(authid) else {
                return BTreeMap::new();
            };
            if !token.privsep {
                return self.roles(user, path);
            }
        }

        let mut roles: BTreeMap<String, bool> = BTreeMap::new();
        let components: Vec<&str> = if path == "/" {
            vec![""]
        } else {
            path.split('/').collect()
        };
        let mut prefix = String::new();
        for (index, component) in components.iter().enumerate() {
            let is_final = index + 1 == components.len();
            if !component.is_empty() {
                prefix.push('/');
                prefix.push_str(component);
            }
            let level = if prefix.is_empty() { "/" } else { &prefix };
            let Some(node) = self.acl.get(level) else {
                continue;
            };
            let applicable = |entries: &BTreeMap<String, bool>| -> Option<BTreeMap<String, bool>> {
                let found: BTreeMap<String, bool> = entries
                    .iter()
                    .filter(|(_, propagate)| is_final || **propagate)
                    .map(|(role, propagate)| (role.clone(), *propagate))
                    .collect();
                (!found.is_empty()).then_some(found)
            };
            // Token entries, else user entries, else the union of group entries;
            // whichever yields a role replaces what the upper levels gave.
            if let Some(new) = node.tokens.get(authid).and_then(applicable) {
                roles = new;
                continue;
            }
            if let Some(new) = node.users.get(authid).and_then(applicable) {
                roles = new;
                continue;
            }
            let mut from_groups: BTreeMap<String, bool> = BTreeMap::new();
            for (group, entries) in &node.groups {
                if !self.is_group_member(group, authid) {
                    continue;
                }
                if let Some(found) = applicable(entries) {
                    from_groups.extend(found);
                }
            }
            if !from_groups.is_empty() {
                roles = from_groups;
            }
        }
        if let Some(propagate) = roles.get("NoAccess") {
            return BTreeMap::from([("NoAccess".to_string(), *propagate)]);
        }
        roles
    }

    /// The privileges `authid` (a user or a token) has on `path`.
    pub fn privileges(&self, authid: &str, path: &str) -> Privileges {
        if authid == ROOT {
            return self.role_privileges("Administrator", true);
        }
        let owning_user = match split_token_id(authid) {
            Some((user, _)) => {
                let Some(token) = self.token(authid) else {
                    return Privileges::new();
                };
                let user_privileges = self.privileges(user, path);
                if !token.privsep {
                    return user_privileges;
                }
                Some(user_privileges)
            }
            None => {
                if !self.users.contains_key(authid) {
                    return Privileges::new();
                }
                None
            }
        };

        let mut roles = self.roles(authid, path);
        let pool_roles = self.pool_roles(authid, path);
        if !pool_roles.is_empty() && !roles.contains_key("NoAccess") {
            if pool_roles.contains("NoAccess") {
                roles = BTreeMap::from([("NoAccess".to_string(), false)]);
            } else {
                for role in pool_roles {
                    roles.entry(role).or_insert(false);
                }
            }
        }

        let mut privileges = Privileges::new();
        for (role, propagate) in &roles {
            if let Some(set) = self.roles.get(role) {
                for privilege in set {
                    let entry = privileges.entry(privilege.clone()).or_insert(false);
                    *entry = *entry || *propagate;
                }
            }
        }

        match owning_user {
            Some(user_privileges) => privileges
                .into_iter()
                .filter_map(|(privilege, propagate)| {
                    user_privileges
                        .get(&privilege)
                        .map(|user_propagate| (privilege, propagate && *user_propagate))
                })
                .collect(),
            None => privileges,
        }
    }

    fn role_privileges(&self, role: &str, propagate: bool) -> Privileges {
        self.roles
            .get(role)
            .map(|set| set.iter().map(|p| (p.clone(), propagate)).collect())
            .unwrap_or_default()
    }

    /// Roles reaching `path` through the pools it is a member of.
    fn pool_roles(&self, authid: &str, path: &str) -> BTreeSet<String> {
        let member = if let Some(vmid) = path.strip_prefix("/vms/") {
            vmid.parse::<u32>().ok().map(PoolMember::Vm)
        } else {
            path.strip_prefix("/storage/")
                .filter(|id| !id.contains('/'))
                .map(PoolMember::Storage)
        };
        let Some(member) = member else {
            return BTreeSet::new();
        };
        let mut found = BTreeSet::new();
        for (name, pool) in &self.pools {
            let is_member = match member {
                PoolMember::Vm(vmid) => pool.vms.contains(&vmid),
                PoolMember::Storage(id) => pool.storage.contains(id),
            };
            if is_member {
                found.extend(self.roles(authid, &format!("/pool/{name}")).into_keys());
            }
        }
        found
    }

    /// Every path whose privileges `/access/permissions` reports without `path`.
    pub fn effective_permission_paths(&self) -> BTreeSet<String> {
        let mut paths: BTreeSet<String> = [
            "/",
            "/access",
            "/access/groups",
            "/nodes",
            "/pool",
            "/sdn",
            "/storage",
            "/vms",
        ]
        .map(String::from)
        .into();
        paths.extend(
            self.acl
                .iter()
                .filter(|(_, node)| !node.is_empty())
                .map(|(path, _)| path.clone()),
        );
        for pool in self.pools.values() {
            paths.extend(pool.vms.iter().map(|id| format!("/vms/{id}")));
            paths.extend(pool.storage.iter().map(|id| format!("/storage/{id}")));
        }
        paths
    }

    /// Drops ACL entries naming a pool (`delete_pool_acl`).
    pub fn delete_pool_acl(&mut self, pool: &str) {
        self.acl.remove(&format!("/pool/{pool}"));
    }

    /// Drops empty ACL nodes so listings stay tidy.
    pub fn prune_acl(&mut self) {
        for node in self.acl.values_mut() {
            for map in [&mut node.users, &mut node.groups, &mut node.tokens] {
                map.retain(|_, roles| !roles.is_empty());
            }
        }
        self.acl.retain(|_, node| !node.is_empty());
    }
}

impl Default for UserConfig {
    fn default() -> Self {
        Self::new()
    }
}

enum PoolMember<'a> {
    Vm(u32),
    Storage(&'a str),
}

/// `normalize_path`: collapse slashes, no trailing slash, leading slash.
pub fn normalize_path(path: &str) -> Option<String> {
    let mut collapsed = String::new();
    for component in path.split('/').filter(|c| !c.is_empty()) {
        collapsed.push('/');
        collapsed.push_str(component);
    }
    if collapsed.is_empty() {
        collapsed.push('/');
    }
    let allowed = collapsed
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
    allowed.then_some(collapsed)
}

/// The ACL paths PVE accepts for new entries (`check_path`).
pub fn is_valid_acl_path(path: &str) -> bool {
    static PATH: LazyLock<Regex> = LazyLock::new(|| {
        let name = r"[A-Za-z0-9\.\-_]+";
        let alternatives = [
            "/".to_string(),
            "/access".into(),
            "/access/groups".into(),
            format!("/access/groups/{name}"),
            "/access/realm".into(),
            format!("/access/realm/{name}"),
            "/nodes".into(),
            format!("/nodes/{name}"),
            "/pool".into(),
            format!("/pool/{name}(?:/{name}){{0,2}}"),
            "/sdn".into(),
            "/sdn/zones".into(),
            format!("/sdn/zones/{name}"),
            format!("/sdn/zones/{name}/{name}"),
            format!("/sdn/zones/{name}/{name}/[1-9][0-9]{{0,3}}"),
            format!("/sdn/(?:controllers|dns|fabrics|ipams|prefix-lists|route-maps)(?:/{name})?"),
            "/storage".into(),
            format!("/storage/{name}"),
            "/vms".into(),
            "/vms/[1-9][0-9]{2,}".into(),
            "/mapping".into(),
            format!("/mapping/{name}(?:/{name})?"),
        ];
        Regex::new(&format!("^(?:{})$", alternatives.join("|"))).expect("valid regex")
    });
    PATH.is_match(path)
}

/// Permission checks for one caller, with PVE's error messages.
pub struct Perms<'a> {
    pub config: &'a UserConfig,
    pub authid: &'a str,
}

impl<'a> Perms<'a> {
    pub fn new(config: &'a UserConfig, authid: &'a str) -> Self {
        Self { config, authid }
    }

    /// Only the `root@pam` user itself, never a token of it.
    pub fn is_root(&self) -> bool {
        self.authid == ROOT
    }

    pub fn privileges(&self, path: &str) -> Privileges {
        self.config.privileges(self.authid, path)
    }

    pub fn has(&self, path: &str, privileges: &[&str]) -> bool {
        let held = self.privileges(path);
        privileges.iter().all(|p| held.contains_key(*p))
    }

    pub fn has_any(&self, path: &str, privileges: &[&str]) -> bool {
        let held = self.privileges(path);
        privileges.iter().any(|p| held.contains_key(*p))
    }

    /// `$rpcenv->check`: all privileges; the error names the first missing one.
    pub fn check(&self, path: &str, privileges: &[&str]) -> ApiResult<()> {
        let held = self.privileges(path);
        match privileges.iter().find(|p| !held.contains_key(**p)) {
            Some(missing) => Err(ApiError::permission(path, missing)),
            None => Ok(()),
        }
    }

    /// `$rpcenv->check_any`: the error lists the alternatives joined by `|`.
    pub fn check_any(&self, path: &str, privileges: &[&str]) -> ApiResult<()> {
        if self.has_any(path, privileges) {
            Ok(())
        } else {
            Err(ApiError::permission(path, &privileges.join("|")))
        }
    }

    /// `check_vm_perm`: a pool named in the request is tried first.
    pub fn check_vm(
        &self,
        vmid: u32,
        pool: Option<&str>,
        privileges: &[&str],
        any: bool,
    ) -> ApiResult<()> {
        if let Some(pool) = pool {
            let path = format!("/pool/{pool}");
            let ok = if any {
                self.has_any(&path, privileges)
            } else {
                self.has(&path, privileges)
            };
            if ok {
                return Ok(());
            }
        }
        let path = format!("/vms/{vmid}");
        if any {
            self.check_any(&path, privileges)
        } else {
            self.check(&path, privileges)
        }
    }

    /// `check_perm_modify`: Permissions.Modify, or the allocate privilege of
    /// the object kind the path names.
    pub fn check_perm_modify(&self, path: &str) -> ApiResult<()> {
        let mut privileges = vec![PERMISSIONS_MODIFY];
        if path.starts_with("/storage/") {
            privileges.push("Datastore.Allocate");
        } else if path.starts_with("/vms/") {
            privileges.push("VM.Allocate");
        } else if path.starts_with("/pool/") {
            privileges.push("Pool.Allocate");
        }
        self.check_any(path, &privileges)
    }

    pub fn can_modify_permissions(&self, path: &str) -> bool {
        self.check_perm_modify(path).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_user(userid: &str) -> UserConfig {
        let mut config = UserConfig::new();
        config.users.insert(
            userid.to_string(),
            User {
                enable: true,
                expire: 0,
                comment: None,
                firstname: None,
                lastname: None,
                email: None,
                tokens: BTreeMap::new(),
            },
        );
        config
    }

    fn grant(config: &mut UserConfig, path: &str, userid: &str, role: &str, propagate: bool) {
        config
            .acl
            .entry(path.to_string())
            .or_default()
            .users
            .entry(userid.to_string())
            .or_default()
            .insert(role.to_string(), propagate);
    }

    #[test]
    fn builtin_roles_have_pve_privilege_lists() {
        let roles = builtin_roles();
        let vm_admin = &roles["PVEVMAdmin"];
        assert!(vm_admin.contains("VM.Allocate"));
        assert!(vm_admin.contains("VM.PowerMgmt"));
        assert!(vm_admin.contains("VM.GuestAgent.Audit"));
        assert!(!vm_admin.contains("Sys.Audit"));
        assert!(!vm_admin.contains("VM.Monitor"));
        assert_eq!(
            roles["PVEDatastoreUser"],
            ["Datastore.AllocateSpace", "Datastore.Audit"]
                .map(String::from)
                .into()
        );
        assert_eq!(
            roles["PVESDNUser"],
            ["SDN.Audit", "SDN.Use"].map(String::from).into()
        );
        assert!(!roles["PVEAdmin"].contains("Permissions.Modify"));
        assert!(!roles["PVEAdmin"].contains("Sys.Modify"));
        assert!(roles["Administrator"].contains("Permissions.Modify"));
        assert!(!roles.contains_key("PVESysUser"));
        assert!(roles["NoAccess"].is_empty());
    }

    #[test]
    fn deeper_level_replaces_inherited_roles() {
        let mut config = config_with_user("u@pve");
        grant(&mut config, "/", "u@pve", "PVEVMAdmin", true);
        grant(&mut config, "/vms/100", "u@pve", "PVEAuditor", false);
        assert!(
            config
                .privileges("u@pve", "/vms/101")
                .contains_key("VM.Allocate")
        );
        let on_100 = config.privileges("u@pve", "/vms/100");
        assert!(on_100.contains_key("VM.Audit"));
        assert!(!on_100.contains_key("VM.Allocate"));
    }

    #[test]
    fn non_propagating_role_stays_on_its_path() {
        let mut config = config_with_user("u@pve");
        grant(&mut config, "/", "u@pve", "PVEAuditor", false);
        assert!(config.privileges("u@pve", "/").contains_key("Sys.Audit"));
        assert!(config.privileges("u@pve", "/nodes/pve").is_empty());
    }
}
