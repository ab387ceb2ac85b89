//! Effect (and withdrawn) receipts: after a call runs, toolfs appends an `effect` receipt in the
//! session's scope with the digests of the arguments and the result; its seq and hash go into
//! the envelope. The effect has already happened when the append is made, so a refused append
//! is said in the envelope and logged, never hidden and never turned into a deny.
//!
//! receiptd is reached on its operator socket (`<runtime>/receipts.sock`); it knows toolfs by
//! its uid. Connections are made on first use and re-made after any failure; several appends
//! in flight use several connections (one `append` fid answers one request at a time).

use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use warren_receiptd::client::Appender;

/// Where a call's receipt is, or why it is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptRef {
    /// `effect` (the tool ran), `decision` (the gate's receipt of a deny), `withdrawn`.
    pub kind: String,
    /// The receipt scope: the session id.
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Why there is no receipt (receiptd refused or could not be reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub struct Receipts {
    socket: PathBuf,
    idle: Mutex<Vec<Appender>>,
}

impl Receipts {
    pub fn new(socket: PathBuf) -> Receipts {
        Receipts {
            socket,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Appends `{"scope","kind","subject","digests"}`; the reference either way.
    pub async fn append(
        &self,
        scope: &str,
        kind: &str,
        subject: Value,
        digests: Value,
    ) -> ReceiptRef {
        let request = serde_json::json!({
            "scope": scope, "kind": kind, "subject": subject, "digests": digests,
        });
        let mut reference = ReceiptRef {
            kind: kind.to_owned(),
            scope: scope.to_owned(),
            seq: None,
            hash: None,
            error: None,
        };
        match self
            .append_bytes(&serde_json::to_vec(&request).expect("json"))
            .await
        {
            Ok((seq, hash)) => {
                reference.seq = Some(seq);
                reference.hash = Some(hash);
            }
            Err(e) => {
                tracing::error!(scope, kind, "receipt not written: {e}");
                reference.error = Some(format!("receipt not written: {e}"));
            }
        }
        reference
    }

    /// One append; if it went out on an idle connection that turns out dead (receiptd restarted
    /// since), once more on a fresh one, so no effect receipt is lost to a receiptd restart. A
    /// refusal by receiptd is never retried. (A connection lost after receiptd committed the
    /// entry but before its ack arrived leaves a second copy in the chain: recorded twice, never
    /// lost.)
    async fn append_bytes(&self, request: &[u8]) -> Result<(u64, String), String> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(appender) = idle {
            match appender.append(request).await {
                Ok(ack) => {
                    self.keep(appender);
                    return Ok((ack.seq, ack.hash));
                }
                Err(e) if e.errno.connection_lost() => {
                    tracing::info!(error = %e, "receiptd connection lost; reconnecting once");
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let socket = &self.socket;
        let appender = Appender::connect(socket)
            .await
            .map_err(|e| format!("cannot reach receiptd at {}: {e}", socket.display()))?;
        // A refused or failed append drops its connection: the next one starts afresh.
        let ack = appender.append(request).await.map_err(|e| e.to_string())?;
        self.keep(appender);
        Ok((ack.seq, ack.hash))
    }

    fn keep(&self, appender: Appender) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(appender);
    }
}
