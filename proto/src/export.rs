//! The host-to-host link and nsd's export socket.
//!
//! - [`keys`]: a host's Ed25519 identity; [`peers`]: the peers file, who may connect and what
//!   each may mount; [`wire`]: the Noise XX handshake and the encrypted frames (both ends: nsd
//!   dials a peer for a namespace's `mount peer:`, exportfs accepts).
//! - `<runtime>/nsd-export.ctl`: how exportfs gets a peer's tree without ever choosing what it
//!   holds. exportfs sends one [`ExportRequest`] naming an authenticated peer and the tree it
//!   asked for ([`ask`]); nsd builds the grant from the peer's entry and answers `ok` with a
//!   connection, `dir` with a directory's handle, or `error: WHY` ([`answer`]).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub mod keys;
pub mod peers;
pub mod wire;

use peers::Peer;

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

/// What nsd answers: a 9P connection, or a directory for exportfs to serve.
pub enum Made {
    Connection(OwnedFd),
    Directory(OwnedFd),
}

/// exportfs's side: asks nsd (on its export socket `socket`) for `peer`'s `tree`.
pub fn ask(socket: &Path, peer: &Peer, tree: &str) -> io::Result<Made> {
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
