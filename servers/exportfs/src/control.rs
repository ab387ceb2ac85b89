//! nsd's export socket, `<runtime>/nsd-export.ctl`: how exportfs gets a peer's tree without
//! ever choosing what it holds.
//!
//! exportfs (its uid, or root) sends one [`ExportRequest`] naming an authenticated peer and the
//! tree it asked for; nsd reads the peers file itself, builds the grant record from the peer's
//! entry, hands one end of a socketpair with it to toolfs (as for a namespace's `mount tool`),
//! and answers `ok` with the other end; for a `dir:` tree it opens the directory itself and
//! answers `dir` with its handle, which exportfs serves read-only (`crate::dir`); or `error: WHY`.
//! So a compromised exportfs can get no more than some peer's entry grants, and never talks to
//! toolfs's root-only control socket.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::peers::Peer;

/// The socket's name: `<runtime>/nsd-export.ctl`.
pub const CONTROL: &str = "nsd-export";
pub const REQUEST_VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub version: u32,
    /// The peer's name in the peers file, and the key it authenticated with.
    pub peer: String,
    pub key: String,
    pub tree: String,
}

/// exportfs's backend: asks nsd; serves a directory nsd hands over on `runtime`.
pub struct NsdBackend {
    pub socket: PathBuf,
    pub runtime: tokio::runtime::Handle,
}

/// What nsd answers: a 9P connection, or a directory for exportfs to serve.
pub enum Made {
    Connection(OwnedFd),
    Directory(OwnedFd),
}

impl crate::server::Backend for NsdBackend {
    fn connect(&self, peer: &Peer, tree: &str) -> Result<UnixStream, String> {
        match ask(&self.socket, peer, tree).map_err(|e| e.to_string())? {
            Made::Connection(fd) => Ok(UnixStream::from(fd)),
            Made::Directory(dir) => serve_dir(&self.runtime, dir).map_err(|e| e.to_string()),
        }
    }
}

/// A 9P connection to `dir` served read-only on `runtime`.
pub fn serve_dir(runtime: &tokio::runtime::Handle, dir: OwnedFd) -> io::Result<UnixStream> {
    let (ours, theirs) = UnixStream::pair()?;
    let tree = std::sync::Arc::new(crate::dir::ReadOnlyDir::new(dir));
    runtime.spawn(async move {
        if let Err(e) = warren_9p::serve_fd(tree, theirs.into(), warren_9p::Limits::default()).await
        {
            tracing::debug!("a directory's connection ended: {e}");
        }
    });
    Ok(ours)
}

fn ask(socket: &PathBuf, peer: &Peer, tree: &str) -> io::Result<Made> {
    let sock = UnixStream::connect(socket)
        .map_err(|e| io::Error::new(e.kind(), format!("connect {}: {e}", socket.display())))?;
    sock.set_read_timeout(Some(warren_daemon::handoff::REPLY_TIMEOUT))?;
    let record = serde_json::to_vec(&ExportRequest {
        version: REQUEST_VERSION,
        peer: peer.name.clone(),
        key: peer.key.to_string(),
        tree: tree.to_owned(),
    })?;
    warren_daemon::handoff::send(&sock, &record, &[])?;
    let (reply, mut fds) = warren_daemon::handoff::recv(&sock)?;
    if fds.len() == 1 && (reply == b"ok" || reply == b"dir") {
        let fd = fds.pop().expect("one fd");
        return Ok(if reply == b"ok" {
            Made::Connection(fd)
        } else {
            Made::Directory(fd)
        });
    }
    let text = String::from_utf8_lossy(&reply);
    Err(io::Error::other(
        text.strip_prefix("error: ").unwrap_or(&text).to_owned(),
    ))
}

/// nsd's answer on the export socket.
pub fn answer(sock: &UnixStream, result: Result<Made, String>) -> io::Result<()> {
    match result {
        Ok(Made::Connection(fd)) => warren_daemon::handoff::send(sock, b"ok", &[fd.as_fd()]),
        Ok(Made::Directory(fd)) => warren_daemon::handoff::send(sock, b"dir", &[fd.as_fd()]),
        Err(why) => warren_daemon::handoff::send(sock, format!("error: {why}").as_bytes(), &[]),
    }
}
