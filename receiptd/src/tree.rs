//! The `/receipts` 9P tree (normative layout in `specs/receipts.md`):
//!
//! ```text
//! append                              rpc: write a request, read {"hash":..,"seq":..}; repeat
//!                                     (the answer is read from o₀, the first read's offset)
//! keys                                the key registry (what `warren verify --keys` takes)
//! ctl                                 operator only: write `rotate` or `checkpoint`
//! signer                              the key in force, or why appends are refused
//! <scope>/log                         canonical envelopes, one per line
//! <scope>/head                        the latest signed checkpoint (C2SP signed note)
//! <scope>/proof/inclusion/<seq>       inclusion proof of entry <seq> in the head's tree
//! <scope>/proof/consistency/<m>-<n>   consistency proof from size m to checkpointed size n
//! ```
//!
//! One tree per connection; its role came from the connection's peer credentials. A connection
//! handed over on the control socket (`crate::control`) is a *view*: one scope's `log`, `head`
//! and `proof/…` and the `keys` registry, read-only; every other name is absent (ENOENT).

use std::hash::{DefaultHasher, Hash as _, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;
use warren_9p::synthetic::{RpcReply, walk};
use warren_9p::{DirEntry, Errno, FileTree, GetAttrMask, QId, Result, Stat, Time};

use crate::access::{AppendError, Role};
use crate::batch::{self, Batcher};
use crate::log::{Ack, Log, Write};
use crate::receipt::AppendRequest;
use crate::sync::{Durability, Syncer};

/// What every connection's tree shares: the log, and the appends waiting for its next commit.
pub struct Shared {
    pub log: Mutex<Log>,
    pub batcher: Batcher,
    /// The log's fsync thread (an append under `--durable=fsync` waits on it, not on the log).
    syncer: Arc<Syncer>,
}

impl Shared {
    pub fn new(log: Log) -> Shared {
        Shared {
            syncer: Arc::clone(log.syncer()),
            log: Mutex::new(log),
            batcher: Batcher::default(),
        }
    }

    pub fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct ReceiptsTree {
    shared: Arc<Shared>,
    role: Role,
    /// A view's one scope: nothing else is named, listed or written.
    view: Option<String>,
    /// Files this connection holds open: each holds a copy of what it read at open (a whole
    /// session's log, for `log`), taken under the log's lock that appends wait on.
    snapshots: Arc<AtomicUsize>,
}

/// Read-only files one connection may hold open at once; the next open is EMFILE. A reader
/// needs one or two at a time; without a bound, a peer or a namespace opening `log` a
/// thousand times would hold a thousand copies and stall every append while taking them.
pub const MAX_SNAPSHOTS: usize = 16;

/// One of a connection's [`MAX_SNAPSHOTS`] places, given back when its fid goes.
struct Held(Arc<AtomicUsize>);

impl Held {
    fn take(count: &Arc<AtomicUsize>) -> Result<Held> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_SNAPSHOTS).then_some(n + 1)
            })
            .map_err(|_| Errno::EMFILE)?;
        Ok(Held(count.clone()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ReceiptsTree {
    pub fn new(shared: Arc<Shared>, role: Role) -> ReceiptsTree {
        ReceiptsTree {
            shared,
            role,
            view: None,
            snapshots: Arc::default(),
        }
    }

    /// The read-only view of one scope (and the key registry that verifies it).
    pub fn view(shared: Arc<Shared>, scope: String) -> ReceiptsTree {
        ReceiptsTree {
            shared,
            role: Role::Reader,
            view: Some(scope),
            snapshots: Arc::default(),
        }
    }

    /// Whether this connection sees the root entry `name` (a view: `keys` and its scope only).
    fn shows(&self, name: &str) -> bool {
        match &self.view {
            None => true,
            Some(scope) => name == "keys" || name == scope,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    Root,
    Append,
    Keys,
    Ctl,
    Signer,
    Scope(String),
    Log(String),
    Head(String),
    Proof(String),
    InclusionDir(String),
    ConsistencyDir(String),
    Inclusion(String, u64),
    Consistency(String, u64, u64),
}

impl Node {
    fn is_dir(&self) -> bool {
        matches!(
            self,
            Node::Root
                | Node::Scope(_)
                | Node::Proof(_)
                | Node::InclusionDir(_)
                | Node::ConsistencyDir(_)
        )
    }

    fn qid(&self) -> QId {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        warren_9p::synthetic::qid(self.is_dir(), 0, h.finish())
    }

    fn mode(&self) -> u32 {
        match self {
            n if n.is_dir() => libc::S_IFDIR | 0o555,
            Node::Append => libc::S_IFREG | 0o666,
            Node::Ctl => libc::S_IFREG | 0o200,
            _ => libc::S_IFREG | 0o444,
        }
    }
}

pub struct FidState {
    node: Node,
    /// A read-only file's contents, taken at open.
    content: Option<Vec<u8>>,
    /// The connection's place that `content` holds.
    held: Option<Held>,
    /// `append`/`ctl`: the reply to the last write.
    reply: RpcReply,
}

fn enoent<T>(_: T) -> Errno {
    Errno::ENOENT
}

impl ReceiptsTree {
    fn child(&self, parent: &Node, name: &str) -> Result<Node> {
        let log = self.shared.log();
        let node = match (parent, name) {
            (_, "..") => return Ok(parent_of(parent)),
            (Node::Root, name) if !self.shows(name) => return Err(Errno::ENOENT),
            (Node::Root, "append") => Node::Append,
            (Node::Root, "keys") => Node::Keys,
            (Node::Root, "ctl") => Node::Ctl,
            (Node::Root, warren_proto::receipts::SIGNER_FILE) => Node::Signer,
            (Node::Root, scope) if log.has_scope(scope) => Node::Scope(scope.to_owned()),
            (Node::Scope(s), "log") => Node::Log(s.clone()),
            (Node::Scope(s), "head") => Node::Head(s.clone()),
            (Node::Scope(s), "proof") => Node::Proof(s.clone()),
            (Node::Proof(s), "inclusion") => Node::InclusionDir(s.clone()),
            (Node::Proof(s), "consistency") => Node::ConsistencyDir(s.clone()),
            (Node::InclusionDir(s), seq) => Node::Inclusion(s.clone(), parse_num(seq)?),
            (Node::ConsistencyDir(s), range) => {
                let (m, n) = range.split_once('-').ok_or(Errno::ENOENT)?;
                Node::Consistency(s.clone(), parse_num(m)?, parse_num(n)?)
            }
            _ => return Err(Errno::ENOENT),
        };
        Ok(node)
    }

    fn content(&self, node: &Node) -> Result<Vec<u8>> {
        let log = self.shared.log();
        let json_line = |v: serde_json::Value| {
            let mut out = warren_jcs::value_to_vec(&v).map_err(|_| Errno::EIO)?;
            out.push(b'\n');
            Ok(out)
        };
        match node {
            Node::Keys => Ok(log.registry().map_err(|_| Errno::EIO)?.to_bytes()),
            Node::Signer => {
                let said = match log.signer_status() {
                    Ok(keyid) => warren_proto::receipts::Signer {
                        keyid: Some(keyid.to_owned()),
                        refused: None,
                    },
                    Err(why) => warren_proto::receipts::Signer {
                        keyid: None,
                        refused: Some(why.to_owned()),
                    },
                };
                json_line(serde_json::to_value(said).map_err(|_| Errno::EIO)?)
            }
            Node::Log(s) => log.log_text(s).map_err(|_| Errno::EIO),
            Node::Head(s) => Ok(log
                .head(s)
                .map_err(|_| Errno::EIO)?
                .map(|(_, note)| note.into_bytes())
                .unwrap_or_default()),
            Node::Inclusion(s, seq) => json_line(log.inclusion_proof(s, *seq).map_err(enoent)?),
            Node::Consistency(s, m, n) => {
                json_line(log.consistency_proof(s, *m, *n).map_err(enoent)?)
            }
            _ => Err(Errno::EISDIR),
        }
    }

    /// One write to `append`: a request, or a batch (a JSON array, appended all or none, whose
    /// reply is the array of their acks).
    async fn append(&self, data: &[u8]) -> std::result::Result<Vec<u8>, AppendError> {
        let (requests, is_batch) =
            AppendRequest::parse_write(data).map_err(AppendError::Invalid)?;
        let write = Write {
            requests,
            role: self.role,
        };
        let acks = batch::append(&self.shared, write).await?;
        let syncer = &self.shared.syncer;
        if syncer.mode() == Durability::Fsync {
            // One commit: every ack of the write has the same generation.
            syncer
                .wait(acks[0].generation)
                .await
                .map_err(AppendError::Storage)?;
        }
        Ok(if is_batch {
            Ack::batch_reply(&acks)
        } else {
            acks[0].reply()
        })
    }

    fn ctl(&self, data: &[u8]) -> std::result::Result<Vec<u8>, AppendError> {
        if !matches!(self.role, Role::Operator(_)) {
            return Err(AppendError::Forbidden("ctl is the operator's".into()));
        }
        let cmd = std::str::from_utf8(data)
            .map_err(|_| AppendError::Invalid("ctl takes text".into()))?
            .trim();
        let mut log = self.shared.log();
        match cmd {
            "rotate" => Ok(warren_jcs::value_to_vec(&json!({"key": log.rotate()?})).expect("json")),
            "checkpoint" => {
                log.checkpoint(true)?;
                Ok(b"{\"ok\":true}".to_vec())
            }
            _ => Err(AppendError::Invalid(format!(
                "unknown ctl command {cmd:?} (rotate, checkpoint)"
            ))),
        }
    }
}

fn parse_num(s: &str) -> Result<u64> {
    let n: u64 = s.parse().map_err(enoent)?;
    if n.to_string() == s {
        Ok(n)
    } else {
        Err(Errno::ENOENT)
    }
}

fn parent_of(node: &Node) -> Node {
    match node {
        Node::Root | Node::Append | Node::Keys | Node::Ctl | Node::Signer | Node::Scope(_) => {
            Node::Root
        }
        Node::Log(s) | Node::Head(s) | Node::Proof(s) => Node::Scope(s.clone()),
        Node::InclusionDir(s) | Node::ConsistencyDir(s) => Node::Proof(s.clone()),
        Node::Inclusion(s, _) => Node::InclusionDir(s.clone()),
        Node::Consistency(s, _, _) => Node::ConsistencyDir(s.clone()),
    }
}

fn error_reply(e: &AppendError) -> Vec<u8> {
    warren_jcs::value_to_vec(&json!({"error": {"code": e.code(), "message": e.to_string()}}))
        .expect("json")
}

#[async_trait::async_trait]
impl FileTree for ReceiptsTree {
    type Fid = FidState;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, FidState)> {
        Ok((
            Node::Root.qid(),
            FidState {
                node: Node::Root,
                content: None,
                held: None,
                reply: RpcReply::default(),
            },
        ))
    }

    async fn walk(
        &self,
        from: &FidState,
        names: &[String],
    ) -> Result<(Vec<QId>, Option<FidState>)> {
        let (qids, node) = walk(from.node.clone(), names, |node, name| {
            let next = self.child(node, name)?;
            let qid = next.qid();
            Ok((next, qid))
        })?;
        let fid = node.map(|node| FidState {
            node,
            content: None,
            held: None,
            reply: RpcReply::default(),
        });
        Ok((qids, fid))
    }

    async fn getattr(&self, fid: &FidState, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        let now = Time {
            sec: crate::log::now_ms() / 1000,
            nsec: 0,
        };
        let size = match &fid.node {
            Node::Append | Node::Ctl => fid.reply.len(),
            _ => fid.content.as_ref().map_or(0, Vec::len),
        };
        let stat = warren_9p::synthetic::stat(fid.node.mode(), size as u64, now);
        Ok((fid.node.qid(), stat))
    }

    async fn open(&self, fid: &mut FidState, flags: u32) -> Result<(QId, u32)> {
        let writing = flags & warren_9p::oflags::ACCMODE != warren_9p::oflags::RDONLY;
        match &fid.node {
            Node::Append => {}
            Node::Ctl if !writing => return Err(Errno::EACCES),
            Node::Ctl => {}
            n if n.is_dir() => {
                if writing {
                    return Err(Errno::EISDIR);
                }
            }
            n => {
                if writing {
                    return Err(Errno::EACCES);
                }
                let held = Held::take(&self.snapshots)?;
                fid.content = Some(self.content(n)?);
                fid.held = Some(held);
            }
        }
        Ok((fid.node.qid(), 0))
    }

    async fn read(&self, fid: &mut FidState, offset: u64, count: u32) -> Result<Vec<u8>> {
        let data = match &fid.node {
            Node::Append | Node::Ctl => return Ok(fid.reply.read(offset, count)),
            _ => fid.content.as_ref().ok_or(Errno::EBADF)?,
        };
        Ok(warren_9p::synthetic::slice(data, offset, count))
    }

    async fn write(&self, fid: &mut FidState, _offset: u64, data: &[u8]) -> Result<u32> {
        // Every write is one whole request, whatever its offset (an rpc file).
        let result = match &fid.node {
            Node::Append => self.append(data).await,
            Node::Ctl => self.ctl(data),
            _ => return Err(Errno::EACCES),
        };
        match result {
            Ok(reply) => {
                fid.reply.set(reply);
                Ok(data.len() as u32)
            }
            Err(e) => {
                tracing::info!(role = ?self.role, error = %e, "append refused");
                fid.reply.set(error_reply(&e));
                Err(Errno(e.errno() as u32))
            }
        }
    }

    async fn readdir(&self, fid: &mut FidState, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        let names: Vec<(String, Node)> = match &fid.node {
            Node::Root => {
                let mut v: Vec<(String, Node)> = vec![
                    ("append".into(), Node::Append),
                    ("keys".into(), Node::Keys),
                    ("ctl".into(), Node::Ctl),
                    (warren_proto::receipts::SIGNER_FILE.into(), Node::Signer),
                ];
                v.extend(
                    self.shared
                        .log()
                        .scopes()
                        .into_iter()
                        .map(|s| (s.clone(), Node::Scope(s))),
                );
                v.retain(|(name, _)| self.shows(name));
                v
            }
            Node::Scope(s) => vec![
                ("log".into(), Node::Log(s.clone())),
                ("head".into(), Node::Head(s.clone())),
                ("proof".into(), Node::Proof(s.clone())),
            ],
            Node::Proof(s) => vec![
                ("inclusion".into(), Node::InclusionDir(s.clone())),
                ("consistency".into(), Node::ConsistencyDir(s.clone())),
            ],
            Node::InclusionDir(_) | Node::ConsistencyDir(_) => Vec::new(),
            _ => return Err(Errno::ENOTDIR),
        };
        Ok(warren_9p::synthetic::dir_entries(
            names.into_iter().map(|(name, node)| (name, node.qid())),
            offset,
        ))
    }
}
