//! Effect and withdrawn receipts: after a call runs, toolfs records an `effect` receipt in the
//! session's scope with the digests of the arguments and the result; a call withdrawn before it
//! ran gets a `withdrawn` receipt. Both record what already happened, so neither is ever turned
//! into a deny.
//!
//! Both are **queued off the call's path** (`docs/decisions.md` D8, "Effect receipts"): a call's result is returned
//! as soon as its effect receipt is queued, and one writer task appends the queue in order (what
//! is queued together in one batch write) over one connection to receiptd's operator socket (`<runtime>/receipts.sock`; receiptd knows
//! toolfs by its uid). The queue fails closed: a call takes its place before it runs, and gets no
//! place (so does not run) while the queue is full or the writer cannot write. The writer never
//! drops a receipt: it retries, with backoff, until receiptd takes it. What a crash of toolfs
//! itself can lose is written in docs/gaps.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use warren_gate::policy::Tier;
use warren_proto::receipts::Ack;
use warren_proto::receipts::Appender;

/// Receipts queued and not yet written, at most; a call finding the queue full is refused.
pub const QUEUE_CAP: usize = 4096;
/// The writer's first and longest wait between two tries of an append receiptd did not take.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The most receipts, and about the most bytes, one write to receiptd carries (its limits are
/// 256 requests and 512 KiB a batch).
const BATCH_MAX: usize = 64;
const BATCH_BYTES: usize = 256 * 1024;

/// The receipt an envelope names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptRef {
    /// `effect` or `query` (the tool ran: [`ran_kind`]) or `decision` (the gate's receipt of a
    /// deny).
    pub kind: String,
    /// The receipt scope: the session id.
    pub scope: String,
    /// A decision receipt's place in the chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// For an effect (queued, maybe not yet written when the result was returned): the gate's
    /// decision receipt that allowed the call; the effect is the scope's `effect` whose
    /// `subject.decision` is this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Ack>,
}

impl ReceiptRef {
    /// The gate's decision receipt `ack` in `scope`.
    pub fn decision(scope: &str, ack: &Ack) -> ReceiptRef {
        ReceiptRef {
            kind: "decision".into(),
            scope: scope.to_owned(),
            seq: Some(ack.seq),
            hash: Some(ack.hash.clone()),
            decision: None,
        }
    }

    /// The (queued) receipt of kind `kind` ([`ran_kind`]) in `scope` of the call `decision`
    /// allowed.
    pub fn ran(kind: &str, scope: &str, decision: Option<Ack>) -> ReceiptRef {
        ReceiptRef {
            kind: kind.into(),
            scope: scope.to_owned(),
            seq: None,
            hash: None,
            decision,
        }
    }
}

/// The kind of the receipt of a call that ran, from the tier the gate decided it by: `query` for
/// a read-tier tool, `effect` for every other (`specs/receipts.md`: query receipts are chained
/// unsigned and covered by receiptd's signed checkpoints; effect receipts are signed one by one).
/// A read-tier call raised by a risk pattern is decided as `destructive`, so it stays `effect`.
pub fn ran_kind(tier: &str) -> &'static str {
    if tier == Tier::Read.as_str() {
        "query"
    } else {
        "effect"
    }
}

struct QueueState {
    /// Queued and not yet acknowledged by receiptd.
    unwritten: AtomicUsize,
    /// The writer's last try failed; it is retrying.
    failing: AtomicBool,
    /// Signalled each time a receipt is written.
    written: Notify,
}

/// The queue of receipts toolfs appends, and its one writer.
pub struct Receipts {
    tx: mpsc::Sender<Vec<u8>>,
    state: Arc<QueueState>,
}

/// A place in the queue, taken before a call runs; [`ReceiptSlot::send`] queues its receipt.
/// Dropped unsent (the call did not run), the place is given back.
pub struct ReceiptSlot {
    permit: mpsc::OwnedPermit<Vec<u8>>,
    state: Arc<QueueState>,
}

impl ReceiptSlot {
    /// Queues `{"scope","kind","subject","digests"}`.
    pub fn send(self, scope: &str, kind: &str, subject: Value, digests: Value) {
        self.send_charged(scope, kind, subject, digests, None);
    }

    /// As [`ReceiptSlot::send`], charged to a namespace subtree's budgets (the grant's
    /// `budgets`): receiptd always takes it — the call ran — and counts it.
    pub fn send_charged(
        self,
        scope: &str,
        kind: &str,
        subject: Value,
        digests: Value,
        budgets: Option<&Value>,
    ) {
        let mut request =
            json!({"scope": scope, "kind": kind, "subject": subject, "digests": digests});
        if let Some(b) = budgets {
            request["budgets"] = b.clone();
        }
        self.state.unwritten.fetch_add(1, Ordering::AcqRel);
        self.permit
            .send(serde_json::to_vec(&request).expect("json"));
    }
}

impl Receipts {
    /// Starts the writer for receiptd's socket (inside the runtime, which it is spawned on).
    pub fn start(socket: PathBuf) -> Receipts {
        let (tx, rx) = mpsc::channel(QUEUE_CAP);
        let state = Arc::new(QueueState {
            unwritten: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            written: Notify::new(),
        });
        tokio::spawn(write_queue(socket, rx, state.clone()));
        Receipts { tx, state }
    }

    /// A place in the queue for a call about to run, or why it must not run.
    pub fn reserve(&self) -> Result<ReceiptSlot, String> {
        if self.state.failing.load(Ordering::Acquire) {
            return Err(format!(
                "receiptd is not taking toolfs's receipts ({} queued)",
                self.state.unwritten.load(Ordering::Acquire)
            ));
        }
        let permit = self
            .tx
            .clone()
            .try_reserve_owned()
            .map_err(|_| format!("{QUEUE_CAP} receipts are queued and not yet written"))?;
        Ok(ReceiptSlot {
            permit,
            state: self.state.clone(),
        })
    }

    /// Waits (at most `limit`) until every queued receipt is written; the number still unwritten.
    pub async fn drain(&self, limit: Duration) -> usize {
        let state = &self.state;
        let _ = tokio::time::timeout(limit, async {
            loop {
                let written = state.written.notified();
                if state.unwritten.load(Ordering::Acquire) == 0 {
                    return;
                }
                written.await;
            }
        })
        .await;
        state.unwritten.load(Ordering::Acquire)
    }
}

async fn connect(socket: &Path) -> Result<Appender, String> {
    Appender::connect(socket)
        .await
        .map_err(|e| format!("cannot reach receiptd at {}: {e}", socket.display()))
}

/// Appends the queue in order: whatever is queued when the writer is free goes in one batch
/// write (all or none, so a retried batch is never half written twice), one receipt alone as a
/// plain append. A write receiptd does not take is retried until it does (receiptd restarting,
/// over its rate limit or below its free-space floor), and while it is being retried no call
/// gets a place in the queue.
async fn write_queue(socket: PathBuf, mut rx: mpsc::Receiver<Vec<u8>>, state: Arc<QueueState>) {
    let mut conn: Option<Appender> = None;
    let mut queued: Vec<Vec<u8>> = Vec::new();
    while rx.recv_many(&mut queued, BATCH_MAX).await > 0 {
        for batch in batches(&queued) {
            let mut wait = RETRY_FIRST;
            loop {
                let appender = match conn.take() {
                    Some(a) => Ok(a),
                    None => connect(&socket).await,
                };
                let result = match appender {
                    Ok(a) => {
                        let written = match batch {
                            [one] => a.append(one).await.map(drop),
                            many => a.append_batch(many).await.map(drop),
                        };
                        written.map(|()| a).map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e),
                };
                match result {
                    Ok(a) => {
                        conn = Some(a);
                        if state.failing.swap(false, Ordering::AcqRel) {
                            tracing::info!("receiptd takes toolfs's receipts again");
                        }
                        break;
                    }
                    Err(e) => {
                        if !state.failing.swap(true, Ordering::AcqRel) {
                            tracing::error!(
                                queued = state.unwritten.load(Ordering::Acquire),
                                "receipts not written, retrying (calls are refused until they are): {e}"
                            );
                        }
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(RETRY_MAX);
                    }
                }
            }
            state.unwritten.fetch_sub(batch.len(), Ordering::AcqRel);
            state.written.notify_waiters();
        }
        queued.clear();
    }
}

/// `queued` cut, in order, into batch writes of at most [`BATCH_BYTES`] (a receipt larger than
/// that goes alone).
fn batches(queued: &[Vec<u8>]) -> Vec<&[Vec<u8>]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, r) in queued.iter().enumerate() {
        if i > start && bytes + r.len() + 1 > BATCH_BYTES {
            out.push(&queued[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += r.len() + 1;
    }
    if start < queued.len() {
        out.push(&queued[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_gate::policy::ToolClass;

    /// Of every tier the gate can answer with (a raised call is answered `destructive`), only a
    /// core read's run goes unsigned.
    #[test]
    fn only_a_read_tier_run_is_a_query() {
        let labels = Tier::ALL
            .into_iter()
            .map(|t| ToolClass::Core(t).label())
            .chain([ToolClass::Dynamic.label(), ToolClass::Unmapped.label()]);
        for label in labels {
            let expect = if label == "read" { "query" } else { "effect" };
            assert_eq!(ran_kind(label), expect, "{label}");
        }
    }

    #[test]
    fn batches_keep_the_order_and_stay_under_the_byte_limit() {
        let r = |n: usize| vec![b'x'; n];
        let queued = vec![
            r(10),
            r(BATCH_BYTES / 2),
            r(BATCH_BYTES / 2),
            r(BATCH_BYTES * 2),
            r(1),
        ];
        let sizes: Vec<Vec<usize>> = batches(&queued)
            .iter()
            .map(|b| b.iter().map(Vec::len).collect())
            .collect();
        assert_eq!(
            sizes,
            vec![
                vec![10, BATCH_BYTES / 2],
                vec![BATCH_BYTES / 2],
                vec![BATCH_BYTES * 2],
                vec![1],
            ]
        );
        assert!(batches(&[]).is_empty());
    }
}
