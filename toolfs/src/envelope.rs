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
        }
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
