//! A [`Plan`]: everything the confinement sequence (`crate::setup`) needs, in plain terms —
//! no spec language. The launcher fills it in before the fork.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use crate::binds::PreparedBind;
use crate::fuse::SendFd;
use crate::landlock::Network;
use crate::seccomp::Relaxed;

/// Who the confined process runs as.
#[derive(Clone, Copy, Debug)]
pub enum Identity {
    /// This uid, and this gid.
    Fixed { uid: u32, gid: u32 },
    /// `base` + the holder's host pid (unique while the namespace lives), as uid and gid.
    HolderPid { base: u32 },
}

/// The mount tree pid 1 builds on a fresh tmpfs root.
#[derive(Default)]
pub struct Tree {
    /// Prepared in the launcher, attached parents first.
    pub binds: Vec<PreparedBind>,
    /// A tmpfs /tmp and home (this size; 256m when `None`) and /etc's passwd, group, hosts and
    /// hostname.
    pub user_dirs: Option<Option<u64>>,
    /// A fresh /proc for the new pid namespace.
    pub proc: bool,
    /// Empty directories in /dev for the launcher's own mounts there.
    pub dev_points: Vec<String>,
    /// FUSE mount points, in order: each fd goes out over [`Plan::fuse_sock`].
    pub fuse_mounts: Vec<String>,
}

/// Names inside the namespace.
#[derive(Clone, Copy, Debug)]
pub struct Names {
    pub hostname: &'static str,
    /// The payload's home directory.
    pub home: &'static str,
    /// Where a command without a `/` is looked for.
    pub path: &'static str,
}

/// Resource limits set by rlimit in the command's process (a cgroup, when there is one, is
/// the launcher's: [`Plan::cgroup_dir`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// RLIMIT_NPROC (per uid: each namespace has its own).
    pub pids: Option<u64>,
    /// RLIMIT_AS, bytes.
    pub mem: Option<u64>,
    /// RLIMIT_CPU, seconds.
    pub cpu: Option<u64>,
    /// Wall-clock seconds, then SIGKILL from pid 1 (a namespace's payload only).
    pub wall: Option<u64>,
}

/// The lock-down's inputs beyond the identity: Landlock's view and seccomp's relaxations.
pub struct LockDown {
    /// Paths (in the new root) the process may write beneath; everything else is read-only.
    pub write: Vec<String>,
    pub weaker_landlock: bool,
    pub seccomp: Relaxed,
}

/// How the holder waits.
pub enum Wait {
    /// For pid 1, forwarding signals (a namespace).
    Supervise,
    /// For pid 1 or this fd to close (a tool worker: toolfs holds the other end).
    Lifeline(OwnedFd),
}

/// What pid 1 does once locked down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pid1 {
    /// Forks the command and becomes its init (a namespace).
    Init,
    /// Execs the command itself (a tool worker).
    Exec,
}

/// The command at the end of the sequence.
pub struct Command {
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// The binary; `None`: `argv[0]`, looked for in [`Names::path`] unless it has a `/`.
    pub program: Option<CString>,
    /// The command's working directory, inside the namespace.
    pub cwd: String,
    /// Handles the command gets across the exec, their numbers appended to `argv`: these, then
    /// each of `open_in_root` (a directory, opened after pivot_root without following symlinks).
    pub pass: Vec<OwnedFd>,
    pub open_in_root: Vec<String>,
}

/// Everything the forked processes need, prepared by the launcher.
pub struct Plan {
    /// Setup errors go here; `None` once this process's copy is closed.
    pub err_pipe: Option<OwnedFd>,
    /// Descriptors (open in the launcher, inherited) to become the command's 0, 1, 2.
    pub stdio: Option<[RawFd; 3]>,
    /// Kill the holder when the launcher dies.
    pub die_with_launcher: bool,
    /// A cgroup to join before unsharing.
    pub cgroup_dir: Option<PathBuf>,
    /// A network namespace to join instead of a fresh one (with the egress proxy's listener).
    pub net_ns: Option<OwnedFd>,
    pub network: Network,
    pub tree: Tree,
    /// Where pid 1 sends the FUSE fds of [`Tree::fuse_mounts`] (and waits for "served").
    pub fuse_sock: Option<UnixStream>,
    /// Where pid 1 sends the master of the namespace's own pty.
    pub pty_sock: Option<UnixStream>,
    /// The pty's slave, set in pid 1, made the command's controlling terminal and stdio.
    pub pty_slave: Option<OwnedFd>,
    /// The launcher terminal's window size, given to the pty before the command starts.
    pub pty_winsize: [u16; 4],
    /// The launcher's record format for the FUSE and pty handoffs.
    pub send_fd: SendFd,
    pub names: Names,
    pub identity: Identity,
    pub lock_down: LockDown,
    pub limits: Limits,
    pub pid1: Pid1,
    pub command: Command,
}

impl Plan {
    /// The descriptors the plan itself holds: kept when everything else inherited is closed.
    pub(crate) fn own_fds(&self) -> Vec<RawFd> {
        let mut keep: Vec<RawFd> = vec![0, 1, 2];
        keep.extend(self.err_pipe.as_ref().map(|f| f.as_raw_fd()));
        keep.extend(self.net_ns.as_ref().map(|f| f.as_raw_fd()));
        keep.extend(self.fuse_sock.as_ref().map(|s| s.as_raw_fd()));
        keep.extend(self.pty_sock.as_ref().map(|s| s.as_raw_fd()));
        keep.extend(self.tree.binds.iter().map(|b| b.tree.as_raw_fd()));
        keep.extend(self.command.pass.iter().map(|f| f.as_raw_fd()));
        keep
    }
}
