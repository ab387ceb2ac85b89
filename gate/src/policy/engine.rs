//! Evaluation order: every matching source is consulted; any deny wins, then any ask, then an
//! allow; with no matching source, the default of the call's effective class. Context states are
//! applied last and only raise.

use super::context::{ContextState, tighten};
use super::rules::Rule;
use super::tier::{Tier, ToolClass};
use super::verdict::{Basis, Verdict};

/// What the store found for one call (session, fingerprint).
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    /// Session grants for this session and fingerprint: `(id, Allow)` from `allow session`,
    /// `(id, Deny)` from a `deny` (a deny covers identical asks for the rest of the session).
    pub session: Vec<(i64, Verdict)>,
    /// The newest unspent `allow once` token for the fingerprint.
    pub allow_once: Option<i64>,
    /// Every rule (the engine matches them).
    pub rules: Vec<Rule>,
}

/// The outcome of [`evaluate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    pub verdict: Verdict,
    pub basis: Basis,
    /// The class policy used: the tool's own, or destructive after a risk raise.
    pub class: ToolClass,
    /// When the verdict is an allow from an `allow once` token: the token to spend before the
    /// answer (if spending fails, the call is evaluated again without it).
    pub spend: Option<i64>,
}

/// The default verdict of a class.
pub fn default_for(class: ToolClass) -> Verdict {
    match class {
        ToolClass::Core(Tier::Read | Tier::Network) => Verdict::Allow,
        ToolClass::Core(Tier::Write | Tier::Exec | Tier::Destructive) => Verdict::Ask,
        ToolClass::Dynamic | ToolClass::Unmapped => Verdict::Ask,
    }
}

/// Decides a call of `tool` (of class `class`; `risk` is the shell tripwire's finding) from the
/// candidates and the context states.
pub fn evaluate(
    tool: &str,
    class: ToolClass,
    risk: Option<&str>,
    found: &Candidates,
    context: &[ContextState],
) -> Evaluation {
    let class = if risk.is_some() {
        ToolClass::Core(Tier::Destructive)
    } else {
        class
    };
    let raised = risk.is_some();
    // Matching sources in consultation order: session grants, unspent decisions, rules.
    let mut matches: Vec<(Verdict, Basis)> = Vec::new();
    for &(id, v) in &found.session {
        let basis = if v == Verdict::Deny {
            Basis::DenyCovers(id)
        } else {
            Basis::SessionGrant(id)
        };
        // A session grant binds the exact call the operator was shown (raise included), so it
        // covers an identical raised call too.
        matches.push((v, basis));
    }
    for rule in found
        .rules
        .iter()
        .filter(|r| r.matches(tool, class, raised))
    {
        matches.push((rule.verdict, Basis::Rule(rule.id)));
    }
    // An allow-once token is the last allow consulted, so one is not spent when another allow
    // covers the call anyway.
    if let Some(id) = found.allow_once {
        matches.push((Verdict::Allow, Basis::AllowOnce(id)));
    }
    let (verdict, basis) = [Verdict::Deny, Verdict::Ask, Verdict::Allow]
        .into_iter()
        .find_map(|v| matches.iter().find(|(mv, _)| *mv == v).cloned())
        .unwrap_or_else(|| (default_for(class), Basis::Default(class.label())));
    let (tightened, by) = tighten(verdict, class, context);
    let (verdict, basis) = match by {
        Some(state) => (tightened, Basis::Context(state)),
        None => (verdict, basis),
    };
    let spend = match (&verdict, &basis) {
        (Verdict::Allow, Basis::AllowOnce(id)) => Some(*id),
        _ => None,
    };
    Evaluation {
        verdict,
        basis,
        class,
        spend,
    }
}

#[cfg(test)]
mod tests {
    use super::super::rules::Selector;
    use super::*;

    fn rule(id: i64, verdict: Verdict, sel: &str) -> Rule {
        Rule {
            id,
            verdict,
            selector: sel.parse::<Selector>().unwrap(),
        }
    }

    fn eval(tool: &str, found: &Candidates) -> Evaluation {
        evaluate(tool, super::super::tier::classify(tool), None, found, &[])
    }

    #[test]
    fn defaults_by_class() {
        let none = Candidates::default();
        for (tool, v, label) in [
            ("fs_read", Verdict::Allow, "read"),
            ("echo", Verdict::Allow, "read"),
            ("fs_write", Verdict::Ask, "write"),
            ("shell", Verdict::Ask, "exec"),
            ("web_fetch", Verdict::Ask, "unmapped"),
            ("mcp:s:fs_read", Verdict::Ask, "dynamic"),
        ] {
            let e = eval(tool, &none);
            assert_eq!((e.verdict, e.basis), (v, Basis::Default(label)), "{tool}");
        }
        assert_eq!(default_for(ToolClass::Core(Tier::Network)), Verdict::Allow);
        assert_eq!(
            default_for(ToolClass::Core(Tier::Destructive)),
            Verdict::Ask
        );
    }

    #[test]
    fn deny_wins_then_ask_then_allow() {
        let found = Candidates {
            session: vec![(7, Verdict::Allow)],
            allow_once: Some(3),
            rules: vec![
                rule(1, Verdict::Allow, "fs_write"),
                rule(2, Verdict::Deny, "tier:write"),
                rule(4, Verdict::Ask, "*"),
            ],
        };
        assert_eq!(eval("fs_write", &found).basis, Basis::Rule(2));
        let no_deny = Candidates {
            rules: vec![
                rule(1, Verdict::Allow, "fs_write"),
                rule(4, Verdict::Ask, "*"),
            ],
            ..found.clone()
        };
        assert_eq!(eval("fs_write", &no_deny).basis, Basis::Rule(4));
        let only_allows = Candidates {
            rules: vec![rule(1, Verdict::Allow, "fs_write")],
            ..found.clone()
        };
        let e = eval("fs_write", &only_allows);
        assert_eq!(
            (e.verdict, e.basis, e.spend),
            (Verdict::Allow, Basis::SessionGrant(7), None)
        );
        let only_token = Candidates {
            allow_once: Some(3),
            ..Candidates::default()
        };
        let e = eval("fs_write", &only_token);
        assert_eq!(
            (e.verdict, e.basis, e.spend),
            (Verdict::Allow, Basis::AllowOnce(3), Some(3))
        );
        // A deny-cover beats any allow, and a rule allowing reads cannot lift it.
        let covered = Candidates {
            session: vec![(9, Verdict::Deny)],
            rules: vec![rule(1, Verdict::Allow, "*")],
            allow_once: Some(1),
        };
        assert_eq!(eval("fs_read", &covered).basis, Basis::DenyCovers(9));
    }

    #[test]
    fn a_deny_rule_on_reads_denies_reads() {
        let found = Candidates {
            rules: vec![rule(5, Verdict::Deny, "fs_read")],
            ..Candidates::default()
        };
        assert_eq!(eval("fs_read", &found).verdict, Verdict::Deny);
    }

    #[test]
    fn risk_raise_asks_past_a_tool_allow() {
        let found = Candidates {
            rules: vec![rule(1, Verdict::Allow, "shell")],
            ..Candidates::default()
        };
        let e = evaluate(
            "shell",
            ToolClass::Core(Tier::Exec),
            Some("rm_rf_root"),
            &found,
            &[],
        );
        assert_eq!(
            (e.verdict, e.basis, e.class),
            (
                Verdict::Ask,
                Basis::Default("destructive"),
                ToolClass::Core(Tier::Destructive)
            )
        );
        let plain = evaluate("shell", ToolClass::Core(Tier::Exec), None, &found, &[]);
        assert_eq!(plain.verdict, Verdict::Allow);
        // A session grant is bound to the exact (raised) call the operator saw.
        let granted = Candidates {
            session: vec![(2, Verdict::Allow)],
            ..found
        };
        let e = evaluate(
            "shell",
            ToolClass::Core(Tier::Exec),
            Some("rm_rf_root"),
            &granted,
            &[],
        );
        assert_eq!(
            (e.verdict, e.basis),
            (Verdict::Allow, Basis::SessionGrant(2))
        );
    }

    #[test]
    fn context_raises_and_is_named_but_never_spends_a_token() {
        let found = Candidates {
            allow_once: Some(3),
            ..Candidates::default()
        };
        let e = evaluate(
            "fs_write",
            ToolClass::Core(Tier::Write),
            None,
            &found,
            &[ContextState::UntrustedContext],
        );
        assert_eq!(
            (e.verdict, e.basis, e.spend),
            (
                Verdict::Ask,
                Basis::Context(ContextState::UntrustedContext),
                None
            )
        );
        let read = evaluate(
            "fs_read",
            ToolClass::Core(Tier::Read),
            None,
            &Candidates::default(),
            &ContextState::ALL,
        );
        assert_eq!(read.verdict, Verdict::Allow);
    }
}
