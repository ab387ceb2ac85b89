//! Operator rules: `allow|ask|deny <selector>`, global, edited through `/gate/rules`.

use std::fmt;
use std::str::FromStr;

use super::tier::{ToolClass, check_name};
use super::verdict::Verdict;

/// What a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// Every call.
    All,
    /// Calls of one tool, by exact name. An `allow` of a tool does not cover a call the shell
    /// tripwire raised to destructive: the operator allowed the tool at its own tier.
    Tool(String),
    /// Calls of one (effective) class: `tier:read` … `tier:destructive`, `tier:dynamic`,
    /// `tier:unmapped`.
    Class(String),
}

const CLASS_LABELS: &[&str] = &[
    "read",
    "write",
    "exec",
    "network",
    "destructive",
    "dynamic",
    "unmapped",
];

impl FromStr for Selector {
    type Err = String;
    fn from_str(s: &str) -> Result<Selector, String> {
        if s == "*" {
            return Ok(Selector::All);
        }
        if let Some(label) = s.strip_prefix("tier:") {
            return match CLASS_LABELS.iter().find(|l| **l == label) {
                Some(l) => Ok(Selector::Class((*l).to_owned())),
                None => Err(format!(
                    "unknown tier {label:?} (one of {})",
                    CLASS_LABELS.join(", ")
                )),
            };
        }
        check_name(s)?;
        Ok(Selector::Tool(s.to_owned()))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::All => f.write_str("*"),
            Selector::Tool(t) => f.write_str(t),
            Selector::Class(c) => write!(f, "tier:{c}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub id: i64,
    pub verdict: Verdict,
    pub selector: Selector,
}

impl Rule {
    /// Whether the rule covers a call of `tool` whose effective class is `class`, `raised` being
    /// whether the shell tripwire raised it.
    pub fn matches(&self, tool: &str, class: ToolClass, raised: bool) -> bool {
        match &self.selector {
            Selector::All => true,
            Selector::Tool(t) => t == tool && !(raised && self.verdict == Verdict::Allow),
            Selector::Class(label) => label == class.label(),
        }
    }
}

/// One edit written to `rules`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleEdit {
    Add(Verdict, Selector),
    Delete(i64),
}

impl FromStr for RuleEdit {
    type Err = String;
    fn from_str(line: &str) -> Result<RuleEdit, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["delete", id] => id
                .parse()
                .map(RuleEdit::Delete)
                .map_err(|_| format!("bad rule id {id:?}")),
            [verdict, selector] => Ok(RuleEdit::Add(verdict.parse()?, selector.parse()?)),
            _ => Err(format!(
                "bad rule line {line:?}: `allow|ask|deny <tool|tier:<t>|*>` or `delete <id>`"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tier::Tier;
    use super::*;

    #[test]
    fn edits_parse() {
        assert_eq!(
            "allow fs_write".parse::<RuleEdit>().unwrap(),
            RuleEdit::Add(Verdict::Allow, Selector::Tool("fs_write".into()))
        );
        assert_eq!(
            "deny tier:exec".parse::<RuleEdit>().unwrap(),
            RuleEdit::Add(Verdict::Deny, Selector::Class("exec".into()))
        );
        assert_eq!(
            "ask *".parse::<RuleEdit>().unwrap(),
            RuleEdit::Add(Verdict::Ask, Selector::All)
        );
        assert_eq!("delete 4".parse::<RuleEdit>().unwrap(), RuleEdit::Delete(4));
        for bad in [
            "allow",
            "permit x",
            "allow tier:bogus",
            "allow a b",
            "delete x",
            "allow bad:name",
        ] {
            assert!(bad.parse::<RuleEdit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_tool_allow_does_not_cover_a_raised_call() {
        let allow = Rule {
            id: 1,
            verdict: Verdict::Allow,
            selector: Selector::Tool("shell".into()),
        };
        assert!(allow.matches("shell", ToolClass::Core(Tier::Exec), false));
        assert!(!allow.matches("shell", ToolClass::Core(Tier::Destructive), true));
        let deny = Rule {
            verdict: Verdict::Deny,
            ..allow
        };
        assert!(deny.matches("shell", ToolClass::Core(Tier::Destructive), true));
    }
}
