//! Request parameters and their verification, after PVE's JSON-schema check.
//!
//! PVE merges path, query and body parameters into one hash, verifies it
//! against the method's schema and reports every offending parameter at once
//! in `400 Parameter verification failed.` with `errors: {param: message}`.
//! Booleans accept 1/0, true/false, yes/no, on/off.

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::{ApiError, ApiResult};

/// What a parameter must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    String,
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    Boolean,
    /// `pve-vmid`: an integer from 100 to 999999999.
    Vmid,
    /// A JSON array (guest agent `exec` command) or a repeated form field.
    Array,
}

impl Kind {
    pub const fn int() -> Self {
        Kind::Integer {
            min: None,
            max: None,
        }
    }

    pub const fn int_min(min: i64) -> Self {
        Kind::Integer {
            min: Some(min),
            max: None,
        }
    }
}

/// One parameter of a method's schema.
#[derive(Debug, Clone, Copy)]
pub struct Prop {
    pub name: &'static str,
    pub kind: Kind,
    pub optional: bool,
}

pub const fn required(name: &'static str, kind: Kind) -> Prop {
    Prop {
        name,
        kind,
        optional: false,
    }
}

pub const fn optional(name: &'static str, kind: Kind) -> Prop {
    Prop {
        name,
        kind,
        optional: true,
    }
}

/// Accepts parameter names by pattern and says their kind.
pub type ExtraProps<'a> = &'a dyn Fn(&str) -> Option<Kind>;

/// A method's parameter schema. `extra` accepts keys by pattern, as the VM
/// config methods accept `net0`…`net31`, `scsi0`…`scsi30` and so on.
pub struct Schema<'a> {
    pub props: &'a [Prop],
    pub extra: Option<ExtraProps<'a>>,
}

impl<'a> Schema<'a> {
    pub fn new(props: &'a [Prop]) -> Self {
        Self { props, extra: None }
    }

    pub fn with_extra(props: &'a [Prop], extra: ExtraProps<'a>) -> Self {
        Self {
            props,
            extra: Some(extra),
        }
    }

    fn kind_of(&self, name: &str) -> Option<Kind> {
        self.props
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.kind)
            .or_else(|| self.extra.and_then(|extra| extra(name)))
    }
}

/// The merged parameters of one call, values kept as PVE receives them.
#[derive(Debug, Clone, Default)]
pub struct Params {
    values: BTreeMap<String, Value>,
}

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a form or query value; a repeated key becomes an array.
    pub fn push_text(&mut self, key: &str, value: &str) {
        match self.values.get_mut(key) {
            Some(Value::Array(items)) => items.push(Value::String(value.to_string())),
            Some(existing) => {
                let first = existing.take();
                *existing = Value::Array(vec![first, Value::String(value.to_string())]);
            }
            None => {
                self.values
                    .insert(key.to_string(), Value::String(value.to_string()));
            }
        }
    }

    /// Adds a JSON body value. Query parameters already present win, as in PVE.
    pub fn push_json(&mut self, key: &str, value: Value) {
        if self.values.contains_key(key) {
            return;
        }
        let value = match value {
            Value::Bool(b) => Value::String(if b { "1" } else { "0" }.to_string()),
            Value::Number(n) => Value::String(n.to_string()),
            Value::Null => return,
            other => other,
        };
        self.values.insert(key.to_string(), value);
    }

    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.values
            .insert(key.to_string(), Value::String(value.into()));
    }

    pub fn contains(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.values.get(key) {
            Some(Value::String(s)) => Some(s.as_str()),
            _ => None,
        }
    }

    /// A string parameter that must be non-empty when present.
    pub fn string(&self, key: &str) -> Option<String> {
        self.str(key).map(str::to_string)
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        self.str(key).and_then(parse_bool)
    }

    pub fn flag(&self, key: &str) -> bool {
        self.bool(key).unwrap_or(false)
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        self.str(key).and_then(|s| s.trim().parse().ok())
    }

    pub fn vmid(&self, key: &str) -> Option<u32> {
        self.int(key).and_then(|v| u32::try_from(v).ok())
    }

    pub fn array(&self, key: &str) -> Vec<String> {
        match self.values.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        }
    }

    /// The parameters whose keys the predicate accepts, as strings.
    pub fn matching(&self, mut accept: impl FnMut(&str) -> bool) -> BTreeMap<String, String> {
        self.values
            .iter()
            .filter(|(k, _)| accept(k))
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect()
    }

    /// Verifies all parameters against the schema; reports every error at once.
    pub fn verify(&self, schema: &Schema<'_>) -> ApiResult<()> {
        let mut errors = BTreeMap::new();
        for prop in schema.props {
            if !prop.optional && !self.values.contains_key(prop.name) {
                errors.insert(
                    prop.name.to_string(),
                    "property is missing and it is not optional".to_string(),
                );
            }
        }
        for (key, value) in &self.values {
            let Some(kind) = schema.kind_of(key) else {
                errors.insert(
                    key.clone(),
                    "property is not defined in schema and the schema does not allow additional properties"
                        .to_string(),
                );
                continue;
            };
            if let Err(message) = check_value(kind, value) {
                errors.insert(key.clone(), message);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::params(errors))
        }
    }
}

fn check_value(kind: Kind, value: &Value) -> Result<(), String> {
    let text = match value {
        Value::String(s) => s.as_str(),
        Value::Array(_) if kind == Kind::Array => return Ok(()),
        other => return Err(format!("type check ('string') failed - got '{other}'")),
    };
    match kind {
        Kind::String | Kind::Array => Ok(()),
        Kind::Boolean => parse_bool(text)
            .map(|_| ())
            .ok_or_else(|| format!("type check ('boolean') failed - got '{text}'")),
        Kind::Integer { min, max } => {
            let n: i64 = text
                .trim()
                .parse()
                .map_err(|_| format!("type check ('integer') failed - got '{text}'"))?;
            if let Some(min) = min
                && n < min
            {
                return Err(format!("value must have a minimum value of {min}"));
            }
            if let Some(max) = max
                && n > max
            {
                return Err(format!("value may have a maximum value of {max}"));
            }
            Ok(())
        }
        Kind::Vmid => check_value(
            Kind::Integer {
                min: Some(100),
                max: Some(999_999_999),
            },
            value,
        ),
    }
}

/// PVE's boolean parsing.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// PVE's `split_list`: values separated by commas, semicolons, spaces or NULs.
pub fn split_list(text: &str) -> Vec<String> {
    text.split(|c: char| c == ',' || c == ';' || c == '\0' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
