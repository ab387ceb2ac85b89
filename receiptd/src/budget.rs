//! Budgets per namespace subtree: receipts per second and receipt bytes in total.
//!
//! The gate and toolfs tag each receipt of a namespace's call with its chain (the namespace
//! first, its subtree's root last: nsd's lineage, never the caller's word), each with the caps
//! its spec sets (`limit receipts= receipt-bytes=`). Every receipt is charged to every key of its
//! chain; the root's missing caps are receiptd's defaults, any other key is capped only by what
//! its own spec sets (it counts against the root as well). Only a `decision` receipt is refused
//! over budget — it is the call's admission, so the call is denied before it runs; the `effect`
//! or `query` receipt of a call already admitted is always taken (and charged), so no call that
//! ran goes unreceipted. A subtree over budget is refused alone: nobody else's keys are touched.

use std::collections::HashMap;
use std::time::Instant;

use serde::Deserialize;

use crate::receipt::check_scope;

/// Default receipts per second per subtree. A gated call costs two receipts (decision, then
/// effect or query): 2 000/s is 1 000 calls/s sustained, where an agent driven by a model makes
/// a few calls a second and a scripted one rarely a hundred; a flood of 8 echo callers makes
/// ~15 000/s.
pub const DEFAULT_SUBTREE_RATE: u64 = 2_000;
/// The burst: this many seconds at the subtree's rate (4 000 receipts by default: an agent
/// firing a hundred calls at once is far inside it; a flood spends it in well under a second).
pub const BURST_SECONDS: f64 = 2.0;
/// Default receipt bytes per subtree in total (a receipt is ~1 KiB): 256 MiB is ~250 000
/// receipts, a day of an agent calling every second; the flood above reaches it in ~15 s.
pub const DEFAULT_SUBTREE_BYTES: u64 = 256 << 20;
/// The most keys one receipt may carry (nsd's lineages are no deeper).
pub const MAX_KEYS: usize = 64;

/// One namespace of a receipt's chain and the caps its spec sets.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetKey {
    /// The namespace's session (its receipt scope).
    pub key: String,
    #[serde(default)]
    pub receipts: Option<u64>,
    #[serde(default)]
    pub receipt_bytes: Option<u64>,
}

/// Checks a receipt's chain: 1 to [`MAX_KEYS`] well-formed keys, none twice.
pub fn check_keys(keys: &[BudgetKey]) -> Result<(), String> {
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(format!("budgets: 1 to {MAX_KEYS} keys"));
    }
    for (i, k) in keys.iter().enumerate() {
        check_scope(&k.key).map_err(|e| format!("budgets: {e}"))?;
        if keys[..i].iter().any(|o| o.key == k.key) {
            return Err(format!("budgets: key {} twice", k.key));
        }
        if k.receipts == Some(0) || k.receipt_bytes == Some(0) {
            return Err("budgets: a cap is at least 1".into());
        }
    }
    Ok(())
}

/// Which budget a refusal is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// Receipts per second.
    Receipts,
    /// Receipt bytes in total.
    ReceiptBytes,
}

impl Over {
    /// The basis the gate denies with, and receiptd's error code.
    pub fn code(self) -> &'static str {
        match self {
            Over::Receipts => "budget:receipts",
            Over::ReceiptBytes => "budget:receipt_bytes",
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The caps where a spec sets none, and each key's use so far.
pub struct Budgets {
    pub default_rate: u64,
    pub default_bytes: u64,
    buckets: HashMap<String, Bucket>,
    bytes: HashMap<String, u64>,
}

impl Budgets {
    pub fn new(default_rate: u64, default_bytes: u64) -> Budgets {
        Budgets {
            default_rate,
            default_bytes,
            buckets: HashMap::new(),
            bytes: HashMap::new(),
        }
    }

    /// Each key's caps: its own, and for the root (the last) receiptd's defaults where unset.
    fn caps<'a>(
        &self,
        keys: &'a [BudgetKey],
    ) -> impl Iterator<Item = (&'a str, Option<u64>, Option<u64>)> {
        let last = keys.len().saturating_sub(1);
        let (rate, bytes) = (self.default_rate, self.default_bytes);
        keys.iter().enumerate().map(move |(i, k)| {
            let root = i == last;
            (
                k.key.as_str(),
                k.receipts.or(root.then_some(rate)),
                k.receipt_bytes.or(root.then_some(bytes)),
            )
        })
    }

    /// Whether one more decision receipt fits every key of `keys`; refills the buckets.
    pub fn admit(&mut self, keys: &[BudgetKey], key_of: &str) -> Result<(), (Over, String)> {
        let now = Instant::now();
        let caps: Vec<_> = self.caps(keys).collect();
        for (key, rate, bytes) in caps {
            if let Some(cap) = bytes {
                let used = self.bytes.get(key).copied().unwrap_or(0);
                if used >= cap {
                    return Err((
                        Over::ReceiptBytes,
                        format!(
                            "the subtree of {key} has used {used} of its {cap} receipt bytes (receipts of {key_of} are refused)"
                        ),
                    ));
                }
            }
            if let Some(rate) = rate {
                let b = self.bucket(key, rate, now);
                if b.tokens < 1.0 {
                    return Err((
                        Over::Receipts,
                        format!(
                            "the subtree of {key} is over {rate} receipts/s (receipts of {key_of} are refused)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn bucket(&mut self, key: &str, rate: u64, now: Instant) -> &mut Bucket {
        let burst = rate as f64 * BURST_SECONDS;
        let b = self.buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate as f64).min(burst);
        b.at = now;
        b
    }

    /// Takes one receipt from every key's rate (a bucket may go below zero: an admitted call's
    /// second receipt is always taken, and paid for by later refusals).
    pub fn charge_rate(&mut self, keys: &[BudgetKey]) {
        let now = Instant::now();
        let caps: Vec<_> = self.caps(keys).map(|(k, r, _)| (k.to_owned(), r)).collect();
        for (key, rate) in caps {
            if let Some(rate) = rate {
                self.bucket(&key, rate, now).tokens -= 1.0;
            }
        }
    }

    /// Adds a committed receipt's `len` bytes to every key of `keys`.
    pub fn charge_bytes(&mut self, keys: &[BudgetKey], len: u64) {
        for k in keys {
            *self.bytes.entry(k.key.clone()).or_insert(0) += len;
        }
    }

    #[cfg(test)]
    fn charge(&mut self, keys: &[BudgetKey], len: u64) {
        self.charge_rate(keys);
        self.charge_bytes(keys, len);
    }

    /// The bytes charged to `key` so far (since receiptd started).
    pub fn bytes_used(&self, key: &str) -> u64 {
        self.bytes.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str, receipts: Option<u64>, receipt_bytes: Option<u64>) -> BudgetKey {
        BudgetKey {
            key: k.into(),
            receipts,
            receipt_bytes,
        }
    }

    #[test]
    fn a_clone_is_charged_to_its_root_and_refused_alone() {
        let mut b = Budgets::new(2, 1000);
        let child = [key("child", None, None), key("root", None, None)];
        let other = [key("other", None, None)];
        // Burst: 2/s x 2 s = 4 receipts for the whole subtree, the child's counting at the root.
        for _ in 0..4 {
            b.admit(&child, "child").unwrap();
            b.charge(&child, 10);
        }
        let (over, _) = b.admit(&[key("root", None, None)], "root").unwrap_err();
        assert_eq!(over, Over::Receipts);
        assert!(
            b.admit(&other, "other").is_ok(),
            "another subtree is not touched"
        );
        assert_eq!(b.bytes_used("root"), 40);
        assert_eq!(b.bytes_used("child"), 40);
    }

    #[test]
    fn the_tightest_cap_on_the_chain_binds_and_bytes_are_a_total() {
        let mut b = Budgets::new(1_000, 50);
        let chain = [key("c", Some(1), None), key("r", None, None)];
        b.admit(&chain, "c").unwrap();
        for _ in 0..2 {
            b.charge(&chain, 1);
        }
        assert_eq!(b.admit(&chain, "c").unwrap_err().0, Over::Receipts);
        // The root's own calls are under its rate, but the subtree's bytes reach the default.
        let root = [key("r", None, None)];
        b.admit(&root, "r").unwrap();
        b.charge(&root, 48);
        assert_eq!(b.admit(&root, "r").unwrap_err().0, Over::ReceiptBytes);
        assert!(check_keys(&chain).is_ok());
        assert!(check_keys(&[]).is_err());
        assert!(check_keys(&[key("a", None, None), key("a", None, None)]).is_err());
        assert!(check_keys(&[key("../x", None, None)]).is_err());
    }
}
