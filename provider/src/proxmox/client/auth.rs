//! API-token credentials: `Authorization: PVEAPIToken=<user>@<realm>!<token>=<secret>`.

use std::fmt;
use std::str::FromStr;

use reqwest::header::HeaderValue;

/// Why a token id or secret was refused. Never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("invalid API token id {token_id:?}: {reason} (expected user@realm!tokenname)")]
    InvalidTokenId {
        token_id: String,
        reason: &'static str,
    },
    #[error("invalid API token secret: {reason}")]
    InvalidSecret { reason: &'static str },
}

/// A PVE API token id, `user@realm!tokenname`, e.g. `capmox@pve!capi`.
///
/// The shape follows pve-access-control: the user part is anything without
/// whitespace, `:` or `/`; realm and token name start with a letter and then
/// have at least one of letters, digits, `.`, `-`, `_`. The realm and token
/// name cannot contain `@` or `!`, so splitting at the last `!` and then the
/// last `@` is exact.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TokenId {
    user: String,
    realm: String,
    token: String,
}

impl TokenId {
    pub fn new(
        user: impl Into<String>,
        realm: impl Into<String>,
        token: impl Into<String>,
    ) -> Result<Self, CredentialsError> {
        let (user, realm, token) = (user.into(), realm.into(), token.into());
        let fail = |reason| CredentialsError::InvalidTokenId {
            token_id: format!("{user}@{realm}!{token}"),
            reason,
        };
        if user.is_empty()
            || user
                .chars()
                .any(|c| c.is_whitespace() || c == ':' || c == '/')
        {
            return Err(fail(
                "the user must be non-empty without whitespace, ':' or '/'",
            ));
        }
        if !is_pve_name(&realm) {
            return Err(fail(
                "the realm must be a letter followed by letters, digits, '.', '-', '_'",
            ));
        }
        if !is_pve_name(&token) {
            return Err(fail(
                "the token name must be a letter followed by letters, digits, '.', '-', '_'",
            ));
        }
        Ok(Self { user, realm, token })
    }

    /// The user name without realm (`capmox`).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The authentication realm (`pve`, `pam`, …).
    pub fn realm(&self) -> &str {
        &self.realm
    }

    /// The token's name (`capi`).
    pub fn token_name(&self) -> &str {
        &self.token
    }

    /// The owning user id, `user@realm`.
    pub fn userid(&self) -> String {
        format!("{}@{}", self.user, self.realm)
    }
}

/// `[A-Za-z][A-Za-z0-9.\-_]+` (pve-access-control's realm and token-name rule).
fn is_pve_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

impl FromStr for TokenId {
    type Err = CredentialsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let fail = |reason| CredentialsError::InvalidTokenId {
            token_id: s.to_owned(),
            reason,
        };
        let (userid, token) = s
            .rsplit_once('!')
            .ok_or_else(|| fail("missing '!tokenname'"))?;
        let (user, realm) = userid
            .rsplit_once('@')
            .ok_or_else(|| fail("missing '@realm'"))?;
        Self::new(user, realm, token).map_err(|_| fail("malformed user, realm or token name"))
    }
}

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}!{}", self.user, self.realm, self.token)
    }
}

impl fmt::Debug for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A token id is not secret (PVE logs it); show it for debugging.
        write!(f, "TokenId({self})")
    }
}

/// A PVE API token secret (a UUID on real PVE). It has no `Display`, its
/// `Debug` is redacted, and the only way to read it is
/// [`TokenSecret::expose`], used when building the request header.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(String);

impl TokenSecret {
    /// Surrounding whitespace is dropped: secrets copied into Kubernetes
    /// secrets often end with a newline.
    pub fn new(secret: impl Into<String>) -> Result<Self, CredentialsError> {
        let secret = secret.into();
        let trimmed = secret.trim();
        if trimmed.is_empty() {
            return Err(CredentialsError::InvalidSecret { reason: "empty" });
        }
        // PVE ends the header value at ';' and splits on whitespace, so such a
        // secret could never authenticate; control characters would not even
        // make a valid header.
        if !trimmed.bytes().all(|b| b.is_ascii_graphic() && b != b';') {
            return Err(CredentialsError::InvalidSecret {
                reason: "must be printable ASCII without whitespace or ';'",
            });
        }
        Ok(Self(trimmed.to_owned()))
    }

    /// The secret itself. Only for building the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(<redacted>)")
    }
}

/// An API token: id and secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub token_id: TokenId,
    pub secret: TokenSecret,
}

impl Credentials {
    pub fn new(token_id: TokenId, secret: TokenSecret) -> Self {
        Self { token_id, secret }
    }

    /// From the strings a capmox credentials secret (`token`, `secret`) or a
    /// CSI/CCM config (`token_id`, `token_secret`) holds.
    pub fn parse(token_id: &str, secret: &str) -> Result<Self, CredentialsError> {
        Ok(Self {
            token_id: token_id.parse()?,
            secret: TokenSecret::new(secret)?,
        })
    }

    /// The `Authorization` header value, marked sensitive so hyper and reqwest
    /// never print it.
    pub(crate) fn authorization_header(&self) -> HeaderValue {
        let mut value = HeaderValue::from_str(&format!(
            "PVEAPIToken={}={}",
            self.token_id,
            self.secret.expose()
        ))
        .expect("token id and secret are validated to be printable ASCII");
        value.set_sensitive(true);
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "5e1c7a56-3b0c-4f0e-9a1d-2f6c8b9d0e11";

    #[test]
    fn parses_user_realm_and_token() {
        let id: TokenId = "capmox@pve!capi".parse().unwrap();
        assert_eq!(id.user(), "capmox");
        assert_eq!(id.realm(), "pve");
        assert_eq!(id.token_name(), "capi");
        assert_eq!(id.userid(), "capmox@pve");
        assert_eq!(id.to_string(), "capmox@pve!capi");
    }

    #[test]
    fn user_part_may_contain_at_signs_and_dots() {
        let id: TokenId = "jane.doe@example.com@ldap-corp!tenantry_1".parse().unwrap();
        assert_eq!(id.user(), "jane.doe@example.com");
        assert_eq!(id.realm(), "ldap-corp");
        assert_eq!(id.token_name(), "tenantry_1");
        assert_eq!(id.to_string(), "jane.doe@example.com@ldap-corp!tenantry_1");
    }

    #[test]
    fn rejects_malformed_token_ids() {
        for bad in [
            "",
            "capmox@pve",        // no token
            "capmox!capi",       // no realm
            "@pve!capi",         // no user
            "capmox@p!capi",     // realm too short
            "capmox@1pve!capi",  // realm must start with a letter
            "capmox@pve!c",      // token name too short
            "capmox@pve!ca pi",  // whitespace
            "cap/mox@pve!capi",  // '/' in user
            "capmox@pve!capi!x", // '!' in token name... splits into token "x" (too short)
        ] {
            assert!(bad.parse::<TokenId>().is_err(), "accepted {bad:?}");
        }
        let err = "capmox@pve".parse::<TokenId>().unwrap_err();
        assert!(err.to_string().contains("expected user@realm!tokenname"));
    }

    #[test]
    fn secret_is_trimmed_and_validated() {
        assert_eq!(
            TokenSecret::new(format!("{SECRET}\n")).unwrap().expose(),
            SECRET
        );
        assert!(TokenSecret::new("  ").is_err());
        assert!(TokenSecret::new("abc;def").is_err());
        assert!(TokenSecret::new("abc def").is_err());
        assert!(TokenSecret::new("abc\u{7f}").is_err());
        // The error never repeats the secret.
        let err = TokenSecret::new("top secret").unwrap_err();
        assert!(!err.to_string().contains("top secret"));
    }

    #[test]
    fn credentials_debug_never_shows_the_secret() {
        let credentials = Credentials::parse("capmox@pve!capi", SECRET).unwrap();
        let debug = format!("{credentials:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(debug.contains("<redacted>"));
        assert!(debug.contains("capmox@pve!capi"));
        assert!(!format!("{:#?}", credentials.secret).contains(SECRET));
    }

    #[test]
    fn authorization_header_is_pve_api_token_and_sensitive() {
        let credentials = Credentials::parse("capmox@pve!capi", SECRET).unwrap();
        let header = credentials.authorization_header();
        assert!(header.is_sensitive());
        assert_eq!(
            header.to_str().unwrap(),
            format!("PVEAPIToken=capmox@pve!capi={SECRET}")
        );
        assert!(!format!("{header:?}").contains(SECRET));
    }
}
