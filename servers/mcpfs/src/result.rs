//! What a tool's result becomes: untrusted data for the caller, never instructions.
//!
//! Text content stays text (joined, in order). Image, audio and embedded-resource blobs are not
//! inlined: each becomes an [`Attachment`] — its type, MIME type, size and digest in the text,
//! its bytes readable from a file beside the result — so a model is never handed a megabyte of
//! base64, and what it was handed can be matched to the bytes by digest. `isError` is a status,
//! not an exception. The digest of the whole result as the server sent it (RFC 8785) goes with
//! the outcome, so the receipt names exactly what came back.

use base64::Engine;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Bytes of a result kept beside its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// `image`, `audio` or `resource`.
    pub kind: String,
    pub mime_type: Option<String>,
    /// For a resource: its URI.
    pub uri: Option<String>,
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
}

/// One call's result, as the caller gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The server said the call failed (`isError: true`).
    pub is_error: bool,
    /// Text content, then one line per attachment and per resource link.
    pub text: String,
    pub attachments: Vec<Attachment>,
    /// `structuredContent`, when the server sent one.
    pub structured: Option<Value>,
    /// The content blocks in MCP's form, in order: each known kind (text, image, audio,
    /// resource, resource link) as the server sent it; one of a kind this build does not know
    /// as the text line that stands for it. What `call.mcp` hands an MCP client (`warren mcp
    /// serve`); every blob in it is named by its digest in `text`.
    pub blocks: Vec<Value>,
    /// What the server said during the call: its progress (for this call's token) and its log
    /// messages (only while this was its one call under way): [`crate::session`].
    pub notes: Vec<Value>,
    /// `sha256:<hex>` of the RFC 8785 form of the result as the server sent it.
    pub digest: String,
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn field<'a>(block: &'a Value, key: &str) -> Option<&'a str> {
    block.get(key).and_then(Value::as_str)
}

impl Outcome {
    /// From a `tools/call` result (its JSON as on the wire).
    pub fn from_result(result: &Value) -> Outcome {
        let digest = sha256(
            &warren_jcs::value_to_vec(result).expect("a parsed JSON value always canonicalises"),
        );
        let mut text = String::new();
        let mut attachments = Vec::new();
        let mut kept = Vec::new();
        let line = |text: &mut String, s: &str| {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(s);
        };
        let blocks = result
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for block in blocks {
            if matches!(
                field(block, "type"),
                Some("text" | "image" | "audio" | "resource" | "resource_link")
            ) {
                kept.push(block.clone());
            }
            match field(block, "type") {
                Some("text") => line(&mut text, field(block, "text").unwrap_or("")),
                Some(kind @ ("image" | "audio")) => {
                    let a = attachment(kind, field(block, "data"), field(block, "mimeType"), None);
                    line(&mut text, &a.describe(attachments.len()));
                    attachments.push(a);
                }
                Some("resource") => {
                    let r = block.get("resource").unwrap_or(&Value::Null);
                    let uri = field(r, "uri");
                    let mime = field(r, "mimeType");
                    let a = match (field(r, "text"), field(r, "blob")) {
                        (Some(t), _) => {
                            Attachment::new("resource", t.as_bytes().to_vec(), mime, uri)
                        }
                        (None, blob) => attachment("resource", blob, mime, uri),
                    };
                    line(&mut text, &a.describe(attachments.len()));
                    attachments.push(a);
                }
                Some("resource_link") => line(
                    &mut text,
                    &format!(
                        "[resource link: {} {}]",
                        field(block, "uri").unwrap_or("?"),
                        field(block, "name").unwrap_or("")
                    ),
                ),
                other => {
                    let said = format!(
                        "[content of unknown type {:?} omitted]",
                        other.unwrap_or("")
                    );
                    kept.push(serde_json::json!({"type": "text", "text": said}));
                    line(&mut text, &said);
                }
            }
        }
        Outcome {
            is_error: result.get("isError").and_then(Value::as_bool) == Some(true),
            text,
            attachments,
            structured: result.get("structuredContent").cloned(),
            blocks: kept,
            notes: Vec::new(),
            digest,
        }
    }
}

/// A base64 blob: decoded, or kept as the text it was when it is not base64 (and said so by
/// the MIME type being absent is not enough, so the digest is of what was sent either way).
fn attachment(kind: &str, data: Option<&str>, mime: Option<&str>, uri: Option<&str>) -> Attachment {
    let data = data.unwrap_or("");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap_or_else(|_| data.as_bytes().to_vec());
    Attachment::new(kind, bytes, mime, uri)
}

impl Attachment {
    fn new(kind: &str, bytes: Vec<u8>, mime: Option<&str>, uri: Option<&str>) -> Attachment {
        Attachment {
            kind: kind.to_string(),
            mime_type: mime.map(str::to_string),
            uri: uri.map(str::to_string),
            digest: sha256(&bytes),
            bytes,
        }
    }

    /// The line that stands for it in the text: `[image 0: image/png, 1234 bytes, sha256:…]`.
    pub fn describe(&self, index: usize) -> String {
        let mut s = format!("[{} {index}: ", self.kind);
        if let Some(uri) = &self.uri {
            s.push_str(uri);
            s.push_str(", ");
        }
        if let Some(m) = &self.mime_type {
            s.push_str(m);
            s.push_str(", ");
        }
        s.push_str(&format!("{} bytes, {}]", self.bytes.len(), self.digest));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_stays_text_and_blobs_are_described_never_inlined() {
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG bytes");
        let result = json!({"content": [
            {"type": "text", "text": "first"},
            {"type": "image", "data": png, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "hello", "mimeType": "text/plain"}},
            {"type": "resource_link", "uri": "file:///b", "name": "b"},
            {"type": "text", "text": "last"}
        ]});
        let o = Outcome::from_result(&result);
        assert!(!o.is_error);
        assert_eq!(o.attachments.len(), 2);
        assert_eq!(o.attachments[0].bytes, b"\x89PNG bytes");
        assert!(!o.text.contains(&png), "{}", o.text);
        let lines: Vec<&str> = o.text.lines().collect();
        assert_eq!(lines[0], "first");
        assert_eq!(
            lines[1],
            format!(
                "[image 0: image/png, 10 bytes, {}]",
                o.attachments[0].digest
            )
        );
        assert!(lines[2].starts_with("[resource 1: file:///a, text/plain, 5 bytes, sha256:"));
        assert_eq!(lines[3], "[resource link: file:///b b]");
        assert_eq!(lines[4], "last");
    }

    /// The MCP form hands on exactly what the text names: every blob's bytes have the digest
    /// its line in the text gives, so the receipt (the text's digest) names them too.
    #[test]
    fn the_mcp_form_keeps_the_blocks_and_every_blob_is_named_in_the_text() {
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG bytes");
        let wav = base64::engine::general_purpose::STANDARD.encode(b"RIFF wav");
        let result = json!({"content": [
            {"type": "text", "text": "first"},
            {"type": "image", "data": png, "mimeType": "image/png"},
            {"type": "audio", "data": wav, "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "test://r", "text": "hello", "mimeType": "text/plain"}},
            {"type": "hologram", "data": "zzz"}
        ]});
        let o = Outcome::from_result(&result);
        let kinds: Vec<&str> = o
            .blocks
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["text", "image", "audio", "resource", "text"]);
        assert_eq!(o.blocks[1], result["content"][1], "as the server sent it");
        assert!(
            o.blocks[4]["text"]
                .as_str()
                .unwrap()
                .contains("unknown type"),
            "{}",
            o.blocks[4]
        );
        for (block, a) in o.blocks[1..4].iter().zip(&o.attachments) {
            let bytes = match block["type"].as_str().unwrap() {
                "resource" => block["resource"]["text"]
                    .as_str()
                    .unwrap()
                    .as_bytes()
                    .to_vec(),
                _ => base64::engine::general_purpose::STANDARD
                    .decode(block["data"].as_str().unwrap())
                    .unwrap(),
            };
            assert_eq!(sha256(&bytes), a.digest);
            assert!(o.text.contains(&a.digest), "{}", o.text);
        }
    }

    #[test]
    fn is_error_is_a_status_and_the_digest_names_what_was_sent() {
        let a = json!({"isError": true, "content": [{"type": "text", "text": "Access denied"}]});
        let o = Outcome::from_result(&a);
        assert!(o.is_error);
        assert_eq!(o.text, "Access denied");
        let reordered: Value = serde_json::from_str(
            r#"{"content":[{"text":"Access denied","type":"text"}],"isError":true}"#,
        )
        .unwrap();
        assert_eq!(Outcome::from_result(&reordered).digest, o.digest);
        assert_ne!(
            Outcome::from_result(&json!({"content": []})).digest,
            o.digest
        );
    }
}
