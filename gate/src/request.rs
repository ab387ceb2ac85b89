//! A decide request, checked, and the call's fingerprint.
//!
//! The fingerprint binds an approval to the exact call: SHA-256 over the RFC 8785 form of
//! `{"tool":…,"args":…,"session":…,"canon":1}`. toolfs hands the gate and the worker the same
//! canonical argument bytes, and the gate refuses arguments that are not already in canonical
//! form — so duplicate keys, integers that would round, or any other text two parsers could read
//! differently never get a fingerprint at all.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::policy::ContextState;
use crate::policy::tier::{Tier, check_name};
use warren_proto::lineage::Lineage;

/// The canonicalisation version bound into every fingerprint.
pub const CANON_VERSION: u32 = 1;
/// The largest decide request taken.
pub const MAX_REQUEST_BYTES: usize = 512 * 1024;
/// The largest integer magnitude arguments may carry (RFC 8785 numbers are IEEE doubles).
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire<'a> {
    session: String,
    tool: String,
    #[serde(borrow)]
    args: &'a RawValue,
    #[serde(default)]
    context: Vec<ContextState>,
    /// The calling namespace's lineage, as nsd gave it to toolfs with the connection.
    #[serde(default)]
    lineage: Option<Lineage>,
    /// An `mcp:` tool's tier as its operator-written definition gives it (mcpfs's only).
    #[serde(default)]
    tier: Option<Tier>,
}

/// A well-formed decide request.
#[derive(Clone, Debug)]
pub struct DecideRequest {
    pub session: String,
    pub tool: String,
    pub args: Value,
    /// The canonical argument text, exactly as received.
    pub canonical_args: String,
    /// Sorted, without duplicates.
    pub context: Vec<ContextState>,
    pub fingerprint: String,
    /// Who is calling: the namespace, its command and its ancestors (nsd's record, relayed by
    /// toolfs). `None` from a connection with no namespace behind it (the operator's).
    pub lineage: Option<Lineage>,
    /// An `mcp:<server>:<tool>` tool's tier from the operator's definition of the server
    /// (raised by the server's own annotations, never lowered), as mcpfs names it: the gate
    /// takes it from mcpfs's connection only (`crate::tree`).
    pub tier: Option<Tier>,
}

/// The core tool a namespace's model call is decided as (the model server's).
pub const LLM_TOOL: &str = "llm";
/// Bytes a model's name may have: it goes whole into the call's decision and `query` receipts,
/// so it is held far below receiptd's request limit.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// A model's name: 1 to [`MAX_MODEL_NAME_BYTES`] bytes of `[A-Za-z0-9._:/@-]`, which every
/// backend's names are made of (`gpt-4o`, `claude-3-5-sonnet@20241022`, `org/model:q4`).
pub fn check_model_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_MODEL_NAME_BYTES {
        return Err(format!(
            "a model's name is 1 to {MAX_MODEL_NAME_BYTES} bytes, not {}",
            name.len()
        ));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._:/@-".contains(*c)))
    {
        Some(c) => Err(format!(
            "a model's name is made of A-Z a-z 0-9 . _ : / @ -, not {c:?}"
        )),
        None => Ok(()),
    }
}

/// A model call's arguments ([`LLM_TOOL`]): the model's name and the digest of the request,
/// nothing else — never the request's text.
fn check_model_call_args(args: &Value) -> Result<(), String> {
    let model = args.get("model").and_then(Value::as_str);
    let digest = args.get("request").and_then(Value::as_str);
    let (Some(model), Some(digest), 2) = (model, digest, args.as_object().map_or(0, |m| m.len()))
    else {
        return Err(
            "a model call's args are {\"model\": NAME, \"request\": \"sha256:HEX\"}".into(),
        );
    };
    check_model_name(model).map_err(|e| format!("a model call: {e}"))?;
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(()),
        _ => Err("a model call's request is \"sha256:\" and 64 hex digits".into()),
    }
}

use warren_proto::gate::check_session;

/// Parses and checks one request. Malformed input is refused, never repaired.
pub fn parse(bytes: &[u8]) -> Result<DecideRequest, String> {
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(format!(
            "request is {} bytes; the limit is {MAX_REQUEST_BYTES}",
            bytes.len()
        ));
    }
    let wire: Wire = serde_json::from_slice(bytes).map_err(|e| format!("request: {e}"))?;
    check_session(&wire.session)?;
    check_name(&wire.tool)?;
    let canonical_args = wire.args.get().to_owned();
    let args = canonical_value(&canonical_args)?;
    if wire.tool == LLM_TOOL {
        check_model_call_args(&args)?;
    }
    let mut context = wire.context;
    context.sort();
    context.dedup();
    if let Some(l) = &wire.lineage {
        let namespace = l.0.first().map_or("", |m| m.namespace.as_str());
        l.check(&wire.session, namespace)?;
    }
    if wire.tier.is_some() && !wire.tool.starts_with("mcp:") {
        return Err(format!(
            "tool {}: a tier is named only for an MCP server's tool (mcp:<server>:<tool>)",
            wire.tool
        ));
    }
    let fingerprint = fingerprint(&wire.tool, &args, &wire.session);
    Ok(DecideRequest {
        session: wire.session,
        tool: wire.tool,
        args,
        canonical_args,
        context,
        fingerprint,
        lineage: wire.lineage,
        tier: wire.tier,
    })
}

/// Parses argument text that must be a JSON object already in RFC 8785 form.
pub fn canonical_value(text: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("args: {e}"))?;
    if !value.is_object() {
        return Err("args: must be a JSON object".into());
    }
    check_numbers(&value)?;
    let canonical = warren_jcs::value_to_vec(&value).map_err(|e| format!("args: {e}"))?;
    if canonical != text.as_bytes() {
        return Err("args: not in RFC 8785 canonical form (toolfs sends the canonical bytes; duplicate keys, \
                    whitespace, key order or number spelling differ)"
            .into());
    }
    Ok(value)
}

fn check_numbers(v: &Value) -> Result<(), String> {
    match v {
        Value::Number(n) => {
            let ok = match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => i.unsigned_abs() <= MAX_SAFE_INTEGER,
                (None, Some(u)) => u <= MAX_SAFE_INTEGER,
                _ => n.as_f64().is_some_and(f64::is_finite),
            };
            if ok {
                Ok(())
            } else {
                Err(format!("args: number {n} is beyond ±2^53 or not finite"))
            }
        }
        Value::Array(a) => a.iter().try_for_each(check_numbers),
        Value::Object(m) => m.values().try_for_each(check_numbers),
        _ => Ok(()),
    }
}

/// The fingerprint of a call, as 64 lowercase hex digits.
pub fn fingerprint(tool: &str, args: &Value, session: &str) -> String {
    let body = serde_json::json!({ "tool": tool, "args": args, "session": session, "canon": CANON_VERSION });
    let bytes = warren_jcs::value_to_vec(&body).expect("a JSON value always canonicalises");
    hex::encode(Sha256::digest(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_proto::gate::{encode, encode_in};

    /// A tier is named only for an MCP server's tool, and round-trips.
    #[test]
    fn a_tier_is_named_only_for_an_mcp_tool() {
        let s = "a".repeat(32);
        let body = encode_in(&s, "mcp:e:echo", b"{}", &[], None, Some(Tier::Read)).unwrap();
        assert_eq!(parse(&body).unwrap().tier, Some(Tier::Read));
        let body = encode_in(&s, "fs_read", b"{}", &[], None, Some(Tier::Read)).unwrap();
        assert!(
            parse(&body)
                .unwrap_err()
                .contains("only for an MCP server's tool")
        );
        let body = encode_in(&s, "mcp:e:echo", b"{}", &[], None, None).unwrap();
        assert_eq!(parse(&body).unwrap().tier, None);
    }

    const S: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_request_round_trips_and_fingerprints() {
        let bytes = encode(
            S,
            "fs_read",
            br#"{"path":"a"}"#,
            &[ContextState::Unattended],
        )
        .unwrap();
        let req = parse(&bytes).unwrap();
        assert_eq!(req.canonical_args, r#"{"path":"a"}"#);
        let spaced = encode(S, "fs_read", br#"{"path": "a"}"#, &[]).unwrap();
        assert!(
            parse(&spaced).is_err(),
            "encode must not canonicalise for the caller"
        );
        assert_eq!(req.fingerprint.len(), 64);
        assert_eq!(
            req.fingerprint,
            fingerprint("fs_read", &serde_json::json!({"path": "a"}), S)
        );
        assert_ne!(
            req.fingerprint,
            fingerprint("fs_read", &serde_json::json!({"path": "b"}), S)
        );
        assert_ne!(
            req.fingerprint,
            fingerprint("fs_list", &serde_json::json!({"path": "a"}), S)
        );
        assert_ne!(
            req.fingerprint,
            fingerprint(
                "fs_read",
                &serde_json::json!({"path": "a"}),
                &"1".repeat(32)
            )
        );
    }

    #[test]
    fn the_fingerprint_is_sha256_of_the_jcs_text() {
        let text =
            format!(r#"{{"args":{{"path":"a"}},"canon":1,"session":"{S}","tool":"fs_read"}}"#);
        let want = hex::encode(Sha256::digest(text.as_bytes()));
        assert_eq!(
            fingerprint("fs_read", &serde_json::json!({"path": "a"}), S),
            want
        );
    }

    #[test]
    fn non_canonical_or_ambiguous_args_are_refused() {
        for args in [
            r#"{"b":1,"a":2}"#,
            r#"{"a": 1}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":9007199254740993}"#,
            r#"{"a":1.0}"#,
            r#"[1]"#,
            r#""x""#,
        ] {
            let req = format!(r#"{{"session":"{S}","tool":"echo","args":{args}}}"#);
            assert!(parse(req.as_bytes()).is_err(), "{args}");
        }
    }

    #[test]
    fn bad_envelopes_are_refused() {
        for req in [
            r#"{"session":"abc","tool":"echo","args":{}}"#.to_string(),
            format!(
                r#"{{"session":"{}","tool":"echo","args":{{}}}}"#,
                S.to_uppercase()
            ),
            format!(r#"{{"session":"{S}","tool":"no such","args":{{}}}}"#),
            format!(r#"{{"session":"{S}","tool":"echo","args":{{}},"extra":1}}"#),
            format!(r#"{{"session":"{S}","tool":"echo","tool":"shell","args":{{}}}}"#),
            format!(r#"{{"session":"{S}","tool":"echo","args":{{}},"context":["sunny"]}}"#),
        ] {
            assert!(parse(req.as_bytes()).is_err(), "{req}");
        }
    }
}
