//! The operator's sockets: `<runtime>/<server>.sock`, for the operator alone.
//!
//! The file mode keeps other users out; on top of it, a peer whose pid namespace is not ours is
//! refused whatever its uid (a confined process that somehow reached the socket), and so is a peer
//! that is neither root, nor this daemon's own uid, nor a member of the operator group.

use std::io;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use tokio::net::UnixListener;
use warren_9p::{FileTree, Limits};

use crate::accept::next_peer;
use crate::peer::{PeerCred, groups_of, peer_cred};

/// The environment variable through which a supervisor hands a daemon sockets it bound for it:
/// `name=fd[,name=fd…]`, `name` being the socket's file name (`tool.sock`). The supervisor binds
/// as root in the root-owned runtime dir, so the daemon can run under its own uid from its first
/// instruction.
pub const LISTEN_FDS_ENV: &str = "WARREN_LISTEN_FDS";

/// The listening socket for `path`: the one the supervisor handed over (see [`LISTEN_FDS_ENV`]),
/// else a fresh bind (removing a stale socket left by a dead daemon), mode 0660.
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    if let Some(fd) = inherited_listener(path) {
        // The supervisor passed this fd for exactly this socket; the env entry is consumed once
        // per name by the daemon's startup.
        let std_listener =
            std::os::unix::net::UnixListener::from(warren_jail::inherited::take(fd)?);
        std_listener.set_nonblocking(true)?;
        return UnixListener::from_std(std_listener);
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is served by a live daemon", path.display()),
            ));
        }
        Err(_) if path.exists() => std::fs::remove_file(path)?,
        Err(_) => {}
    }
    let std_listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    std_listener.set_nonblocking(true)?;
    UnixListener::from_std(std_listener)
}

fn inherited_listener(path: &Path) -> Option<RawFd> {
    let name = path.file_name()?.to_str()?;
    let spec = std::env::var(LISTEN_FDS_ENV).ok()?;
    let fd: RawFd = spec
        .split(',')
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('=')?.parse().ok())?;
    // Only a listening Unix socket counts; anything else means the env is stale.
    let is_listener = warren_jail::inherited::inspect(fd, |fd| {
        nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::AcceptConn)
    })
    .is_ok_and(|r| r.unwrap_or(false));
    is_listener.then_some(fd)
}

/// Who may attach as the operator.
#[derive(Clone, Debug)]
pub struct OperatorPolicy {
    /// Members of this group are operators (root always is).
    pub operator_gid: Option<u32>,
}

impl OperatorPolicy {
    /// The `warren` group if the host has one.
    pub fn from_host() -> OperatorPolicy {
        let gid = nix::unistd::Group::from_name("warren")
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw());
        OperatorPolicy { operator_gid: gid }
    }

    /// Why a peer is not the operator, or `None` if it is.
    pub fn refusal(&self, sock: &tokio::net::UnixStream) -> Option<String> {
        crate::accept::refusal(sock.as_fd(), |cred| {
            if cred.uid == 0 || cred.uid == nix::unistd::geteuid().as_raw() {
                return None;
            }
            if let Some(gid) = self.operator_gid
                && (cred.gid == gid || groups_of(cred.pid).is_ok_and(|g| g.contains(&gid)))
            {
                return None;
            }
            Some(format!("uid {} is not an operator", cred.uid))
        })
    }
}

/// Accepts operator connections forever, serving each with the tree `make` builds for that peer;
/// `make` may refuse a peer by returning `None`. Refused peers are logged and dropped.
pub async fn accept_loop<T, F>(
    listener: UnixListener,
    policy: OperatorPolicy,
    make: F,
    limits: Limits,
) where
    T: FileTree,
    F: Fn(PeerCred) -> Option<Arc<T>>,
{
    loop {
        let sock = next_peer(&listener, "operator socket", |s| policy.refusal(s)).await;
        let Ok(cred) = peer_cred(sock.as_fd()) else {
            continue;
        };
        let Some(tree) = make(cred) else {
            tracing::warn!(
                "operator socket: no tree for pid {} uid {}",
                cred.pid,
                cred.uid
            );
            continue;
        };
        let limits = limits.clone();
        tokio::spawn(async move {
            if let Err(e) = warren_9p::serve(tree, sock, limits).await {
                tracing::info!("operator connection ended: {e}");
            }
        });
    }
}
