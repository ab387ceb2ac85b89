//! Call arguments: parsed once, strictly; validated against the tool's schema; canonicalised.
//!
//! serde_json on its own takes the last of two duplicate keys and turns an integer too large for
//! an f64 into a rounded float. Two parties reading "the same" arguments could then disagree about
//! what was asked, so the parse here refuses both: a [`DeserializeSeed`] over serde_json's own
//! tokenizer that rejects a duplicate key, a non-finite number and any integral number beyond
//! ±2^53, and names the JSON Pointer where it found it. The bytes the tool receives are the
//! RFC 8785 canonical form of what was parsed, never the caller's text.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The largest magnitude an integer may have: beyond it an IEEE double (what RFC 8785 and every
/// JavaScript peer uses) no longer holds every integer exactly.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// Arguments that passed every check, with the exact bytes the tool will be given.
#[derive(Debug, Clone)]
pub struct Arguments {
    pub value: Value,
    /// RFC 8785 (JCS) form of `value`.
    pub canonical: Vec<u8>,
}

/// Why arguments were refused. The message names the field as a JSON Pointer (`(root)` for the
/// whole document).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentError(pub String);

impl fmt::Display for ArgumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgumentError {}

/// Parses `bytes` strictly (see the module doc). The document must be one JSON object.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, ArgumentError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ArgumentError(
            "(root): no arguments were written; write one JSON object before reading".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictSeed {
        pointer: String::new(),
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v))
    .map_err(|e| ArgumentError(e.to_string()))?;
    if !value.is_object() {
        return Err(ArgumentError(format!(
            "(root): arguments must be a JSON object, not {}",
            type_name(&value)
        )));
    }
    Ok(value)
}

/// Validates a parsed document against a compiled schema; on failure the message lists (at most
/// five) violations, each prefixed with the field's JSON Pointer.
pub fn validate(validator: &jsonschema::Validator, value: &Value) -> Result<(), ArgumentError> {
    let messages: Vec<String> = validator
        .iter_errors(value)
        .take(5)
        .map(|e| format!("{}: {}", pointer_or_root(e.instance_path().as_str()), e))
        .collect();
    if messages.is_empty() {
        Ok(())
    } else {
        Err(ArgumentError(messages.join("; ")))
    }
}

/// Strict parse, schema validation and RFC 8785 canonicalisation, in that order.
pub fn prepare(
    bytes: &[u8],
    validator: &jsonschema::Validator,
) -> Result<Arguments, ArgumentError> {
    let value = parse_strict(bytes)?;
    validate(validator, &value)?;
    let canonical = warren_jcs::value_to_vec(&value)
        .map_err(|e| ArgumentError(format!("(root): cannot canonicalise: {e}")))?;
    Ok(Arguments { value, canonical })
}

fn pointer_or_root(pointer: &str) -> &str {
    if pointer.is_empty() {
        "(root)"
    } else {
        pointer
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Appends one RFC 6901 reference token to a JSON Pointer.
fn child_pointer(parent: &str, token: &str) -> String {
    let escaped = token.replace('~', "~0").replace('/', "~1");
    format!("{parent}/{escaped}")
}

/// Names the field in an error the tokenizer raised (e.g. "number out of range"); errors raised
/// here already name theirs.
fn at_pointer<E: de::Error>(pointer: &str, err: E) -> E {
    let msg = err.to_string();
    if msg.starts_with('/') || msg.starts_with("(root)") {
        return err;
    }
    let msg = msg.split(" at line ").next().unwrap_or(&msg);
    E::custom(format!("{pointer}: {msg}"))
}

struct StrictSeed {
    pointer: String,
}

impl StrictSeed {
    fn refuse<E: de::Error>(&self, what: fmt::Arguments<'_>) -> E {
        E::custom(format!("{}: {}", pointer_or_root(&self.pointer), what))
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        if v > MAX_SAFE_INTEGER {
            return Err(self.refuse(format_args!("integer {v} is beyond ±2^53")));
        }
        Ok(Value::Number(v.into()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        if v.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(self.refuse(format_args!("integer {v} is beyond ±2^53")));
        }
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        if !v.is_finite() {
            return Err(self.refuse(format_args!("non-finite number")));
        }
        // An integral float this large is most often an integer literal that overflowed u64 or
        // lost precision; it cannot be told apart from one, so it is refused too.
        if v.abs() > MAX_SAFE_INTEGER as f64 && v.fract() == 0.0 {
            return Err(self.refuse(format_args!("number {v:e} is an integer beyond ±2^53")));
        }
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| self.refuse(format_args!("non-finite number")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let seed = StrictSeed {
                pointer: child_pointer(&self.pointer, &items.len().to_string()),
            };
            let pointer = seed.pointer.clone();
            match seq
                .next_element_seed(seed)
                .map_err(|e| at_pointer(&pointer, e))?
            {
                Some(v) => items.push(v),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(self.refuse(format_args!("duplicate key {key:?}")));
            }
            let pointer = child_pointer(&self.pointer, &key);
            let value = map
                .next_value_seed(StrictSeed {
                    pointer: pointer.clone(),
                })
                .map_err(|e| at_pointer(&pointer, e))?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_strict(text.as_bytes()).unwrap_err().0
    }

    #[test]
    fn accepts_plain_objects() {
        let v =
            parse_strict(br#"{"a":[1,-2,3.5,"x",null,true],"b":{"c":9007199254740992}}"#).unwrap();
        assert_eq!(v["b"]["c"], 9007199254740992u64);
    }

    #[test]
    fn refuses_duplicate_keys_naming_the_object() {
        let m = err(r#"{"a":{"b":1,"b":2}}"#);
        assert!(m.starts_with(r#"/a: duplicate key "b""#), "{m}");
        let m = err(r#"{"a":1,"a":1}"#);
        assert!(m.starts_with(r#"(root): duplicate key "a""#), "{m}");
    }

    #[test]
    fn refuses_integers_beyond_2_pow_53() {
        assert!(err(r#"{"n":9007199254740993}"#).starts_with("/n: integer 9007199254740993"));
        assert!(err(r#"{"n":-9007199254740993}"#).starts_with("/n: integer -9007199254740993"));
        assert!(err(r#"{"n":[0,1e300]}"#).starts_with("/n/1: number"));
        assert!(err(r#"{"n":123456789012345678901234567890}"#).starts_with("/n: number"));
    }

    #[test]
    fn refuses_non_finite_and_non_json() {
        assert!(
            err(r#"{"n":1e999}"#).starts_with("/n: number out of range"),
            "{}",
            err(r#"{"n":1e999}"#)
        );
        assert!(
            err(r#"{"n":[NaN]}"#).starts_with("/n/0: "),
            "{}",
            err(r#"{"n":[NaN]}"#)
        );
        assert!(err(r#"{"n":Infinity}"#).starts_with("/n: "));
        assert!(err(r#"[1]"#).contains("must be a JSON object"));
        assert!(err("").contains("no arguments"));
        assert!(!err(r#"{"a":1} {"b":2}"#).is_empty());
    }

    #[test]
    fn escapes_pointer_tokens() {
        let m = err(r#"{"a/b~":{"x":1,"x":2}}"#);
        assert!(m.starts_with(r#"/a~1b~0: duplicate key"#), "{m}");
    }

    #[test]
    fn schema_errors_name_the_field_and_canonical_form_is_jcs() {
        let schema = serde_json::json!({"type":"object","properties":{"path":{"type":"integer"}}});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let e = prepare(br#"{"path":"x"}"#, &validator).unwrap_err().0;
        assert_eq!(e, r#"/path: "x" is not of type "integer""#);
        let ok = prepare(br#"{ "z": 1.50, "a": [ 1e2 ] , "path": 3 }"#, &validator).unwrap();
        assert_eq!(ok.canonical, br#"{"a":[100],"path":3,"z":1.5}"#);
    }
}
