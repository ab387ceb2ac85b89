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
//! whole with EPERM, later reads answering `error: refused: widens: …` (`crate::narrow`,
//! specs/ns-tree.md).
//!
//! A namespace cloned here has /dev/null stdio. Namespaces started through nsd's run socket
//! (`warren run`, see `launch`) appear here too, as `<id>/`, while their launcher is connected.
//!
//! Why one file: the namespace registry (`Space`, lineages, subtree ends, worker scopes) and the
//! `/ns` 9P tree share one lock over `spaces`; splitting the two is noted in `docs/gaps.md` ("Code
//! structure").

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rs9p::{DirEntry, GetAttrMask, QId, QIdType, Stat};
use tokio::sync::watch;
use warren_9p::synthetic::{self, RpcReply};
use warren_9p::{Errno, FileTree, Result};

use crate::confine::guard::Guard;
use crate::handles::{Built, Handles};
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

/// The most paths (bind sources and tool roots) one namespace's subtree may hold handles for.
pub const SUBTREE_HANDLES: usize = 1024;

pub(crate) struct Space {
    /// The spec as it was written (a child's paths in its parent's view).
    spec: Spec,
    /// The spec nsd builds: every bind source and tool root named by a handle in `handles`.
    build: Spec,
    /// Kept open for as long as the namespace is listed (`crate::handles`).
    handles: Handles,
    /// The namespace whose own `/ns` cloned it.
    parent: Option<u64>,
    status: watch::Sender<Status>,
    running: Mutex<Option<Arc<Running>>>,
    info: Mutex<Info>,
    /// Its subtree's lifetime: see [`Lineage`].
    lineage: Lineage,
}

/// A namespace's subtree ends when it ends: the namespaces cloned through its `/ns` (and theirs)
/// are killed, and one not yet run never runs.
#[derive(Default)]
struct Lineage {
    /// Set once an ancestor has ended (or it has itself): it may not start, and is killed if it
    /// was being started.
    ended: std::sync::atomic::AtomicBool,
    /// The namespaces cloned through its own `/ns`.
    children: Mutex<Vec<std::sync::Weak<Space>>>,
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
        let mut slot = self.running.lock().unwrap();
        *slot = Some(running.clone());
        self.status.send_replace(Status::Running {
            holder: running.holder_pid(),
        });
        // Its parent ended while it was being built: it goes too (its waiter records the end).
        // Checked under the lock `end_subtree` takes after setting the flag, so one of the two
        // always sees the other.
        if self.lineage.ended.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = running.kill();
        }
    }

    /// Records its end, and ends its subtree with it.
    pub(crate) fn set_ended(&self, end: Status) {
        let holder = self.running.lock().unwrap().take().map(|r| r.holder_pid());
        self.status.send_replace(end);
        self.end_subtree();
        // A subtree's root ended: what its `shell` workers still run ends with it (they and the
        // commands they run are the subtree's own uid, and only its).
        if let (None, Some(holder)) = (self.parent, holder) {
            let uid = crate::worker::EXEC_WORKER_UID_BASE + holder;
            if let Err(e) = warren_jail::process::kill_every_process_of(uid) {
                tracing::warn!("ending the shell workers of a subtree: {e}");
            }
        }
    }

    /// Kills every namespace cloned through its `/ns`; each one's waiter then records its end
    /// and ends its own children in turn. A child not yet run is failed at once.
    fn end_subtree(&self) {
        self.lineage
            .ended
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let children: Vec<Arc<Space>> = self
            .lineage
            .children
            .lock()
            .unwrap()
            .drain(..)
            .filter_map(|c| c.upgrade())
            .collect();
        for child in children {
            child
                .lineage
                .ended
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let running = child.running.lock().unwrap().clone();
            match running {
                Some(r) => {
                    if let Err(e) = r.kill() {
                        tracing::warn!("ending a clone with its parent: {e}");
                    }
                }
                None if *child.status.borrow() == Status::Created => {
                    child.set_ended(Status::Failed("its parent namespace ended".into()));
                }
                // Being built (`set_running` kills it) or already ended.
                None => {}
            }
        }
    }

    /// Whether it is alive for the clone count: created or running, its parent not ended.
    fn is_live(&self) -> bool {
        !self.status.borrow().is_final()
            && !self.lineage.ended.load(std::sync::atomic::Ordering::SeqCst)
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

    /// The handles `build` names.
    pub(crate) fn handles(&self) -> &Handles {
        &self.handles
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
        match self.scope {
            None => spaces.contains_key(&id),
            Some(scope) => descends_from(spaces, id, scope),
        }
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
        // Resolved with the namespace's operator's credentials: nsd is root, and a non-root
        // operator's child must not reach through what they cannot (a 0700 directory inside
        // their own bind).
        let narrow = || crate::narrow::narrow(&parent.build, &parent.handles, &spec);
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

    /// Whether namespace `parent_id` may clone one more: it is live, and it and every ancestor
    /// stay within their `limit clones=` (live namespaces in the subtree, default
    /// [`spec::DEFAULT_CLONES`]).
    fn clone_budget(&self, parent_id: u64) -> std::result::Result<(), Refusal> {
        let spaces = self.shared.spaces.lock().unwrap();
        let live = |id: u64| spaces.get(&id).is_some_and(|s| s.is_live());
        if !live(parent_id) {
            return Err(Refusal::new(
                Errno(libc::ESRCH as u32),
                "the parent namespace has ended",
            ));
        }
        let mut ancestor = Some(parent_id);
        while let Some(id) = ancestor {
            let Some(space) = spaces.get(&id) else { break };
            let limit = space.spec.limits.clones();
            let held = spaces
                .iter()
                .filter(|(d, s)| s.is_live() && descends_from(&spaces, **d, id))
                .count() as u64;
            if held >= limit {
                return Err(Refusal::new(
                    Errno(libc::EAGAIN as u32),
                    &format!(
                        "refused: budget:clones: namespace {id} has {held} live clone(s) in its \
                         subtree (limit clones={limit})"
                    ),
                ));
            }
            ancestor = space.parent;
        }
        Ok(())
    }

    /// Refuses `more` handles for a clone in `parent`'s subtree past [`SUBTREE_HANDLES`]: each
    /// is a descriptor nsd holds while the clone is listed, and one namespace's clones must not
    /// exhaust what every namespace needs.
    fn within_handle_budget(&self, parent: u64, more: usize) -> std::result::Result<(), Refusal> {
        let spaces = self.shared.spaces.lock().unwrap();
        let root_of = |mut id: u64| {
            while let Some(p) = spaces.get(&id).and_then(|s| s.parent) {
                id = p;
            }
            id
        };
        let root = root_of(parent);
        let held: usize = spaces
            .iter()
            .filter(|(id, _)| root_of(**id) == root)
            .map(|(_, s)| s.handles.count())
            .sum();
        if held + more > SUBTREE_HANDLES {
            tracing::warn!(
                "/ns/clone in namespace {parent}: refused: budget:handles ({held} held)"
            );
            return Err(Refusal::new(
                Errno(libc::EDQUOT as u32),
                &format!(
                    "refused: budget:handles: namespace {root}'s subtree holds {held} paths and this clone names {more}; at most {SUBTREE_HANDLES}"
                ),
            ));
        }
        Ok(())
    }

    /// Enters an operator's namespace in the tree (as `created`) and returns its id. What its
    /// spec names is opened now, once, and it is built from those handles (`crate::handles`); a
    /// non-root operator's with their credentials (`crate::reach`): nsd builds as root, and
    /// must not show them a path they cannot reach on the host.
    pub(crate) fn add_space(&self, spec: Spec, info: Info) -> std::io::Result<(u64, Arc<Space>)> {
        let guard = Guard::new(&self.shared.opts.protected)?;
        let built = match info.operator_uid {
            0 => crate::handles::open_spec(&spec, &guard)?,
            uid => crate::reach::open_as(&spec, uid, &guard)?,
        };
        Ok(self.insert_space(spec, built, info))
    }

    fn insert_space(&self, spec: Spec, built: Built, info: Info) -> (u64, Arc<Space>) {
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
            build: built.build,
            handles: built.handles,
            status,
            running: Mutex::new(None),
            info: Mutex::new(info),
            lineage: Lineage::default(),
        });
        let mut spaces = self.shared.spaces.lock().unwrap();
        if let Some(parent) = space.parent.and_then(|p| spaces.get(&p)) {
            parent
                .lineage
                .children
                .lock()
                .unwrap()
                .push(Arc::downgrade(&space));
            if !parent.is_live() {
                // Made as its parent ended: it never runs.
                space.set_ended(Status::Failed("its parent namespace ended".into()));
            }
        }
        spaces.insert(id, space.clone());
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
                opts.mount_server = served.clone().map(|s| s as Arc<dyn crate::MountServer>);
                let mut chain = vec![crate::mount_server::member(
                    &session,
                    &id.to_string(),
                    &argv,
                    &build.limits,
                )];
                chain.extend(self.ancestors(space.parent));
                opts.net_proxy = Some(crate::netgrant::NetProxyTarget {
                    session: session.clone(),
                    namespace: id.to_string(),
                    lineage: warren_gate::lineage::Lineage(chain),
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

impl Nsd {
    /// What a clone takes from its parent's: its payload uid, so the whole subtree is one uid and
    /// per-uid limits (RLIMIT_NPROC, inotify instances, …) bind the subtree, not each clone
    /// (docs/decisions.md, "A subtree is one uid"); and at most the wall-clock time the parent
    /// has left. `None` for a namespace with no parent. A clone whose parent has ended (or does
    /// not run) never runs: ESRCH.
    fn parent_share(&self, space: &Space) -> Result<Option<ParentShare>> {
        let Some(parent_id) = space.parent else {
            return Ok(None);
        };
        let ended = Errno(libc::ESRCH as u32);
        if space
            .lineage
            .ended
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(ended);
        }
        let parent = self.shared.spaces.lock().unwrap().get(&parent_id).cloned();
        let parent = parent.ok_or(ended)?;
        let running = parent.running().ok_or(ended)?;
        let started = parent.info().started;
        let wall_left = parent.build.limits.wall.map(|wall| {
            let spent = started.map_or(0, |t| now_secs().saturating_sub(t));
            wall.saturating_sub(spent).max(1)
        });
        Ok(Some(ParentShare {
            uid: running.payload_uid(),
            wall_left,
        }))
    }

    /// The mount server of namespace `id` (run through the run socket or cloned through `/ns`):
    /// toolfs and gate connections from its grant, its own scoped `/ns` for `mount ns`, its
    /// lineage, and file servers attached as this view's operator. `None`: it mounts nothing.
    /// `build`: the spec it is built from (`space`'s, or with the mounts nsd adds outside the
    /// spec: `crate::mount_server::client_asks_mount`).
    pub(crate) fn served_mounts(
        &self,
        id: u64,
        space: &Space,
        build: &Spec,
        argv: &[String],
    ) -> std::io::Result<Option<ServedMounts>> {
        if build.mounts.is_empty() {
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
            build,
            space.handles.all_roots()?,
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
        Ok(Some(served))
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
                &space.spec.limits,
            ));
            parent = space.parent;
            if out.len() >= warren_gate::lineage::MAX_DEPTH - 1 {
                break;
            }
        }
        out
    }
}

/// A worker counts against the namespace it works for: its `limit` line, and for a worker that
/// execs the uid of the namespace's whole subtree (`worker::EXEC_WORKER_UID_BASE` + the holder
/// pid of the subtree's root, which every clone in it ends with).
impl crate::worker::WorkerScopes for Nsd {
    fn worker_scope(
        &self,
        namespace: &str,
        session: &str,
        tool: &str,
    ) -> std::result::Result<Option<crate::worker::WorkerScope>, String> {
        let Ok(id) = namespace.parse::<u64>() else {
            return Ok(None);
        };
        let spaces = self.shared.spaces.lock().unwrap();
        let Some(space) = spaces.get(&id) else {
            return Ok(None);
        };
        if space
            .info()
            .session
            .as_deref()
            .is_some_and(|s| s != session)
        {
            return Err(format!("namespace {id} has another session"));
        }
        let mut root = space;
        while let Some(parent) = root.parent.and_then(|p| spaces.get(&p)) {
            root = parent;
        }
        let holder = root
            .running()
            .map(|r| r.holder_pid())
            .ok_or_else(|| format!("namespace {id}'s subtree is not running"))?;
        // A tool's network is its namespace's grant's: the same session and lineage, the
        // tool's own destinations (the spec checked them to be within the namespace's).
        let net = match (space.build.tool_proxy(tool), space.running()) {
            (Some(patterns), Some(running)) => {
                let target = running.net_target().cloned().ok_or_else(|| {
                    format!("namespace {id} has no network grant for its {tool} worker")
                })?;
                if target.session != session {
                    return Err(format!("namespace {id}'s grant has another session"));
                }
                Some(crate::worker::WorkerNet {
                    target,
                    patterns: patterns.to_vec(),
                })
            }
            _ => None,
        };
        Ok(Some(crate::worker::WorkerScope {
            uid: crate::worker::EXEC_WORKER_UID_BASE + holder,
            limits: space.build.limits,
            writer: crate::worker::Writer {
                operator_uid: space.info().operator_uid,
                clone: space.parent.is_some(),
            },
            net,
        }))
    }
}

/// What a clone gets from its running parent ([`Nsd::parent_share`]).
struct ParentShare {
    uid: u32,
    /// Seconds of the parent's `limit wall` left, if it has one.
    wall_left: Option<u64>,
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

/// Whether `ancestor` cloned `id`, or an ancestor of it did (never itself).
fn descends_from(spaces: &BTreeMap<u64, Arc<Space>>, id: u64, ancestor: u64) -> bool {
    let mut at = spaces.get(&id).and_then(|s| s.parent);
    while let Some(p) = at {
        if p == ancestor {
            return true;
        }
        at = spaces.get(&p).and_then(|s| s.parent);
    }
    false
}

/// Ends namespace `id` when one of its bridges dies (its mounts could never answer again).
pub(crate) fn end_with_a_dead_bridge(served: &ServedMounts, running: &Arc<Running>, id: u64) {
    let running = Arc::downgrade(running);
    served.on_bridge_death(move |why| {
        tracing::warn!("namespace {id}: {why}: ending it");
        if let Some(r) = running.upgrade() {
            let _ = r.kill();
        }
    });
}

/// On a blocking thread: wait for the command and record its end (a dead bridge's, if one
/// ended it).
fn wait_space(space: &Space, running: &Running, served: Option<&ServedMounts>) {
    let end = match running.wait() {
        Ok(code) => Status::Exited(code),
        Err(e) => Status::Failed(e.to_string()),
    };
    let end = served
        .and_then(ServedMounts::bridge_death)
        .map_or(end, |why| Status::Failed(format!("{why}: namespace ended")));
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
                read_only: false,
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
                read_only: false,
                written: Vec::new(),
                reply: RpcReply::default(),
                answer: None,
            }),
        ))
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

    /// `cat /ns/clone`: a read-only open makes no namespace (nothing is listed after it) and its
    /// read fails with EBADF, then says why; the read-write control makes one.
    #[tokio::test]
    async fn a_read_only_clone_makes_nothing() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let (_, root) = nsd.attach("", "", 0).await.unwrap();
        let (_, fid) = nsd.walk(&root, &["clone".into()]).await.unwrap();
        let mut fid = fid.unwrap();
        nsd.open(&mut fid, warren_9p::oflags::RDONLY).await.unwrap();
        assert_eq!(nsd.read(&mut fid, 0, 4096).await, Err(Errno::EBADF));
        let why = String::from_utf8(nsd.read(&mut fid, 0, 4096).await.unwrap()).unwrap();
        assert!(
            why.starts_with("error: clone was opened read-only"),
            "{why}"
        );
        nsd.clunk(fid).await;
        assert_eq!(listing(&nsd).await, vec!["clone".to_string()]);
        let id = clone_in(&nsd, "").await.unwrap();
        assert_eq!(
            listing(&nsd).await,
            vec!["clone".to_string(), id.to_string()]
        );
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

    /// `limit clones=N` counts the live namespaces of a subtree, grandchildren included, at every
    /// ancestor: one more is refused with EAGAIN and a `budget:clones` reason; a child may not
    /// ask for more than its parent has; an ended clone frees its place.
    #[tokio::test]
    async fn live_clones_are_counted_per_subtree() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let text = "mount tool /tool echo\nmount ns /ns\nlimit clones=2\n";
        let (pid, _) = nsd
            .add_space(spec::parse("<t>", text).unwrap(), Info::default())
            .unwrap();
        let view = nsd.scoped(pid).unwrap();
        let child = clone_in(&view, "mount tool /tool echo\nmount ns /ns\n")
            .await
            .unwrap();
        let grand = clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n")
            .await
            .unwrap();
        let (first, why) = clone_twice(&view, "mount tool /tool echo\n").await;
        assert_eq!(first, Err(Errno(libc::EAGAIN as u32)));
        assert_eq!(
            why,
            format!(
                "error: refused: budget:clones: namespace {pid} has 2 live clone(s) in its \
                 subtree (limit clones=2)\n"
            )
        );
        // The grandchild's clone counts against the grandparent's budget too.
        assert_eq!(
            clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n").await,
            Err(Errno(libc::EAGAIN as u32))
        );
        assert_eq!(
            clone_in(&view, "mount tool /tool echo\nlimit clones=3\n").await,
            Err(Errno::EPERM),
            "more than the parent's is widening"
        );
        nsd.space(grand).unwrap().set_ended(Status::Exited(0));
        assert!(clone_in(&view, "mount tool /tool echo\n").await.is_ok());
    }

    /// When a namespace ends, its subtree ends: a clone not yet run (and its own clone) fails
    /// and can never be run, and the ended namespace's `/ns/clone` makes nothing (ESRCH).
    #[tokio::test]
    async fn a_namespaces_subtree_ends_with_it() {
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let text = "mount tool /tool echo\nmount ns /ns\n";
        let (pid, parent) = nsd
            .add_space(spec::parse("<t>", text).unwrap(), Info::default())
            .unwrap();
        let view = nsd.scoped(pid).unwrap();
        let child = clone_in(&view, text).await.unwrap();
        let grand = clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n")
            .await
            .unwrap();
        parent.set_ended(Status::Exited(0));
        for id in [child, grand] {
            assert_eq!(
                *nsd.space(id).unwrap().status.borrow(),
                Status::Failed("its parent namespace ended".into()),
                "namespace {id}"
            );
            assert_eq!(nsd.ctl(id, "run /bin/true").await, Err(Errno::EBUSY));
        }
        assert_eq!(
            clone_in(&view, "mount tool /tool echo\n").await,
            Err(Errno(libc::ESRCH as u32))
        );
    }

    /// A worker is placed by the namespace it works for: none for an id nsd does not have (the
    /// operator's own connection), refused for one that does not run yet or names another
    /// session.
    #[test]
    fn a_worker_is_placed_by_its_running_namespace_only() {
        use crate::worker::WorkerScopes;
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let (id, space) = nsd
            .add_space(
                spec::parse("<t>", "mount tool /tool shell\n").unwrap(),
                Info::default(),
            )
            .unwrap();
        let session = "0".repeat(32);
        assert_eq!(nsd.worker_scope("operator", &session, "shell"), Ok(None));
        assert_eq!(nsd.worker_scope("999", &session, "shell"), Ok(None));
        let not_running = nsd
            .worker_scope(&id.to_string(), &session, "shell")
            .unwrap_err();
        assert!(not_running.contains("not running"), "{not_running}");
        space.info().session = Some("1".repeat(32));
        let other = nsd
            .worker_scope(&id.to_string(), &session, "shell")
            .unwrap_err();
        assert!(other.contains("another session"), "{other}");
    }

    /// A non-root operator's `/ns/clone` may not bind what they cannot reach on the host (nsd
    /// builds as root): EACCES, then the reason naming the path; the same spec from root is
    /// accepted (the control).
    #[tokio::test]
    async fn an_operators_clone_binds_only_what_they_can_reach() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test builds as root and needs root (scripts/test runs as root)"
        );
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

    /// Runs `/bin/sh -c 'test "$(id -u):$(SCRIPT)" = 65534:hidden'` in namespace `id`
    /// through `view`, and returns its end (`exited 0` when uid 65534 read `hidden`).
    async fn run_in(view: &Nsd, id: u64, script: &str) -> String {
        run_sh(
            view,
            id,
            &format!("test \"$(id -u):$({script})\" = 65534:hidden"),
        )
        .await
    }

    /// What a clone needs to run `/bin/sh` (a clone gets only what its spec binds).
    const SYSTEM: &str =
        "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

    /// Writes `line` to namespace `id`'s `ctl` through `view`.
    async fn write_ctl(view: &Nsd, id: u64, line: &str) -> Result<()> {
        let (_, root) = view.attach("", "", 0).await?;
        let (_, ctl) = view.walk(&root, &[id.to_string(), "ctl".into()]).await?;
        let mut ctl = ctl.ok_or(Errno::ENOENT)?;
        view.open(&mut ctl, 1).await?;
        view.write(&mut ctl, 0, line.as_bytes()).await.map(|_| ())
    }

    /// Namespace `id`'s end, as its `wait` file reads once it has ended.
    async fn wait_end(view: &Nsd, id: u64) -> String {
        let (_, root) = view.attach("", "", 0).await.unwrap();
        let (_, wait) = view
            .walk(&root, &[id.to_string(), "wait".into()])
            .await
            .unwrap();
        let mut wait = wait.unwrap();
        view.open(&mut wait, 0).await.unwrap();
        String::from_utf8(view.read(&mut wait, 0, 64).await.unwrap()).unwrap()
    }

    /// Runs `/bin/sh -c SCRIPT` (no `'` in it) in namespace `id` through `view`; its end.
    async fn run_sh(view: &Nsd, id: u64, script: &str) -> String {
        write_ctl(view, id, &format!("run /bin/sh -c '{script}'"))
            .await
            .unwrap();
        wait_end(view, id).await
    }

    /// Found by an attack (another operator's handles): root clones a namespace through its `/ns/clone`
    /// binding a directory under a 0700 root directory; nsd opens it as root and holds the
    /// handle while the namespace is listed. Every operator's `/ns` lists every namespace and
    /// `ctl` checks no owner, so uid 65534 (a `warren` group member) writes `run …` to its
    /// `ctl`: the payload runs as uid 65534 and reads through root's handle what uid 65534
    /// cannot reach by name (the control). `warren attach` refuses the same (owner check).
    /// Held: the non-owner's `run` refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operator_runs_and_kills_only_their_own_namespaces() {
        assert!(nix::unistd::geteuid().is_root(), "needs root");
        let fixture = crate::reach::Fixture::new();
        let inner = fixture.path("private/inner");
        std::fs::write(fixture.path("private/inner/secret"), "hidden").unwrap();
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let text = format!("{SYSTEM}bind -r {inner} /p\n");
        let operator = nsd.for_operator(65534);
        // The control: uid 65534 may not bind it itself.
        let (first, why) = clone_twice(&operator, &text).await;
        assert_eq!(first, Err(Errno::EACCES), "{why}");
        let roots = clone_in(&nsd, &text).await.unwrap();
        let run = "run /bin/sh -c 'test \"$(id -u):$(cat /p/secret)\" = 65534:hidden'";
        let end = match write_ctl(&operator, roots, run).await {
            Ok(()) => wait_end(&operator, roots).await,
            Err(e) => format!("refused: {e:?}"),
        };
        assert!(
            end.starts_with("refused"),
            "uid 65534 ran root's namespace {roots}: {end:?} (exited 0: it read root's handle)"
        );
    }

    /// Found by an attack (another namespace's view through /proc): `open_as` opens a non-root operator's
    /// words on a thread with their fsuid, but the thread keeps nsd's CAP_SYS_PTRACE, so
    /// `/proc/PID/root` of any process — a running namespace's holder, whose pid `info` shows —
    /// is theirs to follow. Inside that namespace root's bind of a directory under a 0700 root
    /// directory sits at `/p`, with no 0700 directory above it: the guard's walk up from the
    /// handle passes, and uid 65534's spec is accepted as reachable. (Its build then fails only
    /// because that mount is not in nsd's own mountinfo, when the bind's filesystem type is
    /// looked up: an accident, not the check.) The same path by its host name is refused (the
    /// control). Held: refused (EACCES) when the spec is taken in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_non_root_operator_never_binds_through_proc() {
        assert!(nix::unistd::geteuid().is_root(), "needs root");
        let fixture = crate::reach::Fixture::new();
        let inner = fixture.path("private/inner");
        std::fs::write(fixture.path("private/inner/secret"), "hidden").unwrap();
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let operator = nsd.for_operator(65534);
        // The control: uid 65534 may not bind it by name.
        let (first, why) = clone_twice(&operator, &format!("{SYSTEM}bind -r {inner} /p\n")).await;
        assert_eq!(first, Err(Errno::EACCES), "{why}");
        // Root's namespace, running.
        let roots = clone_in(&nsd, &format!("{SYSTEM}bind -r {inner} /p\n"))
            .await
            .unwrap();
        write_ctl(&nsd, roots, "run /bin/sleep 60").await.unwrap();
        let holder = match *nsd.find_space(roots).unwrap().status.borrow() {
            Status::Running { holder } => holder,
            ref other => panic!("{other:?}"),
        };
        let via = format!("/proc/{holder}/root/p");
        let (first, why) = clone_twice(&operator, &format!("{SYSTEM}bind -r {via} /x\n")).await;
        let end = match first {
            Ok(id) => {
                let id: u64 = String::from_utf8_lossy(&id).trim().parse().unwrap();
                let run = "run /bin/sh -c 'test \"$(id -u):$(cat /x/secret)\" = 65534:hidden'";
                match write_ctl(&operator, id, run).await {
                    Ok(()) => {
                        let mut rx = nsd.find_space(id).unwrap().status.subscribe();
                        rx.wait_for(Status::is_final).await.unwrap().line()
                    }
                    Err(_) => format!(
                        "accepted (uid 65534 reached it), then failed to build: {:?}",
                        nsd.find_space(id).unwrap().status.borrow().line()
                    ),
                }
            }
            Err(_) => why,
        };
        let _ = nsd.find_space(roots).unwrap().running().unwrap().kill();
        assert!(
            end.starts_with("error: uid 65534 cannot reach"),
            "uid 65534 reached root's {inner} as {via}: {end:?}"
        );
    }

    /// Found by an attack (descriptor exhaustion): every accepted clone holds one descriptor per bind
    /// source and tool root for as long as it is listed, clones stay listed, a spec may repeat
    /// a bind (64 KiB of `bind -r /d /x` lines is thousands), and nothing bounds how many a
    /// namespace makes. A confined namespace with `mount ns` clones a few such children and nsd
    /// runs out of descriptors: root's own `/ns/clone` then fails (EMFILE), as would every
    /// operator's `warren run`. Held: the namespace's clones refused past a bound, and the
    /// operator still served.
    /// (Before the bounds it exhausted the test process's own descriptors; with them it holds
    /// at most a subtree's budget.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_namespaces_clones_cannot_exhaust_nsds_descriptors() {
        let fixture = crate::reach::Fixture::new();
        let open = fixture.path("open");
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let parent = clone_in(&nsd, &format!("bind -r {open} /d\n"))
            .await
            .unwrap();
        let inside = nsd.scoped(parent).unwrap();
        // `bind -r /d /xN` for as many N as fit in one spec, then fewer, until none fits.
        let spec_of =
            |n: usize| -> String { (0..n).map(|i| format!("bind -r /d /x{i}\n")).collect() };
        let mut binds = 0;
        while spec_of(binds + 1).len() <= MAX_SPEC {
            binds += 1;
        }
        let (mut made, mut held) = (0, 0);
        let mut size = binds;
        while size > 0 {
            if clone_in(&inside, &spec_of(size)).await.is_ok() {
                made += 1;
                held += size;
            } else {
                size /= 2;
            }
        }
        // An operator's everyday spec (four binds).
        let operator = clone_twice(&nsd, SYSTEM).await;
        assert!(
            operator.0.is_ok(),
            "after the namespace made {made} clones holding {held} descriptors (up to {binds} each), root's /ns/clone failed: {operator:?}"
        );
    }

    /// Found by an attack end to end (nested read-only bind): root's namespace has `bind -w PROJ /p` and
    /// `bind -r PROJ/ro /p/ro` and `mount ns`; its payload cannot write `/p/ro` (the control),
    /// but clones a child with `bind -w /p/ro /x` from its own `/ns`, runs it, and the child
    /// writes the host's `PROJ/ro`. Held: the clone refused (EPERM, `-w where`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_never_writes_beneath_its_parents_read_only_bind() {
        use std::os::unix::fs::PermissionsExt;
        assert!(nix::unistd::geteuid().is_root(), "needs root");
        let fixture = crate::reach::Fixture::new();
        let proj = fixture.path("open");
        std::fs::create_dir_all(fixture.path("open/ro")).unwrap();
        for d in ["open", "open/ro"] {
            std::fs::set_permissions(fixture.path(d), std::fs::Permissions::from_mode(0o777))
                .unwrap();
        }
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let parent_text = format!("{SYSTEM}bind -w {proj} /p\nbind -r {proj}/ro /p/ro\n");
        // The control: a namespace with that spec cannot write /p/ro, and can write /p.
        let control = clone_in(&nsd, &parent_text).await.unwrap();
        assert_eq!(
            run_sh(&nsd, control, "touch /p/ok && ! touch /p/ro/control").await,
            "exited 0\n"
        );
        assert!(!std::path::Path::new(&fixture.path("open/ro/control")).exists());
        let parent = clone_in(&nsd, &parent_text).await.unwrap();
        let inside = nsd.scoped(parent).unwrap();
        let child = format!("{SYSTEM}bind -w /p/ro /x\n");
        let (first, why) = clone_twice(&inside, &child).await;
        if let Ok(id) = &first {
            let id: u64 = String::from_utf8_lossy(id).trim().parse().unwrap();
            let end = run_sh(&inside, id, "touch /x/written-by-the-child").await;
            assert!(
                !std::path::Path::new(&fixture.path("open/ro/written-by-the-child")).exists(),
                "the child wrote beneath its parent's read-only bind ({end:?})"
            );
        }
        assert_eq!(first, Err(Errno::EPERM), "{why}");
    }

    /// Found by an attack (non-root operator, clone from inside): a namespace a non-root operator started
    /// clones a child from its own `/ns`, naming a directory beneath its bind that the operator
    /// cannot reach on the host (under a root-owned 0700 directory). `narrow` opens it beneath
    /// the parent's handle with nsd's own (root) credentials, so the child is accepted, built
    /// from a handle the operator could never have opened, and its payload (running as the
    /// operator's uid) reads the file. The same path through the operator's own `/ns/clone` is
    /// refused (the control). Held: the child refused (EACCES), as the operator's is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_non_root_operators_child_reaches_only_what_they_can() {
        use std::os::unix::fs::PermissionsExt;
        assert!(nix::unistd::geteuid().is_root(), "needs root");
        let fixture = crate::reach::Fixture::new();
        let open = fixture.path("open");
        std::fs::create_dir_all(fixture.path("open/locked/inner")).unwrap();
        std::fs::write(fixture.path("open/locked/inner/secret"), "hidden").unwrap();
        std::fs::set_permissions(
            fixture.path("open/locked"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        let nsd = Nsd::new(RunOptions::default()).unwrap();
        let operator = nsd.for_operator(65534);
        // The control: the operator may not name it directly.
        let (first, why) = clone_twice(
            &operator,
            &format!("bind -r {} /p\n", fixture.path("open/locked/inner")),
        )
        .await;
        assert_eq!(first, Err(Errno::EACCES), "{why}");
        // The operator's namespace binds what they can reach, and clones from inside.
        let parent = clone_in(
            &operator,
            &format!(
                "{SYSTEM}bind -r {open} /o\nmount tool /tool fs_read\ntool fs_read -r {open}\n"
            ),
        )
        .await
        .unwrap();
        let inside = nsd.scoped(parent).unwrap();
        let mut accepted = Vec::new();
        let tool_child = format!("mount tool /tool fs_read\ntool fs_read -r {open}/locked/inner\n");
        if clone_twice(&inside, &tool_child).await.0.is_ok() {
            accepted.push(tool_child);
        }
        let bind_child = format!("{SYSTEM}bind -r /o/locked/inner /p\n");
        if let Ok(id) = clone_in(&inside, &bind_child).await {
            // Run it: its payload runs as uid 65534 and reads the file through the bind.
            let end = run_in(&inside, id, "cat /p/secret").await;
            accepted.push(format!(
                "{bind_child} (ran as uid 65534 and read the secret: {end:?})"
            ));
        }
        // The control: a namespace with the parent's bind (uid 65534) cannot read it there.
        let sibling = clone_in(&operator, &format!("{SYSTEM}bind -r {open} /o\n"))
            .await
            .unwrap();
        assert_eq!(
            run_in(&operator, sibling, "cat /o/locked/inner/secret").await,
            "exited 1\n"
        );
        assert!(
            accepted.is_empty(),
            "children of uid 65534's namespace built from paths uid 65534 cannot reach: {accepted:#?}"
        );
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
