//! `Upid: FromStr` (provider/src/proxmox/client/upid.rs) on arbitrary text.
//!
//! Invariants, from the type's documentation: a UPID that parses keeps the
//! text PVE sent, so `Display` gives it back byte for byte and parsing that
//! gives an equal value; serde uses the same string form; the accessors are
//! the fields between the colons (the hex ones as numbers).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tenantry_provider::proxmox::client::Upid;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let upid: Upid = match text.parse() {
        Ok(upid) => upid,
        Err(error) => {
            assert_eq!(error.upid, text, "the error names the rejected text");
            assert!(!error.to_string().is_empty());
            return;
        }
    };

    let shown = upid.to_string();
    assert_eq!(shown, text, "Display gives back what was parsed");
    assert_eq!(upid.as_str(), text);
    let again: Upid = shown.parse().expect("a displayed UPID parses");
    assert_eq!(again, upid);

    let json = serde_json::to_string(&upid).expect("a UPID serializes");
    let back: Upid = serde_json::from_str(&json).expect("a serialized UPID deserializes");
    assert_eq!(back, upid);

    // UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:
    let fields: Vec<&str> = text.split(':').collect();
    assert_eq!(fields.len(), 9, "{text:?}");
    assert_eq!(fields[0], "UPID");
    assert_eq!(fields[8], "");
    assert_eq!(upid.node(), fields[1]);
    assert_eq!(u64::from(upid.pid()), hex(fields[2]));
    assert_eq!(upid.pstart(), hex(fields[3]));
    assert_eq!(u64::from(upid.starttime()), hex(fields[4]));
    assert_eq!(upid.task_type(), fields[5]);
    assert_eq!(upid.id(), fields[6]);
    assert_eq!(upid.user(), fields[7]);
    assert!(upid.user().contains('@'));
});

fn hex(field: &str) -> u64 {
    assert!(field.bytes().all(|b| b.is_ascii_hexdigit()), "{field:?}");
    u64::from_str_radix(field, 16).expect("8 or 9 hex digits fit a u64")
}
