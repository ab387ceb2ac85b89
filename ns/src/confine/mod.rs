//! A spec, in the words warren-jail understands: what a namespace's payload (or a command
//! attached to it) is confined by. The steps themselves, and their order, are warren-jail's
//! (`jail/src/setup.rs`); this module only maps `Spec` onto a `warren_jail::setup::Plan`.
//!
//! The names inside every namespace (HOME, HOSTNAME, PAYLOAD_PATH) stay ns's: they are part of
//! what a spec means, and jail takes them as inputs ([`NAMES`]).

pub mod binds;
pub mod fuse;
pub mod guard;
pub mod limits;

use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use warren_jail::landlock::Network;
use warren_jail::setup::{self, Command, Identity, LockDown, Names, Pid1, Plan, Tree};

use crate::spec::{Access, Net, Spec};
use binds::PreparedBind;

pub use warren_jail::setup::SETUP_FAILED;

/// The names inside every namespace.
pub const NAMES: Names = Names {
    hostname: crate::HOSTNAME,
    home: crate::HOME,
    path: crate::PAYLOAD_PATH,
};

/// `net` as Landlock and the loopback step see it.
pub fn network(net: Net) -> Network {
    match net {
        Net::None => Network::None,
        Net::Loopback => Network::Loopback,
        Net::Proxy => Network::Proxy {
            port: crate::spec::PROXY_PORT,
        },
    }
}

/// The launcher-side facts of one namespace run that are not in its spec.
pub(crate) struct Launch {
    pub binds: Vec<PreparedBind>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub identity: Identity,
    pub weaker_landlock: bool,
    pub err_pipe: OwnedFd,
    pub stdio: Option<[RawFd; 3]>,
    pub fuse_sock: Option<UnixStream>,
    pub pty_sock: Option<UnixStream>,
    pub pty_winsize: [u16; 4],
    pub cgroup_dir: Option<PathBuf>,
    /// pids/mem via rlimits (no cgroup).
    pub rlimit_pids_mem: bool,
    pub net_ns: Option<OwnedFd>,
    /// The payload's working directory (HOME unless the launcher chose one).
    pub cwd: String,
}

/// The plan of `spec`'s payload (or, with no binds and `Pid1::Init` unused, of a command
/// attached to it: the same lock-down, limits and mounts).
pub(crate) fn plan(spec: &Spec, launch: Launch) -> Plan {
    let limits = &spec.limits;
    Plan {
        err_pipe: Some(launch.err_pipe),
        stdio: launch.stdio,
        die_with_launcher: true,
        cgroup_dir: launch.cgroup_dir,
        net_ns: launch.net_ns,
        network: network(spec.net()),
        tree: Tree {
            binds: launch.binds,
            user_dirs: Some(limits.mem),
            proc: true,
            // nsd's own mounts beneath /dev (no spec line may land there): their points, made
            // before /dev turns read-only.
            dev_points: spec
                .mounts
                .iter()
                .filter_map(|m| m.path.strip_prefix("/dev/"))
                .map(String::from)
                .collect(),
            fuse_mounts: spec.mounts.iter().map(|m| m.path.clone()).collect(),
        },
        fuse_sock: launch.fuse_sock,
        pty_sock: launch.pty_sock,
        pty_slave: None,
        pty_winsize: launch.pty_winsize,
        send_fd: fuse::send_fd,
        names: NAMES,
        identity: launch.identity,
        lock_down: LockDown {
            write: writable(spec),
            weaker_landlock: launch.weaker_landlock,
            seccomp: Default::default(),
        },
        limits: setup::Limits {
            pids: limits.pids.filter(|_| launch.rlimit_pids_mem),
            mem: limits.mem.filter(|_| launch.rlimit_pids_mem),
            cpu: limits.cpu,
            wall: limits.wall,
        },
        pid1: Pid1::Init,
        command: Command {
            argv: launch.argv,
            env: launch.env,
            program: None,
            cwd: launch.cwd,
            pass: Vec::new(),
            open_in_root: Vec::new(),
        },
    }
}

/// Where a payload may write: its scratch dirs and its `-w` binds.
fn writable(spec: &Spec) -> Vec<String> {
    let mut write: Vec<String> = vec!["/tmp".into(), crate::HOME.into(), "/dev/shm".into()];
    write.extend(
        spec.binds
            .iter()
            .filter(|b| b.access == Access::Write)
            .map(|b| b.path.clone()),
    );
    write
}
