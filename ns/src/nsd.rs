//! nsd's `/ns` tree, served to the operator over 9P (design.md, "File trees"):
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
//! whole with EPERM, later reads answering `error: refused: widens: …` (`crate::narrow`,
//! specs/ns-tree.md).
//!
//! A namespace cloned here has /dev/null stdio. Namespaces started through nsd's run socket
//! (`warren run`, see `launch`) appear here too, as `<id>/`, while their launcher is connected.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rs9p::{DirEntry, GetAttrMask, QId, QIdType, Stat};
use tokio::sync::watch;
use warren_9p::synthetic::{self, RpcReply};
use warren_9p::{Errno, FileTree, Result};

use crate::mount_server::{NsView, ServedMounts, new_session_id};
use crate::run::{PayloadStdio, RunOptions, Running, spawn};
use crate::spec::{self, Spec};

/// The state of one namespace's command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running { holder: u32 },
    Exited(i32),
    Failed(String),
}

impl Status {
    fn line(&self) -> String {
        match self {
            Status::Created => "created\n".into(),
            Status::Running { holder } => format!("running holder={holder}\n"),
            Status::Exited(code) => format!("exited {code}\n"),
            Status::Failed(m) => format!("failed {}\n", m.replace('\n', " ")),
        }
    }
    fn is_final(&self) -> bool {
        matches!(self, Status::Exited(_) | Status::Failed(_))
    }
}

pub(crate) struct Space {
    /// The spec as it was written (a child's paths in its parent's view).
    spec: Spec,
    /// The spec nsd builds: a cloned child's bind sources name the handles in `held`.
    build: Spec,
    /// Kept open for as long as the namespace is listed: `build` names them by fd number.
    _held: Vec<std::os::fd::OwnedFd>,
    /// The namespace whose own `/ns` cloned it.
    parent: Option<u64>,
    status: watch::Sender<Status>,
    running: Mutex<Option<Arc<Running>>>,
    info: Mutex<Info>,
}

/// Who started a namespace, and how: the `<id>/info` file.
#[derive(Clone, Debug, Default)]
pub struct Info {
    /// `run` (nsd's run socket, `warren run`) or `clone` (`/ns/clone`).
    pub origin: &'static str,
    /// The operator's uid (the peer of the connection that asked for it).
    pub operator_uid: u32,
    /// The launcher's pid (run socket only; in nsd's pid namespace).
    pub launcher_pid: Option<i32>,
    /// The command, once started.
    pub argv: Vec<String>,
    /// Unix seconds at start.
    pub started: Option<u64>,
    /// The namespace's session id (every grant record carries it).
    pub session: Option<String>,
    /// The namespace whose own `/ns` cloned it.
    pub parent: Option<u64>,
}

impl Info {
    /// The `info` file: `key value…` lines, words rc-quoted as in specs (specs/ns-tree.md).
    fn text(&self, spec: &Spec, status: &Status) -> String {
        let mut out = format!("origin {}\noperator {}\n", self.origin, self.operator_uid);
        if let Some(p) = self.parent {
            out.push_str(&format!("parent {p}\n"));
        }
        if let Some(pid) = self.launcher_pid {
            out.push_str(&format!("launcher {pid}\n"));
        }
        if !self.argv.is_empty() {
            let words: Vec<String> = self.argv.iter().map(|w| spec::quote(w)).collect();
            out.push_str(&format!("argv {}\n", words.join(" ")));
        }
        if let Some(t) = self.started {
            out.push_str(&format!("started {t}\n"));
        }
        if let Status::Running { holder } = status
            && *holder != 0
        {
            out.push_str(&format!("holder {holder}\n"));
        }
        if let Some(s) = &self.session {
            out.push_str(&format!("session {s}\n"));
        }
        for m in &spec.mounts {
            out.push_str(&format!(
                "mount {} {}\n",
                spec::quote(&m.server.to_string()),
                spec::quote(&m.path)
            ));
        }
        for t in spec.tool_grants() {
            out.push_str(&format!("tool {}\n", spec::quote(&t)));
        }
        out
    }
}

/// Unix seconds now.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Space {
    pub(crate) fn set_running(&self, running: &Arc<Running>) {
        *self.running.lock().unwrap() = Some(running.clone());
        self.status.send_replace(Status::Running {
            holder: running.holder_pid(),
        });
    }

    pub(crate) fn set_ended(&self, end: Status) {
        *self.running.lock().unwrap() = None;
        self.status.send_replace(end);
    }

    pub(crate) fn info(&self) -> std::sync::MutexGuard<'_, Info> {
        self.info.lock().unwrap()
    }

    /// The spec it was built from (`warren attach` confines by it too).
    pub(crate) fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The spec nsd builds it from (bind sources by the handles it holds).
    pub(crate) fn build(&self) -> &Spec {
        &self.build
    }

    /// Its running command, while it runs.
    pub(crate) fn running(&self) -> Option<Arc<Running>> {
        self.running.lock().unwrap().clone()
    }
}

/// The namespaces nsd owns, shared by every operator connection.
struct Shared {
    opts: RunOptions,
    /// `warren-bridge`, for the mounts of namespaces cloned through `/ns` (set by the run
    /// socket's accept loop, which is given it).
    bridge: std::sync::OnceLock<std::path::PathBuf>,
    next_id: Mutex<u64>,
    spaces: Mutex<BTreeMap<u64, Arc<Space>>>,
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

fn slice(bytes: &[u8], offset: u64, count: u32) -> Vec<u8> {
    let start = (offset.min(bytes.len() as u64)) as usize;
    let end = (start + count as usize).min(bytes.len());
    bytes[start..end].to_vec()
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
    /// only; its `clone` takes a child spec in its view and narrows (`crate::narrow`).
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

    /// Is `id` shown in this view: everything for an operator, strict descendants for a
    /// namespace's own.
    fn visible(&self, spaces: &BTreeMap<u64, Arc<Space>>, id: u64) -> bool {
        let Some(scope) = self.scope else {
            return spaces.contains_key(&id);
        };
        let mut at = spaces.get(&id).and_then(|s| s.parent);
        while let Some(p) = at {
            if p == scope {
                return true;
            }
            at = spaces.get(&p).and_then(|s| s.parent);
        }
        false
    }

    /// The run options for a namespace this operator starts: never uid 0; a non-root operator's
    /// own uid, else the per-namespace default.
    fn run_options(&self) -> RunOptions {
        let mut opts = self.shared.opts.clone();
        if self.operator_uid != 0 {
            opts.uid = Some(self.operator_uid);
        }
        opts
    }

    fn space(&self, id: u64) -> Result<Arc<Space>> {
        let spaces = self.shared.spaces.lock().unwrap();
        if !self.visible(&spaces, id) {
            return Err(Errno::ENOENT);
        }
        spaces.get(&id).cloned().ok_or(Errno::ENOENT)
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
        let narrowed = crate::narrow::narrow(&parent.build, &spec).map_err(|e| {
            tracing::warn!("/ns/clone in namespace {parent_id}: refused: {e}");
            Refusal::new(Errno::EPERM, &format!("refused: {}", e.line()))
        })?;
        Ok(self
            .insert_space(spec, narrowed.build, narrowed.held, info)
            .0)
    }

    /// Enters a namespace in the tree (as `created`) and returns its id. A non-root
    /// operator's is built from handles opened with their credentials (`crate::reach`): nsd
    /// builds as root, and must not show them a path they cannot reach on the host.
    pub(crate) fn add_space(&self, spec: Spec, info: Info) -> std::io::Result<(u64, Arc<Space>)> {
        let (build, held) = match info.operator_uid {
            0 => (spec.clone(), Vec::new()),
            uid => crate::reach::open_as(&spec, uid)?,
        };
        Ok(self.insert_space(spec, build, held, info))
    }

    fn insert_space(
        &self,
        spec: Spec,
        build: Spec,
        held: Vec<std::os::fd::OwnedFd>,
        info: Info,
    ) -> (u64, Arc<Space>) {
        let id = {
            let mut next = self.shared.next_id.lock().unwrap();
            let id = *next;
            *next += 1;
            id
        };
        let (status, _) = watch::channel(Status::Created);
        let space = Arc::new(Space {
            parent: info.parent,
            spec,
            build,
            _held: held,
            status,
            running: Mutex::new(None),
            info: Mutex::new(info),
        });
        self.shared.spaces.lock().unwrap().insert(id, space.clone());
        (id, space)
    }

    /// The namespace `/ns/<id>`, if nsd holds it.
    pub(crate) fn find_space(&self, id: u64) -> Option<Arc<Space>> {
        self.space(id).ok()
    }

    /// Takes a namespace out of the tree (a run-socket namespace, once its launcher has its
    /// exit status: nobody else can wait for it).
    pub(crate) fn remove_space(&self, id: u64) {
        self.shared.spaces.lock().unwrap().remove(&id);
    }

    /// The options every namespace nsd builds starts from (protected dirs, Landlock floor).
    pub(crate) fn base_options(&self) -> RunOptions {
        self.shared.opts.clone()
    }

    async fn ctl(&self, id: u64, line: &str) -> Result<()> {
        let space = self.space(id)?;
        let words = spec::split_command(line.trim_end_matches('\n')).map_err(|e| {
            tracing::warn!("/ns/{id}/ctl: {e}");
            Errno::EINVAL
        })?;
        match words.split_first() {
            Some((cmd, argv)) if cmd == "run" && !argv.is_empty() => {
                if *space.status.borrow() != Status::Created {
                    return Err(Errno::EBUSY);
                }
                // Mark it before the (blocking) build, so a second `run` is refused.
                space.status.send_replace(Status::Running { holder: 0 });
                let mut opts = self.run_options();
                let argv = argv.to_vec();
                let argv_shown = argv.clone();
                let building = space.clone();
                let served = match self.served_mounts(id, &space, &argv) {
                    Ok(s) => s,
                    Err(e) => {
                        space.status.send_replace(Status::Failed(e.to_string()));
                        return Err(Errno::from_io(&e));
                    }
                };
                let session = match &served {
                    Some(s) => s.session().to_string(),
                    None => new_session_id().map_err(|e| Errno::from_io(&e))?,
                };
                opts.mount_server = served.clone().map(|s| s as Arc<dyn crate::MountServer>);
                let running =
                    tokio::task::spawn_blocking(move || spawn(&building.build, &argv, &opts))
                        .await
                        .map_err(|_| Errno::EIO)?;
                // The write returns once the command has exec'd, or fails (status says why).
                let running = match running {
                    Ok(r) => Arc::new(r),
                    Err(e) => {
                        space.status.send_replace(Status::Failed(e.to_string()));
                        return Err(Errno::from_io(&e));
                    }
                };
                {
                    let mut info = space.info();
                    info.argv = argv_shown;
                    info.started = Some(now_secs());
                    info.session = Some(session);
                }
                space.set_running(&running);
                tokio::task::spawn_blocking(move || {
                    wait_space(&space, &running);
                    // The bridges are reaped once the namespace is gone.
                    drop(served);
                });
                Ok(())
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

impl Nsd {
    /// The mount server for a namespace cloned through `/ns`: toolfs and gate connections as
    /// for any namespace, and its own scoped `/ns` for `mount ns`.
    fn served_mounts(
        &self,
        id: u64,
        space: &Space,
        argv: &[String],
    ) -> std::io::Result<Option<Arc<ServedMounts>>> {
        if space.build.mounts.is_empty() {
            return Ok(None);
        }
        let bridge = self.shared.bridge.get().cloned().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "this nsd serves no mounts (it was given no warren-bridge)",
            )
        })?;
        let served = ServedMounts::new(
            self.shared.opts.protected.clone(),
            &space.build,
            &id.to_string(),
            bridge,
        )?
        .attach_as(
            nix::unistd::User::from_uid(self.operator_uid.into())
                .ok()
                .flatten()
                .map(|u| u.name),
        )
        .ns_view(Arc::new(ScopedView {
            nsd: self.for_operator(self.operator_uid),
            id,
        }))
        .lineage(argv.to_vec(), self.ancestors(space.parent));
        Ok(Some(Arc::new(served)))
    }

    /// The namespaces above a clone, parent first, as its lineage names them (nsd's own
    /// record of who cloned whom; a parent that never ran has no session and ends the chain).
    pub(crate) fn ancestors(&self, mut parent: Option<u64>) -> Vec<warren_gate::lineage::Member> {
        let spaces = self.shared.spaces.lock().unwrap().clone();
        let mut out = Vec::new();
        while let Some(p) = parent {
            let Some(space) = spaces.get(&p) else { break };
            let info = space.info().clone();
            let Some(session) = &info.session else { break };
            out.push(crate::mount_server::member(
                session,
                &p.to_string(),
                &info.argv,
                &space.spec,
            ));
            parent = space.parent;
            if out.len() >= warren_gate::lineage::MAX_DEPTH - 1 {
                break;
            }
        }
        out
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

/// On a blocking thread: wait for the command and record its end.
fn wait_space(space: &Space, running: &Running) {
    let end = match running.wait() {
        Ok(code) => Status::Exited(code),
        Err(e) => Status::Failed(e.to_string()),
    };
    space.set_ended(end);
}

#[async_trait::async_trait]
impl FileTree for Nsd {
    type Fid = NsFid;

    async fn attach(&self, _uname: &str, _aname: &str, _n_uname: u32) -> Result<(QId, NsFid)> {
        Ok((
            Node::Root.qid(),
            NsFid {
                node: Node::Root,
                written: Vec::new(),
                reply: RpcReply::default(),
                answer: None,
            },
        ))
    }

    async fn walk(&self, from: &NsFid, names: &[String]) -> Result<(Vec<QId>, Option<NsFid>)> {
        let mut node = from.node;
        let mut qids = Vec::new();
        for name in names {
            match self.lookup(node, name) {
                Ok(next) => {
                    node = next;
                    qids.push(node.qid());
                }
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => return Ok((qids, None)),
            }
        }
        Ok((
            qids,
            Some(NsFid {
                node,
                written: Vec::new(),
                reply: RpcReply::default(),
                answer: None,
            }),
        ))
    }

    async fn getattr(&self, fid: &NsFid, _mask: GetAttrMask) -> Result<(QId, Stat)> {
        Ok((fid.node.qid(), fid.node.stat()))
    }

    async fn open(&self, fid: &mut NsFid, _flags: u32) -> Result<(QId, u32)> {
        if let Node::Dir(id) | Node::File(id, _) = fid.node {
            self.space(id)?;
        }
        Ok((fid.node.qid(), 0))
    }

    async fn read(&self, fid: &mut NsFid, offset: u64, count: u32) -> Result<Vec<u8>> {
        match fid.node {
            Node::Root | Node::Dir(_) => Err(Errno::EISDIR),
            Node::Clone => {
                // The first read takes the request; a refusal fails it with its errno, and the
                // reply (read from o₀, as every rpc file's) then says why.
                if fid.reply.is_empty() {
                    match self.create_space(&fid.written) {
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
                    return Ok(slice(taken, offset, count));
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
                let out = slice(text.as_bytes(), offset, count);
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
mod tests {
    use super::*;

    #[test]
    fn operators_namespaces_run_under_their_uid_and_roots_never_as_0() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        assert_eq!(nsd.run_options().uid, None, "root: a per-namespace uid");
        assert_eq!(nsd.for_operator(0).run_options().uid, None);
        assert_eq!(nsd.for_operator(1234).run_options().uid, Some(1234));
        // One set of namespaces, whoever looks.
        assert!(Arc::ptr_eq(&nsd.shared, &nsd.for_operator(1234).shared));
    }

    async fn clone_in(view: &Nsd, text: &str) -> Result<u64> {
        let (_, root) = view.attach("", "", 0).await?;
        let (_, fid) = view.walk(&root, &["clone".into()]).await?;
        let mut fid = fid.ok_or(Errno::ENOENT)?;
        view.open(&mut fid, 2).await?;
        view.write(&mut fid, 0, text.as_bytes()).await?;
        let id = view.read(&mut fid, 0, 64).await?;
        Ok(String::from_utf8(id).unwrap().trim().parse().unwrap())
    }

    /// Writes `text` to a fresh `clone` fid and reads twice at the write's end, as a shell on
    /// one fd does: the first read's outcome, then the second's text.
    async fn clone_twice(view: &Nsd, text: &str) -> (Result<Vec<u8>>, String) {
        let (_, root) = view.attach("", "", 0).await.unwrap();
        let (_, fid) = view.walk(&root, &["clone".into()]).await.unwrap();
        let mut fid = fid.unwrap();
        view.open(&mut fid, 2).await.unwrap();
        view.write(&mut fid, 0, text.as_bytes()).await.unwrap();
        let at = text.len() as u64;
        let first = view.read(&mut fid, at, 4096).await;
        let then = view.read(&mut fid, at, 4096).await.unwrap();
        (first, String::from_utf8(then).unwrap())
    }

    async fn listing(view: &Nsd) -> Vec<String> {
        let (_, root) = view.attach("", "", 0).await.unwrap();
        let (_, fid) = view.walk(&root, &[]).await.unwrap();
        let mut fid = fid.unwrap();
        view.readdir(&mut fid, 0, 4096)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    }

    /// A namespace's own /ns: its `clone` narrows (2 tools cannot make 3, refused whole with
    /// EPERM), and it lists only its descendants, grandchildren included; the operator lists all.
    #[tokio::test]
    async fn a_namespaces_own_view_narrows_and_shows_its_subtree_only() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let parent = spec::parse("<t>", "mount tool /tool echo fs_read\nmount ns /ns\n").unwrap();
        let (pid, _) = nsd.add_space(parent, Info::default()).unwrap();
        let (other, _) = nsd.add_space(Spec::default(), Info::default()).unwrap();
        let view = nsd.scoped(pid).unwrap();
        assert_eq!(
            clone_in(&view, "mount tool /tool echo fs_read shell\n").await,
            Err(Errno::EPERM)
        );
        let child = clone_in(&view, "mount tool /tool echo\nmount ns /ns\n")
            .await
            .unwrap();
        let grand = clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n")
            .await
            .unwrap();
        // The grandchild may not regain what its parent dropped.
        assert_eq!(
            clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool fs_read\n").await,
            Err(Errno::EPERM)
        );
        assert_eq!(
            listing(&view).await,
            vec!["clone".to_string(), child.to_string(), grand.to_string()]
        );
        let (_, root) = view.attach("", "", 0).await.unwrap();
        for hidden in [pid, other] {
            assert!(view.walk(&root, &[hidden.to_string()]).await.is_err());
        }
        let all = listing(&nsd).await;
        for id in [pid, other, child, grand] {
            assert!(all.contains(&id.to_string()), "{all:?}");
        }
    }

    /// A refused clone fails its first read with the errno and then answers why, on one line,
    /// from o₀ (a shell reads on at its write's end); a parse error too. An accepted one answers
    /// its id from the write's end as well.
    #[tokio::test]
    async fn a_refused_clone_says_why_on_the_next_read() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let parent = spec::parse("<t>", "mount tool /tool echo\nmount ns /ns\n").unwrap();
        let (pid, _) = nsd.add_space(parent, Info::default()).unwrap();
        let view = nsd.scoped(pid).unwrap();
        let (first, why) = clone_twice(&view, "mount tool /tool echo shell\nnet loopback\n").await;
        assert_eq!(first, Err(Errno::EPERM));
        assert_eq!(
            why,
            "error: refused: widens: tool `shell` is not granted to the parent; \
             mount of `tool` at /tool is not one of the parent's (same server, same key, a \
             subset of its spec); net Loopback is wider than the parent's net None\n"
        );
        let (first, why) = clone_twice(&view, "bind -q /x /y\n").await;
        assert_eq!(first, Err(Errno::EINVAL));
        assert!(why.starts_with("error: invalid spec: line 1:"), "{why}");
        assert_eq!(why.lines().count(), 1, "{why}");
        let (first, id) = clone_twice(&view, "mount tool /tool echo\n").await;
        let first = String::from_utf8(first.unwrap()).unwrap();
        assert_eq!(first, id, "later reads from o₀ answer the same");
        assert!(
            first.trim().parse::<u64>().is_ok_and(|n| n > pid),
            "{first}"
        );
        assert!(first.ends_with('\n'));
    }

    /// A non-root operator's `/ns/clone` may not bind what they cannot reach on the host (nsd
    /// builds as root): EACCES, then the reason naming the path; the same spec from root is
    /// accepted (the control).
    #[tokio::test]
    async fn an_operators_clone_binds_only_what_they_can_reach() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP an_operators_clone_binds_only_what_they_can_reach: needs root");
            return;
        }
        let fixture = crate::reach::Fixture::new();
        let inner = fixture.path("private/inner");
        let text = format!("bind -r {inner} /p\n");
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let (first, why) = clone_twice(&nsd.for_operator(65534), &text).await;
        assert_eq!(first, Err(Errno::EACCES));
        let expected = format!("error: uid 65534 cannot reach bind `{inner}`");
        assert!(why.starts_with(&expected), "{why}");
        assert!(clone_in(&nsd, &text).await.is_ok(), "root may");
    }

    /// A file read in pieces is one version of it: the read at offset 0 takes the text, later
    /// offsets continue that text even if the namespace changed in between.
    #[tokio::test]
    async fn a_file_read_in_pieces_is_one_version() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let spec = spec::parse("<t>", "mount tool /tool echo\n").unwrap();
        let info = Info {
            origin: "run",
            launcher_pid: Some(42),
            ..Info::default()
        };
        let (id, space) = nsd.add_space(spec, info).unwrap();
        let (_, root) = nsd.attach("", "", 0).await.unwrap();
        let (_, fid) = nsd
            .walk(&root, &[id.to_string(), "info".into()])
            .await
            .unwrap();
        let mut fid = fid.unwrap();
        let first = nsd.read(&mut fid, 0, 10).await.unwrap();
        space.info().argv = vec!["a-much-longer-command-line".into()];
        let mut whole = first;
        loop {
            let more = nsd.read(&mut fid, whole.len() as u64, 10).await.unwrap();
            if more.is_empty() {
                break;
            }
            whole.extend(more);
        }
        let text = String::from_utf8(whole).unwrap();
        assert_eq!(
            text,
            "origin run\noperator 0\nlauncher 42\nmount tool /tool\ntool echo\n"
        );
        // A new read from 0 sees the change.
        let again = nsd.read(&mut fid, 0, 4096).await.unwrap();
        assert!(
            String::from_utf8(again)
                .unwrap()
                .contains("argv a-much-longer")
        );
    }
}
