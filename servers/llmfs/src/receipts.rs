//! Model-call receipts: after an ask is answered, a `query` receipt (model, token counts,
//! SHA-256 digests of the request and the reply, never their text) is appended to receiptd over
//! its operator socket (`<runtime>/receipts.sock`), off the ask's path.
//!
//! Fail closed like toolfs's effect queue: an ask takes its receipt's place before the model is
//! asked and is refused while the queue is full or receiptd is not taking receipts; a receipt in
//! the queue is retried, with backoff, until receiptd takes it — unless receiptd refused that
//! receipt itself (invalid, forbidden, or over its subtree's budget): retrying it could never
//! succeed and would hold every namespace's receipts behind one namespace's, so it is dropped
//! and logged instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use warren_9p::Errno;
use warren_proto::receipts::{Appender, Refusal};

use crate::memory::EDQUOT;

pub const QUEUE_CAP: usize = 1024;
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

pub struct Receipts {
    tx: mpsc::Sender<Vec<u8>>,
    failing: Arc<AtomicBool>,
}

/// A place in the queue; dropped unsent (the ask failed), it is given back.
pub struct ReceiptSlot(mpsc::OwnedPermit<Vec<u8>>);

impl ReceiptSlot {
    pub fn send(self, request: Value) {
        self.0.send(serde_json::to_vec(&request).expect("json"));
    }
}

impl Receipts {
    /// Starts the writer (on the current runtime) for receiptd's socket.
    pub fn start(socket: PathBuf) -> Receipts {
        let (tx, rx) = mpsc::channel(QUEUE_CAP);
        let failing = Arc::new(AtomicBool::new(false));
        tokio::spawn(write_queue(socket, rx, failing.clone()));
        Receipts { tx, failing }
    }

    /// A place for the receipt of an ask about to be sent, or why it must not be sent.
    pub fn reserve(&self) -> Result<ReceiptSlot, String> {
        if self.failing.load(Ordering::Acquire) {
            return Err("receiptd is not taking llmfs's receipts: the ask is refused".into());
        }
        self.tx
            .clone()
            .try_reserve_owned()
            .map(ReceiptSlot)
            .map_err(|_| format!("{QUEUE_CAP} receipts are queued and not yet written"))
    }
}

async fn write_queue(socket: PathBuf, mut rx: mpsc::Receiver<Vec<u8>>, failing: Arc<AtomicBool>) {
    let mut conn: Option<Appender> = None;
    while let Some(request) = rx.recv().await {
        let mut wait = RETRY_FIRST;
        loop {
            let appender = match conn.take() {
                Some(a) => Ok(a),
                None => Appender::connect(&socket)
                    .await
                    .map_err(|e| format!("cannot reach receiptd at {}: {e}", socket.display())),
            };
            let result = match appender {
                Ok(a) => match a.append(&request).await {
                    Ok(_) => Ok(a),
                    Err(refusal) if refused_for_good(&refusal) => {
                        // The connection stays good: only this receipt was refused.
                        conn = Some(a);
                        failing.store(false, Ordering::Release);
                        tracing::error!(
                            "receiptd refused a model call's receipt for good; dropped: {refusal}"
                        );
                        break;
                    }
                    Err(refusal) => Err(refusal.to_string()),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(a) => {
                    conn = Some(a);
                    if failing.swap(false, Ordering::AcqRel) {
                        tracing::info!("receiptd takes llmfs's receipts again");
                    }
                    break;
                }
                Err(e) => {
                    if !failing.swap(true, Ordering::AcqRel) {
                        tracing::error!("receipt not written, retrying (asks are refused): {e}");
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// Whether receiptd refused the receipt itself (it is malformed, not llmfs's to append, or its
/// subtree is over a budget), so that the same bytes would be refused again; anything else
/// (receiptd unreachable, restarting, rate-limited, below its free-space floor) passes.
fn refused_for_good(refusal: &Refusal) -> bool {
    matches!(refusal.errno, Errno::EINVAL | Errno::EACCES | EDQUOT)
}
