//! Who is on a connection, and what that lets it see and answer (see `specs/gate-tree.md`).

use std::collections::HashSet;
use std::str::FromStr;

use warren_9p::Errno;

use crate::policy::Tier;

/// The highest tier a [`Scope::Channel`] answer may ever allow (the record's bound).
use warren_proto::gate::CHANNEL_CAP_MAX;

/// A connection's standing, fixed when the connection was accepted; nothing it sends changes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// An operator attach. `confirmed_tty` is set only for a connection the trusted front door
    /// handed over on the control socket for `warren approvals`'s terminal: only such a
    /// connection may answer `allow session` or `allow always`.
    Operator { confirmed_tty: bool, label: String },
    /// A trusted daemon's connection (toolfs): `decide`, `wait`, `withdraw`.
    Daemon { name: String },
    /// A namespace granted `/gate`: sees and answers only its strict descendants' asks, with
    /// `allow once` and `deny` only.
    Namespace {
        session: String,
        namespace: String,
        descendants: HashSet<String>,
    },
    /// A named, capped answer channel (e.g. `peer:<fingerprint>` for a peer with `asks:remote`):
    /// sees only the asks of `sessions`, answers `allow once` or `deny` only, and allows only
    /// calls whose tier is at most `cap` (never above [`CHANNEL_CAP_MAX`]); receipts name it.
    Channel {
        name: String,
        sessions: HashSet<String>,
        cap: Tier,
    },
}

impl Scope {
    /// Whether asks of `session` are visible (and so answerable at all) on this connection.
    pub fn sees_session(&self, session: &str) -> bool {
        match self {
            Scope::Operator { .. } | Scope::Daemon { .. } => true,
            Scope::Namespace {
                session: own,
                descendants,
                ..
            } => session != own && descendants.contains(session),
            Scope::Channel { sessions, .. } => sessions.contains(session),
        }
    }

    /// Whether `decide` exists on this connection.
    pub fn may_decide(&self) -> bool {
        !matches!(self, Scope::Namespace { .. } | Scope::Channel { .. })
    }

    /// Whether `rules` is shown: this host's policy is not a channel's business.
    pub fn sees_rules(&self) -> bool {
        !matches!(self, Scope::Channel { .. })
    }

    /// Whether this connection may allow a call of `class` (the ask's effective class: `read` …
    /// `destructive`, `dynamic`, `unmapped`). Only a channel is capped: a class that is not a
    /// tier at or below its cap (an unknown tool's `dynamic` included) is refused.
    ///
    /// A channel allows only what asks because of its tier alone (`basis` `default:<tier>`): an
    /// ask the operator's own `ask` rule raised (`rule:N`), or one a session's untrusted
    /// context raised (`context:…`), was raised for a person to look, and a channel's yes is no
    /// evidence that one did.
    pub fn may_allow(&self, class: &str, basis: &str) -> Result<(), (Errno, String)> {
        let Scope::Channel { name, cap, .. } = self else {
            return Ok(());
        };
        if !basis.starts_with("default:") {
            return Err((
                Errno::EPERM,
                format!(
                    "this call asks because of {basis}, not its tier: {name} may not allow it; this host's operator answers it"
                ),
            ));
        }
        match class.parse::<Tier>() {
            Ok(tier) if tier <= *cap && tier <= CHANNEL_CAP_MAX => Ok(()),
            _ => Err((
                Errno::EPERM,
                format!(
                    "a {class} call is above what {name} may allow (at most {cap}); this host's operator answers it"
                ),
            )),
        }
    }

    /// Whether writes to `rules` are taken.
    pub fn may_edit_rules(&self) -> bool {
        matches!(self, Scope::Operator { .. })
    }

    /// Who answered, as receipts and `request` show it.
    pub fn label(&self) -> String {
        match self {
            Scope::Operator {
                label,
                confirmed_tty: true,
            } => format!("{label} (approvals tty)"),
            Scope::Operator { label, .. } => label.clone(),
            Scope::Daemon { name } => format!("daemon:{name}"),
            Scope::Namespace {
                namespace, session, ..
            } => format!("namespace:{namespace} session:{session}"),
            Scope::Channel { name, .. } => name.clone(),
        }
    }

    /// Whether this connection may use `verb` at all; the error is the errno and what to say.
    pub fn may_use(&self, verb: &Verb) -> Result<(), (Errno, String)> {
        let refuse = |msg: &str| Err((Errno::EPERM, msg.to_owned()));
        match (self, verb) {
            (Scope::Daemon { .. }, Verb::Withdraw) => Ok(()),
            (Scope::Daemon { .. }, _) => refuse(
                "a daemon connection may only withdraw its own asks; answers are the operator's",
            ),
            (Scope::Namespace { .. }, Verb::AllowOnce(_) | Verb::Deny) => Ok(()),
            (Scope::Namespace { .. }, Verb::AllowSession | Verb::AllowAlways) => refuse(
                "a namespace may answer only `allow once <fp-prefix>` or `deny`; `allow session` and `allow always` are the operator's, on `warren approvals`",
            ),
            (Scope::Namespace { .. } | Scope::Channel { .. }, Verb::Withdraw) => {
                refuse("only the caller's daemon may withdraw an ask")
            }
            // Once-only: a channel's answer covers this very call, never later ones.
            (Scope::Channel { .. }, Verb::AllowOnce(_) | Verb::Deny) => Ok(()),
            (Scope::Channel { name, .. }, Verb::AllowSession | Verb::AllowAlways) => Err((
                Errno::EPERM,
                format!(
                    "{name} may answer only `allow once <fp-prefix>` or `deny`; `allow session` and `allow always` are this host's operator's"
                ),
            )),
            (
                Scope::Operator {
                    confirmed_tty: false,
                    ..
                },
                Verb::AllowSession | Verb::AllowAlways,
            ) => refuse(
                "`allow session` and `allow always` need confirmation on `warren approvals`'s tty; answer there, or use `allow once <fp-prefix>`",
            ),
            (Scope::Operator { .. }, _) => Ok(()),
        }
    }
}

/// The shortest fingerprint prefix `allow once` takes.
pub const MIN_FP_PREFIX: usize = 8;

/// A line written to `pending/<id>/ctl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verb {
    /// `allow once <fp-prefix>`: the prefix proves the operator looked at this very call.
    AllowOnce(String),
    AllowSession,
    AllowAlways,
    Deny,
    /// The caller is gone: the ask is orphaned and can no longer be answered.
    Withdraw,
}

impl Verb {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verb::AllowOnce(_) => "allow once",
            Verb::AllowSession => "allow session",
            Verb::AllowAlways => "allow always",
            Verb::Deny => "deny",
            Verb::Withdraw => "withdraw",
        }
    }
}

impl FromStr for Verb {
    type Err = String;
    fn from_str(line: &str) -> Result<Verb, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["allow", "once", prefix] => {
                if prefix.len() < MIN_FP_PREFIX || prefix.len() > 64 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("`allow once` takes a fingerprint prefix of {MIN_FP_PREFIX} to 64 hex digits (shown in `request`)"));
                }
                Ok(Verb::AllowOnce(prefix.to_ascii_lowercase()))
            }
            ["allow", "once"] => Err("`allow once` needs the fingerprint prefix shown in `request`: allow once <fp-prefix>".into()),
            ["allow", "session"] => Ok(Verb::AllowSession),
            ["allow", "always"] => Ok(Verb::AllowAlways),
            ["deny"] => Ok(Verb::Deny),
            ["withdraw"] => Ok(Verb::Withdraw),
            _ => Err(format!("unknown answer {line:?}: allow once <fp-prefix> | allow session | allow always | deny")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Scope {
        Scope::Namespace {
            session: "p".repeat(32),
            namespace: "n1".into(),
            descendants: ["c".repeat(32)].into_iter().collect(),
        }
    }

    #[test]
    fn namespaces_see_strict_descendants_only() {
        let s = ns();
        assert!(s.sees_session(&"c".repeat(32)));
        assert!(
            !s.sees_session(&"p".repeat(32)),
            "its own session is not a strict descendant"
        );
        assert!(!s.sees_session(&"d".repeat(32)));
        let own_listed = Scope::Namespace {
            session: "p".repeat(32),
            namespace: "n".into(),
            descendants: ["p".repeat(32)].into_iter().collect(),
        };
        assert!(
            !own_listed.sees_session(&"p".repeat(32)),
            "listing itself as a descendant gains nothing"
        );
    }

    #[test]
    fn verbs_by_scope() {
        let ns = ns();
        assert!(ns.may_use(&Verb::AllowOnce("0".repeat(8))).is_ok());
        assert!(ns.may_use(&Verb::Deny).is_ok());
        assert_eq!(ns.may_use(&Verb::AllowSession).unwrap_err().0, Errno::EPERM);
        assert_eq!(ns.may_use(&Verb::AllowAlways).unwrap_err().0, Errno::EPERM);
        let op = Scope::Operator {
            confirmed_tty: false,
            label: "operator".into(),
        };
        assert!(op.may_use(&Verb::AllowSession).is_err());
        assert!(op.may_use(&Verb::AllowOnce("0".repeat(8))).is_ok());
        let tty = Scope::Operator {
            confirmed_tty: true,
            label: "operator".into(),
        };
        assert!(tty.may_use(&Verb::AllowAlways).is_ok());
        assert!(
            Scope::Daemon {
                name: "toolfs".into()
            }
            .may_use(&Verb::Deny)
            .is_err()
        );
    }

    #[test]
    fn a_channel_allows_only_up_to_its_cap_and_never_above_write() {
        let ch = |cap| Scope::Channel {
            name: "peer:x".into(),
            sessions: ["c".repeat(32)].into_iter().collect(),
            cap,
        };
        let write = ch(Tier::Write);
        for ok in ["read", "write"] {
            assert!(write.may_allow(ok, "default:x").is_ok(), "{ok}");
        }
        for refused in [
            "exec",
            "network",
            "destructive",
            "dynamic",
            "unmapped",
            "bogus",
        ] {
            assert_eq!(
                write.may_allow(refused, "default:x").unwrap_err().0,
                Errno::EPERM,
                "{refused}"
            );
        }
        assert!(ch(Tier::Read).may_allow("write", "default:x").is_err());
        // Even a channel built with a higher cap (the record check refuses one) stops at write.
        assert!(
            ch(Tier::Destructive)
                .may_allow("exec", "default:x")
                .is_err()
        );
        for raised in ["rule:3", "context:untrusted_context", "session_grant:1", ""] {
            assert!(write.may_allow("read", raised).is_err(), "{raised}");
        }
        assert!(write.may_use(&Verb::AllowOnce("0".repeat(8))).is_ok());
        assert!(write.may_use(&Verb::Deny).is_ok());
        for v in [Verb::AllowSession, Verb::AllowAlways, Verb::Withdraw] {
            assert!(write.may_use(&v).is_err(), "{v:?}");
        }
        assert!(write.sees_session(&"c".repeat(32)));
        assert!(!write.sees_session(&"d".repeat(32)));
        assert!(!write.may_decide() && !write.sees_rules());
        assert_eq!(write.label(), "peer:x");
    }

    #[test]
    fn verbs_parse() {
        assert_eq!(
            "allow once ABCDEF01".parse::<Verb>().unwrap(),
            Verb::AllowOnce("abcdef01".into())
        );
        assert_eq!(
            "allow session\n".parse::<Verb>().unwrap(),
            Verb::AllowSession
        );
        for bad in [
            "allow once",
            "allow once 1234",
            "allow once xyzxyzxy",
            "allow",
            "permit",
            "deny now",
        ] {
            assert!(bad.parse::<Verb>().is_err(), "{bad}");
        }
    }
}
