//! Grant records: what one connection may name, and each granted tool's authority.
//!
//! A trusted peer (nsd) hands toolfs one end of a socketpair over the control socket together
//! with a [`GrantRecord`] and the root directory fds of the tools' authority. toolfs serves that
//! connection with a tree built from exactly that record; nothing the connection later says
//! (uname, aname) widens it. See `specs/tool-tree.md`.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use serde_json::value::RawValue;
pub use warren_proto::toolfs::{
    ControlClient, GRANT_VERSION, GrantRecord, RootGrant, ToolGrant, hand_over,
};

use crate::catalog::{Catalog, ToolDef};
use crate::worker::{Root, ToolAuthority};

/// The most roots one tool may be granted.
pub const MAX_ROOTS_PER_TOOL: usize = 64;

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

/// Writes the one-line answer to a handed-over grant (the server side of the protocol).
pub(crate) fn write_reply(mut sock: &UnixStream, result: &Result<(), String>) -> io::Result<()> {
    sock.write_all(warren_proto::control::reply_line(result).as_bytes())
}
