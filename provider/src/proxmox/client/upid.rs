//! Unique Process IDs: how PVE names the worker task an API call started.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A PVE task id, e.g.
/// `UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:tenantry@pve!capi:`.
///
/// Format (pve-common `PVE::Tools::upid_decode`):
/// `UPID:<node>:<pid 8 hex>:<pstart 8–9 hex>:<starttime 8 hex>:<type>:<id>:<user>:`.
/// `pstart` may take a ninth digit once a node has been up for ~497 days;
/// `id` may be empty; `user` is `user@realm`, or `user@realm!token` when a
/// token started the task. The original text is kept, so `Display` gives back
/// exactly what PVE sent (which is what its task endpoints expect).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Upid {
    raw: String,
    node: String,
    pid: u32,
    pstart: u64,
    starttime: u32,
    task_type: String,
    id: String,
    user: String,
}

/// Why a string is not a UPID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid UPID {upid:?}: {reason}")]
pub struct UpidParseError {
    /// The rejected text (a UPID carries no secret).
    pub upid: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Upid {
    /// The node the task runs on; its status lives under `/nodes/{node}/tasks`.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The worker's process id on that node.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The worker's process start time, in clock ticks since boot.
    pub fn pstart(&self) -> u64 {
        self.pstart
    }

    /// When the task started, in seconds since the Unix epoch.
    pub fn starttime(&self) -> u32 {
        self.starttime
    }

    /// The task type: `qmclone`, `qmconfig`, `qmstart`, `qmdestroy`, `imgcopy`, …
    pub fn task_type(&self) -> &str {
        &self.task_type
    }

    /// The object the task acts on (for `qmclone`, the *source* vmid); may be empty.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Who started it: `user@realm` or `user@realm!token`.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The text PVE sent.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Node names as pve-common accepts them in a UPID: alphanumerics and inner
/// hyphens.
fn is_node_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
}

fn has_space(s: &str) -> bool {
    s.chars().any(char::is_whitespace)
}

impl FromStr for Upid {
    type Err = UpidParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |reason| UpidParseError {
            upid: s.to_owned(),
            reason,
        };
        let rest = s
            .strip_prefix("UPID:")
            .ok_or_else(|| fail("does not start with \"UPID:\""))?;
        let rest = rest
            .strip_suffix(':')
            .ok_or_else(|| fail("does not end with ':'"))?;
        // No field may contain ':', so a plain split is exact.
        let fields: Vec<&str> = rest.split(':').collect();
        let [node, pid, pstart, starttime, task_type, id, user] = fields[..] else {
            return Err(fail(
                "expected 7 fields between \"UPID:\" and the final ':'",
            ));
        };
        if !is_node_name(node) {
            return Err(fail("node is not a valid node name"));
        }
        if pid.len() != 8 || !is_hex(pid) {
            return Err(fail("pid is not 8 hex digits"));
        }
        if !(8..=9).contains(&pstart.len()) || !is_hex(pstart) {
            return Err(fail("pstart is not 8 or 9 hex digits"));
        }
        if starttime.len() != 8 || !is_hex(starttime) {
            return Err(fail("starttime is not 8 hex digits"));
        }
        if task_type.is_empty() || has_space(task_type) {
            return Err(fail("task type is empty or contains whitespace"));
        }
        if has_space(id) {
            return Err(fail("id contains whitespace"));
        }
        if user.is_empty() || has_space(user) || !user.contains('@') {
            return Err(fail("user is not user@realm[!token]"));
        }
        // The lengths were checked, so these cannot overflow.
        let hex = |v: &str| u64::from_str_radix(v, 16).map_err(|_| fail("bad hex number"));
        Ok(Upid {
            raw: s.to_owned(),
            node: node.to_owned(),
            pid: u32::try_from(hex(pid)?).map_err(|_| fail("pid out of range"))?,
            pstart: hex(pstart)?,
            starttime: u32::try_from(hex(starttime)?)
                .map_err(|_| fail("starttime out of range"))?,
            task_type: task_type.to_owned(),
            id: id.to_owned(),
            user: user.to_owned(),
        })
    }
}

impl fmt::Display for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl fmt::Debug for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Upid({})", self.raw)
    }
}

impl Serialize for Upid {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for Upid {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLONE: &str = "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:";
    const TOKEN: &str =
        "UPID:pve-node-02:00003E8F:0BEEF123:66AA0001:qmstart:105:tenantry@pve!capi:";

    #[test]
    fn parses_a_clone_upid() {
        let upid: Upid = CLONE.parse().unwrap();
        assert_eq!(upid.node(), "pve1");
        assert_eq!(upid.pid(), 0x000A_1B2C);
        assert_eq!(upid.pstart(), 0x0012_D687);
        assert_eq!(upid.starttime(), 0x6650_F1A3);
        assert_eq!(upid.task_type(), "qmclone");
        assert_eq!(upid.id(), "9000");
        assert_eq!(upid.user(), "root@pam");
    }

    #[test]
    fn token_users_keep_the_token_name() {
        let upid: Upid = TOKEN.parse().unwrap();
        assert_eq!(upid.node(), "pve-node-02");
        assert_eq!(upid.user(), "tenantry@pve!capi");
        assert_eq!(upid.task_type(), "qmstart");
    }

    #[test]
    fn nine_digit_pstart_after_long_uptime_is_valid() {
        let upid: Upid = "UPID:pve1:00001234:1000000AB:6650F1A3:qmstop:101:root@pam:"
            .parse()
            .unwrap();
        assert_eq!(upid.pstart(), 0x1_0000_00AB);
    }

    #[test]
    fn empty_id_is_valid() {
        let upid: Upid = "UPID:pve1:00001234:0012D687:6650F1A3:aptupdate::root@pam:"
            .parse()
            .unwrap();
        assert_eq!(upid.id(), "");
        assert_eq!(upid.task_type(), "aptupdate");
    }

    #[test]
    fn display_round_trips_exactly_including_lowercase_hex() {
        for s in [
            CLONE,
            TOKEN,
            "UPID:pve1:000a1b2c:0012d687:6650f1a3:imgcopy::root@pam:",
        ] {
            assert_eq!(s.parse::<Upid>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn serde_uses_the_string_form() {
        let upid: Upid = serde_json::from_str(&format!("\"{TOKEN}\"")).unwrap();
        assert_eq!(
            serde_json::to_string(&upid).unwrap(),
            format!("\"{TOKEN}\"")
        );
        assert!(serde_json::from_str::<Upid>("\"UPID:nope\"").is_err());
    }

    #[test]
    fn rejects_malformed_upids() {
        for bad in [
            "",
            "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam", // no trailing colon
            "upid:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:", // prefix case
            "UPID:pve1:A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:",   // short pid
            "UPID:pve1:000A1B2C:12D687:6650F1A3:qmclone:9000:root@pam:",  // short pstart
            "UPID:pve1:000A1B2C:0012D6870A:6650F1A3:qmclone:9000:root@pam:", // 10-digit pstart
            "UPID:pve1:000A1B2C:0012D687:6650F1A:qmclone:9000:root@pam:", // short starttime
            "UPID:pve1:000A1B2G:0012D687:6650F1A3:qmclone:9000:root@pam:", // non-hex
            "UPID:-pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:", // bad node
            "UPID:pve_1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:", // bad node
            "UPID:pve1:000A1B2C:0012D687:6650F1A3::9000:root@pam:",       // empty type
            "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000::",        // empty user
            "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root:",    // user without realm
            "UPID:pve1:000A1B2C:0012D687:6650F1A3:qm clone:9000:root@pam:", // whitespace
            "UPID:pve1:000A1B2C:0012D687:6650F1A3:qmclone:9000:root@pam:x:", // extra field
        ] {
            assert!(bad.parse::<Upid>().is_err(), "accepted {bad:?}");
        }
    }
}
