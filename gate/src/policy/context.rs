//! Context states: typed flags trusted daemons attach to a decide request. They only ever raise
//! what a call requires, and never for a read.
//!
//! The one-way property is in the types: [`requirement`] returns a [`Requirement`], which has no
//! allow, and [`tighten`] takes the strictest of the engine's verdict and every requirement, so a
//! state (or any set of states, in any order) can only move a verdict towards deny.

use super::tier::ToolClass;
use super::verdict::Verdict;

pub use warren_proto::gate::ContextState;

/// What a state requires of a call. There is deliberately no `Allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    Ask,
    Deny,
}

impl From<Requirement> for Verdict {
    fn from(r: Requirement) -> Verdict {
        match r {
            Requirement::Ask => Verdict::Ask,
            Requirement::Deny => Verdict::Deny,
        }
    }
}

/// What a state requires. Tainted context means a person should look; the others mean nobody
/// should (degraded receipts, a spent budget) or nobody can (unattended: an ask would only wait
/// for its expiry).
pub fn requirement(state: ContextState) -> Requirement {
    match state {
        ContextState::UntrustedContext => Requirement::Ask,
        ContextState::ReceiptsDegraded | ContextState::OverBudget | ContextState::Unattended => {
            Requirement::Deny
        }
    }
}

/// Applies `states` to the engine's `verdict` for a call of class `class`: the strictest of the
/// verdict and each state's requirement; reads are never raised. Returns the result and the state
/// that decided it, if a state did (the first, in `states`' order, among the strictest).
pub fn tighten(
    verdict: Verdict,
    class: ToolClass,
    states: &[ContextState],
) -> (Verdict, Option<ContextState>) {
    if class.is_read() {
        return (verdict, None);
    }
    let mut out = (verdict, None);
    for &s in states {
        let req = Verdict::from(requirement(s));
        if req > out.0 {
            out = (req, Some(s));
        }
    }
    out
}

/// The states a namespace's call is decided with: its own and those of every namespace that
/// cloned it (parent first). A clone is never decided more loosely than any namespace above it,
/// and as their states only rise, it tightens whenever theirs do. Sorted, without duplicates.
pub fn with_ancestors<'a>(
    own: &[ContextState],
    ancestors: impl IntoIterator<Item = &'a [ContextState]>,
) -> Vec<ContextState> {
    let mut all = own.to_vec();
    for a in ancestors {
        all.extend_from_slice(a);
    }
    all.sort();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::super::tier::Tier;
    use super::*;

    /// Every subset of the states, in `ALL` order.
    fn subsets() -> Vec<Vec<ContextState>> {
        (0u32..(1 << ContextState::ALL.len()))
            .map(|mask| {
                ContextState::ALL
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, s)| *s)
                    .collect()
            })
            .collect()
    }

    type Inherit = fn(&[ContextState], &[&[ContextState]]) -> Vec<ContextState>;

    /// Checks `inherit` over every verdict × class × the states of a clone, its parent and its
    /// grandparent (every subset each), and every later rise of the parent's states: the clone's
    /// call is never decided more loosely than the same call in any namespace above it, nor
    /// than its own states alone; and when the parent's states rise, the clone's verdict never
    /// falls. Returns how many cases were checked, or the first violation.
    fn check_clones(inherit: Inherit) -> Result<usize, String> {
        let all = subsets();
        let mut checked = 0;
        for verdict in [Verdict::Allow, Verdict::Ask, Verdict::Deny] {
            for class in classes() {
                let decide = |states: &[ContextState]| tighten(verdict, class, states).0;
                for own in &all {
                    for parent in &all {
                        for grand in &all {
                            let states = inherit(own, &[parent, grand]);
                            let got = decide(&states);
                            for (who, theirs) in
                                [("own", own), ("parent", parent), ("grandparent", grand)]
                            {
                                if got < decide(theirs) {
                                    return Err(format!(
                                        "{verdict:?} {class:?}: clone {own:?} of {parent:?} of {grand:?} got {got:?}, looser than its {who}'s {:?}",
                                        decide(theirs)
                                    ));
                                }
                            }
                            // The parent tightens later: every superset of its states.
                            for later in all.iter().filter(|l| parent.iter().all(|s| l.contains(s)))
                            {
                                let after = decide(&inherit(own, &[later, grand]));
                                if after < got {
                                    return Err(format!(
                                        "{verdict:?} {class:?}: parent rose {parent:?} -> {later:?}, clone {own:?} fell {got:?} -> {after:?}"
                                    ));
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        Ok(checked)
    }

    #[test]
    fn a_clone_is_decided_at_least_as_tightly_as_every_namespace_above_it() {
        let inherit: Inherit = |own, up| with_ancestors(own, up.iter().copied());
        assert_eq!(check_clones(inherit), Ok(3 * 7 * 16 * 16 * 16));
        // The check can fail: a clone that keeps only its own states (what a fresh session per
        // clone did), or only its parent's, is caught.
        let own_only: Inherit = |own, _| own.to_vec();
        let parent_only: Inherit = |own, up| with_ancestors(own, up.iter().take(1).copied());
        assert!(check_clones(own_only).is_err());
        assert!(check_clones(parent_only).is_err());
    }

    /// Every permutation of `items`.
    fn permutations(items: &[ContextState]) -> Vec<Vec<ContextState>> {
        if items.is_empty() {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for i in 0..items.len() {
            let mut rest = items.to_vec();
            let first = rest.remove(i);
            for mut p in permutations(&rest) {
                p.insert(0, first);
                out.push(p);
            }
        }
        out
    }

    fn classes() -> Vec<ToolClass> {
        let mut v: Vec<ToolClass> = Tier::ALL.into_iter().map(ToolClass::Core).collect();
        v.push(ToolClass::Dynamic);
        v.push(ToolClass::Unmapped);
        v
    }

    type Tighten = fn(Verdict, ToolClass, &[ContextState]) -> Verdict;

    /// Checks `f` over every verdict × every class × every subset of states × every order of
    /// applying them, all at once and one state at a time: the result is the strictest of the
    /// verdict and the states' requirements (never lower than the verdict, never allow once a
    /// state applies), reads are untouched, and order does not matter. Returns how many cases
    /// were checked, or the first violation.
    fn check_one_way(f: Tighten) -> Result<usize, String> {
        let mut checked = 0;
        for verdict in [Verdict::Allow, Verdict::Ask, Verdict::Deny] {
            for class in classes() {
                for mask in 0u32..(1 << ContextState::ALL.len()) {
                    let subset: Vec<ContextState> = ContextState::ALL
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mask & (1 << i) != 0)
                        .map(|(_, s)| *s)
                        .collect();
                    let expected = if class.is_read() {
                        verdict
                    } else {
                        subset
                            .iter()
                            .map(|&s| Verdict::from(requirement(s)))
                            .fold(verdict, Verdict::max)
                    };
                    for order in permutations(&subset) {
                        let case = format!("{verdict:?} {class:?} {order:?}");
                        let all_at_once = f(verdict, class, &order);
                        let stepwise = order.iter().fold(verdict, |v, &s| f(v, class, &[s]));
                        if all_at_once < verdict || stepwise < verdict {
                            return Err(format!("a state lowered the verdict: {case}"));
                        }
                        if all_at_once != expected || stepwise != expected {
                            return Err(format!(
                                "{case}: got {all_at_once:?} / stepwise {stepwise:?}, want {expected:?}"
                            ));
                        }
                        if !order.is_empty() && !class.is_read() && all_at_once == Verdict::Allow {
                            return Err(format!("a state left the call allowed: {case}"));
                        }
                        checked += 1;
                    }
                }
            }
        }
        Ok(checked)
    }

    #[test]
    fn states_only_raise_never_reads_and_order_does_not_matter() {
        // 3 verdicts × 7 classes × Σ_k C(4,k)·k! = 65 ordered subsets.
        assert_eq!(check_one_way(|v, c, s| tighten(v, c, s).0), Ok(3 * 7 * 65));
        // The state named as the reason is one applied, and requires exactly the result.
        for class in classes() {
            for v in [Verdict::Allow, Verdict::Ask, Verdict::Deny] {
                let (out, by) = tighten(v, class, &ContextState::ALL);
                match by {
                    Some(s) => assert_eq!(Verdict::from(requirement(s)), out),
                    None => assert_eq!(out, v),
                }
            }
        }
    }

    /// The check above can fail: planted modifiers that break the property are caught.
    #[test]
    fn the_one_way_check_catches_planted_modifiers() {
        let last_state_wins: Tighten = |v, c, s| {
            if c.is_read() {
                v
            } else {
                s.last().map_or(v, |&x| Verdict::from(requirement(x)))
            }
        };
        let raises_reads: Tighten = |v, _, s| {
            s.iter()
                .map(|&x| Verdict::from(requirement(x)))
                .fold(v, Verdict::max)
        };
        let ignores_states: Tighten = |v, _, _| v;
        for (name, planted) in [
            ("last state wins", last_state_wins),
            ("raises reads", raises_reads),
            ("ignores states", ignores_states),
        ] {
            assert!(
                check_one_way(planted).is_err(),
                "the check passed a modifier that {name}"
            );
        }
    }

    #[test]
    fn no_state_requires_allow() {
        for s in ContextState::ALL {
            assert_ne!(Verdict::from(requirement(s)), Verdict::Allow);
            assert_eq!(s.as_str().parse::<ContextState>().unwrap(), s);
        }
    }
}
