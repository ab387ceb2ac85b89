//! nsd's export socket, `<runtime>/nsd-export.ctl`: how exportfs gets a peer's tree without
//! ever choosing what it holds (the records: `warren_proto::export`).
//!
//! exportfs (its uid, or root) sends one [`ExportRequest`] naming an authenticated peer and the
//! tree it asked for; nsd reads the peers file itself, builds the grant record from the peer's
//! entry, hands one end of a socketpair with it to toolfs (as for a namespace's `mount tool`),
//! and answers `ok` with the other end; for a `dir:` tree it opens the directory itself and
//! answers `dir` with its handle, which exportfs serves read-only (`crate::dir`); or `error: WHY`.
//! So a compromised exportfs can get no more than some peer's entry grants, and never talks to
//! toolfs's root-only control socket.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

pub use warren_proto::export::{CONTROL, ExportRequest, Made, REQUEST_VERSION, answer, ask};

use crate::peers::Peer;

/// exportfs's backend: asks nsd; serves a directory nsd hands over on `runtime`.
pub struct NsdBackend {
    pub socket: PathBuf,
    pub runtime: tokio::runtime::Handle,
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
