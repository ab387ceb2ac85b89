//! Effect (and withdrawn) receipts: after a call runs, toolfs appends an `effect` receipt in the
//! session's scope with the digests of the arguments and the result. The effect has already
//! happened when the append is made, so a refused append is never turned into a deny.
//!
//! Effect receipts are **queued off the call's path** (design.md "Receipts"): the call's result
//! is returned as soon as its effect receipt is queued, and one writer task appends the queue in
//! order. The queue fails closed: a call takes its place in the queue before it runs, and gets no
//! place (so does not run) while the queue is full or the writer cannot write. The writer never
//! drops an effect receipt: it retries, with backoff, until receiptd takes it. What a crash of
//! toolfs itself can lose is written in docs/gaps.md.
//!
//! receiptd is reached on its operator socket (`<runtime>/receipts.sock`); it knows toolfs by
//! its uid. Connections are made on first use and re-made after any failure; several appends
//! in flight use several connections (one `append` fid answers one request at a time).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use warren_receiptd::client::Appender;

/// Effect receipts queued and not yet written, at most; a call finding the queue full is refused.
pub const EFFECT_QUEUE_CAP: usize = 4096;
/// The writer's first and longest wait between two tries of an append receiptd did not take.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

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
    /// An effect receipt queued, not yet written when the result was returned: it is found in
    /// the scope as the `effect` whose `subject.decision` is this `decision`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
    /// For a queued effect: the gate's decision receipt that allowed the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRef>,
}

/// A receipt named by its place in its scope's chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRef {
    pub seq: u64,
    pub hash: String,
}

impl ReceiptRef {
    pub fn new(kind: &str, scope: &str) -> ReceiptRef {
        ReceiptRef {
            kind: kind.to_owned(),
            scope: scope.to_owned(),
            seq: None,
            hash: None,
            error: None,
            queued: false,
            decision: None,
        }
    }
}

pub struct Receipts {
    socket: PathBuf,
    idle: Mutex<Vec<Appender>>,
    effects: EffectQueue,
}

impl Receipts {
    pub fn new(socket: PathBuf) -> Receipts {
        Receipts {
            effects: EffectQueue::new(socket.clone()),
            socket,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A place in the effect queue for a call about to run, or why it must not run.
    pub fn reserve_effect(&self) -> Result<EffectSlot, String> {
        self.effects.reserve()
    }

    /// Waits (at most `limit`) until every queued effect receipt is written; the number still
    /// unwritten.
    pub async fn drain_effects(&self, limit: Duration) -> usize {
        self.effects.drain(limit).await
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
        let mut reference = ReceiptRef::new(kind, scope);
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
        let appender = connect(&self.socket).await?;
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

async fn connect(socket: &Path) -> Result<Appender, String> {
    Appender::connect(socket)
        .await
        .map_err(|e| format!("cannot reach receiptd at {}: {e}", socket.display()))
}

struct QueueState {
    /// Queued and not yet acknowledged by receiptd.
    unwritten: AtomicUsize,
    /// The writer's last try failed; it is retrying.
    failing: AtomicBool,
    /// Signalled each time an effect receipt is written.
    written: Notify,
}

/// The effect receipts' queue and its one writer (started on the first reservation, inside the
/// runtime).
struct EffectQueue {
    tx: mpsc::Sender<Vec<u8>>,
    rx: Mutex<Option<mpsc::Receiver<Vec<u8>>>>,
    socket: PathBuf,
    state: Arc<QueueState>,
}

/// A call's place in the effect queue, taken before it runs; [`EffectSlot::send`] queues its
/// receipt. Dropped unsent (the call did not run), the place is given back.
pub struct EffectSlot {
    permit: mpsc::OwnedPermit<Vec<u8>>,
    state: Arc<QueueState>,
}

impl EffectSlot {
    pub fn send(self, request: Vec<u8>) {
        self.state.unwritten.fetch_add(1, Ordering::AcqRel);
        self.permit.send(request);
    }
}

impl EffectQueue {
    fn new(socket: PathBuf) -> EffectQueue {
        let (tx, rx) = mpsc::channel(EFFECT_QUEUE_CAP);
        EffectQueue {
            tx,
            rx: Mutex::new(Some(rx)),
            socket,
            state: Arc::new(QueueState {
                unwritten: AtomicUsize::new(0),
                failing: AtomicBool::new(false),
                written: Notify::new(),
            }),
        }
    }

    fn reserve(&self) -> Result<EffectSlot, String> {
        if let Some(rx) = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            tokio::spawn(write_effects(self.socket.clone(), rx, self.state.clone()));
        }
        if self.state.failing.load(Ordering::Acquire) {
            return Err(format!(
                "receiptd is not taking effect receipts ({} queued)",
                self.state.unwritten.load(Ordering::Acquire)
            ));
        }
        let permit = self.tx.clone().try_reserve_owned().map_err(|_| {
            format!("{EFFECT_QUEUE_CAP} effect receipts are queued and not yet written")
        })?;
        Ok(EffectSlot {
            permit,
            state: self.state.clone(),
        })
    }

    async fn drain(&self, limit: Duration) -> usize {
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

/// Appends the queue in order, one at a time; an append receiptd does not take is retried until
/// it does (receiptd restarting, over its rate limit or below its free-space floor), and while
/// it is being retried no call gets a place in the queue.
async fn write_effects(socket: PathBuf, mut rx: mpsc::Receiver<Vec<u8>>, state: Arc<QueueState>) {
    let mut conn: Option<Appender> = None;
    while let Some(request) = rx.recv().await {
        let mut wait = RETRY_FIRST;
        loop {
            let appender = match conn.take() {
                Some(a) => Ok(a),
                None => connect(&socket).await,
            };
            let result = match appender {
                Ok(a) => match a.append(&request).await {
                    Ok(_) => {
                        conn = Some(a);
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    if state.failing.swap(false, Ordering::AcqRel) {
                        tracing::info!("receiptd takes effect receipts again");
                    }
                    break;
                }
                Err(e) => {
                    if !state.failing.swap(true, Ordering::AcqRel) {
                        tracing::error!(
                            queued = state.unwritten.load(Ordering::Acquire),
                            "effect receipt not written, retrying (calls are refused until it is): {e}"
                        );
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
        state.unwritten.fetch_sub(1, Ordering::AcqRel);
        state.written.notify_waiters();
    }
}
