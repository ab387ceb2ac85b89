//! The gate's state and its four acts: decide, wait, answer, and closing asks nobody answered
//! (expiry, an orphaned caller). Every decision is receipted before its answer is given.
//!
//! Why one file: the four acts (decide, wait, answer, close) share the gate's state and its
//! receipt-before-answer rule.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use warren_9p::Errno;

use crate::events::Events;
use crate::policy::tier::{ToolClass, classify};
use crate::policy::{Basis, Evaluation, Verdict, evaluate, risk};
use crate::receipts::{DecisionRecord, ReceiptSink};
use crate::request::DecideRequest;
use crate::scope::{Scope, Verb};
use crate::store::{Closing, DecisionRow, NewPending, PendingRow, Store};
use warren_proto::receipts::Ack;

#[derive(Clone, Debug)]
pub struct Config {
    /// An ask nobody answers within this is denied (basis `expiry`).
    pub ask_ttl: Duration,
    /// Open asks per session; one more is denied (basis `ask_cap`).
    pub max_open_asks: usize,
    /// Open asks per namespace subtree where no spec sets `limit asks=`; one more is denied
    /// (basis `budget:asks`).
    pub subtree_asks: u64,
    /// An ask whose caller's connection closed (or that survived a restart) is orphaned unless
    /// someone waits on it again within this.
    pub orphan_grace: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ask_ttl: Duration::from_secs(600),
            max_open_asks: 16,
            subtree_asks: warren_proto::lineage::DEFAULT_SUBTREE_ASKS,
            orphan_grace: Duration::from_secs(30),
        }
    }
}

pub use warren_proto::gate::Answer;

/// How long a call refused for its subtree's receipt budget waits for its answer.
pub const BUDGET_BACKOFF: Duration = Duration::from_millis(200);

/// How long a queued decision row may wait for a transaction to carry it.
const FLUSH_AFTER: Duration = Duration::from_millis(5);

/// A connection's identity for ownership of its asks.
pub type ConnId = u64;
/// No connection owns the ask (it survived a restart).
const NO_OWNER: ConnId = 0;

pub struct Gate {
    store: Mutex<Store>,
    receipts: ReceiptSink,
    pub events: Events,
    cfg: Config,
    /// Bumped whenever an ask closes; waiters re-read their ask.
    closed: watch::Sender<u64>,
    /// Wakes the expiry task when a new ask may expire sooner.
    new_ask: Notify,
    /// Wakes the flusher of queued decision rows.
    decisions_queued: Notify,
    /// Which connection waits on (owns) each open ask.
    owners: Mutex<HashMap<i64, ConnId>>,
    /// Answers are one at a time, so an ask is receipted as answered once.
    answering: tokio::sync::Mutex<()>,
    next_conn: AtomicU64,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    pub fn new(store: Store, receipts: ReceiptSink, cfg: Config) -> Arc<Gate> {
        Arc::new(Gate {
            store: Mutex::new(store),
            receipts,
            events: Events::default(),
            cfg,
            closed: watch::channel(0).0,
            new_ask: Notify::new(),
            decisions_queued: Notify::new(),
            owners: Mutex::new(HashMap::new()),
            answering: tokio::sync::Mutex::new(()),
            next_conn: AtomicU64::new(1),
        })
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub fn new_conn(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts the background work: expiry, and the orphan grace of asks that survived a restart.
    pub fn start(self: &Arc<Gate>) {
        let open = self.store().open_pending().unwrap_or_default();
        for row in open {
            self.orphan_later(row.id, NO_OWNER);
        }
        let gate = self.clone();
        tokio::spawn(async move { gate.expiry_loop().await });
        let gate = self.clone();
        tokio::spawn(async move { gate.flush_loop().await });
    }

    /// Writes queued decision rows that no decide has carried along within a few milliseconds.
    async fn flush_loop(self: Arc<Gate>) {
        loop {
            self.decisions_queued.notified().await;
            tokio::time::sleep(FLUSH_AFTER).await;
            self.flush_decisions();
        }
    }

    /// Writes every queued decision row now (the flusher; at shutdown).
    pub fn flush_decisions(&self) {
        if let Err(e) = self.store().flush_decisions() {
            tracing::error!("store: cannot record decisions: {e}");
        }
    }

    /// Decides one call. Never fails: anything that goes wrong is a deny, with its basis.
    pub async fn decide(&self, req: &DecideRequest, conn: ConnId) -> Answer {
        let started = Instant::now();
        // An MCP tool's tier is its operator's definition's (mcpfs names it); every other name's
        // is the code's table.
        let class = match req.tier {
            Some(tier) if req.tool.starts_with("mcp:") => ToolClass::Core(tier),
            _ => classify(&req.tool),
        };
        let risk = risk::raise_for(&req.tool, &req.args, &req.canonical_args);
        let now = now_ms();
        let context: Vec<&str> = req.context.iter().map(|c| c.as_str()).collect();
        let context_text = context.join(",");
        let decided = self.store().transaction(|s| {
            loop {
                let found = s.candidates(&req.session, &req.fingerprint)?;
                let ev = evaluate(&req.tool, class, risk, &found, &req.context);
                // One write transaction: a token found here cannot be spent by anyone else before
                // this statement; the loop is for a store that would let that happen anyway.
                if let Some(token) = ev.spend
                    && !s.spend_token(token)?
                {
                    continue;
                }
                if ev.verdict != Verdict::Ask {
                    return Ok((ev, None));
                }
                let over = if s.open_asks(&req.session)? >= self.cfg.max_open_asks {
                    Some(Basis::AskCap)
                } else if self.subtree_over_asks(s, req)? {
                    Some(Basis::Budget("asks"))
                } else {
                    None
                };
                if let Some(basis) = over {
                    return Ok((
                        Evaluation {
                            verdict: Verdict::Deny,
                            basis,
                            ..ev
                        },
                        None,
                    ));
                }
                // Who asks, as the ask keeps it (only an ask needs it).
                let (lineage_text, chain) = match &req.lineage {
                    Some(l) => (
                        serde_json::to_string(l).unwrap_or_default(),
                        crate::store::chain_key(l.sessions()),
                    ),
                    None => (
                        String::new(),
                        crate::store::chain_key([req.session.as_str()].into_iter()),
                    ),
                };
                // The ask is in the database before anyone is shown it or told its id.
                let id = s.insert_pending(&NewPending {
                    session: &req.session,
                    tool: &req.tool,
                    args: &req.canonical_args,
                    fp: &req.fingerprint,
                    class: ev.class.label(),
                    risk,
                    basis: &ev.basis.to_string(),
                    context: &context_text,
                    created_ms: now,
                    expires_ms: now + self.cfg.ask_ttl.as_millis() as i64,
                    lineage: &lineage_text,
                    chain: &chain,
                })?;
                return Ok((ev, Some(id)));
            }
        });
        let stored = Instant::now();
        let class_label = risk.map_or(class.label(), |_| "destructive");
        let (ev, pending) = match decided {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("store: {e}; denying");
                let ev = Evaluation {
                    verdict: Verdict::Deny,
                    basis: Basis::GateError,
                    class,
                    spend: None,
                };
                (ev, None)
            }
        };
        if let Some(id) = pending {
            // Owned from its first moment, so a caller that goes away mid-decide orphans it.
            lock(&self.owners).insert(id, conn);
        }
        let basis = ev.basis.to_string();
        let args_sha = sha256_hex(req.canonical_args.as_bytes());
        let record = DecisionRecord {
            session: &req.session,
            tool: &req.tool,
            verdict: ev.verdict.as_str(),
            basis: &basis,
            class: class_label,
            risk,
            pending,
            context: context.clone(),
            answered_by: None,
            fingerprint: &req.fingerprint,
            args_sha256: &args_sha,
        };
        let mut answer = Answer {
            decision: ev.verdict,
            pending,
            basis: basis.clone(),
            fingerprint: req.fingerprint.clone(),
            tier: class_label.to_owned(),
            risk: risk.map(str::to_owned),
            receipt: None,
        };
        let budgets = req
            .lineage
            .as_ref()
            .and_then(|l| serde_json::to_value(l.budget_keys()).ok());
        let receipt = self.receipts.decision_charged(&record, budgets).await;
        let receipted = Instant::now();
        let mut over_budget = false;
        match receipt {
            Ok(ack) => {
                answer.receipt = Some(ack);
                if let Some(id) = pending
                    && let Err(e) = self.store().mark_shown(id)
                {
                    // Not shown means not answerable: fail closed.
                    tracing::error!("store: cannot show ask {id}: {e}; denying");
                    self.close(
                        id,
                        "orphaned",
                        Verdict::Deny,
                        &Basis::GateError.to_string(),
                        "",
                        "gate",
                    );
                    answer.decision = Verdict::Deny;
                    answer.basis = Basis::GateError.to_string();
                    answer.pending = None;
                }
            }
            Err(e) => {
                // A subtree over its receipt budget is denied with that basis (receiptd
                // receipts the episode); anything else is receipts being unavailable.
                let basis = match crate::receipts::budget_refusal(&e) {
                    Some(b) => {
                        over_budget = true;
                        Basis::Budget(b)
                    }
                    None => {
                        tracing::warn!(session = %req.session, tool = %req.tool, "decision not receipted ({e}); denying");
                        Basis::ReceiptsUnavailable
                    }
                };
                if let Some(id) = pending {
                    let _ = self.close(
                        id,
                        "orphaned",
                        Verdict::Deny,
                        &basis.to_string(),
                        "",
                        "gate",
                    );
                }
                answer.decision = Verdict::Deny;
                answer.basis = basis.to_string();
                answer.pending = None;
            }
        }
        if over_budget {
            // No receipt and no audit row: receiptd's episode receipt is the record, and gate.db
            // must not grow with a flood it refuses. The answer is held a while, so a caller
            // looping on refusals spends its own time, not the host's.
            tokio::time::sleep(BUDGET_BACKOFF).await;
            return answer;
        }
        let receipt_text = answer
            .receipt
            .as_ref()
            .map(|a| format!("{}:{}", a.seq, a.hash));
        // The receipt is the durable record; the audit row rides on the next transaction.
        self.store().queue_decision(DecisionRow {
            session: req.session.clone(),
            tool: req.tool.clone(),
            fp: req.fingerprint.clone(),
            verdict: answer.decision,
            basis: answer.basis.clone(),
            pending_id: answer.pending,
            receipt: receipt_text,
            at_ms: now,
        });
        self.decisions_queued.notify_one();
        if let Some(id) = answer.pending {
            self.events.push(
                &req.session,
                format!(
                    "pending {id} session={} tool={} tier={class_label} fp={} bytes={}\n",
                    req.session,
                    // One event a line: a tool name is escaped like everything else shown.
                    crate::escape::escape(&req.tool),
                    &req.fingerprint[..16],
                    req.canonical_args.len()
                ),
            );
            self.new_ask.notify_one();
        }
        // Per-hop timing of the decide path (WARREN_LOG=debug): policy and store, the receipt
        // round trip to receiptd, and recording the decision.
        tracing::debug!(
            policy_store_us = (stored - started).as_micros() as u64,
            receipt_us = (receipted - stored).as_micros() as u64,
            record_us = receipted.elapsed().as_micros() as u64,
            "decide"
        );
        answer
    }

    /// Whether one more ask would put the caller's subtree, or that of any namespace above it,
    /// over its open-ask budget (the tightest `limit asks=` at or above each, else the default).
    fn subtree_over_asks(&self, s: &Store, req: &DecideRequest) -> rusqlite::Result<bool> {
        let caps = match &req.lineage {
            Some(l) => l.ask_caps(self.cfg.subtree_asks),
            None => vec![(req.session.as_str(), self.cfg.subtree_asks)],
        };
        for (session, cap) in caps {
            if s.open_asks_in_subtree(session)? as u64 >= cap {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits until ask `id` is closed and returns the outcome for its caller. An ask answered
    /// `allow once` is allowed only by spending its token here: of two identical calls, one runs.
    pub async fn wait(&self, id: i64, conn: ConnId) -> Result<Answer, Errno> {
        loop {
            let mut closed = self.closed.subscribe();
            let row = self
                .store()
                .pending(id)
                .map_err(|_| Errno::EIO)?
                .ok_or(Errno::ENOENT)?;
            if row.state != "open" {
                return Ok(self.outcome(&row).await);
            }
            let left = row.expires_ms - now_ms();
            if left <= 0 {
                self.expire(id).await;
                continue;
            }
            lock(&self.owners).insert(id, conn);
            tokio::select! {
                _ = closed.changed() => {}
                () = tokio::time::sleep(Duration::from_millis(left as u64)) => {}
            }
        }
    }

    async fn outcome(&self, row: &PendingRow) -> Answer {
        let mut answer = Answer {
            decision: Verdict::Deny,
            pending: Some(row.id),
            basis: row
                .outcome_basis
                .clone()
                .unwrap_or_else(|| Basis::GateError.to_string()),
            fingerprint: row.fp.clone(),
            tier: row.class.clone(),
            risk: row.risk.clone(),
            receipt: None,
        };
        if row.outcome.as_deref() != Some("allow") {
            return answer;
        }
        if row.answer.as_deref() != Some(Verb::AllowOnce(String::new()).as_str()) {
            answer.decision = Verdict::Allow;
            return answer;
        }
        // allow once: this caller runs only if it spends a token for the fingerprint.
        let spent = self.store().spend_once(&row.fp);
        let (verdict, basis) = match spent {
            Ok(Some(token)) => (Verdict::Allow, Basis::AllowOnce(token)),
            Ok(None) => (Verdict::Deny, Basis::OnceSpent),
            Err(e) => {
                tracing::error!("store: {e}");
                (Verdict::Deny, Basis::GateError)
            }
        };
        let basis = basis.to_string();
        let receipted = self.receipt_for(row, verdict, &basis, None).await;
        match receipted {
            Ok(ack) => {
                answer.decision = verdict;
                answer.basis = basis;
                answer.receipt = Some(ack);
            }
            Err(e) => {
                tracing::warn!("allow-once spend not receipted ({e}); denying");
                answer.basis = Basis::ReceiptsUnavailable.to_string();
            }
        }
        answer
    }

    /// Receipts a decision about a stored ask.
    async fn receipt_for(
        &self,
        row: &PendingRow,
        verdict: Verdict,
        basis: &str,
        by: Option<&str>,
    ) -> Result<Ack, String> {
        let args_sha = sha256_hex(row.args.as_bytes());
        let record = DecisionRecord {
            session: &row.session,
            tool: &row.tool,
            verdict: verdict.as_str(),
            basis,
            class: &row.class,
            risk: row.risk.as_deref(),
            pending: Some(row.id),
            context: row.context.split(',').filter(|c| !c.is_empty()).collect(),
            answered_by: by,
            fingerprint: &row.fp,
            args_sha256: &args_sha,
        };
        self.receipts.decision(&record).await
    }

    /// Answers ask `id` on behalf of `scope`. The answer is receipted before it takes effect; if
    /// it cannot be, the ask stays open and the writer gets EIO.
    pub async fn answer(
        &self,
        id: i64,
        verb: &Verb,
        scope: &Scope,
    ) -> Result<String, (Errno, String)> {
        scope.may_use(verb)?;
        let _one_at_a_time = self.answering.lock().await;
        let row = self.visible_row(id, scope)?;
        if row.state != "open" {
            return Err((
                Errno::EPERM,
                format!("ask {id} is {}: it can no longer be answered", row.state),
            ));
        }
        if row.expires_ms <= now_ms() {
            drop(_one_at_a_time);
            self.expire(id).await;
            return Err((
                Errno::EPERM,
                format!("ask {id} expired: it can no longer be answered"),
            ));
        }
        if let Verb::AllowOnce(prefix) = verb
            && !row.fp.starts_with(prefix.as_str())
        {
            return Err((
                Errno::EINVAL,
                format!("fingerprint prefix {prefix} is not ask {id}'s (see its request)"),
            ));
        }
        if matches!(verb, Verb::AllowOnce(_)) {
            // A capped channel's allow above its cap is refused; the ask stays open for this
            // host's operator.
            scope.may_allow(&row.class, &row.basis)?;
        }
        if *verb == Verb::Withdraw {
            drop(_one_at_a_time);
            self.orphan(id).await;
            return Ok(format!("ask {id} withdrawn"));
        }
        let verdict = if *verb == Verb::Deny {
            Verdict::Deny
        } else {
            Verdict::Allow
        };
        let by = scope.label();
        let answer_basis = format!("answer:{}", verb.as_str().replace(' ', "_"));
        let receipted = self
            .receipt_for(&row, verdict, &answer_basis, Some(by.as_str()))
            .await;
        receipted.map_err(|e| {
            (
                Errno::EIO,
                format!("the answer could not be receipted ({e}); ask {id} stays open"),
            )
        })?;
        let now = now_ms();
        let closed = self.store().transaction(|s| {
            let basis = match verb {
                Verb::AllowOnce(_) => {
                    s.add_once_token(&row.fp, Some(id), now)?;
                    "allow_once".to_owned()
                }
                Verb::AllowSession => Basis::SessionGrant(s.add_session_grant(
                    &row.session,
                    &row.fp,
                    Verdict::Allow,
                    Some(id),
                    now,
                )?)
                .to_string(),
                Verb::Deny => Basis::DenyCovers(s.add_session_grant(
                    &row.session,
                    &row.fp,
                    Verdict::Deny,
                    Some(id),
                    now,
                )?)
                .to_string(),
                Verb::AllowAlways => {
                    let selector = crate::policy::Selector::Tool(row.tool.clone());
                    Basis::Rule(s.add_rule(
                        Verdict::Allow,
                        &selector,
                        &format!("allow always on ask {id} by {by}"),
                        now,
                    )?)
                    .to_string()
                }
                Verb::Withdraw => unreachable!("handled above"),
            };
            let closing = Closing {
                state: "answered",
                outcome: verdict,
                basis: &basis,
                answer: verb.as_str(),
                by: &by,
                at_ms: now,
            };
            if !s.close_pending(id, &closing)? {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            }
            Ok(basis)
        });
        let basis =
            closed.map_err(|e| (Errno::EIO, format!("ask {id} could not be answered: {e}")))?;
        self.after_close(id, &row.session, "answered", verdict, &basis);
        Ok(format!("ask {id}: {} ({basis})", verb.as_str()))
    }

    /// The ask `id` if `scope` may see it and it has been shown (ENOENT otherwise, the same as no
    /// such ask).
    pub fn visible_row(&self, id: i64, scope: &Scope) -> Result<PendingRow, (Errno, String)> {
        let row = self
            .store()
            .pending(id)
            .map_err(|e| (Errno::EIO, e.to_string()))?;
        match row {
            // An ask exists for no one until its receipt is written (then it is `shown`).
            Some(r) if r.shown && scope.sees_session(&r.session) => Ok(r),
            _ => Err((Errno::ENOENT, format!("no ask {id}"))),
        }
    }

    /// Closes an open ask with no answer. Returns whether it was open.
    fn close(
        &self,
        id: i64,
        state: &'static str,
        outcome: Verdict,
        basis: &str,
        answer: &str,
        by: &str,
    ) -> bool {
        let closing = Closing {
            state,
            outcome,
            basis,
            answer,
            by,
            at_ms: now_ms(),
        };
        match self.store().close_pending(id, &closing) {
            Ok(closed) => closed,
            Err(e) => {
                tracing::error!("store: cannot close ask {id}: {e}");
                false
            }
        }
    }

    fn after_close(&self, id: i64, session: &str, state: &str, verdict: Verdict, basis: &str) {
        lock(&self.owners).remove(&id);
        self.events
            .push(session, format!("closed {id} {state} {verdict} {basis}\n"));
        self.closed.send_modify(|n| *n += 1);
    }

    /// Denies an ask nobody answered in time (basis `expiry`).
    async fn expire(&self, id: i64) {
        self.close_unanswered(id, "expired", Basis::Expiry).await;
    }

    /// Orphans an ask whose caller is gone: it is denied and can no longer be answered.
    async fn orphan(&self, id: i64) {
        self.close_unanswered(id, "orphaned", Basis::Orphaned).await;
    }

    async fn close_unanswered(&self, id: i64, state: &'static str, basis: Basis) {
        let Ok(Some(row)) = self.store().pending(id) else {
            return;
        };
        if row.state != "open"
            || !self.close(id, state, Verdict::Deny, &basis.to_string(), "", "gate")
        {
            return;
        }
        let basis_text = basis.to_string();
        let receipted = self
            .receipt_for(&row, Verdict::Deny, &basis_text, Some("gate"))
            .await;
        // A deny with nobody to tell: if it cannot be receipted it is still a deny.
        if let Err(e) = receipted {
            tracing::warn!("ask {id} {state} but not receipted: {e}");
        }
        self.after_close(id, &row.session, state, Verdict::Deny, &basis_text);
    }

    /// The connection `conn` ended: each open ask it owns is orphaned after the grace period
    /// unless a new connection waits on it first (toolfs re-waits after a reconnect).
    pub fn conn_closed(self: &Arc<Gate>, conn: ConnId) {
        let owned: Vec<i64> = lock(&self.owners)
            .iter()
            .filter(|(_, c)| **c == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in owned {
            self.orphan_later(id, conn);
        }
    }

    fn orphan_later(self: &Arc<Gate>, id: i64, owner: ConnId) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let gate = self.clone();
        lock(&self.owners).insert(id, owner);
        rt.spawn(async move {
            tokio::time::sleep(gate.cfg.orphan_grace).await;
            let still_unclaimed = lock(&gate.owners).get(&id) == Some(&owner);
            if still_unclaimed {
                gate.orphan(id).await;
            }
        });
    }

    async fn expiry_loop(self: Arc<Gate>) {
        loop {
            let next = self.store().next_expiry().ok().flatten();
            match next {
                Some(at) => {
                    let left = (at - now_ms()).max(0) as u64;
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(left)) => {}
                        () = self.new_ask.notified() => {}
                    }
                }
                None => self.new_ask.notified().await,
            }
            let due = self.store().due(now_ms()).unwrap_or_default();
            for id in due {
                self.expire(id).await;
            }
        }
    }
}
