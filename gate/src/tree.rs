//! The `/gate` 9P tree, one instance per connection (normative layout in `specs/gate-tree.md`):
//!
//! ```text
//! decide                 rpc (operator and daemon connections): write a request, read the answer; repeat
//! pending/               the open asks this connection may see, by id
//! pending/<id>/request   the call, escaped for a person: byte length, fingerprint prefix
//! pending/<id>/ctl       write an answer: allow once <fp-prefix> | allow session | allow always | deny
//! pending/<id>/wait      a read blocks until the ask is closed, then returns the outcome (JSON)
//! rules                  read: the rules (not on a channel); write (operator only): allow|ask|deny <selector>, delete <id>
//! tiers                  the code-owned tier table and the defaults
//! events                 each read blocks until there is a new event past the reader's offset
//! ```
//!
//! Why one file: the nodes and the `FileTree` impl read one connection's view together (≈ 570
//! lines); the rest is their unit tests.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use warren_9p::synthetic::{RpcReply, dir_entries, stat, walk};
use warren_9p::{DirEntry, Errno, FileTree, GetAttrMask, QId, Result, Stat, Time, oflags};

use crate::escape::escape;
use crate::events::Cursor;
use crate::gate::{ConnId, Gate, now_ms};
use crate::policy::rules::RuleEdit;
use crate::policy::tier::CORE_TOOLS;
use crate::policy::{Tier, ToolClass, engine::default_for};
use crate::request;
use crate::scope::{Scope, Verb};
use crate::store::PendingRow;
use warren_proto::lineage::{Lineage, Member, command_text};

/// How many hex digits of the fingerprint `request` shows.
pub const FP_SHOWN: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    Root,
    Decide,
    PendingDir,
    Pending(i64),
    Request(i64),
    Ctl(i64),
    Wait(i64),
    Rules,
    Tiers,
    Events,
}

impl Node {
    fn is_dir(&self) -> bool {
        matches!(self, Node::Root | Node::PendingDir | Node::Pending(_))
    }

    fn qid(&self) -> QId {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        let path = if *self == Node::Root {
            0
        } else {
            h.finish() | 1
        };
        warren_9p::synthetic::qid(self.is_dir(), 0, path)
    }

    fn mode(&self) -> u32 {
        match self {
            n if n.is_dir() => libc::S_IFDIR | 0o555,
            Node::Decide | Node::Rules => libc::S_IFREG | 0o666,
            Node::Ctl(_) => libc::S_IFREG | 0o222,
            _ => libc::S_IFREG | 0o444,
        }
    }
}

/// Per-fid state.
pub struct GateFid {
    node: Node,
    /// Files read whole (`request`, `rules`, `tiers`): the snapshot taken at open.
    data: Vec<u8>,
    /// `decide`, `ctl`, a written `rules`: the reply to the last write, read by the o₀ rule.
    reply: RpcReply,
    /// `wait`: the outcome, once known.
    outcome: Option<Vec<u8>>,
    /// `events`: where this reader is.
    cursor: Option<Cursor>,
}

impl GateFid {
    fn at(node: Node) -> GateFid {
        GateFid {
            node,
            data: Vec::new(),
            reply: RpcReply::default(),
            outcome: None,
            cursor: None,
        }
    }
}

pub struct GateTree {
    gate: Arc<Gate>,
    scope: Scope,
    conn: ConnId,
}

impl GateTree {
    pub fn new(gate: Arc<Gate>, scope: Scope) -> GateTree {
        let conn = gate.new_conn();
        GateTree { gate, scope, conn }
    }

    fn child(&self, parent: &Node, name: &str) -> Result<Node> {
        Ok(match (parent, name) {
            (_, "..") => match parent {
                Node::Pending(_) => Node::PendingDir,
                _ => Node::Root,
            },
            (Node::Root, "decide") if self.scope.may_decide() => Node::Decide,
            (Node::Root, "pending") => Node::PendingDir,
            (Node::Root, "rules") if self.scope.sees_rules() => Node::Rules,
            (Node::Root, "tiers") => Node::Tiers,
            (Node::Root, "events") => Node::Events,
            (Node::PendingDir, id) => {
                let id = parse_id(id)?;
                self.gate.visible_row(id, &self.scope).map_err(|(e, _)| e)?;
                Node::Pending(id)
            }
            (Node::Pending(id), "request") => Node::Request(*id),
            (Node::Pending(id), "ctl") => Node::Ctl(*id),
            // Waiting spends an `allow once`: only the caller's side (a daemon, or the operator) may.
            (Node::Pending(id), "wait") if self.scope.may_decide() => Node::Wait(*id),
            _ => return Err(Errno::ENOENT),
        })
    }

    fn entries(&self, node: &Node) -> Result<Vec<(String, Node)>> {
        Ok(match node {
            Node::Root => {
                let mut v = Vec::new();
                if self.scope.may_decide() {
                    v.push(("decide".to_owned(), Node::Decide));
                }
                for (n, node) in [
                    ("events", Node::Events),
                    ("pending", Node::PendingDir),
                    ("rules", Node::Rules),
                    ("tiers", Node::Tiers),
                ] {
                    if node != Node::Rules || self.scope.sees_rules() {
                        v.push((n.to_owned(), node));
                    }
                }
                v
            }
            Node::PendingDir => self
                .gate
                .store()
                .open_pending()
                .map_err(|_| Errno::EIO)?
                .into_iter()
                .filter(|r| r.shown && self.scope.sees_session(&r.session))
                .map(|r| (r.id.to_string(), Node::Pending(r.id)))
                .collect(),
            Node::Pending(id) => {
                let mut v = vec![
                    ("ctl".to_owned(), Node::Ctl(*id)),
                    ("request".to_owned(), Node::Request(*id)),
                ];
                if self.scope.may_decide() {
                    v.push(("wait".to_owned(), Node::Wait(*id)));
                }
                v
            }
            _ => return Err(Errno::ENOTDIR),
        })
    }

    fn rules_text(&self) -> Result<Vec<u8>> {
        let rules = self.gate.store().rules().map_err(|_| Errno::EIO)?;
        let mut out = String::new();
        for r in rules {
            out.push_str(&format!(
                "{}\t{}\t{}\t{}\n",
                r.rule.id,
                r.rule.verdict,
                r.rule.selector,
                escape(&r.origin)
            ));
        }
        Ok(out.into_bytes())
    }

    fn write_rules(&self, data: &[u8]) -> std::result::Result<String, (Errno, String)> {
        if !self.scope.may_edit_rules() {
            return Err((Errno::EPERM, "rules are the operator's alone".into()));
        }
        let text = std::str::from_utf8(data)
            .map_err(|_| (Errno::EINVAL, "rules take UTF-8 text".to_string()))?;
        let edits: Vec<RuleEdit> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.parse::<RuleEdit>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| (Errno::EINVAL, e))?;
        let origin = format!("rules file by {}", self.scope.label());
        let now = now_ms();
        let done = self.gate.store().transaction(|s| {
            let mut done = Vec::new();
            for edit in &edits {
                match edit {
                    RuleEdit::Add(v, sel) => {
                        done.push(format!("added rule {}", s.add_rule(*v, sel, &origin, now)?))
                    }
                    RuleEdit::Delete(id) => {
                        if !s.delete_rule(*id)? {
                            return Err(rusqlite::Error::QueryReturnedNoRows);
                        }
                        done.push(format!("deleted rule {id}"));
                    }
                }
            }
            Ok(done)
        });
        // All edits of one write or none.
        done.map(|d| d.join("\n")).map_err(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => {
                (Errno::ENOENT, "no such rule; nothing was changed".into())
            }
            e => (Errno::EIO, e.to_string()),
        })
    }
}

impl Drop for GateTree {
    fn drop(&mut self) {
        self.gate.conn_closed(self.conn);
    }
}

fn parse_id(s: &str) -> Result<i64> {
    let id: i64 = s.parse().map_err(|_| Errno::ENOENT)?;
    if id > 0 && id.to_string() == s {
        Ok(id)
    } else {
        Err(Errno::ENOENT)
    }
}

/// The `tiers` file: every core name with its tier and default, then the dynamic and unmapped
/// classes and what each context state requires.
pub fn tiers_text() -> String {
    let mut out = String::new();
    for (name, tier) in CORE_TOOLS {
        out.push_str(&format!(
            "{name}\t{tier}\t{}\n",
            default_for(ToolClass::Core(*tier))
        ));
    }
    out.push_str(&format!(
        "mcp:<server>:<tool>\tdynamic\t{}\n",
        default_for(ToolClass::Dynamic)
    ));
    out.push_str(&format!(
        "skill:<name>\tdynamic\t{}\n",
        default_for(ToolClass::Dynamic)
    ));
    out.push_str(&format!(
        "<other>\tunmapped\t{}\n",
        default_for(ToolClass::Unmapped)
    ));
    for t in Tier::ALL {
        out.push_str(&format!(
            "tier:{t}\t{t}\t{}\n",
            default_for(ToolClass::Core(t))
        ));
    }
    for s in crate::policy::ContextState::ALL {
        let req = crate::policy::Verdict::from(crate::policy::context::requirement(s));
        out.push_str(&format!("context:{s}\t(all but read)\t{req}\n"));
    }
    out
}

/// The lineage stored with an ask; a row from before lineages (or an operator's call) is its own
/// root with nothing known but its session.
pub fn row_lineage(row: &PendingRow) -> Lineage {
    serde_json::from_str(&row.lineage).unwrap_or_else(|_| {
        Lineage::root(Member {
            session: row.session.clone(),
            namespace: "-".into(),
            ..Member::default()
        })
    })
}

/// The `request` file of an ask: what a person needs to decide, with every non-printing and bidi
/// code point escaped, the argument bytes' length and a fingerprint prefix. Who asks comes first:
/// the namespace, its command, the namespaces that cloned it (nsd's record, never the caller's
/// word) and how many asks its subtree has open (`subtree_open`).
pub fn request_text(row: &PendingRow, scope: &Scope, subtree_open: usize) -> String {
    let lineage = row_lineage(row);
    let me = lineage.0.first();
    let namespace = me.map_or("-".to_owned(), |m| escape(&m.namespace));
    let command = me.map_or("-".to_owned(), |m| command_text(&m.command, escape));
    let parents = match lineage.0.get(1..) {
        Some(up) if !up.is_empty() => Lineage(up.to_vec()).chain_text(escape),
        _ => "-".to_owned(),
    };
    let subtree = lineage.root_session().unwrap_or(&row.session).to_owned();
    let tier = match &row.risk {
        Some(r) => format!(
            "{} (raised by the shell tripwire: {r}; a text pattern, not a boundary)",
            row.class
        ),
        None => row.class.clone(),
    };
    let fp = &row.fp[..FP_SHOWN.min(row.fp.len())];
    let answers = match scope {
        Scope::Namespace { .. } => format!("allow once {fp} | deny"),
        Scope::Channel { .. } if scope.may_allow(&row.class, &row.basis).is_err() => {
            "deny (allowing it is this host's operator's)".to_owned()
        }
        Scope::Channel { .. } => format!("allow once {fp} | deny"),
        _ => format!("allow once {fp} | allow session | allow always | deny"),
    };
    let outcome = match (&row.outcome, &row.outcome_basis) {
        (Some(o), Some(b)) => format!("{o} ({b})"),
        _ => "-".into(),
    };
    format!(
        "ask {}\nsession {}\nnamespace {namespace}\ncommand {command}\nparents {parents}\nsubtree {subtree}\nsubtree_open_asks {subtree_open}\ntool {}\ntier {tier}\nbasis {}\ncontext {}\nfingerprint {fp}\nbytes {}\nargs {}\nstate {}\noutcome {outcome}\nexpires {}\nanswer {answers}\n",
        row.id,
        row.session,
        escape(&row.tool),
        row.basis,
        if row.context.is_empty() {
            "-"
        } else {
            &row.context
        },
        row.args.len(),
        escape(&row.args),
        row.state,
        expiry_in_words(row, now_ms()),
    )
}

/// When an ask expires, as a person reads it: the UTC time, and for an open ask how long is
/// left when the file was opened (`2026-12-05T13:40:00Z (in 4m 12s)`).
fn expiry_in_words(row: &PendingRow, now_ms: i64) -> String {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(row.expires_ms).unwrap_or(0));
    let at = humantime::format_rfc3339_seconds(at);
    let left_ms = row.expires_ms.saturating_sub(now_ms);
    if row.state != "open" {
        at.to_string()
    } else if left_ms <= 0 {
        format!("{at} (due now)")
    } else {
        // Whole seconds, rounded up: an ask with 400 ms left still shows 1s.
        let left = std::time::Duration::from_secs((left_ms as u64).div_ceil(1000));
        format!("{at} (in {})", humantime::format_duration(left))
    }
}

/// Each deciding daemon decides only the calls it serves: the model server [`LLM_TOOL`] (a
/// namespace's model call), mcpfs `mcp:*`, netproxy `net:*`, toolfs every other name — so a
/// daemon cannot have the gate decide (and receipt) a call of a kind it never makes.
fn daemon_decides(daemon: &str, tool: &str) -> std::result::Result<(), String> {
    let model_call = tool == crate::request::LLM_TOOL;
    let (mcp, net) = (tool.starts_with("mcp:"), tool.starts_with("net:"));
    let own = match daemon {
        "llmfs" => model_call,
        "mcpfs" => mcp,
        "netproxy" => net,
        "toolfs" => !(model_call || mcp || net),
        _ => false,
    };
    if own {
        Ok(())
    } else {
        Err(format!(
            "{daemon} does not decide {tool}: not a call it serves"
        ))
    }
}

fn json_line(v: &impl serde::Serialize) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

fn error_line(msg: &str) -> Vec<u8> {
    json_line(&serde_json::json!({ "error": msg }))
}

#[async_trait::async_trait]
impl FileTree for GateTree {
    type Fid = GateFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, GateFid)> {
        Ok((Node::Root.qid(), GateFid::at(Node::Root)))
    }

    async fn walk(&self, from: &GateFid, names: &[String]) -> Result<(Vec<QId>, Option<GateFid>)> {
        let (qids, node) = walk(from.node.clone(), names, |node, name| {
            let next = self.child(node, name)?;
            let qid = next.qid();
            Ok((next, qid))
        })?;
        Ok((qids, node.map(GateFid::at)))
    }

    async fn getattr(&self, fid: &GateFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        let now = Time {
            sec: (now_ms() / 1000) as u64,
            nsec: 0,
        };
        let size = if fid.reply.is_empty() {
            fid.data.len()
        } else {
            fid.reply.len()
        };
        Ok((fid.node.qid(), stat(fid.node.mode(), size as u64, now)))
    }

    async fn open(&self, fid: &mut GateFid, flags: u32) -> Result<(QId, u32)> {
        let writing = flags & oflags::ACCMODE != oflags::RDONLY;
        match &fid.node {
            n if n.is_dir() && writing => return Err(Errno::EISDIR),
            Node::Request(_) | Node::Wait(_) | Node::Tiers | Node::Events if writing => {
                return Err(Errno::EACCES);
            }
            Node::Rules if writing && !self.scope.may_edit_rules() => return Err(Errno::EPERM),
            Node::Request(id) => {
                let row = self
                    .gate
                    .visible_row(*id, &self.scope)
                    .map_err(|(e, _)| e)?;
                let lineage = row_lineage(&row);
                let root = lineage.root_session().unwrap_or(&row.session).to_owned();
                let open = self
                    .gate
                    .store()
                    .open_asks_in_subtree(&root)
                    .map_err(|_| Errno::EIO)?;
                fid.data = request_text(&row, &self.scope, open).into_bytes();
            }
            Node::Rules => fid.data = self.rules_text()?,
            Node::Tiers => fid.data = tiers_text().into_bytes(),
            Node::Events => fid.cursor = Some(Cursor::new(self.gate.events.latest())),
            _ => {}
        }
        Ok((fid.node.qid(), 0))
    }

    async fn read(&self, fid: &mut GateFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        match fid.node.clone() {
            Node::Wait(id) => {
                if fid.outcome.is_none() {
                    let answer = self.gate.wait(id, self.conn).await?;
                    fid.outcome = Some(json_line(&answer));
                }
                Ok(warren_9p::synthetic::slice(
                    fid.outcome.as_deref().unwrap_or_default(),
                    offset,
                    count,
                ))
            }
            Node::Events => {
                let cursor = fid.cursor.as_mut().ok_or(Errno::EBADF)?;
                let scope = &self.scope;
                Ok(cursor
                    .read(&self.gate.events, offset, count, |e| {
                        scope.sees_session(&e.session)
                    })
                    .await)
            }
            n if n.is_dir() => Err(Errno::EISDIR),
            Node::Decide | Node::Ctl(_) => Ok(fid.reply.read(offset, count)),
            // `rules` reads its snapshot until a write on this open has answered.
            _ if !fid.reply.is_empty() => Ok(fid.reply.read(offset, count)),
            _ => Ok(warren_9p::synthetic::slice(&fid.data, offset, count)),
        }
    }

    async fn write(&self, fid: &mut GateFid, _offset: u64, data: &[u8]) -> Result<u32> {
        // Every write to an rpc file is one whole request, whatever its offset.
        let result: std::result::Result<Vec<u8>, (Errno, String)> = match fid.node.clone() {
            Node::Decide => match request::parse(data).and_then(|req| {
                // A tier comes from the operator's definition through mcpfs, never from anyone
                // else who may decide.
                let mcpfs = matches!(&self.scope, Scope::Daemon { name } if name == "mcpfs");
                if req.tier.is_some() && !mcpfs {
                    return Err("only mcpfs names a tool's tier".to_string());
                }
                if let Scope::Daemon { name } = &self.scope {
                    daemon_decides(name, &req.tool)?;
                }
                Ok(req)
            }) {
                // Spawned: a flushed write must not leave a decision half made (an ask with no
                // receipt); the decision completes and is receipted whether or not anyone reads it.
                Ok(req) => {
                    let (gate, conn) = (self.gate.clone(), self.conn);
                    let decided = tokio::spawn(async move { gate.decide(&req, conn).await });
                    decided
                        .await
                        .map(|a| json_line(&a))
                        .map_err(|e| (Errno::EIO, format!("decide: {e}")))
                }
                Err(msg) => Err((Errno::EINVAL, msg)),
            },
            Node::Ctl(id) => match std::str::from_utf8(data)
                .map_err(|_| "ctl takes text".to_string())
                .and_then(|t| t.trim().parse::<Verb>())
            {
                // Spawned for the same reason: an answer is receipted and recorded whole.
                Ok(verb) => {
                    let (gate, scope) = (self.gate.clone(), self.scope.clone());
                    let answered =
                        tokio::spawn(async move { gate.answer(id, &verb, &scope).await });
                    match answered.await {
                        Ok(r) => r.map(|msg| format!("{msg}\n").into_bytes()),
                        Err(e) => Err((Errno::EIO, format!("answer: {e}"))),
                    }
                }
                Err(msg) => Err((Errno::EINVAL, msg)),
            },
            Node::Rules => self
                .write_rules(data)
                .map(|msg| format!("{msg}\n").into_bytes()),
            _ => return Err(Errno::EACCES),
        };
        match result {
            Ok(reply) => {
                fid.reply.set(reply);
                Ok(data.len() as u32)
            }
            Err((errno, msg)) => {
                tracing::info!(scope = %self.scope.label(), "refused: {msg}");
                fid.reply.set(error_line(&msg));
                Err(errno)
            }
        }
    }

    async fn readdir(&self, fid: &mut GateFid, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        let entries = self.entries(&fid.node)?;
        Ok(dir_entries(
            entries.into_iter().map(|(name, node)| (name, node.qid())),
            offset,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str, expires_ms: i64) -> PendingRow {
        PendingRow {
            id: 7,
            session: "0123456789abcdef0123456789abcdef".into(),
            tool: "shell".into(),
            args: r#"{"command":"ls"}"#.into(),
            fp: "1a2b3c4d5e6f7a8b9c0d".into(),
            class: "exec".into(),
            risk: None,
            basis: "default:exec".into(),
            context: String::new(),
            created_ms: 0,
            expires_ms,
            state: state.into(),
            outcome: None,
            outcome_basis: None,
            answer: None,
            shown: true,
            lineage: String::new(),
        }
    }

    /// An ask says when it expires as a time and how long is left, never as a raw ms count.
    #[test]
    fn an_ask_shows_its_expiry_as_a_time_and_what_is_left() {
        let at = 1_796_470_710_373;
        assert_eq!(
            expiry_in_words(&row("open", at), at - 252_000),
            "2026-12-05T11:38:30Z (in 4m 12s)"
        );
        assert_eq!(
            expiry_in_words(&row("open", at), at + 5),
            "2026-12-05T11:38:30Z (due now)"
        );
        assert_eq!(
            expiry_in_words(&row("answered", at), at - 1000),
            "2026-12-05T11:38:30Z"
        );
        let operator = Scope::Operator {
            confirmed_tty: false,
            label: "t".into(),
        };
        let text = request_text(&row("open", now_ms() + 60_000), &operator, 1);
        assert!(!text.contains("expires_ms"), "{text}");
        let line = text.lines().find(|l| l.starts_with("expires ")).unwrap();
        assert!(
            line.ends_with("(in 1m)") || line.ends_with("(in 59s)"),
            "{line}"
        );
    }
}
