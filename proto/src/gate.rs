//! The gate's control socket records (`<runtime>/gate.ctl`): a trusted peer hands the gate one end
//! of a socketpair with a [`ControlRecord`] saying who is on the other end; the gate answers `ok`
//! or `error: <why>` (`specs/gate-tree.md` §1). The record is the connection's whole standing.
//! Which scope a sound record gives is the gate's to decide (`warren_gate::control`); this module
//! holds the record, the tiers it may name, and the sender ([`hand_over`]). Also the `decide`
//! file's request ([`encode_in`]) and [`Answer`], and the one client of the gate ([`client`]).

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::control::ReplyForm;
use crate::lineage::Lineage;
use crate::receipts::Ack;

pub mod client;

pub use client::GateClient;

/// The risk tiers, least to most risky.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Read,
    Write,
    Exec,
    Network,
    Destructive,
}

impl Tier {
    pub const ALL: [Tier; 5] = [
        Tier::Read,
        Tier::Write,
        Tier::Exec,
        Tier::Network,
        Tier::Destructive,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Read => "read",
            Tier::Write => "write",
            Tier::Exec => "exec",
            Tier::Network => "network",
            Tier::Destructive => "destructive",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Tier, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown tier {s:?}"))
    }
}

/// The highest tier a channel's answer may ever allow: a low-trust channel (a remote peer's
/// operator, later perhaps an MCP client's elicitation) never allows a call that runs a program,
/// reaches the network or destroys; those stay with this host's operator.
pub const CHANNEL_CAP_MAX: Tier = Tier::Write;

/// A session id: nsd's 128-bit id as 32 lowercase hex digits.
pub fn check_session(session: &str) -> Result<(), String> {
    if session.len() == 32
        && session
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "session {session:?} must be 32 lowercase hex digits"
        ))
    }
}

/// The context states a trusted daemon attaches to a decide request (the gate's reading of
/// each: `warren_gate::policy::context`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextState {
    /// toolfs: the session has been handed tainted content (a tool result it marked untrusted).
    UntrustedContext,
    /// receiptd: receipts are degraded (a floor, a signer problem).
    ReceiptsDegraded,
    /// A budget (calls, tokens, money) is spent.
    OverBudget,
    /// Nobody is at the machine to answer an ask.
    Unattended,
}

impl ContextState {
    pub const ALL: [ContextState; 4] = [
        ContextState::UntrustedContext,
        ContextState::ReceiptsDegraded,
        ContextState::OverBudget,
        ContextState::Unattended,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ContextState::UntrustedContext => "untrusted_context",
            ContextState::ReceiptsDegraded => "receipts_degraded",
            ContextState::OverBudget => "over_budget",
            ContextState::Unattended => "unattended",
        }
    }
}

impl fmt::Display for ContextState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ContextState {
    type Err = String;
    fn from_str(s: &str) -> Result<ContextState, String> {
        ContextState::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown context state {s:?}"))
    }
}

/// A decision, ordered by strictness: `Allow < Ask < Deny`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Ask,
    Deny,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Ask => "ask",
            Verdict::Deny => "deny",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Verdict {
    type Err = String;
    fn from_str(s: &str) -> Result<Verdict, String> {
        match s {
            "allow" => Ok(Verdict::Allow),
            "ask" => Ok(Verdict::Ask),
            "deny" => Ok(Verdict::Deny),
            _ => Err(format!("unknown verdict {s:?} (allow, ask or deny)")),
        }
    }
}

/// What `decide` and `wait` answer (JSON, one line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub decision: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<i64>,
    pub basis: String,
    pub fingerprint: String,
    /// The class policy used (`read` … `destructive`, `dynamic`, `unmapped`).
    pub tier: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Ack>,
}

/// Builds the request text toolfs writes to `decide`. The argument bytes go in verbatim (the
/// gate refuses them if they are not canonical; nothing here repairs them).
pub fn encode(
    session: &str,
    tool: &str,
    canonical_args: &[u8],
    context: &[ContextState],
) -> Result<Vec<u8>, String> {
    encode_in(session, tool, canonical_args, context, None, None)
}

/// [`encode`] with the caller's lineage, serialised once per connection (see [`crate::lineage`]).
pub fn encode_in(
    session: &str,
    tool: &str,
    canonical_args: &[u8],
    context: &[ContextState],
    lineage: Option<&RawValue>,
    tier: Option<Tier>,
) -> Result<Vec<u8>, String> {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        session: &'a str,
        tool: &'a str,
        args: &'a RawValue,
        context: &'a [ContextState],
        #[serde(skip_serializing_if = "Option::is_none")]
        lineage: Option<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tier: Option<Tier>,
    }
    let args = std::str::from_utf8(canonical_args).map_err(|_| "args: not UTF-8".to_string())?;
    let raw = RawValue::from_string(args.to_owned()).map_err(|e| format!("args: {e}"))?;
    serde_json::to_vec(&Out {
        session,
        tool,
        args: &raw,
        context,
        lineage,
        tier,
    })
    .map_err(|e| e.to_string())
}

pub const RECORD_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordKind {
    #[default]
    Namespace,
    Operator,
    Daemon,
    Channel,
}

/// What a connection handed to the gate is (`specs/gate-tree.md` §1 lists each kind's fields).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRecord {
    pub version: u32,
    #[serde(default)]
    pub kind: RecordKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descendants: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirmed_tty: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A namespace record's lineage (itself first, its subtree's root last; nsd's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// A channel record's sessions: whose asks it sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<String>,
    /// A channel record's cap: the highest tier its answers may allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<Tier>,
}

/// The trusted side: hands `conn` to the gate with `record`, and returns once the gate serves it
/// (or with the gate's refusal).
pub fn hand_over(ctl_path: &Path, record: &ControlRecord, conn: impl AsFd) -> io::Result<()> {
    crate::control::hand_over(
        ctl_path,
        record,
        &[conn.as_fd()],
        ReplyForm::Framed,
        "gate",
        "the connection",
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_keeps_its_wire_form() {
        let record = ControlRecord {
            version: RECORD_VERSION,
            kind: RecordKind::Channel,
            name: Some("peer:SHA256:ab".into()),
            sessions: vec!["a".repeat(32)],
            cap: Some(CHANNEL_CAP_MAX),
            ..Default::default()
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"version":1,"kind":"channel","name":"peer:SHA256:ab","sessions":["{}"],"cap":"write"}}"#,
                "a".repeat(32)
            )
        );
        assert_eq!(
            serde_json::from_str::<ControlRecord>(&text).unwrap(),
            record
        );
    }
}
