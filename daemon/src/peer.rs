//! Who is on the other end of a Unix socket, and whether it lives in our pid namespace.
//!
//! The pid namespace is read through the peer's pidfd (`SO_PEERPIDFD`, then the `NSpid` line of
//! its fdinfo), so a peer that exits and has its pid reused cannot be mistaken for another
//! process. Kernels without `SO_PEERPIDFD` fall back to `/proc/<pid>/status`, which has that race;
//! docs/gaps.md says so.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

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
    Ok(PeerCred {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
    })
}

fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(nix::sys::socket::getsockopt(
        &sock,
        nix::sys::socket::sockopt::PeerPidfd,
    )?)
}

/// The `NSpid:` line of a `/proc` status-like text: the process's pid in each pid namespace from
/// the reader's down to its own. One entry: the same pid namespace as the reader. None (or a pid
/// of 0): a namespace the reader cannot see into.
fn nspid_depth(text: &str) -> Option<usize> {
    let line = text.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<i64> = line
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if pids.is_empty() || pids.contains(&0) || pids.contains(&-1) {
        return None;
    }
    Some(pids.len())
}

/// Whether the peer of `sock` is a process in the same pid namespace as this one.
///
/// Read from the fdinfo of the peer's pidfd, which needs no access to the peer (a daemon under its
/// own uid may not ptrace-read its root peer) and cannot be fooled by pid reuse.
pub fn peer_in_own_pidns(sock: BorrowedFd<'_>) -> io::Result<bool> {
    let text = match peer_pidfd(sock) {
        Ok(pidfd) => fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?,
        Err(_) => {
            // Kernels before SO_PEERPIDFD: by pid, racy against pid reuse (docs/gaps.md). A pid
            // we cannot see is in another pid namespace (or gone).
            let pid = peer_cred(sock)?.pid;
            if pid <= 0 {
                return Ok(false);
            }
            match fs::read_to_string(format!("/proc/{pid}/status")) {
                Ok(t) => t,
                Err(_) => return Ok(false),
            }
        }
    };
    Ok(nspid_depth(&text) == Some(1))
}

/// The supplementary groups of a process, from `/proc/<pid>/status`.
pub fn groups_of(pid: i32) -> io::Result<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .ok_or_else(|| io::Error::other("no Groups line in /proc status"))?;
    Ok(line
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn nspid_depth_reads_the_line() {
        assert_eq!(nspid_depth("Pid:\t12\nNSpid:\t12\n"), Some(1));
        assert_eq!(nspid_depth("NSpid:\t12\t1\n"), Some(2));
        assert_eq!(nspid_depth("NSpid:\t0\n"), None);
        assert_eq!(nspid_depth("Pid:\t-1\nNSpid:\t-1\n"), None);
        assert_eq!(nspid_depth("Pid:\t3\n"), None);
    }

    #[test]
    fn a_peer_in_our_pid_namespace_is_ours() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(peer_in_own_pidns(a.as_fd()).unwrap());
    }

    /// The planted violation: a peer in a child pid namespace must be refused. `unshare -p -f`
    /// runs python as pid 1 of a new pid namespace (killed with unshare: `--kill-child`); it
    /// connects to a socket of ours.
    #[test]
    fn a_peer_in_a_child_pid_namespace_is_not() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "creating a pid namespace (CLONE_NEWPID) needs root (scripts/test runs as root)"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut child = std::process::Command::new("unshare")
            .args(["-p", "-f", "--kill-child", "--", "python3", "-c"])
            .arg(format!(
                "import socket,time; s=socket.socket(socket.AF_UNIX); s.connect({:?}); time.sleep(5)",
                path.to_str().unwrap()
            ))
            .spawn()
            .unwrap();
        let (conn, _) = listener.accept().unwrap();
        let ours = peer_in_own_pidns(conn.as_fd()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            !ours,
            "a peer in a child pid namespace was taken for one in ours"
        );
    }
}
