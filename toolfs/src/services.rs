//! What every connection's calls share: the gate, the receipt daemon, the echo journal, each
//! session's context states, and the per-hop timings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warren_gate::policy::ContextState;

use crate::echo::EchoJournal;
use crate::effects::Receipts;
use crate::worker::nsd::WorkerBuilder;
use warren_proto::gate::GateClient;

pub struct Services {
    pub gate: GateClient,
    pub receipts: Receipts,
    pub journal: Arc<EchoJournal>,
    /// nsd's worker socket: every worker is built there, or the call is refused.
    pub workers: WorkerBuilder,
    pub hops: HopTimes,
    /// Kept for toolfs's lifetime: a session's states only ever rise, and a session that
    /// reconnects (a restarted bridge) must not find them lowered.
    contexts: Mutex<HashMap<String, Arc<SessionContext>>>,
}

impl Services {
    pub fn new(
        gate: GateClient,
        receipts: Receipts,
        journal: EchoJournal,
        workers: WorkerBuilder,
    ) -> Services {
        Services {
            gate,
            receipts,
            journal: Arc::new(journal),
            workers,
            hops: HopTimes::default(),
            contexts: Mutex::new(HashMap::new()),
        }
    }

    /// The context states of `session` (shared by all its connections).
    pub fn context(&self, session: &str) -> Arc<SessionContext> {
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(session.to_owned())
            .or_default()
            .clone()
    }
}

/// The typed context states toolfs sets for a session (`specs/gate-tree.md`; they only raise).
#[derive(Default)]
pub struct SessionContext {
    untrusted: AtomicBool,
}

impl SessionContext {
    /// The session has been handed tainted content (a tool's result).
    pub fn mark_untrusted(&self) {
        self.untrusted.store(true, Ordering::Release);
    }

    pub fn states(&self) -> Vec<ContextState> {
        if self.untrusted.load(Ordering::Acquire) {
            vec![ContextState::UntrustedContext]
        } else {
            Vec::new()
        }
    }
}

/// Total time and count per hop of a call: two relaxed atomic adds per hop.
#[derive(Default)]
pub struct HopTimes {
    decide: Hop,
    run: Hop,
    effect: Hop,
}

#[derive(Default)]
struct Hop {
    nanos: AtomicU64,
    count: AtomicU64,
}

impl Hop {
    fn add(&self, d: Duration) {
        self.nanos.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn mean_us(&self) -> (u64, f64) {
        let n = self.count.load(Ordering::Relaxed);
        let ns = self.nanos.load(Ordering::Relaxed);
        (
            n,
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1e3
            },
        )
    }
}

impl HopTimes {
    pub fn decide(&self, d: Duration) {
        self.decide.add(d);
    }
    pub fn run(&self, d: Duration) {
        self.run.add(d);
    }
    pub fn effect(&self, d: Duration) {
        self.effect.add(d);
    }

    /// One line: count and mean per hop.
    pub fn summary(&self) -> String {
        let (dn, du) = self.decide.mean_us();
        let (rn, ru) = self.run.mean_us();
        let (en, eu) = self.effect.mean_us();
        format!(
            "decide (incl. ask waits) {dn} x {du:.1} us, run {rn} x {ru:.1} us, receipt of the run queued {en} x {eu:.1} us"
        )
    }
}

/// A fresh session id for an operator connection: 128 random bits, 32 lowercase hex digits.
pub fn mint_session() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the kernel's random source");
    hex::encode(bytes)
}
