//! The launcher's side of the FUSE handoff: pid 1 makes each 9P `mount` a kernel FUSE mount
//! (`jail/src/fuse.rs`) and sends its fd here, which gives it to a [`MountServer`] (the bridge:
//! `warren_bridge::serve_fuse`).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::spec::Mount;

pub use warren_jail::fuse::SERVED;

/// Serves one FUSE mount of a namespace. The implementation owns the fd from here on (it runs
/// outside the sandbox); dropping the fd aborts the mount (ENOTCONN inside, never a hang).
pub trait MountServer: Send + Sync {
    fn serve(&self, mount: &Mount, fuse: OwnedFd) -> io::Result<()>;
}

/// One fd and its index (which mount, or 0 for the pty) over a handoff socket
/// (`warren_daemon::handoff`: length-prefixed record, fds as SCM_RIGHTS).
pub fn send_fd(sock: &UnixStream, index: u32, fd: BorrowedFd<'_>) -> io::Result<()> {
    warren_daemon::handoff::send(sock, &index.to_le_bytes(), &[fd])
}

/// In the launcher: one (index, fd) per call, as `send_fd` sent it; None at EOF.
pub fn recv_fd(sock: &UnixStream) -> io::Result<Option<(u32, OwnedFd)>> {
    let (record, mut fds) = match warren_daemon::handoff::recv(sock) {
        Ok(got) => got,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    let index: [u8; 4] = record
        .as_slice()
        .try_into()
        .map_err(|_| io::Error::other("fd handoff: bad record"))?;
    if fds.len() != 1 {
        return Err(io::Error::other("fd handoff: expected exactly one fd"));
    }
    Ok(Some((u32::from_le_bytes(index), fds.remove(0))))
}
