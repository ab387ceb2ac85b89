//! One open of a `call` file: one call. Writes append the arguments whatever their offset; the
//! first read runs the call; every read returns a slice of the one immutable result, at
//! `offset − o₀` where o₀ is the offset of the first read.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::task::JoinHandle;
use warren_9p::{Errno, Result};

use serde_json::json;
use warren_proto::gate::client::{GATE_UNAVAILABLE, unavailable};
use warren_proto::gate::{Answer, Verdict};

use crate::args::{self, Arguments};
use crate::dispatch::{Dispatcher, Runnable};
use crate::effects::{ReceiptRef, ReceiptSlot, ran_kind};
use crate::envelope::{Envelope, Status, Taint, content_digest};
use crate::grant::GrantedTool;
use crate::tree::CallSlot;

enum Phase {
    /// Collecting arguments; nothing has run.
    Writing,
    /// The first read is readying the call (asking the gate, waiting for an ask's answer,
    /// finding the worker). If
    /// that read is flushed the call is withdrawn and this phase is what the next read finds.
    Preparing,
    /// Started: it runs to its end in its own task, whatever happens to the reads or the fid.
    Running(JoinHandle<Arc<Vec<u8>>>),
    Done(Arc<Vec<u8>>),
    /// Withdrawn before it started (its first read was flushed).
    Withdrawn,
}

/// What a call's read returns: the envelope (`call`), or the envelope with an MCP tool's result
/// in MCP's own form beside its text (`call.mcp`, [`Envelope::mcp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultForm {
    Envelope,
    Mcp,
}

pub struct CallOpen {
    tool: Arc<GrantedTool>,
    form: ResultForm,
    args: Vec<u8>,
    /// o₀: the offset of the first read.
    first_read_at: Option<u64>,
    /// Why an argument write was refused, if one was: the call is then poisoned and never runs
    /// (its first read answers with an error), because a reader may already have sent that read
    /// before it saw the refusal (the bridge sends a call's write with its first read).
    refused: Option<String>,
    phase: Phase,
    slot: Arc<CallSlot>,
}

/// Where a call's gate decision stands, shared between the call's read and the task that asks
/// the gate: the read may be dropped (Tflush, or its connection ending) while the gate is making
/// an ask whose id it has not answered yet, and that ask must still be withdrawn.
#[derive(Debug, Default)]
enum AskState {
    /// No ask is open for the call (not asked yet, or its ask was answered).
    #[default]
    None,
    /// The gate is deciding; whether it makes an ask is not known yet.
    Deciding,
    /// The call was withdrawn while the gate decided: the deciding task withdraws it, naming
    /// the ask the gate made (if any), once the gate has answered.
    Abandoned,
    /// Ask `id` is open and the call waits for it.
    Pending(i64),
}

/// Withdraws the call if the first read's future is dropped (Tflush) before the call started:
/// the gate's pending ask (if one is open, or is being made) is withdrawn and the withdrawal
/// receipted.
struct Withdrawal {
    dispatcher: Arc<Dispatcher>,
    tool: String,
    args_digest: String,
    ask: Arc<Mutex<AskState>>,
    armed: bool,
}

impl Drop for Withdrawal {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let pending = {
            let mut ask = lock(&self.ask);
            match *ask {
                AskState::Pending(id) => Some(id),
                AskState::Deciding => {
                    // The deciding task withdraws the call once the gate has answered, naming
                    // the ask the gate made (if it made one).
                    *ask = AskState::Abandoned;
                    return;
                }
                AskState::None | AskState::Abandoned => None,
            }
        };
        tracing::info!(conn = %self.dispatcher.grant().label, tool = %self.tool, args = %self.args_digest, pending = ?pending, "call withdrawn: its read was flushed before it started");
        withdraw(
            self.dispatcher.clone(),
            self.tool.clone(),
            self.args_digest.clone(),
            pending,
            "flushed before it started",
        );
    }
}

fn lock(ask: &Mutex<AskState>) -> std::sync::MutexGuard<'_, AskState> {
    ask.lock().unwrap_or_else(|e| e.into_inner())
}

/// In the background (it may run from a destructor): withdraws ask `pending` at the gate, then
/// queues a `withdrawn` receipt (or, with the queue refusing, says at error level that it could
/// not: nothing ran, so there is no call to refuse).
fn withdraw(
    dispatcher: Arc<Dispatcher>,
    tool: String,
    args_digest: String,
    pending: Option<i64>,
    why: impl Into<String>,
) {
    let why = why.into();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::error!(tool, "withdrawn call not receipted: no runtime");
        return;
    };
    runtime.spawn(async move {
        let services = dispatcher.services();
        if let Some(id) = pending {
            services.gate.withdraw(id).await;
        }
        let mut subject = json!({"tool": tool, "why": why});
        if let Some(id) = pending {
            subject["pending"] = json!(id);
        }
        match services.receipts.reserve() {
            Ok(slot) => slot.send(
                dispatcher.session(),
                "withdrawn",
                subject,
                json!({"args": args_digest}),
            ),
            Err(e) => tracing::error!(tool, "withdrawn call not receipted: {e}"),
        }
    });
}

/// The envelope of a call the gate did not allow: the gate's basis, and its decision receipt.
fn denied(tool: &str, session: &str, answer: &Answer) -> Envelope {
    let mut env = Envelope::denied(tool, &answer.basis);
    env.receipt = answer
        .receipt
        .as_ref()
        .map(|ack| ReceiptRef::decision(session, ack));
    env
}

impl CallOpen {
    pub(crate) fn new(tool: Arc<GrantedTool>, slot: CallSlot, form: ResultForm) -> CallOpen {
        CallOpen {
            tool,
            form,
            args: Vec::new(),
            first_read_at: None,
            refused: None,
            phase: Phase::Writing,
            slot: Arc::new(slot),
        }
    }

    pub fn append(&mut self, data: &[u8], max_arg_bytes: usize) -> Result<u32> {
        if !matches!(self.phase, Phase::Writing) {
            // The result is immutable once the call has been read: a new call needs a new open.
            return Err(Errno::EBUSY);
        }
        if self.args.len() + data.len() > max_arg_bytes {
            self.refused = Some(format!(
                "a write took the arguments over {max_arg_bytes} bytes (EFBIG); nothing ran"
            ));
            return Err(Errno::EFBIG);
        }
        self.args.extend_from_slice(data);
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    pub async fn read(
        &mut self,
        dispatcher: &Arc<Dispatcher>,
        offset: u64,
        count: u32,
    ) -> Result<Vec<u8>> {
        loop {
            match &mut self.phase {
                Phase::Writing => {
                    self.first_read_at = Some(offset);
                    self.phase = Phase::Preparing;
                    self.phase = self.start(dispatcher).await;
                }
                Phase::Preparing => {
                    // The read that was readying this call was flushed: the call is withdrawn.
                    self.phase = Phase::Withdrawn;
                }
                Phase::Withdrawn => return Err(Errno::ECANCELED),
                Phase::Running(handle) => {
                    let result = match handle.await {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            tracing::error!(tool = %self.tool.def.gate_name, "call task failed: {e}");
                            let env = Envelope::new(
                                &self.tool.def.gate_name,
                                Status::Error,
                                Taint::Trusted,
                                "the call failed inside toolfs".into(),
                            );
                            Arc::new(env.to_canonical())
                        }
                    };
                    self.phase = Phase::Done(result);
                }
                Phase::Done(result) => {
                    let o0 = self.first_read_at.expect("set by the first read");
                    let Some(rel) = offset.checked_sub(o0) else {
                        return Err(Errno::EINVAL);
                    };
                    return Ok(warren_9p::synthetic::slice(result, rel, count));
                }
            }
        }
    }

    /// Parses the call, has the gate decide it (waiting for an ask's answer), readies it and, if
    /// all that succeeds, starts it in a task of its own.
    async fn start(&self, dispatcher: &Arc<Dispatcher>) -> Phase {
        let name = self.tool.def.gate_name.as_str();
        let parsed = match &self.refused {
            Some(why) => Err(why.clone()),
            None => args::prepare(&self.args, &self.tool.def.validator).map_err(|e| e.to_string()),
        };
        let mut prepared = match parsed {
            Ok(a) => a,
            Err(why) => {
                // Untrusted: the reason may quote the arguments.
                let env = Envelope::new(
                    name,
                    Status::Error,
                    Taint::Untrusted,
                    format!("invalid arguments: {why}"),
                );
                return Phase::Done(Arc::new(env.to_canonical()));
            }
        };
        let mut withdrawal = Withdrawal {
            dispatcher: dispatcher.clone(),
            tool: name.to_owned(),
            args_digest: content_digest(&prepared.canonical),
            ask: Arc::default(),
            armed: true,
        };
        let answer = self
            .decide(dispatcher, &mut prepared, &mut withdrawal)
            .await;
        if answer.decision != Verdict::Allow {
            withdrawal.armed = false;
            tracing::info!(conn = %dispatcher.grant().label, tool = name, basis = %answer.basis, "call denied");
            if answer.basis.starts_with(GATE_UNAVAILABLE) {
                // The gate may have written an `allow` for this call and died before answering:
                // the chain must say the call never ran (docs/decisions.md D16, "A call denied
                // because the gate did not answer").
                withdraw(
                    dispatcher.clone(),
                    name.to_owned(),
                    withdrawal.args_digest.clone(),
                    None,
                    answer.basis.clone(),
                );
            }
            let env = denied(name, dispatcher.session(), &answer);
            return Phase::Done(Arc::new(env.to_canonical()));
        }
        // Fail closed: a call whose effect receipt could not be queued does not run.
        let effect = match dispatcher.services().receipts.reserve() {
            Ok(slot) => slot,
            Err(e) => {
                withdrawal.armed = false;
                tracing::error!(conn = %dispatcher.grant().label, tool = name, "call refused: {e}");
                let refused = Answer {
                    basis: "receipts_unavailable".into(),
                    ..answer
                };
                let env = denied(name, dispatcher.session(), &refused);
                return Phase::Done(Arc::new(env.to_canonical()));
            }
        };
        let runnable = match dispatcher.prepare(&self.tool).await {
            Ok(r) => r,
            Err(env) => {
                withdrawal.armed = false;
                return Phase::Done(Arc::new(env.to_canonical()));
            }
        };
        withdrawal.armed = false;
        let (dispatcher, tool, slot) = (dispatcher.clone(), self.tool.clone(), self.slot.clone());
        let form = self.form;
        Phase::Running(tokio::spawn(async move {
            let mut env =
                run_and_receipt(&dispatcher, &tool, runnable, &prepared, &answer, effect).await;
            drop(slot);
            if form == ResultForm::Envelope {
                // `call` is read by shells and models: the text, blobs described, never inlined.
                env.mcp = None;
            }
            Arc::new(env.to_canonical())
        }))
    }

    /// The gate's answer: an ask is waited for (the read blocks) until it is answered.
    async fn decide(
        &self,
        dispatcher: &Arc<Dispatcher>,
        prepared: &mut Arguments,
        withdrawal: &mut Withdrawal,
    ) -> Answer {
        let name = self.tool.def.gate_name.as_str();
        let started = Instant::now();
        // The decision runs in a task of its own, so that dropping this read cannot lose the id
        // of an ask the gate has already made: the task withdraws it (`AskState::Abandoned`).
        *lock(&withdrawal.ask) = AskState::Deciding;
        let deciding = {
            let (dispatcher, ask) = (dispatcher.clone(), withdrawal.ask.clone());
            // The arguments go to the task and come back with the answer (no copy per call);
            // only an allow reads them again, and a task that failed is a deny.
            let (name, args) = (name.to_owned(), std::mem::take(&mut prepared.canonical));
            let args_digest = withdrawal.args_digest.clone();
            let tier = self.tool.def.gate_tier;
            tokio::spawn(async move {
                let gate = &dispatcher.services().gate;
                let answer = gate
                    .decide_at(
                        dispatcher.session(),
                        &name,
                        &args,
                        &dispatcher.context_states(),
                        dispatcher.grant().lineage.as_deref(),
                        tier,
                    )
                    .await;
                let abandoned = {
                    let mut ask = lock(&ask);
                    let abandoned = matches!(*ask, AskState::Abandoned);
                    *ask = match answer.pending {
                        Some(id) if answer.decision == Verdict::Ask && !abandoned => {
                            AskState::Pending(id)
                        }
                        _ => AskState::None,
                    };
                    abandoned
                };
                if abandoned {
                    let pending = answer.pending.filter(|_| answer.decision == Verdict::Ask);
                    tracing::info!(conn = %dispatcher.grant().label, tool = %name, args = %args_digest, ?pending, "call withdrawn: its read was flushed while the gate decided");
                    withdraw(
                        dispatcher.clone(),
                        name,
                        args_digest,
                        pending,
                        "flushed before it started",
                    );
                }
                (answer, args)
            })
        };
        let mut answer = match deciding.await {
            Ok((answer, args)) => {
                prepared.canonical = args;
                answer
            }
            Err(e) => unavailable(format!("the gate's decision failed in toolfs: {e}")),
        };
        if answer.decision == Verdict::Ask {
            answer = match answer.pending {
                Some(id) => {
                    tracing::info!(conn = %dispatcher.grant().label, tool = name, pending = id, "call waits for its ask to be answered");
                    let mut waited = dispatcher.services().gate.wait(id).await;
                    *lock(&withdrawal.ask) = AskState::None;
                    // A wait's answer may name no receipt: the ask's own decision receipt
                    // (in the same scope) is then the call's.
                    if waited.receipt.is_none() {
                        waited.receipt = answer.receipt.take();
                    }
                    waited
                }
                None => unavailable("the gate asked without a pending id"),
            };
        }
        dispatcher.services().hops.decide(started.elapsed());
        answer
    }

    /// The fid was clunked (or its connection ended).
    pub fn closed(self, dispatcher: &Arc<Dispatcher>) {
        let conn = dispatcher.grant().label.as_str();
        match self.phase {
            // Opened and closed without a byte either way (a probe, an editor's stat): no call.
            Phase::Writing if self.args.is_empty() => {}
            Phase::Writing => {
                let args_digest = content_digest(&self.args);
                tracing::info!(conn, tool = %self.tool.def.gate_name, args = %args_digest, "call withdrawn: closed before its first read");
                withdraw(
                    dispatcher.clone(),
                    self.tool.def.gate_name.clone(),
                    args_digest,
                    None,
                    "closed before its first read",
                );
            }
            Phase::Running(_) => {
                tracing::debug!(conn, tool = %self.tool.def.gate_name, "closed while running; the call runs to its end")
            }
            Phase::Preparing | Phase::Withdrawn | Phase::Done(_) => {}
        }
    }
}

/// Runs an allowed call, marks the session's context untrusted if the result is a tool's, and
/// queues the receipt of its run (`effect`, or `query` for a read-tier call: [`ran_kind`]) in the
/// place taken before it ran; the envelope names it by the decision that allowed the call.
async fn run_and_receipt(
    dispatcher: &Dispatcher,
    tool: &GrantedTool,
    runnable: Runnable,
    args: &Arguments,
    answer: &Answer,
    effect: ReceiptSlot,
) -> Envelope {
    let services = dispatcher.services();
    let started = Instant::now();
    let mut env = dispatcher.run(tool, runnable, args).await;
    services.hops.run(started.elapsed());
    if env.taint == Taint::Untrusted {
        dispatcher.context().mark_untrusted();
    }
    let started = Instant::now();
    let mut subject = json!({
        "tool": env.tool,
        "fingerprint": answer.fingerprint,
        "status": env.status,
    });
    if let Some(ack) = &answer.receipt {
        subject["decision"] = json!({"seq": ack.seq, "hash": ack.hash});
    }
    let kind = ran_kind(&answer.tier);
    effect.send_charged(
        dispatcher.session(),
        kind,
        subject,
        json!({"args": content_digest(&args.canonical), "result": env.digest}),
        dispatcher.grant().budgets.as_ref(),
    );
    services.hops.effect(started.elapsed());
    env.receipt = Some(ReceiptRef::ran(
        kind,
        dispatcher.session(),
        answer.receipt.clone(),
    ));
    env
}
