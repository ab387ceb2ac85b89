//! nsd's run socket: how `warren run` asks nsd to build a namespace and run a command in it,
//! so that the front door never holds CAP_SYS_ADMIN (docs/decisions.md D4, "nsd's run socket").
//!
//! One connection per namespace, on `<runtime>/ns.run` (operators only, as every operator
//! socket). Frames are `warren_daemon::handoff` records (4-byte length, JSON) with fds as
//! SCM_RIGHTS:
//!
//! 1. launcher → nsd: [`Request`], with fds: the payload's stdin, stdout, stderr (only when no
//!    pty is asked for), then one connected socket per name in `connections`, in order.
//! 2. nsd → launcher: [`Reply::Started`] (with the pty master when a pty was asked for) once
//!    the command has exec'd, or [`Reply::Failed`] (nothing runs).
//! 3. launcher → nsd: any number of [`Control`] messages (forwarded signals).
//! 4. nsd → launcher: [`Reply::Exited`] when the command has ended; then nsd closes.
//!
//! If the launcher's connection closes before the end, nsd kills the namespace (like ssh).
//! nsd parses the spec text itself; nothing the launcher sends is taken as already checked.
//!
//! The first message may instead be an [`AttachRequest`] (`warren attach`): a command inside a
//! live namespace, confined as its payload (`attach`); the rest of the exchange is the same, and
//! a launcher that goes away kills the attached command only.

pub mod attach;
pub mod client;

use std::path::PathBuf;

use warren_daemon::Dirs;

use crate::spec::{LocalServer, Mount, Server};

pub use warren_proto::launch::*;

/// `<runtime>/ns.run`.
pub fn socket_path(dirs: &Dirs) -> PathBuf {
    dirs.runtime.join(SOCKET_NAME)
}

/// Whether the launcher makes this mount's connection and hands it over with the request (a
/// peer's socket it can reach, or an operator's own gate, receipts or `/ns`); nsd makes the rest.
pub fn launcher_connects(mount: &Mount, operator: bool) -> bool {
    match mount.server {
        Server::Unix(_) | Server::Tcp { .. } => true,
        Server::Local(LocalServer::Tool | LocalServer::Llm) | Server::Mcp(_) => false,
        Server::Local(LocalServer::Gate) => operator,
        Server::Local(LocalServer::Receipts | LocalServer::Ns) => operator,
    }
}
