//! `/access/…` (pve-access-control): users, API tokens, groups, roles, ACLs
//! and the effective-permission dump.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::error::{ApiError, ApiResult};
use super::params::{Kind, Schema, optional, required, split_list};
use super::permissions::{
    Group, Perms, Token, User, UserConfig, is_builtin_role, is_valid_acl_path, normalize_path,
    split_token_id, valid_privileges, valid_token_name, valid_userid,
};
use super::router::{Call, Reply};
use super::vm_config::random_uuid;

/// Realms of a fresh install.
const REALMS: &[&str] = &["pam", "pve"];

fn realm_of(userid: &str) -> &str {
    userid.rsplit_once('@').map_or("", |(_, realm)| realm)
}

/// The `userid-group` check: the privilege on `/access/groups`, or on a
/// group the (existing) user belongs to.
fn userid_group(perms: &Perms<'_>, config: &UserConfig, userid: &str, privileges: &[&str]) -> bool {
    if !config.users.contains_key(userid) {
        return false;
    }
    if perms.has_any("/access/groups", privileges) {
        return true;
    }
    config.groups.iter().any(|(name, group)| {
        group.users.contains(userid) && perms.has_any(&format!("/access/groups/{name}"), privileges)
    })
}

/// `or(userid-param self, userid-group User.Modify)` of the token methods.
fn check_self_or_user_modify(call: &Call<'_>, userid: &str) -> ApiResult<()> {
    let config = &call.cluster.users;
    let is_self = config.users.contains_key(userid) && call.authid == userid;
    if is_self || userid_group(&call.perms(), config, userid, &["User.Modify"]) {
        Ok(())
    } else {
        Err(ApiError::permission_denied())
    }
}

fn userid_param(call: &Call<'_>) -> ApiResult<String> {
    let userid = call.params.string("userid").unwrap_or_default();
    if !valid_userid(&userid) {
        return Err(ApiError::param(
            "userid",
            "invalid format - value does not look like a valid user name",
        ));
    }
    Ok(userid)
}

fn user_json(userid: &str, user: &User, groups: &[String], full: bool) -> Value {
    let mut value = json!({
        "userid": userid,
        "enable": u8::from(user.enable),
        "expire": user.expire,
        "realm-type": realm_of(userid),
    });
    for (key, field) in [
        ("comment", &user.comment),
        ("firstname", &user.firstname),
        ("lastname", &user.lastname),
        ("email", &user.email),
    ] {
        if let Some(text) = field {
            value[key] = json!(text);
        }
    }
    if !groups.is_empty() {
        value["groups"] = json!(groups.join(","));
    }
    if full {
        value["tokens"] = Value::Array(
            user.tokens
                .iter()
                .map(|(name, token)| {
                    let mut info = token_json(token);
                    info["tokenid"] = json!(name);
                    info
                })
                .collect(),
        );
    }
    value
}

fn token_json(token: &Token) -> Value {
    let mut value = json!({ "privsep": u8::from(token.privsep), "expire": token.expire });
    if let Some(comment) = &token.comment {
        value["comment"] = json!(comment);
    }
    value
}

fn groups_of(config: &UserConfig, userid: &str) -> Vec<String> {
    config
        .groups
        .iter()
        .filter(|(_, g)| g.users.contains(userid))
        .map(|(name, _)| name.clone())
        .collect()
}

// ------------------------------------------------------------------ users

/// GET /access/users — users the caller may see (always itself).
pub fn users(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        optional("enabled", Kind::Boolean),
        optional("full", Kind::Boolean),
    ]))?;
    let full = call.params.flag("full");
    let enabled = call.params.bool("enabled");
    let perms = call.perms();
    let config = &call.cluster.users;
    let caller_user = split_token_id(call.authid).map_or(call.authid, |(u, _)| u);
    let rows: Vec<Value> = config
        .users
        .iter()
        .filter(|(userid, _)| {
            *userid == caller_user
                || userid_group(&perms, config, userid, &["User.Modify", "Sys.Audit"])
        })
        .filter(|(_, user)| enabled.is_none_or(|e| e == user.enable))
        .map(|(userid, user)| user_json(userid, user, &groups_of(config, userid), full))
        .collect();
    Ok(Value::Array(rows).into())
}

/// POST /access/users — Realm.AllocateUser on the realm and User.Modify on
/// `/access/groups` (or on every group named).
pub fn create_user(call: &mut Call<'_>) -> ApiResult<Reply> {
    let userid = userid_param(call)?;
    let realm = realm_of(&userid).to_string();
    let groups = split_list(&call.params.string("groups").unwrap_or_default());
    {
        let perms = call.perms();
        perms.check(&format!("/access/realm/{realm}"), &["Realm.AllocateUser"])?;
        if !perms.has_any("/access/groups", &["User.Modify"]) {
            if groups.is_empty() {
                return Err(ApiError::permission("/access/groups", "User.Modify"));
            }
            for group in &groups {
                perms.check(&format!("/access/groups/{group}"), &["User.Modify"])?;
            }
        }
    }
    call.params.verify(&Schema::new(&[
        required("userid", Kind::String),
        optional("enable", Kind::Boolean),
        optional("expire", Kind::int_min(0)),
        optional("firstname", Kind::String),
        optional("lastname", Kind::String),
        optional("email", Kind::String),
        optional("comment", Kind::String),
        optional("keys", Kind::String),
        optional("password", Kind::String),
        optional("groups", Kind::String),
    ]))?;
    let fail = |m: String| ApiError::internal(format!("create user failed: {m}"));
    if !REALMS.contains(&realm.as_str()) {
        return Err(fail(format!("domain '{realm}' does not exist")));
    }
    let config = &mut call.cluster.users;
    if config.users.contains_key(&userid) {
        return Err(fail(format!("user '{userid}' already exists")));
    }
    for group in &groups {
        if !config.groups.contains_key(group) {
            return Err(fail(format!("no such group '{group}'")));
        }
    }
    let params = &call.params;
    config.users.insert(
        userid.clone(),
        User {
            enable: params.bool("enable").unwrap_or(true),
            expire: params.int("expire").unwrap_or(0),
            comment: params.string("comment"),
            firstname: params.string("firstname"),
            lastname: params.string("lastname"),
            email: params.string("email"),
            tokens: BTreeMap::new(),
        },
    );
    for group in groups {
        if let Some(entry) = config.groups.get_mut(&group) {
            entry.users.insert(userid.clone());
        }
    }
    Ok(Reply::null())
}

/// GET /access/users/{userid} — userid-group [User.Modify, Sys.Audit].
pub fn read_user(call: &mut Call<'_>) -> ApiResult<Reply> {
    let userid = userid_param(call)?;
    if !userid_group(
        &call.perms(),
        &call.cluster.users,
        &userid,
        &["User.Modify", "Sys.Audit"],
    ) {
        return Err(ApiError::permission_denied());
    }
    call.params
        .verify(&Schema::new(&[required("userid", Kind::String)]))?;
    let config = &call.cluster.users;
    let user = config
        .users
        .get(&userid)
        .ok_or_else(|| ApiError::internal(format!("no such user ('{userid}')")))?;
    let mut value = user_json(&userid, user, &groups_of(config, &userid), false);
    value["tokens"] = Value::Object(
        user.tokens
            .iter()
            .map(|(name, token)| (name.clone(), token_json(token)))
            .collect(),
    );
    if let Some(map) = value.as_object_mut() {
        map.remove("userid");
    }
    Ok(value.into())
}

/// PUT /access/users/{userid} — userid-group User.Modify.
pub fn update_user(call: &mut Call<'_>) -> ApiResult<Reply> {
    let userid = userid_param(call)?;
    if !userid_group(
        &call.perms(),
        &call.cluster.users,
        &userid,
        &["User.Modify"],
    ) {
        return Err(ApiError::permission_denied());
    }
    call.params.verify(&Schema::new(&[
        required("userid", Kind::String),
        optional("enable", Kind::Boolean),
        optional("expire", Kind::int_min(0)),
        optional("firstname", Kind::String),
        optional("lastname", Kind::String),
        optional("email", Kind::String),
        optional("comment", Kind::String),
        optional("keys", Kind::String),
        optional("groups", Kind::String),
        optional("append", Kind::Boolean),
    ]))?;
    let params = call.params.clone();
    let config = &mut call.cluster.users;
    let user = config.users.get_mut(&userid).ok_or_else(|| {
        ApiError::internal(format!("update user failed: no such user ('{userid}')"))
    })?;
    if let Some(enable) = params.bool("enable") {
        user.enable = enable;
    }
    if let Some(expire) = params.int("expire") {
        user.expire = expire;
    }
    for (key, field) in [
        ("comment", &mut user.comment),
        ("firstname", &mut user.firstname),
        ("lastname", &mut user.lastname),
        ("email", &mut user.email),
    ] {
        if let Some(text) = params.string(key) {
            *field = Some(text).filter(|t| !t.is_empty());
        }
    }
    if let Some(groups) = params.string("groups") {
        let groups = split_list(&groups);
        if !params.flag("append") {
            for group in config.groups.values_mut() {
                group.users.remove(&userid);
            }
        }
        for group in groups {
            config
                .groups
                .get_mut(&group)
                .ok_or_else(|| {
                    ApiError::internal(format!("update user failed: no such group '{group}'"))
                })?
                .users
                .insert(userid.clone());
        }
    }
    Ok(Reply::null())
}

/// DELETE /access/users/{userid} — Realm.AllocateUser and User.Modify.
pub fn delete_user(call: &mut Call<'_>) -> ApiResult<Reply> {
    let userid = userid_param(call)?;
    {
        let perms = call.perms();
        perms.check(
            &format!("/access/realm/{}", realm_of(&userid)),
            &["Realm.AllocateUser"],
        )?;
        if !userid_group(&perms, &call.cluster.users, &userid, &["User.Modify"]) {
            return Err(ApiError::permission_denied());
        }
    }
    call.params
        .verify(&Schema::new(&[required("userid", Kind::String)]))?;
    let config = &mut call.cluster.users;
    config.users.remove(&userid);
    for group in config.groups.values_mut() {
        group.users.remove(&userid);
    }
    let token_prefix = format!("{userid}!");
    for node in config.acl.values_mut() {
        node.users.remove(&userid);
        node.tokens.retain(|id, _| !id.starts_with(&token_prefix));
    }
    config.prune_acl();
    Ok(Reply::null())
}

// ----------------------------------------------------------------- tokens

fn token_params(call: &Call<'_>) -> ApiResult<(String, String)> {
    let userid = userid_param(call)?;
    let tokenid = call.params.string("tokenid").unwrap_or_default();
    Ok((userid, tokenid))
}

fn token_schema(call: &Call<'_>, extra: &[super::params::Prop]) -> ApiResult<()> {
    let mut props = vec![
        required("userid", Kind::String),
        required("tokenid", Kind::String),
    ];
    props.extend_from_slice(extra);
    call.params.verify(&Schema::new(&props))?;
    let tokenid = call.params.str("tokenid").unwrap_or_default();
    if !valid_token_name(tokenid) {
        return Err(ApiError::param(
            "tokenid",
            "invalid format - value does not match the regex pattern",
        ));
    }
    Ok(())
}

/// GET /access/users/{userid}/token
pub fn tokens(call: &mut Call<'_>) -> ApiResult<Reply> {
    let userid = userid_param(call)?;
    check_self_or_user_modify(call, &userid)?;
    call.params
        .verify(&Schema::new(&[required("userid", Kind::String)]))?;
    let user = call
        .cluster
        .users
        .users
        .get(&userid)
        .ok_or_else(|| ApiError::internal(format!("no such user ('{userid}')")))?;
    let rows = user
        .tokens
        .iter()
        .map(|(name, token)| {
            let mut value = token_json(token);
            value["tokenid"] = json!(name);
            value
        })
        .collect();
    Ok(Value::Array(rows).into())
}

fn no_such_token(userid: &str, tokenid: &str) -> ApiError {
    ApiError::internal(format!("no such token '{tokenid}' for user '{userid}'"))
}

/// GET /access/users/{userid}/token/{tokenid}
pub fn read_token(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (userid, tokenid) = token_params(call)?;
    check_self_or_user_modify(call, &userid)?;
    token_schema(call, &[])?;
    let token = call
        .cluster
        .users
        .users
        .get(&userid)
        .and_then(|u| u.tokens.get(&tokenid))
        .ok_or_else(|| no_such_token(&userid, &tokenid))?;
    Ok(token_json(token).into())
}

/// POST /access/users/{userid}/token/{tokenid} — the secret is returned
/// this once; `privsep` defaults to 1.
pub fn create_token(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (userid, tokenid) = token_params(call)?;
    check_self_or_user_modify(call, &userid)?;
    token_schema(
        call,
        &[
            optional("privsep", Kind::Boolean),
            optional("expire", Kind::int_min(0)),
            optional("comment", Kind::String),
        ],
    )?;
    let privsep = call.params.bool("privsep").unwrap_or(true);
    let expire = call.params.int("expire").unwrap_or(0);
    let comment = call.params.string("comment").filter(|c| !c.is_empty());
    let secret = random_uuid(&mut call.cluster.rng).to_string();
    let user = call
        .cluster
        .users
        .users
        .get_mut(&userid)
        .ok_or_else(|| ApiError::internal(format!("no such user ('{userid}')")))?;
    if user.tokens.contains_key(&tokenid) {
        return Err(ApiError::param("tokenid", "Token already exists."));
    }
    let token = Token {
        privsep,
        expire,
        comment,
        secret: secret.clone(),
    };
    let info = token_json(&token);
    user.tokens.insert(tokenid.clone(), token);
    Ok(json!({
        "info": info,
        "value": secret,
        "full-tokenid": format!("{userid}!{tokenid}"),
    })
    .into())
}

/// PUT /access/users/{userid}/token/{tokenid} — change privsep, expiry,
/// comment; `regenerate` returns a new secret.
pub fn update_token(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (userid, tokenid) = token_params(call)?;
    check_self_or_user_modify(call, &userid)?;
    token_schema(
        call,
        &[
            optional("privsep", Kind::Boolean),
            optional("expire", Kind::int_min(0)),
            optional("comment", Kind::String),
            optional("regenerate", Kind::Boolean),
            optional("delete", Kind::String),
        ],
    )?;
    let params = call.params.clone();
    let secret = random_uuid(&mut call.cluster.rng).to_string();
    let token = call
        .cluster
        .users
        .users
        .get_mut(&userid)
        .and_then(|u| u.tokens.get_mut(&tokenid))
        .ok_or_else(|| no_such_token(&userid, &tokenid))?;
    if let Some(privsep) = params.bool("privsep") {
        token.privsep = privsep;
    }
    if let Some(expire) = params.int("expire") {
        token.expire = expire;
    }
    if let Some(comment) = params.string("comment") {
        token.comment = Some(comment).filter(|c| !c.is_empty());
    }
    for key in split_list(&params.string("delete").unwrap_or_default()) {
        if key != "comment" {
            return Err(ApiError::param("delete", format!("unknown option '{key}'")));
        }
        token.comment = None;
    }
    let mut value = token_json(token);
    if params.flag("regenerate") {
        token.secret = secret.clone();
        value["value"] = json!(secret);
        value["full-tokenid"] = json!(format!("{userid}!{tokenid}"));
    }
    Ok(value.into())
}

/// DELETE /access/users/{userid}/token/{tokenid}
pub fn delete_token(call: &mut Call<'_>) -> ApiResult<Reply> {
    let (userid, tokenid) = token_params(call)?;
    check_self_or_user_modify(call, &userid)?;
    token_schema(call, &[])?;
    let config = &mut call.cluster.users;
    let removed = config
        .users
        .get_mut(&userid)
        .and_then(|u| u.tokens.remove(&tokenid));
    if removed.is_none() {
        return Err(no_such_token(&userid, &tokenid));
    }
    // ACL entries of a token that no longer exists are dropped.
    let full = format!("{userid}!{tokenid}");
    for node in config.acl.values_mut() {
        node.tokens.remove(&full);
    }
    config.prune_acl();
    Ok(Reply::null())
}

// ----------------------------------------------------------------- groups

/// GET /access/groups — groups with User.Modify or Sys.Audit on them.
pub fn groups(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[]))?;
    let perms = call.perms();
    let rows = call
        .cluster
        .users
        .groups
        .iter()
        .filter(|(name, _)| {
            perms.has_any(
                &format!("/access/groups/{name}"),
                &["User.Modify", "Sys.Audit"],
            )
        })
        .map(|(name, group)| {
            let mut value = json!({
                "groupid": name,
                "users": group.users.iter().cloned().collect::<Vec<_>>().join(","),
            });
            if let Some(comment) = &group.comment {
                value["comment"] = json!(comment);
            }
            value
        })
        .collect();
    Ok(Value::Array(rows).into())
}

/// POST /access/groups — Group.Allocate on /access/groups.
pub fn create_group(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.perms().check("/access/groups", &["Group.Allocate"])?;
    call.params.verify(&Schema::new(&[
        required("groupid", Kind::String),
        optional("comment", Kind::String),
    ]))?;
    let groupid = call.params.string("groupid").unwrap_or_default();
    let config = &mut call.cluster.users;
    if config.groups.contains_key(&groupid) {
        return Err(ApiError::internal(format!(
            "create group failed: group '{groupid}' already exists"
        )));
    }
    config.groups.insert(
        groupid,
        Group {
            comment: call.params.string("comment"),
            users: BTreeSet::new(),
        },
    );
    Ok(Reply::null())
}

// ------------------------------------------------------------------ roles

/// GET /access/roles — every caller.
pub fn roles(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[]))?;
    let rows = call
        .cluster
        .users
        .roles
        .iter()
        .map(|(role, privileges)| {
            json!({
                "roleid": role,
                "privs": privileges.iter().cloned().collect::<Vec<_>>().join(","),
                "special": u8::from(is_builtin_role(role)),
            })
        })
        .collect();
    Ok(Value::Array(rows).into())
}

fn parse_privileges(text: &str) -> ApiResult<BTreeSet<String>> {
    let mut privileges = BTreeSet::new();
    for privilege in split_list(text) {
        if !valid_privileges().contains(privilege.as_str()) {
            return Err(ApiError::internal(format!(
                "invalid privilege '{privilege}'"
            )));
        }
        privileges.insert(privilege);
    }
    Ok(privileges)
}

/// POST /access/roles — Sys.Modify on /access; no `PVE` prefix.
pub fn create_role(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.perms().check("/access", &["Sys.Modify"])?;
    call.params.verify(&Schema::new(&[
        required("roleid", Kind::String),
        optional("privs", Kind::String),
    ]))?;
    let role = call.params.string("roleid").unwrap_or_default();
    if role.to_ascii_lowercase().starts_with("pve") {
        return Err(ApiError::param(
            "roleid",
            "cannot use role ID starting with the (case-insensitive) 'PVE' namespace",
        ));
    }
    if call.cluster.users.roles.contains_key(&role) {
        return Err(ApiError::internal(format!(
            "create role failed: role '{role}' already exists"
        )));
    }
    let privileges = parse_privileges(&call.params.string("privs").unwrap_or_default())
        .map_err(|e| ApiError::internal(format!("create role failed: {}", e.message)))?;
    call.cluster.users.roles.insert(role, privileges);
    Ok(Reply::null())
}

/// GET /access/roles/{roleid} — privilege -> 1.
pub fn read_role(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params
        .verify(&Schema::new(&[required("roleid", Kind::String)]))?;
    let role = call.params.string("roleid").unwrap_or_default();
    let privileges = call
        .cluster
        .users
        .roles
        .get(&role)
        .ok_or_else(|| ApiError::internal(format!("role '{role}' does not exist")))?;
    let map: Map<String, Value> = privileges.iter().map(|p| (p.clone(), json!(1))).collect();
    Ok(Value::Object(map).into())
}

/// PUT /access/roles/{roleid} — Sys.Modify on /access; built-ins are fixed.
pub fn update_role(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.perms().check("/access", &["Sys.Modify"])?;
    call.params.verify(&Schema::new(&[
        required("roleid", Kind::String),
        optional("privs", Kind::String),
        optional("append", Kind::Boolean),
    ]))?;
    let role = call.params.string("roleid").unwrap_or_default();
    if is_builtin_role(&role) {
        return Err(ApiError::internal(format!(
            "auto-generated role '{role}' cannot be modified"
        )));
    }
    let privileges = parse_privileges(&call.params.string("privs").unwrap_or_default())?;
    let append = call.params.flag("append");
    let entry = call
        .cluster
        .users
        .roles
        .get_mut(&role)
        .ok_or_else(|| ApiError::internal(format!("role '{role}' does not exist")))?;
    if !append {
        entry.clear();
    }
    entry.extend(privileges);
    Ok(Reply::null())
}

/// DELETE /access/roles/{roleid} — Sys.Modify on /access.
pub fn delete_role(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.perms().check("/access", &["Sys.Modify"])?;
    call.params
        .verify(&Schema::new(&[required("roleid", Kind::String)]))?;
    let role = call.params.string("roleid").unwrap_or_default();
    if is_builtin_role(&role) {
        return Err(ApiError::internal(format!(
            "auto-generated role '{role}' cannot be deleted"
        )));
    }
    let config = &mut call.cluster.users;
    if config.roles.remove(&role).is_none() {
        return Err(ApiError::internal(format!(
            "delete role failed: role '{role}' does not exist"
        )));
    }
    for node in config.acl.values_mut() {
        for map in [&mut node.users, &mut node.groups, &mut node.tokens] {
            for roles in map.values_mut() {
                roles.remove(&role);
            }
        }
    }
    config.prune_acl();
    Ok(Reply::null())
}

// -------------------------------------------------------------------- ACL

/// GET /access/acl — all entries with Sys.Audit on /access, else those on
/// paths where the caller may modify permissions.
pub fn read_acl(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[]))?;
    let perms = call.perms();
    let audit = perms.has("/access", &["Sys.Audit"]);
    let mut rows = Vec::new();
    for (path, node) in &call.cluster.users.acl {
        if !audit && !perms.can_modify_permissions(path) {
            continue;
        }
        for (kind, entries) in [
            ("user", &node.users),
            ("group", &node.groups),
            ("token", &node.tokens),
        ] {
            for (ugid, roles) in entries {
                for (role, propagate) in roles {
                    rows.push(json!({
                        "path": path,
                        "type": kind,
                        "ugid": ugid,
                        "roleid": role,
                        "propagate": u8::from(*propagate),
                    }));
                }
            }
        }
    }
    Ok(Value::Array(rows).into())
}

/// PUT /access/acl — `perm-modify` on the path; without Permissions.Modify
/// only roles whose privileges the caller holds (propagated, when the
/// entry propagates) can be handed out.
pub fn update_acl(call: &mut Call<'_>) -> ApiResult<Reply> {
    let raw_path = call.params.string("path").unwrap_or_default();
    if let Some(path) = normalize_path(&raw_path) {
        call.perms().check_perm_modify(&path)?;
    }
    call.params.verify(&Schema::new(&[
        required("path", Kind::String),
        required("roles", Kind::String),
        optional("users", Kind::String),
        optional("groups", Kind::String),
        optional("tokens", Kind::String),
        optional("propagate", Kind::Boolean),
        optional("delete", Kind::Boolean),
    ]))?;
    let users = split_list(&call.params.string("users").unwrap_or_default());
    let groups = split_list(&call.params.string("groups").unwrap_or_default());
    let tokens = split_list(&call.params.string("tokens").unwrap_or_default());
    if users.is_empty() && groups.is_empty() && tokens.is_empty() {
        let message = "either 'users', 'groups' or 'tokens' is required.";
        return Err(ApiError::params([
            ("users", message),
            ("groups", message),
            ("tokens", message),
        ]));
    }
    let invalid_path = || ApiError::param("path", format!("invalid ACL path '{raw_path}'"));
    let path = normalize_path(&raw_path).ok_or_else(invalid_path)?;
    let delete = call.params.flag("delete");
    if !delete && !is_valid_acl_path(&path) {
        return Err(invalid_path());
    }
    let propagate = call.params.bool("propagate").unwrap_or(true);
    let roles = split_list(&call.params.string("roles").unwrap_or_default());
    let fail = |m: String| ApiError::internal(format!("ACL update failed: {m}"));

    let caller_privileges = call.perms().privileges(&path);
    let mut config = call.cluster.users.clone();
    for role in &roles {
        let Some(role_privileges) = config.roles.get(role) else {
            return Err(fail(format!("role '{role}' does not exist")));
        };
        if !caller_privileges.contains_key("Permissions.Modify") {
            let verb = if delete { "remove" } else { "add" };
            for privilege in role_privileges {
                match caller_privileges.get(privilege) {
                    None => {
                        return Err(ApiError::param(
                            "role",
                            format!(
                                "Cannot {verb} role '{role}' - requires 'Permissions.Modify' or superset of privileges."
                            ),
                        ));
                    }
                    Some(held) if propagate && !held && !delete => {
                        return Err(ApiError::param(
                            "role",
                            format!(
                                "Cannot {verb} role '{role}' with propagation - requires 'Permissions.Modify' or propagated superset of privileges."
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
            if role == "NoAccess" {
                return Err(ApiError::param(
                    "role",
                    format!("Cannot {verb} role '{role}' - requires 'Permissions.Modify'"),
                ));
            }
        }
        let node = config.acl.entry(path.clone()).or_default();
        for group in &groups {
            if !config.groups.contains_key(group) {
                return Err(fail(format!("group '{group}' does not exist")));
            }
            let entry = node.groups.entry(group.clone()).or_default();
            if delete {
                entry.remove(role);
            } else {
                entry.insert(role.clone(), propagate);
            }
        }
        for user in &users {
            if !config.users.contains_key(user) {
                return Err(fail(format!("user '{user}' does not exist")));
            }
            let entry = node.users.entry(user.clone()).or_default();
            if delete {
                entry.remove(role);
            } else {
                entry.insert(role.clone(), propagate);
            }
        }
        for token in &tokens {
            let Some((user, name)) = split_token_id(token) else {
                return Err(ApiError::param(
                    "tokens",
                    format!("invalid token id '{token}'"),
                ));
            };
            match config.users.get(user) {
                None => return Err(fail(format!("no such user ('{user}')"))),
                Some(u) if !u.tokens.contains_key(name) => {
                    return Err(fail(format!("no such token '{name}' for user '{user}'")));
                }
                Some(_) => {}
            }
            let entry = node.tokens.entry(token.clone()).or_default();
            if delete {
                entry.remove(role);
            } else {
                entry.insert(role.clone(), propagate);
            }
        }
    }
    config.prune_acl();
    call.cluster.users = config;
    Ok(Reply::null())
}

// ------------------------------------------------------------ permissions

/// GET /access/permissions — one's own (or one's tokens') effective
/// permissions; another user's need Sys.Audit on /access.
pub fn permissions(call: &mut Call<'_>) -> ApiResult<Reply> {
    call.params.verify(&Schema::new(&[
        optional("userid", Kind::String),
        optional("path", Kind::String),
    ]))?;
    let authid = call.authid.to_string();
    let target = call
        .params
        .string("userid")
        .unwrap_or_else(|| authid.clone());
    let owned_token = split_token_id(&target).is_some_and(|(user, _)| user == authid);
    if target != authid && !owned_token {
        call.perms().check("/access", &["Sys.Audit"])?;
    }
    let config = &call.cluster.users;
    let dump = |path: &str| -> Value {
        let privileges = config.privileges(&target, path);
        Value::Object(
            privileges
                .into_iter()
                .map(|(p, propagate)| (p, json!(u8::from(propagate))))
                .collect(),
        )
    };
    let mut result = Map::new();
    match call.params.string("path") {
        Some(path) => {
            result.insert(path.clone(), dump(&path));
        }
        None => {
            for path in config.effective_permission_paths() {
                let privileges = dump(&path);
                if privileges.as_object().is_some_and(|m| !m.is_empty()) {
                    result.insert(path, privileges);
                }
            }
        }
    }
    Ok(Value::Object(result).into())
}
