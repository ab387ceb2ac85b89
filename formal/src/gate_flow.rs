//! The gate's decision flow for one fingerprint in one session, with the daemons crashing.
//!
//! What is modelled (docs/gate.md, specs/gate-tree.md "decide"): identical exec-tier calls (one
//! fingerprint, one session) each `decide` once; with nothing to allow them they ask, and wait.
//! The operator answers an open ask `allow once` (a token for the fingerprint) or `deny` (a deny
//! session grant on the fingerprint), or lets it expire; a caller may go away while it waits
//! (its ask is orphaned). A waiter whose ask was allowed runs only by spending a token; a fresh
//! identical `decide` may spend one too. The gate and receiptd each may crash and come back
//! (asks, tokens and grants are in SQLite and survive); toolfs denies when the gate is down, the
//! gate denies when the decision's receipt cannot be written. Effects and effect receipts are
//! out of scope.
//!
//! Each `Bug` is a way the real code could be wrong; `tests/gate_flow.rs` shows the checker
//! finds each one, so the properties are not vacuous.

use stateright::{Model, Property};

/// A planted defect, to show the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Spending a token reads "is there one?" and marks it spent in two steps (no `spent = 0`
    /// guard in one statement): two callers can both see the last token.
    SpendCheckThenSet,
    /// The gate allows even when receiptd cannot write the decision's receipt (fail open).
    AllowWithoutReceipt,
    /// `deny` answers the ask but records no deny grant for the session.
    DenyNotRemembered,
}

/// The flow for `callers` identical calls, at most `answers` operator answers and at most
/// `crashes` crashes of each daemon.
#[derive(Clone, Debug)]
pub struct GateFlow {
    pub callers: usize,
    pub answers: u8,
    pub crashes: u8,
    pub bug: Option<Bug>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Caller {
    /// Has not called `decide` yet.
    Ready,
    /// Waiting on the ask with this index.
    Waiting(usize),
    /// Only under `Bug::SpendCheckThenSet`: saw a token, has not marked it spent.
    Spending,
    /// Allowed: the tool runs.
    Allowed,
    Denied,
    /// Went away while waiting.
    Gone,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Ask {
    Open,
    AnsweredOnce,
    AnsweredDeny,
    Expired,
    Orphaned,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub callers: Vec<Caller>,
    pub asks: Vec<Ask>,
    /// Unspent `allow once` tokens for the fingerprint.
    pub tokens: u8,
    /// A deny session grant on the fingerprint.
    pub deny_grant: bool,
    pub gate_up: bool,
    pub receiptd_up: bool,
    pub gate_crashes: u8,
    pub receiptd_crashes: u8,
    pub answers_given: u8,
    // Ghost variables: what the properties look at, never read by the flow itself.
    /// Callers whose allow was written as a decision receipt before they were told.
    pub allow_receipted: Vec<bool>,
    pub allow_once_answers: u8,
    pub allows: u8,
    pub denied_by_operator: bool,
    /// A `decide` (not a waiter on an ask answered earlier) allowed after the operator denied.
    pub fresh_allow_after_deny: bool,
    pub lost_token_race: bool,
    pub allowed_after_restart: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Decide(usize),
    Wait(usize),
    CommitSpend(usize),
    GoAway(usize),
    AnswerOnce(usize),
    AnswerDeny(usize),
    Expire(usize),
    CrashGate,
    RestartGate,
    CrashReceiptd,
    RestartReceiptd,
}

/// What a spend attempt by a caller comes to.
enum Spend {
    Allowed,
    /// `Bug::SpendCheckThenSet` only: the check passed, the mark comes later.
    Checked,
    NoToken,
    NoReceipt,
}

impl GateFlow {
    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// Spends a token for caller `c`, then writes the allowing receipt, as the gate does (one
    /// `UPDATE … WHERE spent = 0 RETURNING`, then the receipt; a receipt that fails denies and
    /// the token stays spent: fail closed). `fresh` is a `decide`, not a waiter.
    fn spend(&self, s: &mut State, c: usize, fresh: bool) -> Spend {
        if s.tokens == 0 {
            return Spend::NoToken;
        }
        if self.has(Bug::SpendCheckThenSet) {
            return Spend::Checked;
        }
        s.tokens -= 1;
        self.allow_if_receipted(s, c, fresh)
    }

    fn allow_if_receipted(&self, s: &mut State, c: usize, fresh: bool) -> Spend {
        if !s.receiptd_up && !self.has(Bug::AllowWithoutReceipt) {
            s.callers[c] = Caller::Denied;
            return Spend::NoReceipt;
        }
        s.allow_receipted[c] = s.receiptd_up;
        s.callers[c] = Caller::Allowed;
        s.allows += 1;
        s.fresh_allow_after_deny |= fresh && s.denied_by_operator;
        s.allowed_after_restart |= s.gate_crashes > 0 || s.receiptd_crashes > 0;
        Spend::Allowed
    }

    fn open_ask(s: &State, a: usize) -> bool {
        s.asks.get(a) == Some(&Ask::Open)
    }
}

impl Model for GateFlow {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            callers: vec![Caller::Ready; self.callers],
            asks: Vec::new(),
            tokens: 0,
            deny_grant: false,
            gate_up: true,
            receiptd_up: true,
            gate_crashes: 0,
            receiptd_crashes: 0,
            answers_given: 0,
            allow_receipted: vec![false; self.callers],
            allow_once_answers: 0,
            allows: 0,
            denied_by_operator: false,
            fresh_allow_after_deny: false,
            lost_token_race: false,
            allowed_after_restart: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, caller) in s.callers.iter().enumerate() {
            match *caller {
                Caller::Ready => actions.push(Action::Decide(c)),
                Caller::Waiting(a) => {
                    if s.asks[a] != Ask::Open {
                        actions.push(Action::Wait(c));
                    } else {
                        actions.push(Action::GoAway(c));
                    }
                }
                Caller::Spending => actions.push(Action::CommitSpend(c)),
                _ => {}
            }
        }
        if s.gate_up && s.receiptd_up && s.answers_given < self.answers {
            for (a, ask) in s.asks.iter().enumerate() {
                if *ask == Ask::Open {
                    actions.push(Action::AnswerOnce(a));
                    actions.push(Action::AnswerDeny(a));
                }
            }
        }
        for (a, ask) in s.asks.iter().enumerate() {
            if *ask == Ask::Open && s.gate_up {
                actions.push(Action::Expire(a));
            }
        }
        if s.gate_up && s.gate_crashes < self.crashes {
            actions.push(Action::CrashGate);
        }
        if !s.gate_up {
            actions.push(Action::RestartGate);
        }
        if s.receiptd_up && s.receiptd_crashes < self.crashes {
            actions.push(Action::CrashReceiptd);
        }
        if !s.receiptd_up {
            actions.push(Action::RestartReceiptd);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Decide(c) => {
                if !s.gate_up {
                    // toolfs cannot reach the gate: the call is denied, never run.
                    s.callers[c] = Caller::Denied;
                } else if s.deny_grant {
                    s.callers[c] = Caller::Denied;
                } else if s.tokens > 0 {
                    match self.spend(&mut s, c, true) {
                        Spend::Allowed | Spend::NoReceipt => {}
                        Spend::Checked => s.callers[c] = Caller::Spending,
                        Spend::NoToken => s.callers[c] = Caller::Denied,
                    }
                } else if !s.receiptd_up {
                    // An ask whose receipt fails is closed: deny.
                    s.callers[c] = Caller::Denied;
                } else {
                    s.asks.push(Ask::Open);
                    s.callers[c] = Caller::Waiting(s.asks.len() - 1);
                }
            }
            Action::Wait(c) => {
                // toolfs re-waits across a gate restart: a down gate just delays the answer.
                if !s.gate_up {
                    return None;
                }
                let Caller::Waiting(a) = s.callers[c] else {
                    return None;
                };
                match s.asks[a] {
                    Ask::AnsweredOnce => match self.spend(&mut s, c, false) {
                        Spend::Allowed | Spend::NoReceipt => {}
                        Spend::Checked => s.callers[c] = Caller::Spending,
                        Spend::NoToken => {
                            s.lost_token_race = true;
                            s.callers[c] = Caller::Denied;
                        }
                    },
                    Ask::AnsweredDeny | Ask::Expired | Ask::Orphaned => {
                        s.callers[c] = Caller::Denied
                    }
                    Ask::Open => return None,
                }
            }
            Action::CommitSpend(c) => {
                // The second half of the planted check-then-set: marks "a" token spent.
                s.tokens = s.tokens.saturating_sub(1);
                self.allow_if_receipted(&mut s, c, false);
            }
            Action::GoAway(c) => {
                let Caller::Waiting(a) = s.callers[c] else {
                    return None;
                };
                s.callers[c] = Caller::Gone;
                s.asks[a] = Ask::Orphaned;
            }
            Action::AnswerOnce(a) => {
                if !Self::open_ask(&s, a) {
                    return None;
                }
                s.asks[a] = Ask::AnsweredOnce;
                s.tokens += 1;
                s.answers_given += 1;
                s.allow_once_answers += 1;
            }
            Action::AnswerDeny(a) => {
                if !Self::open_ask(&s, a) {
                    return None;
                }
                s.asks[a] = Ask::AnsweredDeny;
                s.deny_grant = !self.has(Bug::DenyNotRemembered);
                s.answers_given += 1;
                s.denied_by_operator = true;
            }
            Action::Expire(a) => {
                if !Self::open_ask(&s, a) {
                    return None;
                }
                s.asks[a] = Ask::Expired;
            }
            Action::CrashGate => {
                s.gate_up = false;
                s.gate_crashes += 1;
            }
            Action::RestartGate => s.gate_up = true,
            Action::CrashReceiptd => {
                s.receiptd_up = false;
                s.receiptd_crashes += 1;
            }
            Action::RestartReceiptd => s.receiptd_up = true,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no call runs without an allowing decision receipt",
                |_, s: &State| {
                    s.callers
                        .iter()
                        .zip(&s.allow_receipted)
                        .all(|(c, receipted)| *c != Caller::Allowed || *receipted)
                },
            ),
            Property::always("an allow once runs at most one call", |_, s: &State| {
                s.allows <= s.allow_once_answers
            }),
            Property::always(
                "a deny covers identical calls for the session",
                |_, s: &State| !s.fresh_allow_after_deny,
            ),
            Property::sometimes("a call runs", |_, s: &State| s.allows > 0),
            Property::sometimes("a waiter loses the race for the token", |_, s: &State| {
                s.lost_token_race
            }),
            Property::sometimes("a call runs after a daemon restart", |_, s: &State| {
                s.allowed_after_restart
            }),
            Property::sometimes("a deny is answered", |_, s: &State| s.denied_by_operator),
        ]
    }
}
