//! The egress proxy's records: nsd hands netproxy, per namespace, the listening TCP socket it made
//! inside that namespace's network namespace with a [`GrantRecord`] of the namespace's policy, on
//! `<runtime>/netproxy.ctl` (framed as `warren_daemon::handoff`, answered with one line, `ok` or
//! `error: <why>`: [`crate::control`]). The control connection stays open for as long as the
//! namespace runs. The destinations a record lists are [`policy`]'s patterns, which nsd checks a
//! spec's by (and a clone's against its parent's) and netproxy enforces.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::control::ReplyForm;
use crate::lineage::Lineage;

pub mod policy;
pub mod special;

pub use policy::{Pattern, Policy};

/// The control socket's stem: `<runtime>/netproxy.ctl`.
pub const CONTROL: &str = "netproxy";

/// What nsd hands over with a namespace's listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantRecord {
    pub version: u32,
    /// The namespace's session id: the receipts' scope and the gate's session.
    pub session: String,
    /// The namespace's id in `/ns`, for logs.
    pub namespace: String,
    /// The spec's `net proxy` patterns, as written by `Pattern`'s `Display`.
    pub patterns: Vec<String>,
    /// Who the namespace is (itself, then the namespaces that cloned it), as nsd records it:
    /// sent with each gate request, so a clone's ask is its subtree's (specs/gate-tree.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
}

/// Hands `listener` over with `record` on `ctl_path` and returns the control connection once
/// the proxy has answered `ok`. Keep it open for as long as the namespace runs: closing it ends
/// the session.
pub fn hand_over(
    ctl_path: &Path,
    record: &GrantRecord,
    listener: BorrowedFd<'_>,
) -> io::Result<std::os::unix::net::UnixStream> {
    crate::control::hand_over(
        ctl_path,
        record,
        &[listener],
        ReplyForm::Line,
        "netproxy",
        "the grant",
    )
}
