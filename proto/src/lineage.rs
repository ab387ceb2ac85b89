//! A namespace's lineage: which namespace cloned which, up to the root of its subtree. nsd puts it
//! in the records it hands the gate and the servers with a connection, so it is as trusted as
//! the connection itself; nothing a caller writes names or changes it.
//!
//! Budgets (`limit receipts= receipt-bytes= asks= llm-bytes=` in a spec) are kept per subtree: a
//! clone's usage counts against every namespace above it, up to the root, and each of them may
//! cap it.

use serde::{Deserialize, Serialize};

use crate::gate::check_session;

/// The deepest chain a record may carry (nsd's clones nest no deeper in practice).
pub const MAX_DEPTH: usize = 64;
/// The most command words kept per namespace, and bytes per word (for display only).
pub const MAX_COMMAND_WORDS: usize = 32;
pub const MAX_WORD_BYTES: usize = 256;

/// Default open asks per subtree: a person answers asks one at a time, and an agent with more
/// than this many of its calls waiting on a person is flooding, not working.
pub const DEFAULT_SUBTREE_ASKS: u64 = 32;

/// What a spec's `limit` line caps for its namespace's subtree; `None`: the parent's (or, at the
/// root, the daemons' defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Receipts per second (decision and effect receipts together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipts: Option<u64>,
    /// Bytes of receipts in total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_bytes: Option<u64>,
    /// Open asks at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asks: Option<u64>,
    /// Bytes llmfs holds for the subtree's model sessions at once (settings, conversations,
    /// messages being written, requests and replies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_bytes: Option<u64>,
}

/// One namespace of a chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Its session id (32 lowercase hex digits).
    pub session: String,
    /// nsd's namespace id.
    pub namespace: String,
    /// The command it runs (shown to the operator, escaped; never used to decide).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default)]
    pub budget: Budget,
}

/// A namespace and its ancestors: the namespace itself first, its subtree's root last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Lineage(pub Vec<Member>);

impl Lineage {
    /// The chain of a namespace nobody cloned.
    pub fn root(member: Member) -> Lineage {
        Lineage(vec![member])
    }

    /// Checks a chain that came with a record for `session` in `namespace`: it starts there,
    /// every session is well formed and appears once, and it is no deeper than [`MAX_DEPTH`].
    pub fn check(&self, session: &str, namespace: &str) -> Result<(), String> {
        let Some(first) = self.0.first() else {
            return Err("a lineage names at least the namespace itself".into());
        };
        if first.session != session || first.namespace != namespace {
            return Err("a lineage starts with the record's own session and namespace".into());
        }
        if self.0.len() > MAX_DEPTH {
            return Err(format!("a lineage deeper than {MAX_DEPTH}"));
        }
        for (i, m) in self.0.iter().enumerate() {
            check_session(&m.session)?;
            if self.0[..i].iter().any(|o| o.session == m.session) {
                return Err(format!("session {} twice in one lineage", m.session));
            }
            if m.namespace.is_empty()
                || m.namespace.len() > 128
                || m.namespace.chars().any(char::is_control)
            {
                return Err("namespace id must be 1 to 128 printable characters".into());
            }
            if m.command.len() > MAX_COMMAND_WORDS
                || m.command.iter().any(|w| w.len() > MAX_WORD_BYTES)
            {
                return Err(format!(
                    "a command of at most {MAX_COMMAND_WORDS} words of {MAX_WORD_BYTES} bytes"
                ));
            }
        }
        Ok(())
    }

    /// The session of the subtree's root (the namespace's own when nobody cloned it).
    pub fn root_session(&self) -> Option<&str> {
        self.0.last().map(|m| m.session.as_str())
    }

    /// The sessions, self first.
    pub fn sessions(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|m| m.session.as_str())
    }

    /// The strictest open-ask cap that binds each member's subtree: `(session, cap)`, self
    /// first. A member that sets none inherits its parent's; the root's default is `default`.
    pub fn ask_caps(&self, default: u64) -> Vec<(&str, u64)> {
        let mut caps: Vec<(&str, u64)> = Vec::with_capacity(self.0.len());
        let mut inherited = default;
        for m in self.0.iter().rev() {
            inherited = m.budget.asks.map_or(inherited, |a| a.min(inherited));
            caps.push((&m.session, inherited));
        }
        caps.reverse();
        caps
    }

    /// The chain as an operator reads it: `namespace 7 (cmd…) ← 3 (cmd…) ← 1 (cmd…)`, with the
    /// given function escaping what the namespaces wrote.
    pub fn chain_text(&self, escape: impl Fn(&str) -> String) -> String {
        self.0
            .iter()
            .map(|m| {
                format!(
                    "{} ({})",
                    escape(&m.namespace),
                    command_text(&m.command, &escape)
                )
            })
            .collect::<Vec<_>>()
            .join(" <- ")
    }
}

/// One namespace of a receipt's chain as receiptd charges it (receiptd's `budgets` field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BudgetKey<'a> {
    pub key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_bytes: Option<u64>,
}

impl Lineage {
    /// The keys a receipt of this namespace's calls is charged to: every namespace of the
    /// chain, self first, the root last (whose unset caps are receiptd's defaults).
    pub fn budget_keys(&self) -> Vec<BudgetKey<'_>> {
        self.0
            .iter()
            .map(|m| BudgetKey {
                key: &m.session,
                receipts: m.budget.receipts,
                receipt_bytes: m.budget.receipt_bytes,
            })
            .collect()
    }
}

/// A command's words for display, each escaped; `-` when there is none.
pub fn command_text(words: &[String], escape: impl Fn(&str) -> String) -> String {
    if words.is_empty() {
        return "-".into();
    }
    words
        .iter()
        .map(|w| escape(w))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(c: char, ns: &str, asks: Option<u64>) -> Member {
        Member {
            session: c.to_string().repeat(32),
            namespace: ns.into(),
            command: vec!["sh".into(), "-c".into(), "x".into()],
            budget: Budget {
                asks,
                ..Budget::default()
            },
        }
    }

    #[test]
    fn a_chain_is_checked_from_its_own_namespace_up() {
        let l = Lineage(vec![m('a', "3", None), m('b', "1", None)]);
        assert!(l.check(&"a".repeat(32), "3").is_ok());
        assert!(l.check(&"b".repeat(32), "1").is_err(), "must start at self");
        assert_eq!(l.root_session(), Some("b".repeat(32).as_str()));
        let twice = Lineage(vec![m('a', "3", None), m('a', "1", None)]);
        assert!(twice.check(&"a".repeat(32), "3").is_err());
        assert!(Lineage::default().check(&"a".repeat(32), "3").is_err());
    }

    #[test]
    fn each_member_is_capped_by_the_tightest_budget_above_it() {
        let l = Lineage(vec![
            m('a', "7", None),
            m('b', "3", Some(4)),
            m('c', "1", Some(10)),
        ]);
        let caps: Vec<u64> = l.ask_caps(32).into_iter().map(|(_, c)| c).collect();
        assert_eq!(caps, vec![4, 4, 10]);
        let caps: Vec<u64> = l.ask_caps(2).into_iter().map(|(_, c)| c).collect();
        assert_eq!(caps, vec![2, 2, 2]);
        assert_eq!(
            l.chain_text(|s| s.to_owned()),
            "7 (sh -c x) <- 3 (sh -c x) <- 1 (sh -c x)"
        );
    }
}
