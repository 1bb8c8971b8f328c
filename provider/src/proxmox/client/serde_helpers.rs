//! Lenient (de)serialisation for the shapes PVE actually emits.
//!
//! PVE's Perl backend types its JSON loosely: booleans come out as `0`/`1`,
//! numbers are sometimes strings (`/cluster/nextid` returns `"105"`, a VM
//! config's `memory` is `"2048"`, and since PVE 8.1 may be the property string
//! `"current=2048"`), and optional keys are simply absent. The helpers here
//! accept every form seen in the wild so a PVE minor release does not break
//! decoding, and serialise booleans the way PVE documents them (`0`/`1`).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};
use serde_json::Value;

/// Numbers PVE may send as JSON numbers or as strings.
pub(crate) trait LenientNumber: Sized {
    fn from_value(value: &Value) -> Option<Self>;
}

macro_rules! lenient_integer {
    ($($t:ty),*) => {$(
        impl LenientNumber for $t {
            fn from_value(value: &Value) -> Option<Self> {
                match value {
                    Value::Number(n) => n
                        .as_u64()
                        .and_then(|v| <$t>::try_from(v).ok())
                        .or_else(|| n.as_i64().and_then(|v| <$t>::try_from(v).ok()))
                        // Integral floats (`2048.0`) appear in some RRD-derived fields.
                        .or_else(|| {
                            n.as_f64()
                                .filter(|f| f.fract() == 0.0)
                                .and_then(|f| <$t>::try_from(f as i128).ok())
                        }),
                    Value::String(s) => s.trim().parse::<$t>().ok(),
                    Value::Bool(b) => Some(<$t>::from(*b)),
                    _ => None,
                }
            }
        }
    )*};
}

lenient_integer!(u8, u16, u32, u64, i64);

impl LenientNumber for f64 {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
}

/// A number that may arrive as a JSON number or a numeric string.
pub(crate) fn number<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: LenientNumber,
{
    let value = Value::deserialize(deserializer)?;
    T::from_value(&value).ok_or_else(|| D::Error::custom(format!("expected a number, got {value}")))
}

/// Like [`number`], for optional fields: `null` and `""` mean absent.
/// Use with `#[serde(default)]`.
pub(crate) fn opt_number<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: LenientNumber,
{
    let value = Value::deserialize(deserializer)?;
    match &value {
        Value::Null => Ok(None),
        Value::String(s) if s.trim().is_empty() => Ok(None),
        _ => T::from_value(&value)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected a number, got {value}"))),
    }
}

/// PVE's booleans: `0`/`1` (the documented output), JSON booleans, and the
/// strings PVE's own `parse_boolean` accepts. `null` is false.
/// Use with `#[serde(default)]`.
pub(crate) fn bool_lenient<'de, D>(deserializer: D) -> Result<bool, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Value::deserialize(deserializer)?;
    parse_bool(&value).ok_or_else(|| D::Error::custom(format!("expected a boolean, got {value}")))
}

/// Like [`bool_lenient`], keeping "absent" apart from "false".
pub(crate) fn opt_bool_lenient<'de, D>(deserializer: D) -> Result<Option<bool>, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Value::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    parse_bool(&value)
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("expected a boolean, got {value}")))
}

pub(crate) fn parse_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Null => Some(false),
        Value::Bool(b) => Some(*b),
        Value::Number(n) => n.as_f64().map(|f| f != 0.0),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "on" | "yes" | "true" => Some(true),
            "0" | "off" | "no" | "false" | "" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// A VM config's `memory`: `2048`, `"2048"`, or (PVE 8.1+, where memory became
/// a property string for virtio-mem) `"current=2048"`, possibly with more keys.
pub(crate) fn opt_memory_mib<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Value::deserialize(deserializer)?;
    match &value {
        Value::Null => Ok(None),
        Value::String(s) => {
            let current = s
                .split(',')
                .find_map(|part| match part.split_once('=') {
                    Some(("current", v)) => Some(v),
                    Some(_) => None,
                    None => Some(part),
                })
                .unwrap_or_default();
            current
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| D::Error::custom(format!("unparseable memory value {s:?}")))
        }
        _ => u64::from_value(&value)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected memory in MiB, got {value}"))),
    }
}

/// Any scalar as a string: PVE sometimes sends numbers where a string is
/// expected (a VM `name` of `123`, error values in `errors`).
pub(crate) fn opt_string_lenient<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Value::deserialize(deserializer)?;
    Ok(value_to_string(&value))
}

pub(crate) fn value_to_string(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "1" } else { "0" }.to_owned()),
        other => Some(other.to_string()),
    }
}

/// Serialises an optional boolean request parameter as PVE documents it:
/// `1` or `0` (pair with `skip_serializing_if = "Option::is_none"`).
pub(crate) fn opt_bool_as_int<S: Serializer>(
    value: &Option<bool>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(b) => serializer.serialize_u8(u8::from(*b)),
        None => serializer.serialize_none(),
    }
}

/// Splits PVE's list strings: tags are `;`-separated (older releases wrote
/// `,` or spaces), storage content types are `,`-separated.
pub(crate) fn split_list(value: &str) -> Vec<String> {
    value
        .split([';', ',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Sample {
        #[serde(deserialize_with = "number")]
        id: u32,
        #[serde(default, deserialize_with = "opt_number")]
        maybe: Option<u64>,
        #[serde(default, deserialize_with = "bool_lenient")]
        flag: bool,
        #[serde(default, deserialize_with = "opt_bool_lenient")]
        tri: Option<bool>,
        #[serde(default, deserialize_with = "opt_memory_mib")]
        memory: Option<u64>,
        #[serde(default, deserialize_with = "opt_string_lenient")]
        name: Option<String>,
    }

    fn parse(json: &str) -> Sample {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn numbers_arrive_as_numbers_or_strings() {
        assert_eq!(parse(r#"{"id": 105}"#).id, 105);
        assert_eq!(parse(r#"{"id": "105"}"#).id, 105);
        assert_eq!(
            parse(r#"{"id": 105, "maybe": "8589934592"}"#).maybe,
            Some(8_589_934_592)
        );
        assert_eq!(parse(r#"{"id": 105, "maybe": 2048.0}"#).maybe, Some(2048));
        assert_eq!(parse(r#"{"id": 105, "maybe": ""}"#).maybe, None);
        assert_eq!(parse(r#"{"id": 105, "maybe": null}"#).maybe, None);
        assert_eq!(parse(r#"{"id": 105}"#).maybe, None);
    }

    #[test]
    fn non_numbers_are_rejected() {
        assert!(serde_json::from_str::<Sample>(r#"{"id": "abc"}"#).is_err());
        assert!(serde_json::from_str::<Sample>(r#"{"id": -1}"#).is_err());
        assert!(serde_json::from_str::<Sample>(r#"{"id": 1.5}"#).is_err());
    }

    #[test]
    fn booleans_arrive_as_zero_one_or_strings() {
        assert!(parse(r#"{"id": 1, "flag": 1}"#).flag);
        assert!(!parse(r#"{"id": 1, "flag": 0}"#).flag);
        assert!(parse(r#"{"id": 1, "flag": "1"}"#).flag);
        assert!(parse(r#"{"id": 1, "flag": true}"#).flag);
        assert!(!parse(r#"{"id": 1}"#).flag);
        assert_eq!(parse(r#"{"id": 1}"#).tri, None);
        assert_eq!(parse(r#"{"id": 1, "tri": 0}"#).tri, Some(false));
        assert!(serde_json::from_str::<Sample>(r#"{"id": 1, "flag": "maybe"}"#).is_err());
    }

    #[test]
    fn memory_accepts_plain_and_property_string_forms() {
        assert_eq!(parse(r#"{"id": 1, "memory": 2048}"#).memory, Some(2048));
        assert_eq!(parse(r#"{"id": 1, "memory": "2048"}"#).memory, Some(2048));
        assert_eq!(
            parse(r#"{"id": 1, "memory": "current=4096"}"#).memory,
            Some(4096)
        );
        assert_eq!(
            parse(r#"{"id": 1, "memory": "current=4096,foo=1"}"#).memory,
            Some(4096)
        );
        assert!(serde_json::from_str::<Sample>(r#"{"id": 1, "memory": "lots"}"#).is_err());
    }

    #[test]
    fn scalar_names_become_strings() {
        assert_eq!(
            parse(r#"{"id": 1, "name": 123}"#).name.as_deref(),
            Some("123")
        );
        assert_eq!(
            parse(r#"{"id": 1, "name": "web"}"#).name.as_deref(),
            Some("web")
        );
    }

    #[test]
    fn lists_split_on_every_separator_pve_has_used() {
        assert_eq!(split_list("a;b;;c"), ["a", "b", "c"]);
        assert_eq!(
            split_list("iso,vztmpl, backup"),
            ["iso", "vztmpl", "backup"]
        );
        assert!(split_list("").is_empty());
    }

    #[test]
    fn booleans_serialise_as_zero_one() {
        #[derive(serde::Serialize)]
        struct Form {
            #[serde(
                serialize_with = "opt_bool_as_int",
                skip_serializing_if = "Option::is_none"
            )]
            full: Option<bool>,
            #[serde(
                serialize_with = "opt_bool_as_int",
                skip_serializing_if = "Option::is_none"
            )]
            purge: Option<bool>,
            #[serde(
                serialize_with = "opt_bool_as_int",
                skip_serializing_if = "Option::is_none"
            )]
            skiplock: Option<bool>,
        }
        let form = Form {
            full: Some(true),
            purge: Some(false),
            skiplock: None,
        };
        assert_eq!(
            crate::proxmox::client::test_support::form_body(&form),
            "full=1&purge=0"
        );
    }
}
