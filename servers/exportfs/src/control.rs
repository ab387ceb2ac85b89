//! nsd's export socket, `<runtime>/nsd-export.ctl`: how exportfs gets a peer's tree without
//! ever choosing what it holds.
//!
//! exportfs (its uid, or root) sends one [`ExportRequest`] naming an authenticated peer and the
//! tree it asked for; nsd reads the peers file itself, builds the grant record from the peer's
//! entry, hands one end of a socketpair with it to toolfs (as for a namespace's `mount tool`),
//! and answers `ok` with the other end, or `error: WHY`. So a compromised exportfs can get no
//! more than some peer's entry grants, and never talks to toolfs's root-only control socket.

use std::io;
use std::os::fd::AsFd;
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

/// exportfs's backend: asks nsd.
pub struct NsdBackend {
    pub socket: PathBuf,
}

impl crate::server::Backend for NsdBackend {
    fn connect(&self, peer: &Peer, tree: &str) -> Result<UnixStream, String> {
        ask(&self.socket, peer, tree).map_err(|e| e.to_string())
    }
}

fn ask(socket: &PathBuf, peer: &Peer, tree: &str) -> io::Result<UnixStream> {
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
    if reply == b"ok" && fds.len() == 1 {
        let fd = fds.pop().expect("one fd");
        return Ok(UnixStream::from(fd));
    }
    let text = String::from_utf8_lossy(&reply);
    Err(io::Error::other(
        text.strip_prefix("error: ").unwrap_or(&text).to_owned(),
    ))
}

/// nsd's answer on the export socket.
pub fn answer(sock: &UnixStream, result: Result<std::os::fd::OwnedFd, String>) -> io::Result<()> {
    match result {
        Ok(fd) => warren_daemon::handoff::send(sock, b"ok", &[fd.as_fd()]),
        Err(why) => warren_daemon::handoff::send(sock, format!("error: {why}").as_bytes(), &[]),
    }
}
