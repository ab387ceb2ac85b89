//! nsd's side of the run socket: build the namespace a launcher asks for, hand back the pty,
//! forward its signals, tell it the exit status, and kill the namespace if it goes away.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::UnixListener;
use warren_daemon::accept::next_blocking_peer;
use warren_daemon::operator::OperatorPolicy;
use warren_daemon::peer::{PeerCred, peer_cred};

use nix::sys::signal::Signal;

use crate::mount_server::{ServedMounts, new_session_id};
use crate::nsd::{Info, Nsd, Space, Status, now_secs};
use warren_ns::confine::guard::Guard;
use warren_ns::launch::attach::{AttachPlan, Attached, attach};
use warren_ns::launch::{
    AttachRequest, Control, FORWARDED, Opening, Reply, Request, VERSION, launcher_connects, recv,
    send,
};
use warren_ns::run::{PayloadStdio, Running, spawn};
use warren_ns::spec::{self, Server, Spec};

/// Accepts launchers forever (operators only: same pid namespace, root or the operator group),
/// each served on a thread of its own. `bridge`: the `warren-bridge` executable.
pub async fn accept_loop(
    listener: UnixListener,
    policy: OperatorPolicy,
    nsd: Nsd,
    bridge: PathBuf,
) {
    nsd.set_bridge(bridge.clone());
    let nsd = Arc::new(nsd);
    loop {
        let sock = next_blocking_peer(&listener, "run socket", |s| policy.refusal(s)).await;
        let Ok(cred) = peer_cred(sock.as_fd()) else {
            continue;
        };
        let nsd = nsd.clone();
        std::thread::spawn(move || serve_launcher(&sock, cred, &nsd.for_operator(cred.uid)));
    }
}

/// A namespace started for a launcher.
struct Started {
    id: u64,
    space: Arc<crate::nsd::Space>,
    running: Arc<Running>,
    /// Its bridges, reaped when it ends.
    served: Option<Arc<ServedMounts>>,
}

/// What a connection follows once it has started: a namespace's command, or an attached one.
trait Job: Send + Sync + 'static {
    fn signal(&self, signal: Signal) -> io::Result<()>;
    fn kill(&self) -> io::Result<()>;
    fn wait(&self) -> io::Result<i32>;
}

impl Job for Running {
    fn signal(&self, signal: Signal) -> io::Result<()> {
        Running::signal(self, signal)
    }
    fn kill(&self) -> io::Result<()> {
        Running::kill(self)
    }
    fn wait(&self) -> io::Result<i32> {
        Running::wait(self)
    }
}

impl Job for Attached {
    fn signal(&self, signal: Signal) -> io::Result<()> {
        Attached::signal(self, signal)
    }
    fn kill(&self) -> io::Result<()> {
        Attached::kill(self)
    }
    fn wait(&self) -> io::Result<i32> {
        Attached::wait(self)
    }
}

fn serve_launcher(sock: &UnixStream, cred: PeerCred, nsd: &Nsd) {
    let opening = match recv::<Opening>(sock) {
        Ok(o) => o,
        // A connect-and-close (`warren run` checking that nsd is up) is no request.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return,
        Err(e) => return refuse(sock, cred, &e),
    };
    match opening {
        (Opening::Run(request), fds) => run_and_follow(sock, cred, nsd, request, fds, "run"),
        (Opening::Attach(request), fds) => match start_attach(nsd, cred, request, fds) {
            Ok((id, session, mut attached)) => {
                let pty_master = attached.take_pty_master();
                tracing::info!("namespace {id}: pid {} uid {} attached", cred.pid, cred.uid);
                follow(sock, id, session, Arc::new(attached), pty_master, |end| end);
            }
            Err(e) => refuse(sock, cred, &e),
        },
    }
}

/// Builds and starts the namespace `request` asks for and follows it to its end (steps 2–4),
/// or answers `failed`.
pub(super) fn run_and_follow(
    sock: &UnixStream,
    cred: PeerCred,
    nsd: &Nsd,
    request: Request,
    fds: Vec<OwnedFd>,
    origin: &'static str,
) {
    match start(nsd, cred, request, fds, origin) {
        Ok((started, pty_master)) => {
            let session = started.space.info().session.clone().unwrap_or_default();
            let (space, served) = (started.space.clone(), started.served.clone());
            follow(
                sock,
                started.id,
                session,
                started.running,
                pty_master,
                move |end| {
                    // A dead bridge ended it: that is its end, not the kill's status.
                    let end = served
                        .as_ref()
                        .and_then(|s| s.bridge_death())
                        .map_or(end, |why| Status::Failed(format!("{why}: namespace ended")));
                    space.set_ended(end.clone());
                    drop(served);
                    end
                },
            );
            nsd.remove_space(started.id);
        }
        Err(e) => refuse(sock, cred, &e),
    }
}

/// Step 2's `failed`: nothing runs.
pub(super) fn refuse(sock: &UnixStream, cred: PeerCred, e: &io::Error) {
    tracing::info!("run socket: pid {} uid {}: {e}", cred.pid, cred.uid);
    let _ = send(
        sock,
        &Reply::Failed {
            message: e.to_string(),
        },
        &[],
    );
}

/// Steps 2–4 once `job` has started: `started` (with the pty master), the launcher's signals
/// forwarded, at the end what `on_end` makes of the job's end (`exited`, or `failed` with why);
/// the job is killed if the launcher goes first.
fn follow(
    sock: &UnixStream,
    id: u64,
    session: String,
    job: Arc<dyn Job>,
    pty_master: Option<OwnedFd>,
    on_end: impl FnOnce(Status) -> Status + Send + 'static,
) {
    let fds: Vec<BorrowedFd<'_>> = pty_master.iter().map(|f| f.as_fd()).collect();
    if send(sock, &Reply::Started { id, session }, &fds).is_err() {
        let _ = job.kill();
    }
    drop(pty_master);
    let waiter = {
        let job = job.clone();
        let sock = sock.try_clone();
        std::thread::spawn(move || {
            let end = match job.wait() {
                Ok(code) => Status::Exited(code),
                Err(e) => Status::Failed(e.to_string()),
            };
            let end = on_end(end);
            if let Ok(sock) = sock {
                let reply = match end {
                    Status::Exited(code) => Reply::Exited { code },
                    Status::Failed(message) => Reply::Failed { message },
                    other => Reply::Failed {
                        message: format!("{other:?}"),
                    },
                };
                let _ = send(&sock, &reply, &[]);
                // Wakes the control loop below even if the launcher keeps the socket open.
                let _ = sock.shutdown(std::net::Shutdown::Both);
            }
        })
    };
    loop {
        match recv::<Control>(sock) {
            Ok((Control::Signal { number }, _)) if FORWARDED.contains(&number) => {
                if let Ok(sig) = Signal::try_from(number) {
                    let _ = job.signal(sig);
                }
            }
            Ok((Control::Signal { number }, _)) => {
                tracing::warn!("run socket: namespace {id}: signal {number} is not forwarded");
            }
            Err(_) => {
                // The launcher is gone (or the command ended): the job goes with it.
                let _ = job.kill();
                break;
            }
        }
    }
    let _ = waiter.join();
}

/// The payload's stdin, stdout and stderr from the request's fds (none when a pty is asked for).
fn take_stdio(pty: bool, fds: &mut Vec<OwnedFd>) -> io::Result<Option<PayloadStdio>> {
    if pty {
        return Ok(None);
    }
    if fds.len() < 3 {
        return Err(invalid(
            "a run without a pty needs stdin, stdout and stderr".into(),
        ));
    }
    let mut stdio = fds.drain(..3);
    match (stdio.next(), stdio.next(), stdio.next()) {
        (Some(stdin), Some(stdout), Some(stderr)) => Ok(Some(PayloadStdio {
            stdin,
            stdout,
            stderr,
        })),
        _ => Err(invalid("stdio fds missing".into())),
    }
}

/// Checks an attach request: the namespace exists and runs, and it is this operator's (root may
/// attach to any); then starts the command in it. Returns the id, the session and the command.
fn start_attach(
    nsd: &Nsd,
    cred: PeerCred,
    request: AttachRequest,
    mut fds: Vec<OwnedFd>,
) -> io::Result<(u64, String, Attached)> {
    if request.version != VERSION {
        return Err(invalid(format!(
            "attach request version {} (this nsd speaks {VERSION})",
            request.version
        )));
    }
    let id = request.attach;
    let stdio = take_stdio(request.pty.is_some(), &mut fds)?;
    if !fds.is_empty() {
        return Err(invalid(format!(
            "{} fds more than stdio handed over",
            fds.len()
        )));
    }
    let gone = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no running namespace {id} (see `warren ps`)"),
        )
    };
    let space = nsd.find_space(id).ok_or_else(gone)?;
    let (owner, session) = {
        let info = space.info();
        (info.operator_uid, info.session.clone().unwrap_or_default())
    };
    if cred.uid != 0 && owner != cred.uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("namespace {id} is another operator's"),
        ));
    }
    let running = space.running().ok_or_else(gone)?;
    let attached = attach(
        &running,
        space.spec(),
        AttachPlan {
            argv: &request.argv,
            env: &request.env,
            stdio,
            pty: request.pty,
        },
    )?;
    Ok((id, session, attached))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Checks the request against the spec nsd parsed itself, builds the namespace, starts the
/// command. Returns the started namespace and the pty master to hand back.
fn start(
    nsd: &Nsd,
    cred: PeerCred,
    request: Request,
    mut fds: Vec<OwnedFd>,
    origin: &'static str,
) -> io::Result<(Started, Option<OwnedFd>)> {
    if request.version != VERSION {
        return Err(invalid(format!(
            "run request version {} (this nsd speaks {VERSION})",
            request.version
        )));
    }
    let spec = spec::parse_bytes("<run request>", request.spec.as_bytes())
        .map_err(|e| invalid(e.to_string()))?;
    let mut opts = nsd.base_options();
    if let Some(stdio) = take_stdio(request.pty.is_some(), &mut fds)? {
        opts.stdio = Some(Arc::new(stdio));
    }
    let connections = check_connections(&spec, &request, fds, &opts.protected)?;
    opts.uid = payload_uid(cred.uid, request.uid)?;
    if request.weaker_landlock && !opts.weaker_landlock {
        tracing::warn!("run socket: uid {} asked for --weaker-landlock", cred.uid);
    }
    opts.weaker_landlock |= request.weaker_landlock;
    opts.bare = request.bare;
    if let Some(cwd) = &request.cwd
        && !cwd.starts_with('/')
    {
        return Err(invalid(format!(
            "cwd {cwd}: not an absolute path in the namespace"
        )));
    }
    opts.cwd = request.cwd.clone();
    opts.pty = request.pty.is_some();
    opts.pty_winsize = request.pty;
    opts.env = Some(request.env.clone());

    let (id, space) = nsd.add_space(
        spec.clone(),
        Info {
            origin,
            operator_uid: cred.uid,
            launcher_pid: Some(cred.pid),
            ..Info::default()
        },
    )?;
    // The client-asks mount is added to what is built, not to the namespace's spec: a clone's
    // spec is checked against the parent's, and this mount is no spec's to grant.
    let mut build = space.build().clone();
    if request.client_asks {
        build.mounts.push(crate::mount_server::client_asks_mount());
    }
    let built = (|| {
        if let Some(target) = &request.uid_from_bind {
            opts.uid = Some(bind_owner_uid(cred.uid, &request, &space)?);
            tracing::info!(
                "namespace {id}: the payload runs as uid {:?}, the owner of the bind at {target}",
                opts.uid
            );
        }
        let served = nsd
            .served_mounts(id, &space, &build, &request.argv)?
            .map(|s| {
                Arc::new(
                    s.with_connections(connections)
                        .operator(request.operator)
                        .client_asks(request.client_asks),
                )
            });
        let session = match &served {
            Some(s) => s.session().to_string(),
            None => new_session_id()?,
        };
        opts.mount_server = served.clone().map(|s| s as Arc<dyn warren_ns::MountServer>);
        opts.net_proxy = Some(warren_ns::netgrant::NetProxyTarget {
            session: session.clone(),
            namespace: id.to_string(),
            lineage: warren_proto::lineage::Lineage::root(crate::mount_server::member(
                &session,
                &id.to_string(),
                &request.argv,
                &space.build().limits,
            )),
        });
        let mut running = spawn(&build, &request.argv, &opts)
            .map_err(|e| io::Error::new(e.kind(), space.handles().in_words(&e.to_string())))?;
        let pty_master = running.take_pty_master();
        Ok::<_, io::Error>((served, session, Arc::new(running), pty_master))
    })();
    let (served, session, running, pty_master) = match built {
        Ok(b) => b,
        Err(e) => {
            nsd.remove_space(id);
            return Err(e);
        }
    };
    {
        let mut info = space.info();
        info.argv = request.argv.clone();
        info.started = Some(now_secs());
        info.session = Some(session);
    }
    space.set_running(&running);
    if let Some(served) = &served {
        crate::nsd::end_with_a_dead_bridge(served, &running, id);
    }
    tracing::info!(
        "namespace {id} started for pid {} uid {}: holder {}",
        cred.pid,
        cred.uid,
        running.holder_pid()
    );
    Ok((
        Started {
            id,
            space,
            running,
            served,
        },
        pty_master,
    ))
}

/// The payload's uid: a non-root operator's own (asking for another is refused); root's choice
/// (never 0 nor one of warren's daemon uids), or `None` for a per-namespace uid.
fn payload_uid(operator: u32, requested: Option<u32>) -> io::Result<Option<u32>> {
    if operator == 0 {
        if let Some(u) = requested {
            warren_daemon::identity::refuse_payload_uid(u, &format!("uid {u}"))
                .map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;
        }
        return Ok(requested);
    }
    match requested {
        Some(u) if u != operator => Err(invalid(format!(
            "uid {u}: a non-root operator's namespaces run under their own uid {operator}"
        ))),
        _ => Ok(Some(operator)),
    }
}

/// `Request::uid_from_bind`: the owner of the handle nsd opened for the bind at that target —
/// the same open file the namespace binds, so no rename between a lookup and the bind can make
/// the uid one directory's and the bind another's. Root operators only, and not with `uid`.
fn bind_owner_uid(operator: u32, request: &Request, space: &Space) -> io::Result<u32> {
    let target = request.uid_from_bind.as_deref().unwrap_or_default();
    if operator != 0 || request.uid.is_some() {
        return Err(invalid(format!(
            "uid_from_bind {target}: for a root operator that names no uid"
        )));
    }
    let index = space
        .build()
        .binds
        .iter()
        .position(|b| b.path == target)
        .ok_or_else(|| {
            invalid(format!(
                "uid_from_bind {target}: the spec binds nothing there"
            ))
        })?;
    let handle = space
        .handles()
        .bind(index)
        .ok_or_else(|| invalid(format!("uid_from_bind {target}: no handle for that bind")))?;
    handle_owner_uid(handle.as_fd(), target)
}

/// The owner of an open file, as a payload's uid: refused if root or one of warren's own.
fn handle_owner_uid(handle: BorrowedFd<'_>, target: &str) -> io::Result<u32> {
    let owner = nix::sys::stat::fstat(handle)
        .map_err(|e| io::Error::other(format!("the project {target}: fstat: {e}")))?
        .st_uid;
    warren_daemon::identity::refuse_payload_uid(owner, &format!("the project {target}"))
        .map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;
    Ok(owner)
}

/// The launcher's connections: one per `connections` name, each a mount the launcher must make
/// (`launcher_connects`), none missing, none twice; a `unix!` path inside
/// warren's dirs refused here too.
fn check_connections(
    spec: &Spec,
    request: &Request,
    fds: Vec<OwnedFd>,
    protected: &warren_daemon::Dirs,
) -> io::Result<Vec<(String, OwnedFd)>> {
    if fds.len() != request.connections.len() {
        return Err(invalid(format!(
            "{} connections named, {} handed over",
            request.connections.len(),
            fds.len()
        )));
    }
    let guard = Guard::new(protected)?;
    let wanted: Vec<&warren_ns::spec::Mount> = spec
        .mounts
        .iter()
        .filter(|m| launcher_connects(m, request.operator))
        .collect();
    for m in &wanted {
        if !request.connections.contains(&m.path) {
            return Err(invalid(format!(
                "mount of {} at {}: the launcher must make its connection",
                m.server, m.path
            )));
        }
        if let Server::Unix(path) = &m.server {
            warren_ns::launch::client::checked_unix_path(&guard, path)?;
        }
    }
    let mut out: Vec<(String, OwnedFd)> = Vec::new();
    for (path, fd) in request.connections.iter().zip(fds) {
        if !wanted.iter().any(|m| &m.path == path) {
            return Err(invalid(format!(
                "a connection for {path}, which is no mount the launcher makes"
            )));
        }
        if out.iter().any(|(p, _)| p == path) {
            return Err(invalid(format!("two connections for {path}")));
        }
        out.push((path.clone(), fd));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_root_operator_runs_as_themselves_only() {
        assert_eq!(payload_uid(0, None).unwrap(), None);
        assert_eq!(payload_uid(0, Some(1234)).unwrap(), Some(1234));
        assert_eq!(payload_uid(1000, None).unwrap(), Some(1000));
        assert_eq!(payload_uid(1000, Some(1000)).unwrap(), Some(1000));
        assert!(payload_uid(1000, Some(0)).is_err());
        assert!(payload_uid(1000, Some(1001)).is_err());
    }

    /// Root's `--uid` is never root nor one of warren's daemon uids (the gate's, here).
    #[test]
    fn root_never_runs_a_payload_as_root_or_a_daemon_uid() {
        use warren_daemon::identity::Role;
        for uid in [0, Role::Gate.uid(), Role::Worker.uid()] {
            let e = payload_uid(0, Some(uid)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{uid}: {e}");
        }
    }

    /// The project handle's owner is the payload's uid; a handle owned by root or by one of
    /// warren's daemon uids is refused, by name.
    #[test]
    fn a_project_handle_owned_by_root_or_a_daemon_uid_is_refused() {
        use warren_daemon::identity::Role;
        let dir = tempfile::tempdir().unwrap();
        let handle = std::fs::File::open(dir.path()).unwrap();
        let owned_by = |uid: u32| {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
            handle_owner_uid(handle.as_fd(), "/p")
        };
        assert_eq!(owned_by(4321).unwrap(), 4321);
        let e = owned_by(0).unwrap_err().to_string();
        assert!(e.contains("/p is owned by root"), "{e}");
        let gate = Role::Gate.uid();
        let e = owned_by(gate).unwrap_err().to_string();
        assert!(
            e.contains(&format!("uid {gate} is one of warren's own")),
            "{e}"
        );
    }
}
