//! llmfs's control socket, `<runtime>/llmfs.ctl` (root only): how nsd hands llmfs a namespace's
//! connection for `mount llm PATH`.
//!
//! nsd makes a socketpair, keeps one end for the namespace's bridge, and sends the other with one
//! [`LlmGrant`] (a `warren_daemon::handoff` record, the connection as its one fd). llmfs serves
//! the model tree on it, its sessions tied to that connection and their receipts appended in the
//! namespace's session scope, and answers one line: `ok` or `error: <why>`. Any number of grants
//! may follow one another on one control connection. The operator socket `llm.sock` is the
//! operator's own way in and is not this.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::control::ReplyForm;

/// The control socket's stem in the runtime dir (`Dirs::control("llmfs")`).
pub const CONTROL_NAME: &str = "llmfs";

/// The record sent with a namespace's connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmGrant {
    pub version: u32,
    /// The namespace's session id (32 lowercase hex digits): the receipts' scope.
    pub session: String,
    /// The namespace's id, for logs.
    pub namespace: String,
    /// Who the namespace is (itself first, then the namespaces that cloned it, with the budgets
    /// their specs set): each model call is decided by the gate with it and its receipt charged
    /// to the subtree's receipt budgets. nsd always sends it; llmfs with a gate refuses a grant
    /// without it (its calls would be decided for no one's subtree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<crate::lineage::Lineage>,
}

impl LlmGrant {
    /// Why the record is refused, if it is.
    pub fn check(&self) -> Result<(), String> {
        if self.version != 1 {
            return Err(format!("version {}: expected 1", self.version));
        }
        if self.session.len() != 32
            || !self
                .session
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err("session must be 32 lowercase hex digits".into());
        }
        if self.namespace.is_empty()
            || self.namespace.len() > 128
            || !self.namespace.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err("namespace must be 1-128 printable ASCII characters".into());
        }
        if let Some(l) = &self.lineage {
            l.check(&self.session, &self.namespace)?;
        }
        Ok(())
    }
}

/// Hands `conn` (the server end of a socketpair) to llmfs with `grant`; returns once llmfs serves
/// it, or with llmfs's refusal as the error.
pub fn hand_over(ctl_path: &Path, grant: &LlmGrant, conn: BorrowedFd<'_>) -> io::Result<()> {
    crate::control::hand_over(
        ctl_path,
        grant,
        &[conn],
        ReplyForm::Line,
        "llmfs",
        "the connection",
    )
    .map(drop)
}

/// The one-line answer to a handed-over grant (llmfs's side).
pub use crate::control::reply_line;

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> LlmGrant {
        LlmGrant {
            version: 1,
            session: "0123456789abcdef0123456789abcdef".into(),
            namespace: "7".into(),
            lineage: None,
        }
    }

    #[test]
    fn a_sound_grant_passes_and_bad_ones_say_why() {
        assert_eq!(grant().check(), Ok(()));
        let upper = LlmGrant {
            session: "0123456789ABCDEF0123456789abcdef".into(),
            ..grant()
        };
        assert!(upper.check().unwrap_err().contains("session"));
        let v2 = LlmGrant {
            version: 2,
            ..grant()
        };
        assert!(v2.check().unwrap_err().contains("version"));
        let blank = LlmGrant {
            namespace: "a b".into(),
            ..grant()
        };
        assert!(blank.check().unwrap_err().contains("namespace"));
        // A lineage must start with the grant's own namespace.
        let member = |session: &str, namespace: &str| crate::lineage::Member {
            session: session.into(),
            namespace: namespace.into(),
            ..Default::default()
        };
        let own = LlmGrant {
            lineage: Some(crate::lineage::Lineage::root(member(
                "0123456789abcdef0123456789abcdef",
                "7",
            ))),
            ..grant()
        };
        assert_eq!(own.check(), Ok(()));
        let other = LlmGrant {
            lineage: Some(crate::lineage::Lineage::root(member(
                "fedcba9876543210fedcba9876543210",
                "8",
            ))),
            ..grant()
        };
        assert!(other.check().unwrap_err().contains("lineage"));
        assert!(
            serde_json::from_str::<LlmGrant>(
                r#"{"version":1,"session":"x","namespace":"1","extra":1}"#
            )
            .is_err()
        );
    }
}
