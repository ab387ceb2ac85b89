//! Verdicts and what answered them.

use std::fmt;

use super::context::ContextState;

pub use warren_proto::gate::Verdict;

/// What answered a decision. Rendered as `kind` or `kind:detail` (see `specs/gate-tree.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Basis {
    /// A rule in `rules`, by id.
    Rule(i64),
    /// An `allow session` grant for this session and fingerprint, by id.
    SessionGrant(i64),
    /// An earlier `deny` of this fingerprint in this session, by id.
    DenyCovers(i64),
    /// An `allow once` token for this fingerprint, spent by this decision, by id.
    AllowOnce(i64),
    /// The default for the call's (effective) class, by label.
    Default(&'static str),
    /// A context state raised the call.
    Context(ContextState),
    /// An ask nobody answered in time.
    Expiry,
    /// The decision could not be receipted.
    ReceiptsUnavailable,
    /// The session has too many open asks.
    AskCap,
    /// The caller's namespace subtree is over one of its budgets (`asks`, `receipts`).
    Budget(&'static str),
    /// The ask's caller went away (or withdrew it).
    Orphaned,
    /// The ask was answered `allow once`, but an identical call spent the token first.
    OnceSpent,
    /// The gate's own store failed; it denies rather than guess.
    GateError,
}

impl fmt::Display for Basis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Basis::Rule(id) => write!(f, "rule:{id}"),
            Basis::SessionGrant(id) => write!(f, "session_grant:{id}"),
            Basis::DenyCovers(id) => write!(f, "deny_covers:{id}"),
            Basis::AllowOnce(id) => write!(f, "allow_once:{id}"),
            Basis::Default(label) => write!(f, "default:{label}"),
            Basis::Context(s) => write!(f, "context:{s}"),
            Basis::Expiry => f.write_str("expiry"),
            Basis::ReceiptsUnavailable => f.write_str("receipts_unavailable"),
            Basis::AskCap => f.write_str("ask_cap"),
            Basis::Budget(what) => write!(f, "budget:{what}"),
            Basis::Orphaned => f.write_str("orphaned"),
            Basis::OnceSpent => f.write_str("once_spent"),
            Basis::GateError => f.write_str("gate_error"),
        }
    }
}
