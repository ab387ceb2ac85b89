//! What a server says one of its tools is, and what warren makes of it.
//!
//! - The **digest** pins a definition: SHA-256 over the RFC 8785 form of `{name, description,
//!   inputSchema, annotations}` (absent members omitted). Any change to what a model is told
//!   about a tool, or to the arguments it takes, or to the server's claims about it, changes
//!   the digest, and the tool is held until the operator accepts it again (`crate::pins`).
//! - The **tier** a call is decided at is the operator's (`crate::config`, default `exec`),
//!   raised to `destructive` when the server itself says so (`destructiveHint: true` on a tool
//!   not marked read-only). A server's annotations are its own claims: they may raise a tier,
//!   never lower it — `readOnlyHint: true` makes nothing cheaper.
//! - The **gate name** is `mcp:<server>:<tool>`, which can never be a built-in tool's name.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The gate's tiers (docs/gate.md): the operator's definition names one per tool.
pub use warren_proto::gate::Tier;

/// One tool as a server listed it, kept as the server's JSON (the fields warren reads are
/// checked; the rest is carried untouched).
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Value,
    pub annotations: Option<Value>,
}

/// Why a listed tool cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unservable {
    #[error("the tool has no name")]
    NoName,
    #[error(
        "tool name {0:?} is not served: a tool name is 1 to 128 letters, digits, `_`, `.` or `-`, and not `.`, `..`, `tools`, `resources` or `resources.mcp`"
    )]
    BadName(String),
    #[error(
        "tool name {0:?} is listed more than once: neither definition is served (which one a call reaches is the server's choice)"
    )]
    ListedTwice(String),
    #[error("tool {0:?}: inputSchema is not a JSON object")]
    BadSchema(String),
    #[error("tool {0:?}: its {1} is over {2} bytes")]
    TooLarge(String, &'static str, usize),
}

/// The most bytes of a tool's description.
pub const MAX_DESCRIPTION_BYTES: usize = 64 * 1024;
/// The most bytes of a tool's inputSchema (as JSON).
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

impl Definition {
    /// From one entry of a `tools/list` result.
    pub fn from_listing(tool: &Value) -> Result<Definition, Unservable> {
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or(Unservable::NoName)?
            .to_string();
        // A file name, and a name the gate takes as `mcp:<server>:<name>` (letters, digits and
        // `_.-` only): a tool the gate would refuse to decide is not served at all; nor is one
        // named as a file the tree serves itself.
        if name.is_empty()
            || name == "."
            || name == ".."
            || warren_toolfs::tree::RESERVED_NAMES.contains(&name.as_str())
            || name.len() > 128
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(Unservable::BadName(name));
        }
        let input_schema = match tool.get("inputSchema") {
            Some(s @ Value::Object(_)) => s.clone(),
            _ => return Err(Unservable::BadSchema(name)),
        };
        if tool
            .get("description")
            .and_then(Value::as_str)
            .is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES)
        {
            return Err(Unservable::TooLarge(
                name,
                "description",
                MAX_DESCRIPTION_BYTES,
            ));
        }
        if serde_json::to_vec(&input_schema).map_or(usize::MAX, |b| b.len()) > MAX_SCHEMA_BYTES {
            return Err(Unservable::TooLarge(name, "inputSchema", MAX_SCHEMA_BYTES));
        }
        Ok(Definition {
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            annotations: tool.get("annotations").filter(|a| !a.is_null()).cloned(),
            name,
            input_schema,
        })
    }

    /// A whole `tools/list` listing (every page's entries, in order), each entry made a
    /// definition or refused. A name listed more than once is refused at every place it is
    /// listed: a call names only the tool, so which definition answers it would be the server's
    /// choice, never the one the operator accepted.
    pub fn from_listings(tools: &[Value]) -> Vec<Result<Definition, Unservable>> {
        let name = |t: &Value| t.get("name").and_then(Value::as_str).map(str::to_string);
        let mut count = std::collections::HashMap::<String, usize>::new();
        for n in tools.iter().filter_map(name) {
            *count.entry(n).or_default() += 1;
        }
        tools
            .iter()
            .map(|t| match name(t) {
                Some(n) if count[&n] > 1 => Err(Unservable::ListedTwice(n)),
                _ => Definition::from_listing(t),
            })
            .collect()
    }

    /// The pinned members (name, description, inputSchema, annotations) as RFC 8785 bytes:
    /// what [`Definition::digest`] covers, and what `warren mcp check --full` shows.
    pub fn pinned_bytes(&self) -> Vec<u8> {
        let mut pinned = Map::new();
        pinned.insert("name".into(), Value::String(self.name.clone()));
        if let Some(d) = &self.description {
            pinned.insert("description".into(), Value::String(d.clone()));
        }
        pinned.insert("inputSchema".into(), self.input_schema.clone());
        if let Some(a) = &self.annotations {
            pinned.insert("annotations".into(), a.clone());
        }
        warren_jcs::value_to_vec(&Value::Object(pinned))
            .expect("a parsed JSON value always canonicalises")
    }

    /// `sha256:<hex>` over [`Definition::pinned_bytes`].
    pub fn digest(&self) -> String {
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(self.pinned_bytes()))
        )
    }

    /// Does the server claim the tool destroys something? (`destructiveHint: true` and not
    /// `readOnlyHint: true`; an absent hint claims nothing.)
    fn claims_destructive(&self) -> bool {
        let hint = |k: &str| {
            self.annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .and_then(Value::as_bool)
        };
        hint("destructiveHint") == Some(true) && hint("readOnlyHint") != Some(true)
    }

    /// The tier a call is decided at: the operator's, raised (never lowered) by the server's
    /// own claims.
    pub fn tier(&self, operator: Tier) -> Tier {
        if self.claims_destructive() {
            operator.max(Tier::Destructive)
        } else {
            operator
        }
    }

    /// The gate's name for a call of this tool on `server`.
    pub fn gate_name(&self, server: &str) -> String {
        format!("mcp:{server}:{}", self.name)
    }

    /// The one-line description for a `tools` listing: the first line, at most 200 bytes.
    pub fn summary(&self) -> String {
        let first = self
            .description
            .as_deref()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("");
        let mut end = first.len().min(200);
        while !first.is_char_boundary(end) {
            end -= 1;
        }
        first[..end].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(v: Value) -> Definition {
        Definition::from_listing(&v).unwrap()
    }

    #[test]
    fn the_digest_changes_with_every_pinned_member_and_nothing_else() {
        let base = json!({"name": "echo", "description": "Echoes", "inputSchema": {"type": "object"},
                          "annotations": {"readOnlyHint": true}, "title": "Echo"});
        let d = def(base.clone()).digest();
        assert!(d.starts_with("sha256:") && d.len() == 71, "{d}");
        // Key order and spacing never matter (RFC 8785).
        let reordered: Value = serde_json::from_str(
            r#"{"inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true},"name":"echo","description":"Echoes"}"#,
        )
        .unwrap();
        assert_eq!(def(reordered).digest(), d);
        for (key, value) in [
            ("name", json!("echo2")),
            (
                "description",
                json!("Echoes, and also sends your files away"),
            ),
            (
                "inputSchema",
                json!({"type": "object", "properties": {"x": {}}}),
            ),
            ("annotations", json!({"readOnlyHint": false})),
        ] {
            let mut changed = base.clone();
            changed[key] = value;
            assert_ne!(def(changed).digest(), d, "{key}");
        }
        // A member outside the pin (here `title`) does not move it.
        let mut retitled = base.clone();
        retitled["title"] = json!("Another");
        assert_eq!(def(retitled).digest(), d);
    }

    #[test]
    fn annotations_raise_a_tier_and_never_lower_it() {
        let t = |annotations: Value| {
            def(json!({"name": "t", "inputSchema": {}, "annotations": annotations}))
        };
        let destructive = t(json!({"destructiveHint": true}));
        assert_eq!(destructive.tier(Tier::Read), Tier::Destructive);
        assert_eq!(destructive.tier(Tier::Exec), Tier::Destructive);
        // Read-only claims never lower what the operator set.
        let read_only = t(json!({"readOnlyHint": true, "destructiveHint": true}));
        assert_eq!(read_only.tier(Tier::Exec), Tier::Exec);
        assert_eq!(t(json!({})).tier(Tier::Exec), Tier::Exec);
        assert_eq!(
            t(json!({"destructiveHint": false})).tier(Tier::Write),
            Tier::Write
        );
        assert_eq!(destructive.gate_name("fs"), "mcp:fs:t");
    }

    #[test]
    fn a_tool_that_cannot_be_a_file_is_refused_by_name() {
        for name in [
            "",
            ".",
            "..",
            "tools",
            "resources",
            "resources.mcp",
            "a/b",
            "a\nb",
            &"x".repeat(129),
        ] {
            let got = Definition::from_listing(&json!({"name": name, "inputSchema": {}}));
            assert!(got.is_err(), "{name:?}");
        }
        let got = Definition::from_listing(&json!({"name": "ok", "inputSchema": "no"}));
        assert_eq!(got, Err(Unservable::BadSchema("ok".into())));
    }
}
