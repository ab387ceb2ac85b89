//! Step 3: each 9P `mount` becomes a kernel FUSE mount inside the namespace. pid 1 opens
//! /dev/fuse, creates the `fuse` filesystem on that fd (fd=N, rootmode=40000, user_id=0,
//! group_id=0, allow_other — no default_permissions: the server decides), attaches it at the
//! target before pivot_root and Landlock, and hands the fd to the launcher over a socketpair
//! (SCM_RIGHTS), which gives it to a [`MountServer`] (the bridge: `warren_bridge::serve_fuse`).

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::binds::make_target;
use super::sys::{self, Dir};
use crate::spec::Mount;

/// Serves one FUSE mount of a namespace. The implementation owns the fd from here on (it runs
/// outside the sandbox); dropping the fd aborts the mount (ENOTCONN inside, never a hang).
pub trait MountServer: Send + Sync {
    fn serve(&self, mount: &Mount, fuse: OwnedFd) -> io::Result<()>;
}

/// Inside, before pivot_root: create and attach the FUSE mount, send its fd out. Returns an
/// O_PATH fd of the mounted FUSE root for its Landlock rule (never stat it: every stat waits for
/// the bridge).
pub fn mount_and_send(
    root: &OwnedFd,
    index: u32,
    mount: &Mount,
    sock: &UnixStream,
) -> Result<OwnedFd, String> {
    let dev = sys::openat2(
        Dir::Cwd,
        "/dev/fuse",
        libc::O_RDWR,
        0,
        libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| format!("/dev/fuse: {e}"))?;
    let fd = dev.as_raw_fd().to_string();
    let fs = sys::new_fs(
        "fuse",
        &[
            ("fd", &fd),
            ("rootmode", "40000"),
            ("user_id", "0"),
            ("group_id", "0"),
            ("allow_other", ""),
        ],
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
    )
    .map_err(|e| format!("fuse for {}: {e}", mount.path))?;
    let target =
        make_target(root, &mount.path, true).map_err(|e| format!("target {}: {e}", mount.path))?;
    sys::move_mount(fs.as_fd(), target.as_fd())
        .map_err(|e| format!("attaching fuse at {}: {e}", mount.path))?;
    send_fd(sock, index, dev.as_fd()).map_err(|e| format!("handing off fuse fd: {e}"))?;
    // The FUSE root itself, for its Landlock rule.
    open_mount_root(root.as_fd(), &mount.path)
}

/// An O_PATH fd of the 9P mount at `path` beneath `root`, for its Landlock rule (an O_PATH open
/// of a FUSE root sends no request).
pub fn open_mount_root(root: BorrowedFd<'_>, path: &str) -> Result<OwnedFd, String> {
    sys::openat2(
        Dir::Fd(root),
        path.trim_start_matches('/'),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
    )
    .map_err(|e| format!("reopening the mount at {path}: {e}"))
}

/// After the last FUSE fd: tells the launcher there are no more (EOF) and waits for its word
/// that every mount is served. Anything else — the launcher could not hand a connection over,
/// refused a mount, died — fails the setup, so the command never starts with a mount unserved.
pub fn await_served(sock: &UnixStream) -> Result<(), String> {
    sock.shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("fuse handoff: {e}"))?;
    let mut ack = [0u8; 1];
    match (&mut &*sock).read(&mut ack) {
        Ok(1) if ack == SERVED => Ok(()),
        _ => Err("the launcher did not serve this namespace's 9P mounts".into()),
    }
}

/// The launcher's word that every FUSE mount is served.
pub const SERVED: [u8; 1] = [1];

/// One fd and its index (which mount, or 0 for the pty) over a handoff socket
/// (`warren_daemon::handoff`: length-prefixed record, fds as SCM_RIGHTS).
pub(crate) fn send_fd(sock: &UnixStream, index: u32, fd: BorrowedFd<'_>) -> io::Result<()> {
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
