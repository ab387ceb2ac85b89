//! The gate's one long-lived connection to receiptd, and the decision receipts it writes there.
//!
//! Every decision is appended before its answer is given; an append that fails for any reason
//! (receiptd down, refusing, slow to connect) makes the decision a deny with basis
//! `receipts_unavailable`. The connection is re-made on the next decision after a failure.
//! Each append goes through `warren_proto::receipts::Appender`, receiptd's one append client
//! (its contract is in `specs/receipts.md`; the request fields are receiptd's).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use warren_9p::Client;
use warren_proto::receipts::Ack;
use warren_proto::receipts::Appender;

/// How long a connection attempt may take before the decision is denied.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one append may take before the decision is denied.
const APPEND_TIMEOUT: Duration = Duration::from_secs(10);

/// What one decision receipt says (the subject of the `decision` body).
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRecord<'a> {
    pub session: &'a str,
    pub tool: &'a str,
    pub verdict: &'a str,
    pub basis: &'a str,
    pub class: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<i64>,
    pub context: Vec<&'a str>,
    /// Who answered an ask (`operator`, `namespace:<id>`, `gate` for expiry), if one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<&'a str>,
    pub fingerprint: &'a str,
    /// SHA-256 of the canonical argument bytes.
    pub args_sha256: &'a str,
}

/// The budget a refused append was over (`receipts`, `receipt_bytes`), from receiptd's error
/// code (`budget:…`) in the refusal's text.
pub fn budget_refusal(error: &str) -> Option<&'static str> {
    ["receipts", "receipt_bytes"]
        .into_iter()
        .find(|b| error.contains(&format!("\"code\":\"budget:{b}\"")))
}

/// The receipt sink: a lazily made connection and a pool of [`Appender`]s on it (one per
/// concurrent append; requests on one fid are served in order, so a pool keeps appends parallel).
pub struct ReceiptSink {
    socket: PathBuf,
    /// The connection and its generation (a failed connection's pooled appenders are dropped by it).
    conn: tokio::sync::Mutex<Option<(u64, Client)>>,
    generation: std::sync::atomic::AtomicU64,
    pool: Mutex<Vec<(u64, Appender)>>,
}

impl ReceiptSink {
    pub fn new(socket: PathBuf) -> ReceiptSink {
        ReceiptSink {
            socket,
            conn: tokio::sync::Mutex::new(None),
            generation: 0.into(),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// Appends one decision receipt in the session's scope.
    pub async fn decision(&self, record: &DecisionRecord<'_>) -> Result<Ack, String> {
        self.decision_charged(record, None).await
    }

    /// Appends one decision receipt charged to a namespace subtree's budgets (the chain from
    /// its lineage: `Lineage::budget_keys`). receiptd refuses it when the subtree is over
    /// budget ([`budget_refusal`] reads which).
    pub async fn decision_charged(
        &self,
        record: &DecisionRecord<'_>,
        budgets: Option<Value>,
    ) -> Result<Ack, String> {
        let mut body = json!({
            "scope": record.session,
            "kind": "decision",
            "subject": record,
            "digests": { "fingerprint": record.fingerprint, "args": record.args_sha256 },
        });
        if let Some(b) = budgets {
            body["budgets"] = b;
        }
        let bytes = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        match tokio::time::timeout(APPEND_TIMEOUT, self.append(&bytes)).await {
            Ok(r) => r,
            Err(_) => Err("receiptd did not answer in time".into()),
        }
    }

    /// One append; if it went out on a pooled connection that turns out dead (receiptd
    /// restarted since), once more on a fresh one, so the first decision after a receiptd
    /// restart is not denied. A refusal by receiptd is never retried.
    async fn append(&self, bytes: &[u8]) -> Result<Ack, String> {
        match self.append_once(bytes, true).await {
            Err((true, e)) => {
                tracing::info!(error = %e, "receiptd connection lost; reconnecting once");
                self.append_once(bytes, false).await.map_err(|(_, e)| e)
            }
            other => other.map_err(|(_, e)| e),
        }
    }

    /// The error says whether it was a dead pooled connection (worth one retry).
    async fn append_once(&self, bytes: &[u8], pooled_ok: bool) -> Result<Ack, (bool, String)> {
        let (generation, appender, reused) = self.take_appender(pooled_ok).await?;
        let result = appender
            .append(bytes)
            .await
            .map_err(|r| (reused && r.errno.connection_lost(), r.to_string()));
        match &result {
            Ok(_) => self
                .pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((generation, appender)),
            Err(_) => self.forget(generation).await,
        }
        result
    }

    /// A pooled appender if `pooled_ok` and one is idle, else one opened on the current or a new
    /// connection. The bool says the connection was not made just now (so it may be one that
    /// died with a receiptd restart); an error carries whether that is why it failed.
    async fn take_appender(
        &self,
        pooled_ok: bool,
    ) -> Result<(u64, Appender, bool), (bool, String)> {
        if pooled_ok
            && let Some((g, appender)) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop()
        {
            return Ok((g, appender, true));
        }
        let (generation, client, reused) = {
            let mut conn = self.conn.lock().await;
            match &*conn {
                Some((g, c)) => (*g, c.clone(), true),
                None => {
                    let c =
                        tokio::time::timeout(CONNECT_TIMEOUT, Client::connect_unix(&self.socket))
                            .await
                            .map_err(|_| {
                                (
                                    false,
                                    format!("connect {}: timed out", self.socket.display()),
                                )
                            })?
                            .map_err(|e| {
                                (false, format!("connect {}: {e}", self.socket.display()))
                            })?;
                    let g = self
                        .generation
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        + 1;
                    *conn = Some((g, c.clone()));
                    (g, c, false)
                }
            }
        };
        match Appender::on(client).await {
            Ok(appender) => Ok((generation, appender, reused)),
            Err(e) => {
                self.forget(generation).await;
                Err((reused && e.connection_lost(), format!("open append: {e}")))
            }
        }
    }

    /// Drops a connection that failed, with every pooled appender on it, so the next append
    /// reconnects.
    async fn forget(&self, failed: u64) {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|(g, _)| *g == failed) {
            *conn = None;
        }
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(g, _)| *g != failed);
    }
}

/// Turns receiptd's ack into the JSON the gate's answers carry.
pub fn ack_json(ack: &Ack) -> Value {
    json!({ "seq": ack.seq, "hash": ack.hash })
}
