//! The result envelope a call file returns: RFC 8785 JSON, so its bytes are one function of its
//! fields and can be digested and compared by anyone.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::effects::ReceiptRef;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The tool ran and reported success.
    Ok,
    /// The arguments were refused, or the tool ran and failed, or could not be reached.
    Error,
    /// The gate did not allow the call (or there is no gate); the tool did not run.
    Denied,
}

/// Where the content came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Taint {
    /// Any byte of the content came from outside toolfs: a tool's output, or text quoted from
    /// the caller's own arguments. A reader must treat it as data, never as instructions.
    Untrusted,
    /// The content is toolfs's own text (e.g. "this connection grants fs_read no host path").
    Trusted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub status: Status,
    pub content: String,
    /// `sha256:<hex>` of the UTF-8 bytes of `content`.
    pub digest: String,
    pub taint: Taint,
    pub tool: String,
    /// The call's receipt: the effect receipt of a call that ran (or why receiptd did not take
    /// it), the gate's decision receipt of a denied call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<ReceiptRef>,
    /// A denied call's basis, as the gate gave it (`deny_covers:1`, `expiry`, …): the
    /// machine-readable reason; `content` says it in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
    /// An MCP tool's result in MCP's own form (`content`: the server's content blocks as it
    /// sent them, images and all; `notifications`: its progress and log messages during the
    /// call): only in what `call.mcp` returns, never in `call`'s envelope (§3 of
    /// specs/tool-tree.md). `content` (text, each blob described by its digest) stays what the
    /// receipt names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<serde_json::Value>,
}

/// What a gate basis means, in words, for a denied call's `content`.
pub fn basis_in_words(basis: &str) -> String {
    let (kind, detail) = match basis.split_once(':') {
        Some((k, d)) => (k, d.trim()),
        None => (basis, ""),
    };
    match kind {
        "deny_covers" => "an identical call was denied earlier in this session".into(),
        "rule" => format!("the policy's rule {detail} denies this call"),
        "default" => {
            format!("no rule covers this call and the default for a {detail} call is deny")
        }
        "context" => format!("the session's context ({detail}) does not allow this call"),
        "expiry" => "the ask for this call was not answered in time".into(),
        "receipts_unavailable" => {
            "the decision could not be written as a receipt (receiptd is unavailable)".into()
        }
        "ask_cap" => "this session has too many asks open already".into(),
        "orphaned" => "the ask was withdrawn before it was answered".into(),
        "once_spent" => {
            "it was allowed once, and an identical call used that allowance first".into()
        }
        "gate_error" => {
            "the gate could not read its own store, and denies rather than guess".into()
        }
        "answer" => match detail {
            "deny" => "the operator answered deny".into(),
            other => format!("the operator answered {}", other.replace('_', " ")),
        },
        "gate_unavailable" => format!("the gate cannot be reached ({detail})"),
        _ => basis.to_owned(),
    }
}

impl Envelope {
    pub fn new(tool: &str, status: Status, taint: Taint, content: String) -> Envelope {
        Envelope {
            status,
            digest: content_digest(content.as_bytes()),
            content,
            taint,
            tool: tool.to_owned(),
            receipt: None,
            basis: None,
            mcp: None,
        }
    }

    /// A denied call: `content` says why in words (`denied: …`), `basis` keeps the gate's basis.
    pub fn denied(tool: &str, basis: &str) -> Envelope {
        let mut env = Envelope::new(
            tool,
            Status::Denied,
            Taint::Trusted,
            format!("denied: {}", basis_in_words(basis)),
        );
        env.basis = Some(basis.to_owned());
        env
    }

    /// The canonical (RFC 8785) bytes: what a call file's read returns.
    pub fn to_canonical(&self) -> Vec<u8> {
        // Serialising a struct of strings and enums cannot fail.
        warren_jcs::to_vec(self).expect("envelope serialises")
    }

    /// Parses an envelope a call file returned (for clients: the CLI, tests).
    pub fn parse(bytes: &[u8]) -> serde_json::Result<Envelope> {
        serde_json::from_slice(bytes)
    }

    /// Whether `digest` matches `content`.
    pub fn digest_matches(&self) -> bool {
        self.digest == content_digest(self.content.as_bytes())
    }
}

/// `sha256:<lowercase hex>`.
pub fn content_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A denied envelope says what happened in words and keeps the gate's basis beside them.
    #[test]
    fn a_denied_envelope_says_why_in_words_and_keeps_the_basis() {
        let env = Envelope::denied("shell", "deny_covers:1");
        assert_eq!(
            env.content,
            "denied: an identical call was denied earlier in this session"
        );
        assert_eq!(env.basis.as_deref(), Some("deny_covers:1"));
        let json: serde_json::Value = serde_json::from_slice(&env.to_canonical()).unwrap();
        assert_eq!(json["basis"], "deny_covers:1");
        for (basis, words) in [
            ("rule:4", "the policy's rule 4 denies this call"),
            (
                "default:destructive",
                "the default for a destructive call is deny",
            ),
            ("context:untrusted_context", "context (untrusted_context)"),
            ("expiry", "not answered in time"),
            ("receipts_unavailable", "receiptd is unavailable"),
            ("ask_cap", "too many asks open"),
            ("orphaned", "withdrawn"),
            ("once_spent", "used that allowance first"),
            ("gate_error", "its own store"),
            ("answer:deny", "the operator answered deny"),
            ("gate_unavailable: EOF", "the gate cannot be reached (EOF)"),
        ] {
            let said = basis_in_words(basis);
            assert!(said.contains(words), "{basis}: {said}");
        }
        // Not a gate basis: said as it is.
        assert_eq!(
            basis_in_words("no gate: every call is denied"),
            "no gate: every call is denied"
        );
        // Not denied: no basis field.
        assert!(
            !String::from_utf8(
                Envelope::new("echo", Status::Ok, Taint::Untrusted, "x".into()).to_canonical()
            )
            .unwrap()
            .contains("basis")
        );
    }

    #[test]
    fn canonical_bytes_and_digest() {
        let e = Envelope::new("echo", Status::Ok, Taint::Untrusted, "{}".into());
        let text = String::from_utf8(e.to_canonical()).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"content":"{{}}","digest":"sha256:{}","status":"ok","taint":"untrusted","tool":"echo"}}"#,
                hex::encode(Sha256::digest(b"{}"))
            )
        );
        let back = Envelope::parse(text.as_bytes()).unwrap();
        assert_eq!(back, e);
        assert!(back.digest_matches());
    }
}
