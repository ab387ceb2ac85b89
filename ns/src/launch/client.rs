//! The launcher's side of nsd's run socket (`warren run`): make the connections that are the
//! operator's to make, send the request with the payload's stdio, then forward signals and wait.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use warren_daemon::Dirs;

pub use super::Launched;
use super::launcher_connects;
use super::{AttachRequest, Request, VERSION, open_at, socket_path};
use crate::confine::guard::Guard;
use crate::spec::{Mount, Server, Spec};
use warren_jail::inode::open_path;

/// How to launch (the request's fields other than the spec and the command).
#[derive(Clone, Debug, Default)]
pub struct LaunchOptions {
    /// A pty with this window size instead of the launcher's stdio.
    pub pty: Option<[u16; 4]>,
    pub weaker_landlock: bool,
    pub uid: Option<u32>,
    /// The payload runs as the owner of this bind's source, as nsd opened it
    /// (`Request::uid_from_bind`).
    pub uid_from_bind: Option<String>,
    pub bare: bool,
    /// An operator namespace (see `Request::operator`).
    pub operator: bool,
    /// The payload's own asks on a capped channel (see `Request::client_asks`).
    pub client_asks: bool,
    /// The payload's working directory inside the namespace (`Request::cwd`).
    pub cwd: Option<String>,
    /// Values for the spec's `env` names that the launcher sets itself (a profile's switches
    /// and PATH), over this process's environment.
    pub env_set: BTreeMap<String, String>,
}

/// Values for TERM, LANG and the spec's `env` names, from this process's environment.
fn env_values(spec: &Spec) -> io::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for name in ["TERM", "LANG"]
        .into_iter()
        .chain(spec.env.iter().map(String::as_str))
    {
        if let Some(v) = std::env::var_os(name) {
            let v = v.into_string().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("env {name} is not UTF-8"),
                )
            })?;
            out.insert(name.to_string(), v);
        }
    }
    Ok(out)
}

/// Refuses a `unix!` socket inside (or containing) warren's runtime, data or secrets dir, by
/// inode, and returns it opened O_PATH (what was checked is what gets connected).
pub fn checked_unix_path(guard: &Guard, path: &str) -> io::Result<OwnedFd> {
    let fd = open_path(Path::new(path))
        .map_err(|e| io::Error::new(e.kind(), format!("mount of unix!{path}: {e}")))?;
    guard
        .check_as("mount", fd.as_fd(), &format!("unix!{path}"))
        .map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;
    Ok(fd)
}

/// Connects a mount the launcher makes, with this process's own credentials.
fn connect(mount: &Mount, dirs: &Dirs, guard: &Guard) -> io::Result<OwnedFd> {
    let fail = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("mount of {} at {}: connect: {e}", mount.server, mount.path),
        )
    };
    match &mount.server {
        Server::Unix(path) => {
            let fd = checked_unix_path(guard, path)?;
            // Through the checked handle, never the name again.
            let sock =
                UnixStream::connect(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(fail)?;
            Ok(sock.into())
        }
        Server::Tcp { host, port } => Ok(std::net::TcpStream::connect((host.as_str(), *port))
            .map_err(fail)?
            .into()),
        Server::Local(local) => Ok(UnixStream::connect(dirs.socket(local.name()))
            .map_err(fail)?
            .into()),
        // nsd makes it, with the grant, on mcpfs's control socket.
        Server::Mcp(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "mount of {} at {}: nsd makes its connection",
                mount.server, mount.path
            ),
        )),
    }
}

/// Asks nsd (on `<runtime>/ns.run`) to run `argv` confined by `spec`; returns once the command
/// has exec'd. `stdio`: the payload's stdin, stdout, stderr (ignored with a pty).
pub fn launch(
    dirs: &Dirs,
    spec: &Spec,
    argv: &[String],
    opts: &LaunchOptions,
    stdio: [BorrowedFd<'_>; 3],
) -> io::Result<Launched> {
    let mut guard = None;
    let mut connections = Vec::new();
    let mut conn_fds = Vec::new();
    for m in &spec.mounts {
        if launcher_connects(m, opts.operator) {
            let guard = match &guard {
                Some(g) => g,
                None => guard.insert(Guard::new(dirs)?),
            };
            conn_fds.push(connect(m, dirs, guard)?);
            connections.push(m.path.clone());
        }
    }
    let request = Request {
        version: VERSION,
        spec: spec.to_text(),
        argv: argv.to_vec(),
        env: {
            let mut values = env_values(spec)?;
            values.extend(opts.env_set.clone());
            values
        },
        pty: opts.pty,
        weaker_landlock: opts.weaker_landlock,
        uid: opts.uid,
        uid_from_bind: opts.uid_from_bind.clone(),
        bare: opts.bare,
        cwd: opts.cwd.clone(),
        operator: opts.operator,
        connections,
        client_asks: opts.client_asks,
    };
    let mut fds: Vec<BorrowedFd<'_>> = Vec::new();
    if opts.pty.is_none() {
        fds.extend(stdio);
    }
    fds.extend(conn_fds.iter().map(|f| f.as_fd()));
    open(dirs, &request, &fds, opts.pty.is_some())
}

/// Asks nsd to run `argv` inside the live namespace `id` (`warren attach`), confined as its
/// payload; returns once the command has exec'd. `pty`: a pty with this window size instead of
/// `stdio`.
pub fn attach(
    dirs: &Dirs,
    id: u64,
    argv: &[String],
    pty: Option<[u16; 4]>,
    stdio: [BorrowedFd<'_>; 3],
) -> io::Result<Launched> {
    let request = AttachRequest {
        version: VERSION,
        attach: id,
        argv: argv.to_vec(),
        // TERM and LANG: the namespace's `env` values were its own launcher's (docs/gaps.md).
        env: env_values(&Spec::default())?,
        pty,
    };
    let fds: &[BorrowedFd<'_>] = if pty.is_none() { &stdio } else { &[] };
    open(dirs, &request, fds, pty.is_some())
}

/// How long a launcher waits for nsd's `started` or `failed`: nsd's own setup deadline and a
/// margin for the connections it makes.
const STARTED_PATIENCE: std::time::Duration =
    crate::run::SETUP_DEADLINE.saturating_add(std::time::Duration::from_secs(30));

/// Connects to the run socket, sends the opening message with `fds`, and reads `started`.
fn open<T: serde::Serialize>(
    dirs: &Dirs,
    opening: &T,
    fds: &[BorrowedFd<'_>],
    pty: bool,
) -> io::Result<Launched> {
    open_at(&socket_path(dirs), opening, fds, pty, STARTED_PATIENCE)
}
