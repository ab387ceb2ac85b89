//! What llmfs holds for a namespace is a budget of its subtree, like its receipts and its asks:
//! the bytes of its sessions' settings (`system`, `tools`), conversations, messages being
//! written to `ask`, requests in flight and replies are charged to every namespace of its
//! lineage (nsd's, never the caller's word), up to its subtree's root. Each namespace's cap is
//! what its spec sets (`limit llm-bytes=`); the root's unset cap is llmfs's default
//! (`--subtree-mb`). A clone's bytes count against its root too, so clones share the root's
//! budget; a subtree that is full is refused alone. An operator's connection (`llm.sock`)
//! carries no lineage: it is a subtree of its own, with the default cap.
//!
//! Bytes are counted at their size as written (a message or a reply at its JSON text's size),
//! held by a [`Charge`] and freed when it is dropped: when a session ends with its connection,
//! an ask ends, or an open of `ask` is closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use warren_9p::Errno;
use warren_proto::lineage::Lineage;

/// Bytes a subtree's sessions may hold in llmfs when its root's spec sets no `llm-bytes`.
/// 64 MiB is 30 sessions at the most a session's settings take (2 MiB of `system` and `tools`)
/// with room for their conversations; an agent holds one session of a few hundred KiB.
pub const DEFAULT_SUBTREE_BYTES: u64 = 64 << 20;
/// The most bytes llmfs sends in one request by default (`--max-request-mb`): far above what
/// any model's context takes as text, so a conversation that reaches it is refused, not sent.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 8 << 20;
/// The errno of a write refused over a budget (as receiptd's and nsd's budgets answer).
pub const EDQUOT: Errno = Errno(libc::EDQUOT as u32);

/// A write (or an ask) that would take a subtree past its budget: the text says which budget,
/// how much is held and its cap.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OverBudget(pub String);

/// Bytes held per namespace (by its session), across every connection.
pub struct Ledger {
    default_cap: u64,
    held: Mutex<HashMap<String, u64>>,
    /// Names the subtree of each operator connection.
    connections: AtomicU64,
}

/// One namespace of a connection's chain, and its cap.
struct Key {
    /// The namespace's session (operator connections: a name of llmfs's own).
    key: String,
    /// For messages: `namespace 3`, or `this operator connection`.
    name: String,
    cap: Option<u64>,
    /// Whether the cap is llmfs's default (the root's spec set none).
    default: bool,
}

/// The chain a connection's sessions are charged to.
pub struct Account {
    ledger: Arc<Ledger>,
    chain: Vec<Key>,
}

impl Ledger {
    pub fn new(default_cap: u64) -> Arc<Ledger> {
        Arc::new(Ledger {
            default_cap,
            held: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The account of a namespace's connection: every namespace of its lineage (self first, the
    /// root last), each capped by its spec's `llm-bytes`, the root by the default where unset.
    pub fn namespace(self: &Arc<Self>, lineage: &Lineage) -> Arc<Account> {
        let last = lineage.0.len().saturating_sub(1);
        let chain = lineage
            .0
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let default = i == last && m.budget.llm_bytes.is_none();
                Key {
                    key: m.session.clone(),
                    name: format!("namespace {}", m.namespace),
                    cap: m.budget.llm_bytes.or(default.then_some(self.default_cap)),
                    default,
                }
            })
            .collect();
        Arc::new(Account {
            ledger: self.clone(),
            chain,
        })
    }

    /// The account of an operator's connection: a subtree of its own, with the default cap.
    pub fn connection(self: &Arc<Self>) -> Arc<Account> {
        let n = self.connections.fetch_add(1, Ordering::Relaxed);
        Arc::new(Account {
            ledger: self.clone(),
            chain: vec![Key {
                key: format!("operator connection {n}"),
                name: "this operator connection".into(),
                cap: Some(self.default_cap),
                default: true,
            }],
        })
    }
}

impl Account {
    /// Takes `bytes` more in every namespace of the chain, or none if any would pass its cap.
    fn take(&self, bytes: u64) -> Result<(), OverBudget> {
        let mut held = self.ledger.held();
        for k in &self.chain {
            let used = held.get(&k.key).copied().unwrap_or(0);
            if let Some(cap) = k.cap
                && used.saturating_add(bytes) > cap
            {
                let set_by = if k.default {
                    "llmfs's default for a subtree, --subtree-mb"
                } else {
                    "its spec's limit llm-bytes="
                };
                return Err(OverBudget(format!(
                    "budget:llm_bytes: the subtree of {} holds {used} bytes in llmfs, and {bytes} more would pass its {cap} ({set_by})",
                    k.name
                )));
            }
        }
        for k in &self.chain {
            *held.entry(k.key.clone()).or_default() += bytes;
        }
        Ok(())
    }

    fn give_back(&self, bytes: u64) {
        let mut held = self.ledger.held();
        for k in &self.chain {
            if let Some(used) = held.get_mut(&k.key) {
                *used = used.saturating_sub(bytes);
                if *used == 0 {
                    held.remove(&k.key);
                }
            }
        }
    }
}

/// Bytes one holder (a session's settings and conversation, a reply, an ask in flight, a
/// message being written) has taken from its account; given back when dropped.
pub struct Charge {
    account: Arc<Account>,
    bytes: u64,
}

impl Charge {
    pub fn new(account: Arc<Account>) -> Charge {
        Charge { account, bytes: 0 }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds `bytes` from now on: more is taken (or refused, holding what it held), less is
    /// given back.
    pub fn set(&mut self, bytes: u64) -> Result<(), OverBudget> {
        if bytes > self.bytes {
            self.account.take(bytes - self.bytes)?;
        } else {
            self.account.give_back(self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.account.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_proto::lineage::{Budget, Member};

    fn member(c: char, ns: &str, llm_bytes: Option<u64>) -> Member {
        Member {
            session: c.to_string().repeat(32),
            namespace: ns.into(),
            budget: Budget {
                llm_bytes,
                ..Budget::default()
            },
            ..Member::default()
        }
    }

    /// A clone's bytes count against its root; a cap anywhere in the chain binds; another
    /// subtree is untouched; what is dropped is given back.
    #[test]
    fn a_chain_is_charged_to_every_namespace_up_to_its_root() {
        let ledger = Ledger::new(100);
        let root = ledger.namespace(&Lineage(vec![member('r', "1", None)]));
        let clone = ledger.namespace(&Lineage(vec![
            member('c', "2", Some(30)),
            member('r', "1", None),
        ]));
        let other = ledger.namespace(&Lineage(vec![member('o', "3", None)]));
        let mut a = Charge::new(root.clone());
        a.set(60).unwrap();
        let mut b = Charge::new(clone);
        let e = b.set(31).unwrap_err();
        assert!(
            e.0.contains("namespace 2") && e.0.contains("limit llm-bytes="),
            "{e}"
        );
        let e = b.set(41).unwrap_err();
        assert!(e.0.contains("namespace 2"), "the tightest cap first: {e}");
        b.set(30).unwrap();
        let e = Charge::new(root).set(11).unwrap_err();
        assert!(
            e.0.contains("namespace 1 holds 90") && e.0.contains("--subtree-mb"),
            "{e}"
        );
        Charge::new(other).set(100).unwrap();
        drop(b);
        a.set(100).unwrap();
        a.set(0).unwrap();
        assert!(ledger.held().is_empty(), "all given back");
    }
}
