//! Grant records: what one connection may name, and each granted tool's authority.
//!
//! A trusted peer (nsd) hands toolfs one end of a socketpair over the control socket together
//! with a [`GrantRecord`] and the root directory fds of the tools' authority. toolfs serves that
//! connection with a tree built from exactly that record; nothing the connection later says
//! (uname, aname) widens it. See `specs/tool-tree.md`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use warren_gate::lineage::Lineage;

use crate::catalog::{Catalog, ToolDef};
use crate::worker::{Root, ToolAuthority};

/// The only record version this toolfs understands.
pub const GRANT_VERSION: u32 = 1;
/// The most roots one tool may be granted.
pub const MAX_ROOTS_PER_TOOL: usize = 64;

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
    /// cloned it, up to its subtree's root. Context and budgets follow it (`warren_gate::lineage`).
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

/// One granted tool with its authority (fds included).
pub struct GrantedTool {
    pub def: Arc<ToolDef>,
    pub authority: ToolAuthority,
}

/// Everything a connection's tree knows about its peer.
pub struct ConnGrant {
    /// For log lines: `operator uid=…` or `session … namespace …`.
    pub label: String,
    /// The namespace's session, or one minted for an operator connection: the gate decides
    /// and receipts are kept per session.
    pub session: String,
    /// Sorted by name.
    pub tools: Vec<Arc<GrantedTool>>,
    /// The namespace id (the operator's connections: `operator`); nsd builds workers for it.
    pub namespace: String,
    /// The namespace's lineage as the gate reads it with every decide (serialised once here).
    pub lineage: Option<Box<RawValue>>,
    /// The sessions of the namespaces that cloned this one, parent first: their context
    /// states bind this one's calls too.
    pub ancestors: Vec<String>,
    /// The subtree keys the receipts of this connection's runs are charged to (receiptd's
    /// `budgets`), from the lineage.
    pub budgets: Option<serde_json::Value>,
}

impl ConnGrant {
    /// The operator's grant: every tool in the catalog, worker tools with no roots and no
    /// network (so they answer an error instead of touching the host: authority over host
    /// paths comes only with a grant record).
    pub fn operator(catalog: &Catalog, uid: u32) -> ConnGrant {
        let session = crate::services::mint_session();
        let tools = catalog
            .names()
            .filter_map(|n| catalog.get(n))
            .map(|def| {
                Arc::new(GrantedTool {
                    def: def.clone(),
                    authority: ToolAuthority {
                        roots: Vec::new(),
                        network: false,
                    },
                })
            })
            .collect();
        ConnGrant {
            label: format!("operator uid={uid} session {session}"),
            session,
            tools,
            namespace: "operator".into(),
            lineage: None,
            ancestors: Vec::new(),
            budgets: None,
        }
    }

    /// Checks a record against the catalog and the fds that came with it (the connection fd
    /// already taken off), and builds the grant. Any problem refuses the whole record.
    pub fn from_record(
        record: &GrantRecord,
        root_fds: Vec<OwnedFd>,
        catalog: &Catalog,
    ) -> Result<ConnGrant, String> {
        if record.version != GRANT_VERSION {
            return Err(format!(
                "grant version {} is not {GRANT_VERSION}",
                record.version
            ));
        }
        if record.session.len() != 32
            || !record
                .session
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err("session must be 32 lowercase hex digits".into());
        }
        if record.namespace.is_empty()
            || record.namespace.len() > 128
            || !record.namespace.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err("namespace must be 1 to 128 printable ASCII characters".into());
        }
        if record.worker_uid == 0 || record.worker_gid == 0 {
            return Err("workers never run as uid or gid 0".into());
        }
        let (lineage, ancestors, budgets) = match &record.lineage {
            Some(l) => {
                l.check(&record.session, &record.namespace)?;
                let raw = serde_json::value::to_raw_value(l).map_err(|e| e.to_string())?;
                let budgets = serde_json::to_value(l.budget_keys()).map_err(|e| e.to_string())?;
                (
                    Some(raw),
                    l.sessions().skip(1).map(str::to_owned).collect(),
                    Some(budgets),
                )
            }
            None => (None, Vec::new(), None),
        };
        let unknown: Vec<&str> = record
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| catalog.get(n).is_none())
            .collect();
        if !unknown.is_empty() {
            return Err(format!("unknown tool(s): {}", unknown.join(", ")));
        }
        let wanted_fds: usize = record.tools.iter().map(|t| t.roots.len()).sum();
        if wanted_fds != root_fds.len() {
            return Err(format!(
                "the record names {wanted_fds} root(s) but {} root fd(s) came with it",
                root_fds.len()
            ));
        }
        let mut fds = root_fds.into_iter();
        let mut tools: Vec<Arc<GrantedTool>> = Vec::with_capacity(record.tools.len());
        for t in &record.tools {
            let def = catalog.get(&t.name).expect("checked above").clone();
            if tools.iter().any(|g| g.def.name == t.name) {
                return Err(format!("tool {} is granted twice", t.name));
            }
            if !def.runner.is_worker() && (!t.roots.is_empty() || t.network) {
                return Err(format!(
                    "{} runs in no worker and takes no roots or network",
                    t.name
                ));
            }
            if t.roots.len() > MAX_ROOTS_PER_TOOL {
                return Err(format!("{}: more than {MAX_ROOTS_PER_TOOL} roots", t.name));
            }
            let mut roots = Vec::with_capacity(t.roots.len());
            for r in &t.roots {
                let dir = fds.next().expect("counted above");
                check_root(&t.name, r, &dir)?;
                roots.push(Root {
                    path: r.path.clone(),
                    dir,
                    writable: r.writable,
                });
            }
            tools.push(Arc::new(GrantedTool {
                def,
                authority: ToolAuthority {
                    roots,
                    network: t.network,
                },
            }));
        }
        tools.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        Ok(ConnGrant {
            label: format!("session {} namespace {}", record.session, record.namespace),
            session: record.session.clone(),
            tools,
            namespace: record.namespace.clone(),
            lineage,
            ancestors,
            budgets,
        })
    }
}

fn check_root(tool: &str, root: &RootGrant, dir: &OwnedFd) -> Result<(), String> {
    if !root.path.starts_with('/')
        || root.path.contains('\0')
        || root.path.split('/').any(|c| c == "..")
    {
        return Err(format!(
            "{tool}: root path {:?} must be absolute, without `..`",
            root.path
        ));
    }
    let st = nix::sys::stat::fstat(dir)
        .map_err(|e| format!("{tool}: root {}: fstat: {e}", root.path))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(format!(
            "{tool}: the fd for root {} is not a directory",
            root.path
        ));
    }
    Ok(())
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
        let mut line = String::new();
        if self.replies.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} closed the control connection", self.daemon),
            ));
        }
        match line.trim_end().strip_prefix("error: ") {
            None if line.trim_end() == "ok" => Ok(()),
            None => Err(io::Error::other(format!(
                "{} answered {line:?}",
                self.daemon
            ))),
            Some(msg) => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} refused the grant: {msg}", self.daemon),
            )),
        }
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

/// Writes the one-line answer to a handed-over grant (the server side of the protocol).
pub(crate) fn write_reply(mut sock: &UnixStream, result: &Result<(), String>) -> io::Result<()> {
    let line = match result {
        Ok(()) => "ok\n".to_owned(),
        Err(msg) => format!("error: {}\n", msg.replace('\n', " ")),
    };
    sock.write_all(line.as_bytes())
}
