//! receiptd's logs as a test reads them: over its operator socket (`receipts.sock`), each line
//! a DSSE envelope whose payload is the receipt's body.

use std::path::Path;

use base64::Engine;
use serde_json::Value;
use warren_9p::{Client, oflags};

/// The receipt body in a DSSE `envelope` (its base64 payload, decoded, as JSON).
fn payload(envelope: &Value) -> Value {
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope["payload"].as_str().expect("a DSSE payload"))
        .expect("a base64 payload");
    serde_json::from_slice(&payload).expect("a JSON receipt body")
}

/// The bodies of the receipts in `log` (one envelope a line), in order.
pub fn bodies_of(log: &[u8]) -> Vec<Value> {
    envelopes_of(log).iter().map(payload).collect()
}

fn envelopes_of(log: &[u8]) -> Vec<Value> {
    log.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| serde_json::from_slice(line).expect("a JSON envelope"))
        .collect()
}

/// `scope`'s log, read from receiptd's operator `socket` (empty while the scope has none).
pub async fn log(socket: &Path, scope: &str) -> Vec<u8> {
    let c = Client::connect_unix(socket)
        .await
        .expect("connect receipts.sock");
    let root = c.attach("test", "").await.unwrap();
    let Ok(log) = root.walk(&[scope, "log"]).await else {
        return Vec::new();
    };
    log.open(oflags::RDONLY).await.unwrap();
    log.read_to_end(0).await.unwrap()
}

/// The DSSE envelopes of `scope`'s log, in order (none for an unknown scope).
pub async fn envelopes(socket: &Path, scope: &str) -> Vec<Value> {
    envelopes_of(&log(socket, scope).await)
}

/// The bodies of the receipts in `scope`, in log order.
pub async fn bodies(socket: &Path, scope: &str) -> Vec<Value> {
    bodies_of(&log(socket, scope).await)
}
