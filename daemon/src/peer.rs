//! Who is on the other end of a Unix socket, and whether it lives in our pid namespace.
//!
//! The pid namespace is read through the peer's pidfd (`SO_PEERPIDFD`, then
//! `PIDFD_GET_PID_NAMESPACE`), so a peer that exits and has its pid reused cannot be mistaken for
//! another process. Kernels without those fall back to `/proc/<pid>/ns/pid`, which has that race;
//! docs/gaps.md says so.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// The credentials the kernel recorded for a socket's peer when it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<PeerCred> {
    let cred = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok(PeerCred { pid: cred.pid(), uid: cred.uid(), gid: cred.gid() })
}

const SO_PEERPIDFD: libc::c_int = 77;
// linux/pidfd.h: _IO(PIDFS_IOCTL_MAGIC = 0xFF, 5)
const PIDFD_GET_PID_NAMESPACE: libc::c_ulong = 0xFF05;

fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a c_int we own.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new pidfd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidns_of_pidfd(pidfd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: the ioctl takes no argument and returns a new fd or -1.
    let ns = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_PID_NAMESPACE as _, 0) };
    if ns < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel just gave us.
    let ns = unsafe { OwnedFd::from_raw_fd(ns) };
    let st = nix::sys::stat::fstat(ns.as_fd())?;
    Ok((st.st_dev, st.st_ino))
}

fn own_pidns() -> io::Result<(u64, u64)> {
    let m = fs::metadata("/proc/self/ns/pid")?;
    Ok((m.dev(), m.ino()))
}

/// Whether the peer of `sock` is a process in the same pid namespace as this one.
pub fn peer_in_own_pidns(sock: BorrowedFd<'_>) -> io::Result<bool> {
    let ours = own_pidns()?;
    match peer_pidfd(sock).and_then(|pidfd| pidns_of_pidfd(pidfd.as_fd())) {
        Ok(theirs) => Ok(theirs == ours),
        Err(_) => {
            // Older kernels: by pid, racy against pid reuse (docs/gaps.md).
            let pid = peer_cred(sock)?.pid;
            let m = fs::metadata(format!("/proc/{pid}/ns/pid"));
            match m {
                Ok(m) => Ok((m.dev(), m.ino()) == ours),
                // A pid we cannot see is in another pid namespace (or gone).
                Err(_) => Ok(false),
            }
        }
    }
}

/// The supplementary groups of a process, from `/proc/<pid>/status`.
pub fn groups_of(pid: i32) -> io::Result<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .ok_or_else(|| io::Error::other("no Groups line in /proc status"))?;
    Ok(line.split_whitespace().filter_map(|g| g.parse().ok()).collect())
}
