//! nsd's `/ns` tree, served to the operator over 9P (`specs/ns-tree.md`; `docs/confinement.md`):
//!
//! - `clone` — one open is one namespace: write a spec (any number of writes, appended), then
//!   read: the spec is parsed and the new id is returned as `<id>\n`. A spec that does not parse
//!   fails that read with EINVAL; every later read on the fid answers why, on one line
//!   (`error: invalid spec: …`), as 9P's Rlerror carries an errno only.
//! - `<id>/spec` — the spec as text (env names only: a spec never holds a value).
//! - `<id>/status` — `created`, `running holder=<pid>`, `exited <code>` or `failed <message>`.
//! - `<id>/ctl` — write `run ARG…` (rc-quoted words, as in specs) to build the namespace and
//!   start its command (once; the write returns when it has exec'd, or fails and `status` says
//!   why), `kill` to SIGKILL it (ESRCH when nothing runs).
//! - `<id>/wait` — a read blocks until the command has ended and returns its final status line.
//! - `<id>/info` — what `warren ps` shows: one `key value…` line each (specs/ns-tree.md).
//!
//! A namespace with `mount ns` gets this tree scoped to itself ([`Nsd::scoped`]): only its
//! descendants, and a `clone` that takes a child spec in its own view and refuses any widening
//! whole with EPERM, later reads answering `error: refused: widens: …` (`warren_ns::narrow`,
//! specs/ns-tree.md).
//!
//! A namespace cloned here has /dev/null stdio. Namespaces started through nsd's run socket
//! (`warren run`, see `launch`) appear here too, as `<id>/`, while their launcher is connected.
//!
//! The registry of namespaces the tree is served from is `registry`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rs9p::{DirEntry, GetAttrMask, QId, QIdType, Stat};
use warren_9p::synthetic::{self, RpcReply};
use warren_9p::{Errno, FileTree, Result};
use warren_ns::run::{PayloadStdio, RunOptions, spawn};
use warren_ns::spec;

use crate::mount_server::{NsView, new_session_id};

mod registry;

use registry::wait_space;
pub use registry::{Info, SUBTREE_HANDLES, Status};
pub(crate) use registry::{Space, end_with_a_dead_bridge, now_secs};

/// The namespaces nsd owns, shared by every operator connection.
struct Shared {
    opts: RunOptions,
    /// `warren-bridge`, for the mounts of namespaces cloned through `/ns` (set by the run
    /// socket's accept loop, which is given it).
    bridge: std::sync::OnceLock<std::path::PathBuf>,
    next_id: Mutex<u64>,
    spaces: Mutex<BTreeMap<u64, Arc<Space>>>,
    /// Held while a clone is counted against its ancestors' budgets and entered.
    cloning: Mutex<()>,
}

/// The `/ns` tree as one operator sees it: the namespaces they start run under their own uid
/// (root's under a per-namespace uid).
pub struct Nsd {
    shared: Arc<Shared>,
    operator_uid: u32,
    /// A namespace's own view (`mount ns`): only its descendants, and `clone` narrows it.
    scope: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Root,
    Clone,
    Dir(u64),
    File(u64, FileKind),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    Spec,
    Status,
    Ctl,
    Wait,
    Info,
}

const FILES: [(&str, FileKind); 5] = [
    ("spec", FileKind::Spec),
    ("status", FileKind::Status),
    ("ctl", FileKind::Ctl),
    ("wait", FileKind::Wait),
    ("info", FileKind::Info),
];

impl Node {
    fn qid(self) -> QId {
        let (typ, path) = match self {
            Node::Root => (QIdType::DIR, 1),
            Node::Clone => (QIdType::FILE, 2),
            Node::Dir(id) => (QIdType::DIR, (id << 8) | 0x10),
            Node::File(id, k) => (QIdType::FILE, (id << 8) | (0x11 + k as u64)),
        };
        QId {
            typ,
            version: 0,
            path,
        }
    }

    fn stat(self) -> Stat {
        let mode = match self {
            Node::Root | Node::Dir(_) => 0o040555,
            Node::Clone | Node::File(_, FileKind::Ctl) => 0o100660,
            Node::File(..) => 0o100440,
        };
        synthetic::stat(mode, 0, synthetic::EPOCH)
    }
}

/// Per-fid state: the node, for `clone` the spec written so far and the reply to it, and for a
/// file the text its read at offset 0 took.
pub struct NsFid {
    node: Node,
    /// `clone` opened read-only (`cat /ns/clone`): it can carry no spec, so it makes nothing.
    read_only: bool,
    written: Vec<u8>,
    reply: RpcReply,
    answer: Option<Vec<u8>>,
}

/// Why `/ns/clone` made nothing: the errno its first read fails with, and the one line later
/// reads on that fid answer.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    errno: Errno,
    line: String,
}

impl Refusal {
    fn new(errno: Errno, why: &str) -> Refusal {
        // One line, whatever a path or a message held.
        let why: String = why
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        Refusal {
            errno,
            line: format!("error: {why}\n"),
        }
    }
}

impl Nsd {
    /// nsd's tree for root. Namespaces started by nsd get /dev/null stdio unless `opts.stdio`
    /// says otherwise.
    pub fn new(mut opts: RunOptions) -> std::io::Result<Nsd> {
        if opts.stdio.is_none() {
            opts.stdio = Some(Arc::new(PayloadStdio::null()?));
        }
        Ok(Nsd {
            shared: Arc::new(Shared {
                opts,
                bridge: std::sync::OnceLock::new(),
                next_id: Mutex::new(1),
                spaces: Mutex::new(BTreeMap::new()),
                cloning: Mutex::new(()),
            }),
            operator_uid: 0,
            scope: None,
        })
    }

    /// The same namespaces, for an operator connection from `uid`.
    pub fn for_operator(&self, uid: u32) -> Nsd {
        Nsd {
            shared: self.shared.clone(),
            operator_uid: uid,
            scope: None,
        }
    }

    /// Namespace `id`'s own view of `/ns` (what its `mount ns` is served): its descendants
    /// only; its `clone` takes a child spec in its view and narrows (`warren_ns::narrow`).
    pub fn scoped(&self, id: u64) -> Result<Nsd> {
        let space = self.space(id)?;
        let uid = space.info().operator_uid;
        Ok(Nsd {
            shared: self.shared.clone(),
            operator_uid: uid,
            scope: Some(id),
        })
    }

    /// Where the bridge binary is (namespaces cloned through `/ns` serve their mounts too).
    pub fn set_bridge(&self, bridge: std::path::PathBuf) {
        let _ = self.shared.bridge.set(bridge);
    }

    fn lookup(&self, node: Node, name: &str) -> Result<Node> {
        match (node, name) {
            (Node::Root, "." | "..") | (Node::Dir(_), "..") => Ok(Node::Root),
            (Node::Root, "clone") => Ok(Node::Clone),
            (Node::Root, _) => {
                let id: u64 = name.parse().map_err(|_| Errno::ENOENT)?;
                self.space(id)?;
                Ok(Node::Dir(id))
            }
            (Node::Dir(id), ".") => Ok(Node::Dir(id)),
            (Node::Dir(id), _) => FILES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, k)| Node::File(id, *k))
                .ok_or(Errno::ENOENT),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn create_space(&self, text: &[u8]) -> std::result::Result<u64, Refusal> {
        let text = std::str::from_utf8(text)
            .map_err(|_| Refusal::new(Errno::EINVAL, "invalid spec: not UTF-8"))?;
        let spec = spec::parse("<clone>", text).map_err(|e| {
            tracing::warn!("/ns/clone: refused spec:\n{e}");
            let why = format!("invalid spec: line {}:{}: {}", e.line, e.column, e.message);
            Refusal::new(Errno::EINVAL, &why)
        })?;
        let info = Info {
            origin: "clone",
            operator_uid: self.operator_uid,
            parent: self.scope,
            ..Info::default()
        };
        let Some(parent_id) = self.scope else {
            return self.add_space(spec, info).map(|(id, _)| id).map_err(|e| {
                tracing::warn!("/ns/clone: refused: {e}");
                let errno = match e.kind() {
                    std::io::ErrorKind::PermissionDenied => Errno::EACCES,
                    _ => Errno::from_io(&e),
                };
                Refusal::new(errno, &e.to_string())
            });
        };
        // The parent's view: a child asking for anything it lacks is refused whole.
        let parent = self.shared.spaces.lock().unwrap().get(&parent_id).cloned();
        let parent =
            parent.ok_or_else(|| Refusal::new(Errno::ENOENT, "the parent namespace is gone"))?;
        // Resolved with the namespace's operator's credentials: nsd is root, and a non-root
        // operator's child must not reach through what they cannot (a 0700 directory inside
        // their own bind).
        let narrow = || warren_ns::narrow::narrow(&parent.build, &parent.handles, &spec);
        let narrowed = match self.operator_uid {
            0 => narrow(),
            uid => crate::reach::as_operator(uid, narrow)
                .map_err(|e| Refusal::new(Errno::from_io(&e), &format!("refused: {e}")))?,
        };
        let narrowed = narrowed.map_err(|e| {
            tracing::warn!("/ns/clone in namespace {parent_id}: refused: {e}");
            Refusal::new(Errno::EPERM, &format!("refused: {}", e.line()))
        })?;
        self.within_handle_budget(parent_id, narrowed.handles.count())?;
        // Counted and entered under one lock, so two clones at once cannot both take the last.
        let _counting = self.shared.cloning.lock().unwrap();
        self.clone_budget(parent_id).inspect_err(|r| {
            tracing::warn!("/ns/clone in namespace {parent_id}: {}", r.line.trim_end());
        })?;
        Ok(self.insert_space(spec, narrowed, info).0)
    }

    async fn ctl(&self, id: u64, line: &str) -> Result<()> {
        let space = self.space(id)?;
        // A non-root operator runs and kills only their own namespaces (as `warren attach`
        // attaches only to them): another's holds handles they may not be able to reach.
        if self.operator_uid != 0 && space.info().operator_uid != self.operator_uid {
            return Err(Errno(libc::EACCES as u32));
        }
        let words = spec::split_command(line.trim_end_matches('\n')).map_err(|e| {
            tracing::warn!("/ns/{id}/ctl: {e}");
            Errno::EINVAL
        })?;
        match words.split_first() {
            Some((cmd, argv)) if cmd == "run" && !argv.is_empty() => {
                if *space.status.borrow() != Status::Created {
                    return Err(Errno::EBUSY);
                }
                let mut opts = self.run_options();
                let mut build = space.build.clone();
                if let Some(parent) = self.parent_share(&space)? {
                    opts.uid = Some(parent.uid);
                    if let Some(left) = parent.wall_left {
                        build.limits.wall = Some(build.limits.wall.map_or(left, |w| w.min(left)));
                    }
                }
                // Mark it before the (blocking) build, so a second `run` is refused.
                space.status.send_replace(Status::Running { holder: 0 });
                let argv = argv.to_vec();
                let argv_shown = argv.clone();
                let served = match self.served_mounts(id, &space, space.build(), &argv) {
                    Ok(s) => s.map(Arc::new),
                    Err(e) => {
                        space.status.send_replace(Status::Failed(e.to_string()));
                        return Err(Errno::from_io(&e));
                    }
                };
                let session = match &served {
                    Some(s) => s.session().to_string(),
                    None => new_session_id().map_err(|e| Errno::from_io(&e))?,
                };
                opts.mount_server = served.clone().map(|s| s as Arc<dyn warren_ns::MountServer>);
                let mut chain = vec![crate::mount_server::member(
                    &session,
                    &id.to_string(),
                    &argv,
                    &build.limits,
                )];
                chain.extend(self.ancestors(space.parent));
                opts.net_proxy = Some(warren_ns::netgrant::NetProxyTarget {
                    session: session.clone(),
                    namespace: id.to_string(),
                    lineage: warren_proto::lineage::Lineage(chain),
                });
                let (started, started_rx) = tokio::sync::oneshot::channel();
                // Built, recorded and waited for on one blocking thread: the holder's
                // parent-death signal follows the thread that forked it (an idle pool thread
                // exits, and would take the namespace with it), and a request dropped mid-build
                // (its parent's `/ns` connection gone) still leaves the namespace recorded, so
                // its parent's end reaches it.
                tokio::task::spawn_blocking(move || {
                    let running = match spawn(&build, &argv, &opts) {
                        Ok(r) => Arc::new(r),
                        Err(e) => {
                            let why = space.handles.in_words(&e.to_string());
                            space.status.send_replace(Status::Failed(why));
                            let _ = started.send(Err(Errno::from_io(&e)));
                            return;
                        }
                    };
                    {
                        let mut info = space.info();
                        info.argv = argv_shown;
                        info.started = Some(now_secs());
                        info.session = Some(session);
                    }
                    space.set_running(&running);
                    if let Some(served) = &served {
                        end_with_a_dead_bridge(served, &running, id);
                    }
                    let _ = started.send(Ok(()));
                    wait_space(&space, &running, served.as_deref());
                    // The bridges are reaped once the namespace is gone.
                    drop(served);
                });
                // The write returns once the command has exec'd, or fails (status says why).
                started_rx.await.map_err(|_| Errno::EIO)?
            }
            Some((cmd, rest)) if cmd == "kill" && rest.is_empty() => {
                let running = space.running.lock().unwrap().clone();
                match running {
                    Some(r) => r.kill().map_err(|e| Errno::from_io(&e)),
                    None => Err(Errno(libc::ESRCH as u32)),
                }
            }
            _ => Err(Errno::EINVAL),
        }
    }
}

/// Namespace `id`'s own `/ns`, served on a socketpair nsd makes: the connection is the
/// capability, and it shows that namespace's subtree only.
pub struct ScopedView {
    pub nsd: Nsd,
    pub id: u64,
}

impl NsView for ScopedView {
    fn connect(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        let view = self
            .nsd
            .scoped(self.id)
            .map_err(|e| std::io::Error::from_raw_os_error(e.0 as i32))?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let id = self.id;
        std::thread::Builder::new()
            .name(format!("ns-view-{id}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return tracing::warn!("namespace {id}'s /ns: runtime: {e}"),
                };
                let served = rt.block_on(warren_9p::serve_fd(
                    Arc::new(view),
                    ours.into(),
                    warren_9p::Limits::default(),
                ));
                if let Err(e) = served {
                    tracing::debug!("namespace {id}'s /ns: {e}");
                }
            })?;
        Ok(theirs.into())
    }
}

#[async_trait::async_trait]
impl FileTree for Nsd {
    type Fid = NsFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, NsFid)> {
        Ok((
            Node::Root.qid(),
            NsFid {
                node: Node::Root,
                read_only: false,
                written: Vec::new(),
                reply: RpcReply::default(),
                answer: None,
            },
        ))
    }

    async fn walk(&self, from: &NsFid, names: &[String]) -> Result<(Vec<QId>, Option<NsFid>)> {
        let (qids, node) = synthetic::walk(from.node, names, |&node, name| {
            let next = self.lookup(node, name)?;
            Ok((next, next.qid()))
        })?;
        let fid = node.map(|node| NsFid {
            node,
            read_only: false,
            written: Vec::new(),
            reply: RpcReply::default(),
            answer: None,
        });
        Ok((qids, fid))
    }

    async fn getattr(&self, fid: &NsFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        Ok((fid.node.qid(), fid.node.stat()))
    }

    async fn open(&self, fid: &mut NsFid, flags: u32) -> Result<(QId, u32)> {
        if let Node::Dir(id) | Node::File(id, _) = fid.node {
            self.space(id)?;
        }
        fid.read_only = flags & 3 == warren_9p::oflags::RDONLY;
        Ok((fid.node.qid(), 0))
    }

    async fn read(&self, fid: &mut NsFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        match fid.node {
            Node::Root | Node::Dir(_) => Err(Errno::EISDIR),
            Node::Clone => {
                // The first read takes the request; a refusal fails it with its errno, and the
                // reply (read from o₀, as every rpc file's) then says why.
                if fid.reply.is_empty() {
                    let made = if fid.read_only {
                        Err(Refusal::new(
                            Errno::EBADF,
                            "clone was opened read-only, so it carries no spec and made nothing: \
                             open it for reading and writing, write the spec, then read",
                        ))
                    } else {
                        self.create_space(&fid.written)
                    };
                    match made {
                        Ok(id) => fid.reply.set(format!("{id}\n").into_bytes()),
                        Err(refusal) => {
                            fid.reply.set(refusal.line.into_bytes());
                            return Err(refusal.errno);
                        }
                    }
                }
                Ok(fid.reply.read(offset, count))
            }
            Node::File(id, kind) => {
                // A read past 0 continues the text the read at 0 took, so a reader never splices
                // two versions of a file that changed in between (status, info).
                if offset > 0
                    && let Some(taken) = &fid.answer
                {
                    return Ok(warren_9p::synthetic::slice(taken, offset, count));
                }
                let space = self.space(id)?;
                let text = match kind {
                    FileKind::Spec => space.spec.to_text(),
                    FileKind::Status => space.status.borrow().line(),
                    FileKind::Ctl => return Ok(Vec::new()),
                    FileKind::Info => space.info().text(&space.spec, &space.status.borrow()),
                    FileKind::Wait => {
                        let mut rx = space.status.subscribe();
                        let end = rx
                            .wait_for(Status::is_final)
                            .await
                            .map_err(|_| Errno::EIO)?;
                        end.line()
                    }
                };
                let out = warren_9p::synthetic::slice(text.as_bytes(), offset, count);
                fid.answer = Some(text.into_bytes());
                Ok(out)
            }
        }
    }

    async fn write(&self, fid: &mut NsFid, _offset: u64, data: &[u8]) -> Result<u32> {
        match fid.node {
            Node::Clone if fid.reply.is_empty() => {
                if fid.written.len() + data.len() > MAX_SPEC {
                    return Err(Errno::EFBIG);
                }
                fid.written.extend_from_slice(data);
                Ok(data.len() as u32)
            }
            Node::File(id, FileKind::Ctl) => {
                let line = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
                self.ctl(id, line).await?;
                Ok(data.len() as u32)
            }
            Node::Root | Node::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EACCES),
        }
    }

    async fn readdir(&self, fid: &mut NsFid, offset: u64, _count: u32) -> Result<Vec<DirEntry>> {
        let entries: Vec<(String, Node)> = match fid.node {
            Node::Root => {
                let spaces = self.shared.spaces.lock().unwrap();
                std::iter::once(("clone".to_string(), Node::Clone))
                    .chain(
                        spaces
                            .keys()
                            .filter(|id| self.visible(&spaces, **id))
                            .map(|id| (id.to_string(), Node::Dir(*id))),
                    )
                    .collect()
            }
            Node::Dir(id) => FILES
                .iter()
                .map(|(n, k)| (n.to_string(), Node::File(id, *k)))
                .collect(),
            _ => return Err(Errno::ENOTDIR),
        };
        Ok(entries
            .into_iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (name, node))| DirEntry {
                qid: node.qid(),
                offset: i as u64 + 1,
                typ: if matches!(node, Node::Root | Node::Dir(_)) {
                    4
                } else {
                    8
                },
                name,
            })
            .collect())
    }
}

/// The largest spec `clone` takes.
const MAX_SPEC: usize = 64 * 1024;

#[cfg(test)]
mod tests;
