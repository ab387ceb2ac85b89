//! nsd's registry of namespaces: each one's spec, handles, status and lineage (`Space`), who
//! cloned whom, what a clone takes from its parent (uid, time left), the budgets a subtree's
//! clones count against (`limit clones=`, [`SUBTREE_HANDLES`]), ending a whole subtree, and
//! the scope a tool worker counts against. The `/ns` tree (`super`) reads and changes it under
//! the one lock over `spaces`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use warren_9p::{Errno, Result};
use warren_ns::confine::guard::Guard;
use warren_ns::handles::{Built, Handles};
use warren_ns::run::{RunOptions, Running};
use warren_ns::spec::{self, Spec};

use tokio::sync::watch;

use super::{Nsd, Refusal, ScopedView};
use crate::mount_server::ServedMounts;

/// The state of one namespace's command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running { holder: u32 },
    Exited(i32),
    Failed(String),
}

impl Status {
    pub(super) fn line(&self) -> String {
        match self {
            Status::Created => "created\n".into(),
            Status::Running { holder } => format!("running holder={holder}\n"),
            Status::Exited(code) => format!("exited {code}\n"),
            Status::Failed(m) => format!("failed {}\n", m.replace('\n', " ")),
        }
    }
    pub(super) fn is_final(&self) -> bool {
        matches!(self, Status::Exited(_) | Status::Failed(_))
    }
}

/// The most paths (bind sources and tool roots) one namespace's subtree may hold handles for.
pub const SUBTREE_HANDLES: usize = 1024;

pub(crate) struct Space {
    /// The spec as it was written (a child's paths in its parent's view).
    pub(super) spec: Spec,
    /// The spec nsd builds: every bind source and tool root named by a handle in `handles`.
    pub(super) build: Spec,
    /// Kept open for as long as the namespace is listed (`warren_ns::handles`).
    pub(super) handles: Handles,
    /// The namespace whose own `/ns` cloned it.
    pub(super) parent: Option<u64>,
    pub(super) status: watch::Sender<Status>,
    pub(super) running: Mutex<Option<Arc<Running>>>,
    pub(super) info: Mutex<Info>,
    /// Its subtree's lifetime: see [`Lineage`].
    pub(super) lineage: Lineage,
}

/// A namespace's subtree ends when it ends: the namespaces cloned through its `/ns` (and theirs)
/// are killed, and one not yet run never runs.
#[derive(Default)]
pub(super) struct Lineage {
    /// Set once an ancestor has ended (or it has itself): it may not start, and is killed if it
    /// was being started.
    pub(super) ended: std::sync::atomic::AtomicBool,
    /// The namespaces cloned through its own `/ns`.
    pub(super) children: Mutex<Vec<std::sync::Weak<Space>>>,
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
    pub(super) fn text(&self, spec: &Spec, status: &Status) -> String {
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
    pub(super) fn end_subtree(&self) {
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
    pub(super) fn is_live(&self) -> bool {
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

impl Nsd {
    /// Is `id` shown in this view: everything for an operator, strict descendants for a
    /// namespace's own.
    pub(super) fn visible(&self, spaces: &BTreeMap<u64, Arc<Space>>, id: u64) -> bool {
        match self.scope {
            None => spaces.contains_key(&id),
            Some(scope) => descends_from(spaces, id, scope),
        }
    }

    /// The run options for a namespace this operator starts: never uid 0; a non-root operator's
    /// own uid, else the per-namespace default.
    pub(super) fn run_options(&self) -> RunOptions {
        let mut opts = self.shared.opts.clone();
        if self.operator_uid != 0 {
            opts.uid = Some(self.operator_uid);
        }
        opts
    }

    pub(super) fn space(&self, id: u64) -> Result<Arc<Space>> {
        let spaces = self.shared.spaces.lock().unwrap();
        if !self.visible(&spaces, id) {
            return Err(Errno::ENOENT);
        }
        spaces.get(&id).cloned().ok_or(Errno::ENOENT)
    }

    /// Whether namespace `parent_id` may clone one more: it is live, and it and every ancestor
    /// stay within their `limit clones=` (live namespaces in the subtree, default
    /// [`spec::DEFAULT_CLONES`]).
    pub(super) fn clone_budget(&self, parent_id: u64) -> std::result::Result<(), Refusal> {
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
    pub(super) fn within_handle_budget(
        &self,
        parent: u64,
        more: usize,
    ) -> std::result::Result<(), Refusal> {
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
    /// spec names is opened now, once, and it is built from those handles (`warren_ns::handles`); a
    /// non-root operator's with their credentials (`crate::reach`): nsd builds as root, and
    /// must not show them a path they cannot reach on the host.
    pub(crate) fn add_space(&self, spec: Spec, info: Info) -> std::io::Result<(u64, Arc<Space>)> {
        let guard = Guard::new(&self.shared.opts.protected)?;
        let built = match info.operator_uid {
            0 => warren_ns::handles::open_spec(&spec, &guard)?,
            uid => crate::reach::open_as(&spec, uid, &guard)?,
        };
        Ok(self.insert_space(spec, built, info))
    }

    pub(super) fn insert_space(&self, spec: Spec, built: Built, info: Info) -> (u64, Arc<Space>) {
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
}

impl Nsd {
    /// What a clone takes from its parent's: its payload uid, so the whole subtree is one uid and
    /// per-uid limits (RLIMIT_NPROC, inotify instances, …) bind the subtree, not each clone
    /// (docs/decisions.md D19, "A subtree is one uid"); and at most the wall-clock time the parent
    /// has left. `None` for a namespace with no parent. A clone whose parent has ended (or does
    /// not run) never runs: ESRCH.
    pub(super) fn parent_share(&self, space: &Space) -> Result<Option<ParentShare>> {
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
    pub(crate) fn ancestors(&self, mut parent: Option<u64>) -> Vec<warren_proto::lineage::Member> {
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
            if out.len() >= warren_proto::lineage::MAX_DEPTH - 1 {
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
pub(super) struct ParentShare {
    pub(super) uid: u32,
    /// Seconds of the parent's `limit wall` left, if it has one.
    pub(super) wall_left: Option<u64>,
}

/// Whether `ancestor` cloned `id`, or an ancestor of it did (never itself).
pub(super) fn descends_from(spaces: &BTreeMap<u64, Arc<Space>>, id: u64, ancestor: u64) -> bool {
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
pub(super) fn wait_space(space: &Space, running: &Running, served: Option<&ServedMounts>) {
    let end = match running.wait() {
        Ok(code) => Status::Exited(code),
        Err(e) => Status::Failed(e.to_string()),
    };
    let end = served
        .and_then(ServedMounts::bridge_death)
        .map_or(end, |why| Status::Failed(format!("{why}: namespace ended")));
    space.set_ended(end);
}
