//! Step 3: each 9P `mount` becomes a kernel FUSE mount inside the namespace. pid 1 opens
//! /dev/fuse, creates the `fuse` filesystem on that fd (fd=N, rootmode=40000, user_id=0,
//! group_id=0, allow_other — no default_permissions: the server decides), attaches it at the
//! target before pivot_root and Landlock, and hands the fd to the launcher over a socketpair
//! (SCM_RIGHTS, through the launcher's [`SendFd`]), which serves it (the bridge).

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::mount_api;
use crate::mounts::make_target;
use crate::openat2::{Dir, openat2};

/// How one fd and its index (which mount, or 0 for the pty) cross a handoff socket: the
/// launcher's record format, given to the plan, so this crate does not define a wire format.
pub type SendFd = fn(&UnixStream, u32, BorrowedFd<'_>) -> io::Result<()>;

/// Inside, before pivot_root: create and attach the FUSE mount at `path`, send its fd out.
/// Returns an O_PATH fd of the mounted FUSE root for its Landlock rule (never stat it: every
/// stat waits for the bridge).
pub fn mount_and_send(
    root: &OwnedFd,
    index: u32,
    path: &str,
    sock: &UnixStream,
    send: SendFd,
) -> Result<OwnedFd, String> {
    let dev = openat2(
        Dir::Cwd,
        "/dev/fuse",
        libc::O_RDWR,
        0,
        libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| format!("/dev/fuse: {e}"))?;
    let fd = dev.as_raw_fd().to_string();
    let fs = mount_api::new_fs(
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
    .map_err(|e| format!("fuse for {path}: {e}"))?;
    let target = make_target(root, path, true).map_err(|e| format!("target {path}: {e}"))?;
    mount_api::move_mount(fs.as_fd(), target.as_fd())
        .map_err(|e| format!("attaching fuse at {path}: {e}"))?;
    send(sock, index, dev.as_fd()).map_err(|e| format!("handing off fuse fd: {e}"))?;
    // The FUSE root itself, for its Landlock rule.
    open_mount_root(root.as_fd(), path)
}

/// An O_PATH fd of the 9P mount at `path` beneath `root`, for its Landlock rule (an O_PATH open
/// of a FUSE root sends no request).
pub fn open_mount_root(root: BorrowedFd<'_>, path: &str) -> Result<OwnedFd, String> {
    openat2(
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
