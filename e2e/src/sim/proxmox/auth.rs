//! API token authentication as pveproxy does it.
//!
//! The header is `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`
//! (a space may replace the first `=`, the value ends at `;`, is URL-decoded,
//! and the token id and secret are split at the last `=`). Without any
//! credential the answer is `401 No ticket`, with a wrong one
//! `401 Authentication failed!`, both after a delay. Tickets (cookies) are
//! not simulated.

use super::permissions::{UserConfig, split_token_id};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("No ticket")]
    NoTicket,
    #[error("Authentication failed!")]
    Failed { reason: String },
}

/// Extracts the `PVEAPIToken` value from an Authorization header.
pub fn token_value(header: &str) -> Option<String> {
    const KEY: &str = "PVEAPIToken";
    let mut search = header;
    loop {
        let index = search.find(KEY)?;
        let at_word_start = index == 0
            || search[..index]
                .chars()
                .next_back()
                .is_some_and(char::is_whitespace);
        let rest = &search[index + KEY.len()..];
        if at_word_start && (rest.starts_with('=') || rest.starts_with(' ')) {
            let value = rest[1..].split(';').next().unwrap_or_default();
            return Some(percent_decode(value));
        }
        search = rest;
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && index + 2 < bytes.len() + 1
            && let Some(byte) = text
                .get(index + 1..index + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Verifies the header against `user.cfg`; returns the token id on success.
pub fn authenticate(users: &UserConfig, header: Option<&str>) -> Result<String, AuthError> {
    let fail = |reason: &str| AuthError::Failed {
        reason: reason.to_string(),
    };
    let Some(value) = header.and_then(token_value) else {
        return Err(AuthError::NoTicket);
    };
    if value.is_empty() {
        return Err(fail("no API token specified"));
    }
    let (token_id, secret) = value
        .rsplit_once('=')
        .ok_or_else(|| fail("no tokenid specified"))?;
    let (userid, token_name) = split_token_id(token_id).ok_or_else(|| fail("invalid token id"))?;
    let user = users
        .users
        .get(userid)
        .ok_or_else(|| fail("no such user"))?;
    let now = chrono::Utc::now().timestamp();
    if !user.enable || (user.expire > 0 && user.expire < now) {
        return Err(fail("user account disabled or expired"));
    }
    let token = user
        .tokens
        .get(token_name)
        .ok_or_else(|| fail("no such token"))?;
    if token.expire > 0 && token.expire < now {
        return Err(fail("token access expired"));
    }
    if token.secret != secret {
        return Err(fail("invalid token value"));
    }
    Ok(token_id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_value_follows_pveproxy_parsing() {
        assert_eq!(
            token_value("PVEAPIToken=root@pam!sim=abc-def").as_deref(),
            Some("root@pam!sim=abc-def")
        );
        assert_eq!(
            token_value("PVEAPIToken root@pam!sim=abc;junk").as_deref(),
            Some("root@pam!sim=abc")
        );
        assert_eq!(
            token_value("PVEAPIToken=a%40pve!t=x").as_deref(),
            Some("a@pve!t=x")
        );
        assert_eq!(token_value("Bearer xyz"), None);
    }
}
