//! Tool workers, built by nsd from a tool's own authority (`docs/decisions.md` D1, "toolfs holds no
//! capability"; specs/worker-protocol.md §1). toolfs asks on `<runtime>/nsd-workers.ctl` with a
//! [`BuildRequest`] and the root fds it got with the namespace's grant; nsd answers with the
//! worker's channel, a lifeline and a pidfd of the worker's holder.
//!
//! Processes: nsd forks a *holder* (root, host pid namespace) that unshares mount, pid, net, ipc,
//! uts and cgroup namespaces and forks the worker, pid 1 of the new pid namespace. The worker
//! builds its tree — a tmpfs root; each root bound at its path from the fd toolfs passed (never
//! re-resolved from a host string), read-only unless writable; `/lib`, `/lib64` read-only (its
//! binary is dynamically linked), plus `/usr`, `/bin`, `/proc`, `/tmp`, a home and `/etc`
//! entries for `shell`, which execs; a `/dev`; no `/tool` — pivots, brings `lo` up, drops to the
//! worker uid with no capabilities, restricts itself with Landlock and seccomp, and execs
//! `warren-tool-worker`, bound read-only at [`WORKER_PATH`]. The holder waits: when toolfs closes
//! the lifeline it SIGKILLs the worker, and with its pid 1 the kernel kills the whole pid
//! namespace.
//!
//! Why one file: it follows one worker's life — request check, plan, holder — in order; the
//! steps themselves, and the holder, are warren-jail's (`jail/src/setup.rs`), the same as a
//! namespace's payload runs.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use nix::unistd::ForkResult;
use warren_daemon::Dirs;
use warren_daemon::accept::{next_blocking_peer, refusal};
use warren_daemon::identity::Role;
use warren_daemon::peer::PeerCred;
use warren_proto::worker::protocol::RootConfig;
use warren_proto::worker::{BUILD_VERSION, BuildReply, BuildRequest};

use warren_jail::landlock::Network;
use warren_jail::process as sys;
use warren_jail::seccomp::Relaxed;
use warren_jail::setup::{self as jail, Command, Identity, LockDown, Pid1, Plan, Tree, Wait};

use warren_ns::confine::NAMES;
use warren_ns::confine::binds::{self, PreparedBind};
use warren_ns::confine::guard::Guard;
use warren_ns::run::{SETUP_DEADLINE, SetupErrors};
use warren_ns::spec::{Access, Bind, Limits};

/// Where the worker binary is bound (read-only) in every worker's root.
pub const WORKER_PATH: &str = "/warren-tool-worker";
/// Host directories every worker gets read-only: its binary's loader and libraries.
const LIB_DIRS: &[&str] = &["/lib", "/lib64"];
/// And those a worker whose tool execs programs (`shell`) gets too.
const EXEC_DIRS: &[&str] = &["/usr", "/bin"];
/// The tools that exec programs.
const EXEC_TOOLS: &[&str] = &["shell"];
/// A root may not be at or under these: they are the worker's own tree.
const RESERVED: &[&str] = &[
    WORKER_PATH,
    "/usr",
    "/bin",
    "/lib",
    "/lib64",
    "/dev",
    "/proc",
];
/// `shell` forks each command with these (a user and a pid namespace of its own, so the command
/// is pid 1 of a namespace the worker kills whole): see docs/decisions.md.
const SHELL_CLONE_FLAGS: u64 = (libc::CLONE_NEWUSER | libc::CLONE_NEWPID) as u64;

/// The uids of the workers that exec (`shell`): this + the host pid of the holder of the
/// namespace subtree they work for, unique while that subtree lives (a subtree ends with its
/// root: `nsd`). Above every payload uid (`RunOptions::uid_base` + a pid, pids < 2²²).
pub const EXEC_WORKER_UID_BASE: u32 = 5_000_000;

/// What a worker of one namespace runs under: its uid and the namespace's `limit` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerScope {
    pub uid: u32,
    pub limits: Limits,
    /// Who may write as whom: the operator who started the namespace's subtree, and whether
    /// the namespace is a clone (see [`write_identity`]).
    pub writer: Writer,
    /// The network the namespace's spec gives this tool (`tool NAME net proxy`), if any.
    pub net: Option<WorkerNet>,
}

/// A tool worker's network: its own listener at the egress proxy, in the namespace's name
/// (session, lineage) and for the tool's destinations (within the namespace's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerNet {
    pub target: warren_ns::netgrant::NetProxyTarget,
    pub patterns: Vec<warren_proto::net::Pattern>,
}

/// Whose files a namespace's file tools may write as another uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writer {
    /// The operator who started the namespace (0: root).
    pub operator_uid: u32,
    /// A namespace cloned through `/ns`.
    pub clone: bool,
}

impl Writer {
    /// May a worker write as `owner` (a writable root's)? Only as the operator themselves, or
    /// as anyone a root operator named in their own spec: never for a clone, whose roots are
    /// narrowed beneath its parent's and may belong to someone the parent never wrote as, and
    /// never for a non-root operator's grant of another user's directory (nsd checks that they
    /// can reach a path, not that they may write as its owner).
    pub fn may_write_as(self, owner: u32) -> bool {
        !self.clone && (self.operator_uid == 0 || owner == self.operator_uid)
    }
}

/// Who the namespaces are (nsd's `/ns`): the scope of a worker built for one of them.
pub trait WorkerScopes: Send + Sync {
    /// `Ok(None)`: no namespace of this nsd has this id (the operator's own connection). An
    /// error refuses the build: the namespace is known but not running, or the session differs.
    /// `tool`: the tool the worker is for (its network is the spec's for that tool).
    fn worker_scope(
        &self,
        namespace: &str,
        session: &str,
        tool: &str,
    ) -> Result<Option<WorkerScope>, String>;
}

/// Builds workers. One per nsd.
pub struct WorkerFactory {
    protected: Dirs,
    weaker_landlock: bool,
    uid: u32,
    binary: PathBuf,
    scopes: Option<Arc<dyn WorkerScopes>>,
}

/// A running worker, as nsd hands it to toolfs.
pub struct Built {
    /// toolfs's end of the worker's channel.
    pub channel: OwnedFd,
    /// Closing it ends the worker (the holder SIGKILLs it).
    pub lifeline: OwnedFd,
    /// A pidfd of the holder: readable once the worker is gone.
    pub holder: OwnedFd,
    pub holder_pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Whether the worker got the network (its own listener at the egress proxy).
    pub network: bool,
}

impl WorkerFactory {
    /// `binary`: the `warren-tool-worker` executable (see
    /// [`warren_proto::worker::worker_program`]).
    pub fn new(protected: Dirs, weaker_landlock: bool, binary: PathBuf) -> WorkerFactory {
        WorkerFactory {
            protected,
            weaker_landlock,
            uid: Role::Worker.uid(),
            binary,
            scopes: None,
        }
    }

    /// Workers of the namespaces `scopes` knows count against them (their uid and limits).
    pub fn with_scopes(mut self, scopes: Arc<dyn WorkerScopes>) -> WorkerFactory {
        self.scopes = Some(scopes);
        self
    }

    /// The uid a worker runs as and the limits it gets. A worker that execs (`shell`) runs as
    /// its namespace subtree's own uid, so the processes and per-uid kernel objects (inotify
    /// instances, …) of what it runs count there and nowhere else; the file tools' workers,
    /// which run only warren's code and never fork, keep the one worker uid, so what they
    /// write keeps one owner across namespaces (docs/decisions.md D19, "A subtree is one uid").
    fn identity(
        &self,
        request: &BuildRequest,
        execs: bool,
    ) -> Result<(u32, Limits, Option<Writer>, Option<WorkerNet>), String> {
        let scope = match &self.scopes {
            Some(s) => s.worker_scope(&request.namespace, &request.session, &request.tool)?,
            None => None,
        };
        Ok(match scope {
            Some(scope) if execs => (scope.uid, scope.limits, Some(scope.writer), scope.net),
            Some(scope) => (self.uid, scope.limits, Some(scope.writer), scope.net),
            None => (self.uid, Limits::default(), None, None),
        })
    }

    /// The uid (and gid) every worker runs as.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Builds one worker from `request` and its root fds. Every problem refuses the whole build.
    pub fn build(&self, request: &BuildRequest, root_fds: Vec<OwnedFd>) -> Result<Built, String> {
        check_request(request, root_fds.len())?;
        let execs = EXEC_TOOLS.contains(&request.tool.as_str());
        let (uid, limits, writer, net) = self.identity(request, execs)?;
        // The network only when toolfs asks for it (its grant says so) and the namespace's own
        // spec gives it to this tool: nsd's record decides, never toolfs's word alone.
        let net_grant = match (request.network, net) {
            (false, _) => None,
            (true, None) => {
                return Err(format!(
                    "{}: namespace {}'s spec gives it no network (`tool {} net proxy`)",
                    request.tool, request.namespace, request.tool
                ));
            }
            (true, Some(net)) => Some(
                warren_ns::netgrant::grant(&net.patterns, &net.target, &self.protected)
                    .map_err(|e| format!("the worker's network: {e}"))?,
            ),
        };
        let guard = Guard::new(&self.protected).map_err(|e| e.to_string())?;
        let mut prepared = Vec::new();
        for (root, fd) in request.roots.iter().zip(&root_fds) {
            let bind = Bind {
                access: if root.writable {
                    Access::Write
                } else {
                    Access::Read
                },
                recursive: false,
                host: format!("root {}", root.path),
                path: root.path.clone(),
            };
            let b = binds::prepare_handle(fd.as_fd(), &bind, &guard)?;
            if !b.is_dir {
                return Err(format!("root {} is not a directory", root.path));
            }
            prepared.push(b);
        }
        let system: Vec<&str> = if execs {
            LIB_DIRS.iter().chain(EXEC_DIRS).copied().collect()
        } else {
            LIB_DIRS.to_vec()
        };
        for dir in system {
            if std::fs::metadata(dir).is_err() {
                continue;
            }
            prepared.push(binds::prepare(
                &Bind {
                    access: Access::Read,
                    recursive: false,
                    host: dir.into(),
                    path: dir.into(),
                },
                &guard,
            )?);
        }
        prepared.push(binds::prepare(
            &Bind {
                access: Access::Read,
                recursive: false,
                host: self.binary.to_string_lossy().into_owned(),
                path: WORKER_PATH.into(),
            },
            &guard,
        )?);
        // A file tool writes as its writable roots' owner; otherwise the identity above.
        let (uid, gid) = write_identity(request, &root_fds, execs)?
            .filter(|&(owner, _)| writer.is_some_and(|w| w.may_write_as(owner)))
            .unwrap_or((uid, uid));
        let (channel, worker_end) = UnixStream::pair().map_err(io("channel"))?;
        let (lifeline, holder_end) = UnixStream::pair().map_err(io("lifeline"))?;
        let (err_read, err_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        let net_ns = net_grant
            .as_ref()
            .map(|g| g.netns.try_clone())
            .transpose()
            .map_err(io("the network namespace"))?;
        let plan = WorkerPlan {
            binds: prepared,
            worker_end: worker_end.into(),
            err_write,
            tool: &request.tool,
            roots: &request.roots,
            uid,
            gid,
            execs,
            weaker_landlock: self.weaker_landlock,
            limits,
            net_ns,
            network: net_grant.is_some(),
        }
        .plan()?;
        let holder = match sys::fork_process().map_err(io("fork"))? {
            ForkResult::Child => {
                drop(err_read);
                drop(channel);
                drop(lifeline);
                jail::holder(plan, Wait::Lifeline(holder_end.into()))
            }
            ForkResult::Parent { child } => child,
        };
        // Our copies of the worker's ends: the error pipe must reach EOF at the worker's exec.
        drop(plan);
        drop(holder_end);
        drop(root_fds);
        let holder_fd = sys::pidfd_open(holder.as_raw());
        let network = net_grant.is_some();
        // The holder is our child: reap it whenever it ends (the worker's end), and only then
        // end the worker's session at the proxy.
        std::thread::spawn(move || {
            let _ = nix::sys::wait::waitpid(holder, None);
            drop(net_grant);
        });
        let deadline = Instant::now() + SETUP_DEADLINE;
        match SetupErrors::drain(err_read).wait(deadline) {
            Ok(message) if message.is_empty() => {}
            Ok(message) => return Err(message),
            Err(e) => {
                // Never a worker half set up: it goes (and the reaper above reaps it).
                let _ = nix::sys::signal::kill(holder, nix::sys::signal::Signal::SIGKILL);
                return Err(format!("the worker's setup: {e}"));
            }
        }
        Ok(Built {
            channel: channel.into(),
            lifeline: lifeline.into(),
            holder: holder_fd.map_err(io("pidfd_open"))?,
            holder_pid: holder.as_raw(),
            uid,
            gid,
            network,
        })
    }

    /// Serves the worker socket forever: toolfs (its uid, or root) in our own pid namespace only;
    /// each connection on a blocking thread, one request after another, each answered in turn.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::UnixListener) {
        loop {
            let sock = next_blocking_peer(&listener, "worker socket", |s| {
                refusal(s.as_fd(), toolfs_or_root)
            })
            .await;
            let factory = self.clone();
            tokio::task::spawn_blocking(move || factory.connection(sock));
        }
    }

    fn connection(&self, sock: UnixStream) {
        loop {
            let (record, fds) = match warren_daemon::handoff::recv(&sock) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return,
                Err(e) => {
                    tracing::warn!("worker socket: {e}; closing the connection");
                    return;
                }
            };
            let built = serde_json::from_slice::<BuildRequest>(&record)
                .map_err(|e| format!("bad build request: {e}"))
                .and_then(|request| {
                    let built = self.build(&request, fds);
                    match &built {
                        Ok(b) => tracing::info!(
                            session = %request.session,
                            namespace = %request.namespace,
                            tool = %request.tool,
                            holder = b.holder_pid,
                            network = b.network,
                            "worker built"
                        ),
                        Err(e) => tracing::warn!(
                            session = %request.session,
                            namespace = %request.namespace,
                            tool = %request.tool,
                            "worker refused: {e}"
                        ),
                    }
                    built
                });
            let sent = match built {
                Ok(b) => {
                    let reply = BuildReply {
                        ok: true,
                        error: String::new(),
                        uid: b.uid,
                        gid: b.gid,
                        pid: 1,
                        holder_pid: b.holder_pid,
                    };
                    send_reply(
                        &sock,
                        &reply,
                        &[b.channel.as_fd(), b.lifeline.as_fd(), b.holder.as_fd()],
                    )
                }
                Err(error) => {
                    let reply = BuildReply {
                        ok: false,
                        error,
                        uid: 0,
                        gid: 0,
                        pid: 0,
                        holder_pid: 0,
                    };
                    send_reply(&sock, &reply, &[])
                }
            };
            if let Err(e) = sent {
                tracing::warn!("worker socket: cannot answer: {e}");
                return;
            }
        }
    }
}

/// Listens on `<runtime>/nsd-workers.ctl` (or the socket the supervisor bound for it) and serves
/// worker builds there until the runtime stops.
/// `scopes`: the namespaces whose workers count against them.
pub fn spawn_server(
    dirs: &Dirs,
    weaker_landlock: bool,
    scopes: Arc<dyn WorkerScopes>,
) -> io::Result<PathBuf> {
    let binary = warren_proto::worker::worker_program()?;
    let path = dirs.control(warren_proto::worker::NSD_WORKER_CONTROL);
    let listener = warren_daemon::operator::listen(&path)?;
    let factory =
        Arc::new(WorkerFactory::new(dirs.clone(), weaker_landlock, binary).with_scopes(scopes));
    tokio::spawn(factory.serve(listener));
    Ok(path)
}

/// An io error as a message naming what failed.
fn io(what: &'static str) -> impl Fn(io::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn send_reply(sock: &UnixStream, reply: &BuildReply, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let bytes = serde_json::to_vec(reply).map_err(io::Error::other)?;
    warren_daemon::handoff::send(sock, &bytes, fds)
}

/// Who may use the worker socket (besides being in our pid namespace): toolfs's uid or root.
fn toolfs_or_root(cred: &PeerCred) -> Option<String> {
    (cred.uid != 0 && cred.uid != Role::Toolfs.uid())
        .then(|| format!("uid {} is neither toolfs nor root", cred.uid))
}

/// Whom a worker that writes files writes as: the owner (uid and gid) of its writable roots, so
/// what `fs_write` and `fs_edit` create belongs to whoever owns the directory the operator
/// granted, and the worker can create files in it (a directory's owner can; the warren worker
/// uid, in a 0755 directory, cannot). `None` keeps nsd's worker uid: no writable root; a tool
/// that runs programs (`shell`: the user's uid would carry the user's keyrings and process
/// limits); a root owned by root (never uid 0: writing into a root-owned directory is the
/// explicit choice of making it writable for the worker uid) or by one of warren's daemons.
/// Writable roots of different owners are refused: a worker writes as one user.
fn write_identity(
    request: &BuildRequest,
    root_fds: &[OwnedFd],
    execs: bool,
) -> Result<Option<(u32, u32)>, String> {
    if execs {
        return Ok(None);
    }
    let mut owner: Option<(u32, u32, &str)> = None;
    for (root, fd) in request.roots.iter().zip(root_fds) {
        if !root.writable {
            continue;
        }
        let st =
            nix::sys::stat::fstat(fd).map_err(|e| format!("root {}: fstat: {e}", root.path))?;
        let this = (st.st_uid, st.st_gid);
        match owner {
            Some((u, g, other)) if (u, g) != this => {
                return Err(format!(
                    "writable roots {other} (owner {u}:{g}) and {} (owner {}:{}) belong to \
                     different users: a worker writes as one; grant them to separate tools",
                    root.path, this.0, this.1
                ));
            }
            _ => owner = Some((this.0, this.1, &root.path)),
        }
    }
    let daemons = [
        Role::Toolfs,
        Role::Receiptd,
        Role::Gate,
        Role::Bridge,
        Role::Mcpfs,
        Role::Llmfs,
        Role::Netproxy,
    ]
    .map(Role::uid);
    Ok(owner
        .filter(|&(u, g, _)| u != 0 && g != 0 && !daemons.contains(&u))
        .map(|(u, g, _)| (u, g)))
}

/// The request must name a worker tool, roots that fit the fds and do not overlap each other or
/// the worker's own tree, and the network only for a tool that runs programs.
fn check_request(request: &BuildRequest, fds: usize) -> Result<(), String> {
    if request.version != BUILD_VERSION {
        return Err(format!(
            "build request version {} is not {BUILD_VERSION}",
            request.version
        ));
    }
    if !warren_proto::worker::WORKER_TOOLS.contains(&request.tool.as_str()) {
        return Err(format!("no tool named {:?} runs in a worker", request.tool));
    }
    if request.roots.len() != fds {
        return Err(format!(
            "the request names {} root(s) but {fds} fd(s) came with it",
            request.roots.len()
        ));
    }
    if request.network && !warren_ns::spec::NETWORK_TOOLS.contains(&request.tool.as_str()) {
        return Err(format!(
            "{}: no network for a tool that runs no programs",
            request.tool
        ));
    }
    let under = |path: &str, dir: &str| path == dir || path.starts_with(&format!("{dir}/"));
    for (i, root) in request.roots.iter().enumerate() {
        warren_proto::worker::check_root_path(&root.path).map_err(|e| e.to_string())?;
        if root.path == "/" {
            return Err("a root at / would hide the worker's own tree".into());
        }
        if let Some(r) = RESERVED.iter().find(|r| under(&root.path, r)) {
            return Err(format!(
                "root {} lies in the worker's own {r}; bind it elsewhere",
                root.path
            ));
        }
        for other in &request.roots[i + 1..] {
            if under(&root.path, &other.path) || under(&other.path, &root.path) {
                return Err(format!(
                    "roots {} and {} overlap: a worker's roots must be disjoint",
                    root.path, other.path
                ));
            }
        }
    }
    Ok(())
}

/// What nsd knows of one worker before the fork, mapped onto warren-jail's plan.
struct WorkerPlan<'a> {
    binds: Vec<PreparedBind>,
    worker_end: OwnedFd,
    err_write: OwnedFd,
    tool: &'a str,
    roots: &'a [RootConfig],
    uid: u32,
    gid: u32,
    execs: bool,
    weaker_landlock: bool,
    /// The calling namespace's `limit` line (none for a namespace nsd does not know).
    limits: Limits,
    /// The network namespace with the worker's own proxy listener, joined instead of a fresh
    /// one (`lo` only) when the tool has the network.
    net_ns: Option<OwnedFd>,
    /// The tool has the network: the proxy's variables, Landlock's TCP rule.
    network: bool,
}

impl WorkerPlan<'_> {
    /// The worker's plan: a tmpfs root with its binds (and for `shell`, /tmp, a home, /etc and
    /// /proc), `lo` up, the lock-down with the worker's seccomp relaxations, and the exec of
    /// `warren-tool-worker TOOL CHANNEL ROOT...` as the worker's pid 1. Nothing but the channel
    /// and the roots crosses the exec (the error pipe closes at it).
    fn plan(self) -> Result<Plan, String> {
        let cstr = |s: &str| CString::new(s).map_err(|_| "NUL in an argument".to_string());
        let home = if self.execs { warren_ns::HOME } else { "/" };
        let mut env = vec![
            format!("PATH={}", warren_ns::PAYLOAD_PATH),
            format!("HOME={home}"),
            "LANG=C.UTF-8".into(),
            "TMPDIR=/tmp".into(),
            "USER=agent".into(),
        ];
        if self.execs {
            // What each command may use at most (the tool's own defaults apply below these).
            let l = self.limits;
            let words: Vec<String> = [("pids", l.pids), ("mem", l.mem), ("cpu", l.cpu)]
                .into_iter()
                .filter_map(|(k, v)| Some(format!("{k}={}", v?)))
                .collect();
            env.push(format!(
                "{}={}",
                warren_proto::worker::NAMESPACE_LIMITS_ENV,
                words.join(" ")
            ));
        }
        if self.network {
            // The worker's own proxy listener, as a `net proxy` payload finds it: `shell`
            // passes these on to its commands.
            env.extend(warren_ns::netgrant::proxy_env());
        }
        let mut write: Vec<String> = self
            .roots
            .iter()
            .filter(|r| r.writable)
            .map(|r| r.path.clone())
            .collect();
        if self.execs {
            write.extend(["/tmp".into(), warren_ns::HOME.into(), "/dev/shm".into()]);
        }
        Ok(Plan {
            err_pipe: Some(self.err_write),
            stdio: None,
            // The worker lives while toolfs holds its lifeline, whatever becomes of nsd.
            die_with_launcher: false,
            cgroup_dir: None,
            net_ns: self.net_ns,
            // With the network: TCP connect to the proxy's port only and no bind, as its
            // namespace.
            network: if self.network {
                warren_ns::confine::network(warren_ns::spec::Net::Proxy)
            } else {
                Network::Loopback
            },
            tree: Tree {
                binds: self.binds,
                user_dirs: self.execs.then_some(None),
                proc: self.execs,
                dev_points: Vec::new(),
                fuse_mounts: Vec::new(),
            },
            fuse_sock: None,
            pty_sock: None,
            pty_slave: None,
            pty_winsize: [0; 4],
            send_fd: warren_ns::confine::fuse::send_fd,
            names: NAMES,
            identity: Identity::Fixed {
                uid: self.uid,
                gid: self.gid,
            },
            lock_down: LockDown {
                write,
                weaker_landlock: self.weaker_landlock,
                seccomp: Relaxed {
                    clone_flags: if self.execs { SHELL_CLONE_FLAGS } else { 0 },
                    // The worker resolves every tool path beneath its roots with openat2.
                    openat2: true,
                },
            },
            // The namespace's process count is per uid: its exec worker, and all that runs
            // under it, share its subtree's uid and this limit.
            limits: jail::Limits {
                pids: self.limits.pids.filter(|_| self.execs),
                ..Default::default()
            },
            pid1: Pid1::Exec,
            command: Command {
                argv: vec![cstr("warren-tool-worker")?, cstr(self.tool)?],
                env: env.iter().map(|e| cstr(e)).collect::<Result<Vec<_>, _>>()?,
                program: Some(cstr(WORKER_PATH)?),
                cwd: "/".into(),
                pass: vec![self.worker_end],
                // Each root, opened at the mount just made from toolfs's fd: the worker
                // resolves every tool path beneath these.
                open_in_root: self.roots.iter().map(|r| r.path.clone()).collect(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(roots: &[(&str, bool)]) -> BuildRequest {
        BuildRequest {
            version: BUILD_VERSION,
            session: "0".repeat(32),
            namespace: "t".into(),
            tool: "fs_read".into(),
            roots: roots
                .iter()
                .map(|(p, w)| RootConfig {
                    path: p.to_string(),
                    writable: *w,
                })
                .collect(),
            network: false,
        }
    }

    struct OneNamespace;

    impl WorkerScopes for OneNamespace {
        fn worker_scope(
            &self,
            namespace: &str,
            _: &str,
            _: &str,
        ) -> Result<Option<WorkerScope>, String> {
            match namespace {
                "7" => Ok(Some(WorkerScope {
                    uid: EXEC_WORKER_UID_BASE + 42,
                    limits: warren_ns::spec::parse("<t>", "limit pids=16 mem=64M")
                        .unwrap()
                        .limits,
                    writer: Writer {
                        operator_uid: 0,
                        clone: false,
                    },
                    net: None,
                })),
                "8" => Err("namespace 8's subtree is not running".into()),
                _ => Ok(None),
            }
        }
    }

    /// A `shell` worker runs as its namespace subtree's uid with its limits; a file tool's keeps
    /// the one worker uid (and gets the limits); a namespace nsd does not know gets the worker
    /// uid and no limits; one it knows but cannot place is refused.
    #[test]
    fn a_shell_worker_runs_as_its_subtrees_uid() {
        let factory = WorkerFactory::new(Dirs::from_env(), false, PathBuf::from("/nonexistent"))
            .with_scopes(Arc::new(OneNamespace));
        let mut shell = request(&[]);
        shell.tool = "shell".into();
        shell.namespace = "7".into();
        let (uid, limits, _, _) = factory.identity(&shell, true).unwrap();
        assert_eq!(uid, EXEC_WORKER_UID_BASE + 42);
        assert_eq!((limits.pids, limits.mem), (Some(16), Some(64 << 20)));
        let mut read = request(&[]);
        read.namespace = "7".into();
        let (uid, limits, _, _) = factory.identity(&read, false).unwrap();
        assert_eq!((uid, limits.pids), (Role::Worker.uid(), Some(16)));
        shell.namespace = "operator".into();
        assert_eq!(
            factory.identity(&shell, true).unwrap(),
            (Role::Worker.uid(), Limits::default(), None, None)
        );
        shell.namespace = "8".into();
        assert!(factory.identity(&shell, true).is_err());
    }

    /// A worker writes as a root's owner only for the operator themselves, or for a root
    /// operator's own namespace; never for a clone.
    #[test]
    fn only_the_operator_or_roots_own_namespace_writes_as_a_roots_owner() {
        let w = |operator_uid, clone| Writer {
            operator_uid,
            clone,
        };
        assert!(w(0, false).may_write_as(4242));
        assert!(w(4242, false).may_write_as(4242));
        assert!(!w(4242, false).may_write_as(4243));
        assert!(!w(0, true).may_write_as(4242));
        assert!(!w(4242, true).may_write_as(4242));
    }

    #[test]
    fn requests_are_checked_whole() {
        assert!(check_request(&request(&[("/home/me/repo", false)]), 1).is_ok());
        assert!(check_request(&request(&[("/home/me/repo", false)]), 2).is_err());
        for bad in ["/", "/usr/x", "/proc", "/a/../b", "relative", WORKER_PATH] {
            assert!(
                check_request(&request(&[(bad, false)]), 1).is_err(),
                "{bad} accepted"
            );
        }
        let overlap = check_request(&request(&[("/a", false), ("/a/b", true)]), 2).unwrap_err();
        assert!(overlap.contains("overlap"), "{overlap}");
        assert!(check_request(&request(&[("/a", false), ("/ab", true)]), 2).is_ok());
        let mut net = request(&[]);
        net.network = true;
        assert!(check_request(&net, 0).unwrap_err().contains("network"));
        net.tool = "shell".into();
        assert!(check_request(&net, 0).is_ok());
        let mut echo = request(&[]);
        echo.tool = "echo".into();
        assert!(check_request(&echo, 0).is_err());
    }
}
