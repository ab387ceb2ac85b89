//! The grant records toolfs and mcpfs serve connections by: a trusted peer (nsd) hands the
//! server one end of a socketpair over its control socket (`<runtime>/toolfs.ctl`,
//! `<runtime>/mcpfs.ctl`) together with a [`GrantRecord`] and the root directory fds of the tools'
//! authority; the server answers each with one line, `ok` or `error: <why>`
//! ([`crate::control`]). What a sound record grants is the server's to check
//! (`warren_toolfs::grant`). The contract is `specs/tool-tree.md` §1.

use std::io::{self, BufReader};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::control::read_line_reply;
use crate::lineage::Lineage;

/// The only record version toolfs and mcpfs understand.
pub const GRANT_VERSION: u32 = 1;

/// The record a trusted peer sends with a connection (JSON on the control socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantRecord {
    pub version: u32,
    /// The namespace's session id: 128 bits as 32 lowercase hex digits.
    pub session: String,
    /// The namespace id (for logs and, later, receipts).
    pub namespace: String,
    pub tools: Vec<ToolGrant>,
    /// Kept for the record's shape; nsd, which builds the workers, chooses their uid and gid
    /// itself (never 0, which is still refused here).
    pub worker_uid: u32,
    pub worker_gid: u32,
    /// Who the namespace is: itself first (its command, its budget), then the namespaces that
    /// cloned it, up to its subtree's root. Context and budgets follow it ([`crate::lineage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// The operator's MCP server whose tools `tools` names (`mount mcp:NAME`): such a record
    /// goes to mcpfs, and toolfs refuses it. No names then means every tool the operator
    /// accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolGrant {
    pub name: String,
    /// Host directories the tool may touch, in the order their fds follow the connection fd.
    #[serde(default)]
    pub roots: Vec<RootGrant>,
    #[serde(default)]
    pub network: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootGrant {
    /// The path as the tool sees it, e.g. `/home/me/repo`.
    pub path: String,
    #[serde(default)]
    pub writable: bool,
}

/// A client of toolfs's control socket: one long-lived connection over which grants are handed
/// over one after another, each answered with one line.
pub struct ControlClient {
    sock: UnixStream,
    replies: BufReader<UnixStream>,
    /// The daemon, as errors name it: the socket's stem (`toolfs`, `mcpfs`).
    daemon: String,
}

impl ControlClient {
    pub fn connect(ctl_path: &Path) -> io::Result<ControlClient> {
        let sock = UnixStream::connect(ctl_path)?;
        // Bounded: a toolfs that accepts and never answers must not hold its caller (nsd).
        sock.set_read_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
        sock.set_write_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
        let replies = BufReader::new(sock.try_clone()?);
        let daemon = ctl_path
            .file_stem()
            .map_or_else(|| "the server".into(), |s| s.to_string_lossy().into_owned());
        Ok(ControlClient {
            sock,
            replies,
            daemon,
        })
    }

    /// Hands over `conn` (the server end of a socketpair) with its grant and root fds (one per
    /// root, in record order). Returns when toolfs has accepted the grant and serves `conn`, or
    /// with toolfs's refusal as the error message.
    pub fn hand_over(
        &mut self,
        record: &GrantRecord,
        conn: BorrowedFd<'_>,
        root_fds: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
        let mut fds = Vec::with_capacity(1 + root_fds.len());
        fds.push(conn);
        fds.extend_from_slice(root_fds);
        warren_daemon::handoff::send(&self.sock, &bytes, &fds)?;
        read_line_reply(&mut self.replies, &self.daemon, "the grant")
    }
}

/// Connects to the control socket and hands over one connection (see [`ControlClient::hand_over`]).
pub fn hand_over(
    ctl_path: &Path,
    record: &GrantRecord,
    conn: impl AsFd,
    root_fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    ControlClient::connect(ctl_path)?.hand_over(record, conn.as_fd(), root_fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_keeps_its_wire_form() {
        let record = GrantRecord {
            version: GRANT_VERSION,
            session: "a".repeat(32),
            namespace: "7".into(),
            tools: vec![ToolGrant {
                name: "fs_read".into(),
                roots: vec![RootGrant {
                    path: "/srv".into(),
                    writable: false,
                }],
                network: false,
            }],
            worker_uid: 1000,
            worker_gid: 1000,
            lineage: None,
            server: None,
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"version":1,"session":"{}","namespace":"7","tools":[{{"name":"fs_read","roots":[{{"path":"/srv","writable":false}}],"network":false}}],"worker_uid":1000,"worker_gid":1000}}"#,
                "a".repeat(32)
            )
        );
        assert_eq!(serde_json::from_str::<GrantRecord>(&text).unwrap(), record);
    }
}
