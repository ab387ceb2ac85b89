//! The receipt body (RFC 8785 JSON inside a DSSE envelope), what an appender sends, and the
//! hybrid logical clock receiptd stamps on every body.

use std::fmt;

use crate::budget::{BudgetKey, check_keys};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest integer a body may carry: JSON numbers above 2^53 do not survive every parser.
pub const MAX_SAFE_INT: u64 = (1 << 53) - 1;
/// The largest append request receiptd takes.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// The most requests one batch write to `append` carries.
pub const MAX_BATCH_REQUESTS: usize = 256;
/// The largest batch write to `append` (within the 1 MiB msize receiptd's clients negotiate).
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Boot,
    Decision,
    Effect,
    Query,
    Cap,
    Checkpoint,
    Conflict,
    Withdrawn,
    /// An operator accepted a tool definition (an MCP server's tool, pinned by its digest).
    Accept,
    /// This host's namespace called a peer's tool over a keyed mount: nsd's record of the
    /// call, naming the peer's receipt of it (docs/distribution.md, "Receipts on both sides").
    Remote,
}

impl Kind {
    /// Query receipts are chained unsigned and covered by signed checkpoints; every other kind is
    /// signed one by one.
    pub fn signed(self) -> bool {
        self != Kind::Query
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Boot => "boot",
            Kind::Decision => "decision",
            Kind::Effect => "effect",
            Kind::Query => "query",
            Kind::Cap => "cap",
            Kind::Checkpoint => "checkpoint",
            Kind::Conflict => "conflict",
            Kind::Withdrawn => "withdrawn",
            Kind::Accept => "accept",
            Kind::Remote => "remote",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Hybrid logical clock (Kulkarni et al. 2014): wall milliseconds, a counter for events within
/// one millisecond (or while the wall clock is behind), and the node that stamped it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hlc {
    pub wall_ms: u64,
    pub counter: u64,
    pub node: String,
}

impl Hlc {
    /// The next stamp after `self` given the wall clock `now_ms`: never goes backwards, even when
    /// the wall clock steps back.
    pub fn next(&self, now_ms: u64) -> Hlc {
        if now_ms > self.wall_ms {
            Hlc {
                wall_ms: now_ms,
                counter: 0,
                node: self.node.clone(),
            }
        } else {
            Hlc {
                wall_ms: self.wall_ms,
                counter: self.counter + 1,
                node: self.node.clone(),
            }
        }
    }

    pub fn is_after(&self, other: &Hlc) -> bool {
        (self.wall_ms, self.counter) > (other.wall_ms, other.counter)
    }
}

/// The signed (or chained) body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Body {
    pub v: u32,
    pub scope: String,
    pub seq: u64,
    /// Hex SHA-256 of the previous entry's canonical envelope; 64 zeros for seq 0.
    pub prev: String,
    pub kind: Kind,
    pub hlc: Hlc,
    pub subject: Value,
    pub digests: Value,
    pub policy_hash: Option<String>,
    /// The appending daemon, named by receiptd from the connection's uid, never by the caller.
    pub appender: String,
}

impl Body {
    pub fn canonical(&self) -> Vec<u8> {
        warren_jcs::to_vec(self).expect("a body always serialises")
    }
}

pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What an appender writes to `append`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendRequest {
    pub scope: String,
    pub kind: Kind,
    #[serde(default)]
    pub subject: Value,
    #[serde(default)]
    pub digests: Value,
    #[serde(default)]
    pub policy_hash: Option<String>,
    /// The namespace chain the receipt is charged to (the gate's and toolfs's, from nsd's
    /// lineage; see `budget`). Not part of the receipt.
    #[serde(default)]
    pub budgets: Vec<BudgetKey>,
}

impl AppendRequest {
    /// Parses and validates a request: size, duplicate keys, integers beyond ±2^53, non-finite
    /// numbers, the scope's spelling and the digests' shape. Malformed input is refused, never
    /// repaired.
    pub fn parse(bytes: &[u8]) -> Result<AppendRequest, String> {
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(format!(
                "request is {} bytes; the limit is {MAX_REQUEST_BYTES}",
                bytes.len()
            ));
        }
        Self::from_value(parse_strict(bytes)?)
    }

    /// Parses one write to `append`: a request, or a batch (a JSON array of 1 to
    /// [`MAX_BATCH_REQUESTS`] requests, appended all or none). A batch may be at most
    /// [`MAX_BATCH_BYTES`], and each of its requests at most [`MAX_REQUEST_BYTES`] as it
    /// re-serialises.
    pub fn parse_write(bytes: &[u8]) -> Result<(Vec<AppendRequest>, bool), String> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'[') {
            return Ok((vec![Self::parse(bytes)?], false));
        }
        if bytes.len() > MAX_BATCH_BYTES {
            return Err(format!(
                "batch is {} bytes; the limit is {MAX_BATCH_BYTES}",
                bytes.len()
            ));
        }
        let Value::Array(items) = parse_strict(bytes)? else {
            return Err("batch: not a JSON array".into());
        };
        if items.is_empty() || items.len() > MAX_BATCH_REQUESTS {
            return Err(format!(
                "batch has {} requests; it must have 1 to {MAX_BATCH_REQUESTS}",
                items.len()
            ));
        }
        let large = bytes.len() > MAX_REQUEST_BYTES;
        let requests = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                if large {
                    let size = serde_json::to_vec(&item).map_or(usize::MAX, |v| v.len());
                    if size > MAX_REQUEST_BYTES {
                        return Err(format!(
                            "batch request {i}: {size} bytes; the limit is {MAX_REQUEST_BYTES}"
                        ));
                    }
                }
                Self::from_value(item).map_err(|e| format!("batch request {i}: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok((requests, true))
    }

    fn from_value(value: Value) -> Result<AppendRequest, String> {
        let req: AppendRequest =
            serde_json::from_value(value).map_err(|e| format!("request: {e}"))?;
        check_scope(&req.scope)?;
        check_numbers(&req.subject, "subject")?;
        match &req.digests {
            Value::Null => {}
            Value::Object(map) => {
                if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!("digests.{k}: every digest must be a string"));
                }
            }
            _ => return Err("digests: must be an object of strings".into()),
        }
        if let Some(p) = &req.policy_hash
            && (p.is_empty() || p.len() > 256)
        {
            return Err("policy_hash: must be 1 to 256 characters".into());
        }
        if !req.budgets.is_empty() {
            check_keys(&req.budgets)?;
        }
        Ok(req)
    }
}

/// Names at the root of `/receipts` that are not scopes.
pub const RESERVED_NAMES: [&str; 4] = ["append", "keys", "ctl", "signer"];

/// A scope is a path element of `/receipts`: 1 to 128 of `[A-Za-z0-9._:-]`, not `.`, `..` or a
/// reserved root name.
pub fn check_scope(scope: &str) -> Result<(), String> {
    let ok = !scope.is_empty()
        && !RESERVED_NAMES.contains(&scope)
        && scope.len() <= 128
        && scope != "."
        && scope != ".."
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "scope {scope:?}: must be 1-128 of [A-Za-z0-9._:-], not . or .. or {RESERVED_NAMES:?}"
        ))
    }
}

fn check_numbers(v: &Value, at: &str) -> Result<(), String> {
    match v {
        Value::Number(n) => {
            let ok = if let Some(i) = n.as_i64() {
                i.unsigned_abs() <= MAX_SAFE_INT
            } else if n.as_u64().is_some() {
                false
            } else {
                n.as_f64().is_some_and(f64::is_finite)
            };
            if ok {
                Ok(())
            } else {
                Err(format!("{at}: number {n} is beyond ±2^53 or not finite"))
            }
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| check_numbers(x, &format!("{at}[{i}]"))),
        Value::Object(map) => map
            .iter()
            .try_for_each(|(k, x)| check_numbers(x, &format!("{at}.{k}"))),
        _ => Ok(()),
    }
}

/// Parses JSON, refusing duplicate object keys anywhere (serde_json would keep the last one).
pub fn parse_strict(bytes: &[u8]) -> Result<Value, String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    struct Strict;
    impl<'de> DeserializeSeed<'de> for Strict {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(StrictVisitor)
        }
    }
    struct StrictVisitor;
    impl<'de> Visitor<'de> for StrictVisitor {
        type Value = Value;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
            serde_json::Number::from_f64(v)
                .map(Value::Number)
                .ok_or_else(|| E::custom("non-finite number"))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut out = Vec::new();
            while let Some(v) = seq.next_element_seed(Strict)? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                }
                let v = map.next_value_seed(Strict)?;
                out.insert(key, v);
            }
            Ok(Value::Object(out))
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = Strict
        .deserialize(&mut de)
        .map_err(|e| format!("request is not valid JSON: {e}"))?;
    de.end()
        .map_err(|e| format!("request has trailing data: {e}"))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hlc_never_goes_backwards() {
        let h = Hlc {
            wall_ms: 1000,
            counter: 3,
            node: "n".into(),
        };
        let back = h.next(10);
        assert!(back.is_after(&h));
        assert_eq!((back.wall_ms, back.counter), (1000, 4));
        let fwd = back.next(2000);
        assert_eq!((fwd.wall_ms, fwd.counter), (2000, 0));
    }

    #[test]
    fn malformed_requests_are_refused() {
        let ok = br#"{"scope":"s1","kind":"query","subject":{"tool":"fs_read"},"digests":{"args":"sha256:00"}}"#;
        assert!(AppendRequest::parse(ok).is_ok());
        for bad in [
            &br#"{"scope":"s1","kind":"query","kind":"cap"}"#[..],
            br#"{"scope":"s1","kind":"query","subject":{"a":1,"a":2}}"#,
            br#"{"scope":"s1","kind":"query","subject":{"n":9007199254740993}}"#,
            br#"{"scope":"../x","kind":"query"}"#,
            br#"{"scope":"s1","kind":"nope"}"#,
            br#"{"scope":"s1","kind":"query","extra":1}"#,
            br#"{"scope":"s1","kind":"query","digests":{"a":1}}"#,
            br#"{"scope":"s1","kind":"query"} x"#,
        ] {
            assert!(
                AppendRequest::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
