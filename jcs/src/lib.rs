//! RFC 8785 (JSON Canonicalization Scheme) bytes of a serializable value.
//!
//! `serde_json_canonicalizer` is the reference here, and it is what every value that needs it
//! goes through. But on a tool call's path warren canonicalizes about seven small values (the
//! arguments, the gate's fingerprint body, two receipt bodies and their envelopes, the result
//! envelope), and the crate takes ≈ 10 µs for a receipt body where serde_json takes < 1 µs.
//!
//! For a *plain* value JCS and serde_json write the same bytes, so this takes serde_json:
//! - strings: both escape `"`, `\` and U+0000–U+001F alike (`\b \t \n \f \r`, else `\u00xx`
//!   lowercase) and write everything else as UTF-8, `/` and U+2028/9 included;
//! - integers of magnitude ≤ 2^53: both write them in plain decimal;
//! - object members: serde_json's map (no `preserve_order`) is sorted by UTF-8 bytes, JCS sorts
//!   by UTF-16 code units; the two orders agree on ASCII keys.
//!
//! A value is plain when every number is an integer of magnitude ≤ 2^53 and every object key is
//! ASCII. Anything else — a float, a larger integer, a non-ASCII key — goes to the crate.
//! `tests` checks the two agree on arbitrary values, floats and astral keys included. Where the
//! bytes are used: `specs/tool-tree.md` (arguments, envelopes) and `specs/receipts.md` (bodies);
//! why this crate: `docs/decisions.md` D10 ("Canonical JSON through `warren-jcs`").

use serde::Serialize;
use serde_json::Value;

/// Numbers JCS writes exactly as integers: the IEEE-754 double's integer range.
const MAX_EXACT: u64 = 1 << 53;

/// Why a value has no canonical form: it does not serialize to JSON (a map with non-string
/// keys, a non-finite float, a failing `Serialize`).
pub type Error = serde_json::Error;

/// The RFC 8785 bytes of `value`.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    value_to_vec(&serde_json::to_value(value)?)
}

/// [`to_vec`] of a value already parsed (no copy into a new tree).
pub fn value_to_vec(value: &Value) -> Result<Vec<u8>, Error> {
    if is_plain(value) {
        serde_json::to_vec(value)
    } else {
        serde_json_canonicalizer::to_vec(value).map_err(serde::ser::Error::custom)
    }
}

/// Whether serde_json writes `value` exactly as JCS does (module docs).
fn is_plain(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => true,
        Value::Number(n) => {
            n.as_u64().is_some_and(|u| u <= MAX_EXACT)
                || n.as_i64().is_some_and(|i| i.unsigned_abs() <= MAX_EXACT)
        }
        Value::Array(items) => items.iter().all(is_plain),
        Value::Object(members) => members.iter().all(|(k, v)| k.is_ascii() && is_plain(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(v: &Value) -> Vec<u8> {
        serde_json_canonicalizer::to_vec(v).unwrap()
    }

    /// Keys and strings from every region where the two orders or escapes could part: ASCII
    /// (controls, quote, backslash, slash), Latin-1, U+2028, the U+E000–U+FFFF block and astral
    /// code points (sorted differently by UTF-8 and UTF-16).
    fn text() -> impl Strategy<Value = String> {
        let ch = prop_oneof![
            any::<u8>().prop_map(|b| char::from(b & 0x7f)),
            Just('\u{e9}'),
            Just('\u{2028}'),
            Just('\u{fb01}'),
            Just('\u{ffff}'),
            Just('\u{1f600}'),
            Just('\u{10000}'),
        ];
        proptest::collection::vec(ch, 0..6).prop_map(|cs| cs.into_iter().collect())
    }

    fn number() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-(1i64 << 53)..=(1i64 << 53)).prop_map(Value::from),
            Just(Value::from(MAX_EXACT)),
            Just(Value::from(MAX_EXACT + 1)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            Just(Value::from(1e21)),
            Just(Value::from(-0.0)),
            Just(Value::from(0.1)),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            number(),
            text().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::btree_map(text(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn agrees_with_serde_json_canonicalizer(v in value()) {
            prop_assert_eq!(value_to_vec(&v).unwrap(), reference(&v));
        }
    }

    /// The cases the fast path must hand over, one by one (each fails if `is_plain` takes it).
    #[test]
    fn what_serde_json_writes_differently_goes_to_the_crate() {
        for v in [
            serde_json::json!({"\u{1f600}": 1, "\u{ffff}": 2}),
            serde_json::json!([1e21, 0.1, -0.0, 1.5]),
            serde_json::json!(9007199254740993u64),
            serde_json::json!(-9007199254740993i64),
        ] {
            assert!(!is_plain(&v), "{v}");
            assert_eq!(to_vec(&v).unwrap(), reference(&v), "{v}");
        }
        let plain = serde_json::json!({"b": [1, -2, "\u{2028}/\"\\\u{1}"], "a": null, "é": 1});
        assert!(!is_plain(&plain), "a non-ASCII key");
        let plain = serde_json::json!({"b": [1, -2, "\u{2028}/\"\\\u{1}é"], "a": null});
        assert!(is_plain(&plain));
        assert_eq!(to_vec(&plain).unwrap(), reference(&plain));
    }

    /// A struct's fields are written sorted, not in declaration order.
    #[test]
    fn struct_fields_are_sorted() {
        #[derive(Serialize)]
        struct S {
            z: u8,
            #[serde(rename = "payloadType")]
            payload_type: &'static str,
            payload: &'static str,
        }
        let s = S {
            z: 1,
            payload_type: "t",
            payload: "p",
        };
        assert_eq!(
            to_vec(&s).unwrap(),
            br#"{"payload":"p","payloadType":"t","z":1}"#
        );
    }
}
