//! `warren attach`: a command run inside a live namespace, confined exactly as the namespace's
//! payload (its uid, Landlock ruleset, capabilities, no_new_privs, seccomp filters, limits).
//!
//! nsd forks an *attacher*: it joins the namespace through a pidfd of the holder (never a pid),
//! non-dumpable from the start, with every inherited fd closed (`close_range`), then applies the
//! namespace's confinement with the same function pid 1 uses (`confine::lock_down`) and forks
//! the command, which lands in the namespace's pid namespace (a pid-namespace `setns` applies to
//! children only). The attacher stays outside that pid namespace, forwards signals to the
//! command and exits with its status; the command dies with it (PDEATHSIG) and, like everything
//! in the namespace, with the namespace's pid 1.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, Pid};

use crate::confine::fuse::open_mount_root;
use crate::confine::{self, Plan, SETUP_FAILED, fail, init, sys};
use crate::run::{
    PayloadStdio, Running, SETUP_DEADLINE, SetupErrors, collect_started, payload_env,
};
use crate::spec::Spec;

/// The namespaces joined through the holder's pidfd in one atomic `setns`. The pid namespace is
/// not among them: the holder's own is the host's; its children's comes from
/// `PIDFD_GET_PID_FOR_CHILDREN_NAMESPACE`.
const JOINED: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP);

/// What to run and with what stdio.
pub struct AttachPlan<'a> {
    pub argv: &'a [String],
    /// Values for TERM, LANG and the spec's `env` names (the attaching launcher's).
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// The command's stdin, stdout, stderr; `None` with a pty.
    pub stdio: Option<PayloadStdio>,
    /// A pty of the namespace's own devpts with this window size.
    pub pty: Option<[u16; 4]>,
}

/// A command running attached to a namespace.
#[derive(Debug)]
pub struct Attached {
    attacher: Pid,
    attacher_fd: OwnedFd,
    pty_master: Option<OwnedFd>,
}

impl Attached {
    /// The pty's master (nsd hands it to the launcher and keeps no copy).
    pub fn take_pty_master(&mut self) -> Option<OwnedFd> {
        self.pty_master.take()
    }

    /// Forwards `signal` to the command (through the attacher, by pidfd).
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        sys::pidfd_signal(self.attacher_fd.as_fd(), signal as i32)
    }

    /// SIGKILLs the attacher; the command follows (PDEATHSIG). The namespace lives on.
    pub fn kill(&self) -> io::Result<()> {
        sys::pidfd_signal(self.attacher_fd.as_fd(), libc::SIGKILL)
    }

    /// The command's exit status (128+N for signal N). Call once.
    pub fn wait(&self) -> io::Result<i32> {
        init::wait_exit_code(self.attacher)
    }
}

/// Starts `plan.argv` inside the namespace `running` holds, confined by `spec` (the one it was
/// built from) exactly as its payload; returns once the command has exec'd.
pub fn attach(running: &Running, spec: &Spec, plan: AttachPlan<'_>) -> io::Result<Attached> {
    if plan.argv.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command to run",
        ));
    }
    let holder = running.holder_pidfd()?;
    // Refuse a namespace that has ended (its holder gone or a zombie with no namespaces left).
    sys::pidfd_signal(holder.as_fd(), 0)
        .map_err(|e| io::Error::new(e.kind(), format!("the namespace has ended: {e}")))?;
    let argv = plan
        .argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in an argument"))?;
    let env = payload_env(spec, Some(plan.env))?;
    let conf = running.confinement();
    let (err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (pty_parent, pty_child) = match plan.pty {
        Some(_) => {
            let (a, b) = UnixStream::pair()?;
            (Some(a), Some(b))
        }
        None => (None, None),
    };
    let child_plan = Plan {
        spec: spec.clone(),
        binds: Vec::new(),
        argv,
        env,
        uid: Some(conf.uid),
        uid_base: conf.uid_base,
        weaker_landlock: conf.weaker_landlock,
        err_pipe: Some(err_write),
        fuse_sock: None,
        net_ns: None,
        stdio: plan.stdio.as_ref().map(|s| {
            [
                s.stdin.as_raw_fd(),
                s.stdout.as_raw_fd(),
                s.stderr.as_raw_fd(),
            ]
        }),
        pty_sock: pty_child,
        pty_slave: None,
        pty_winsize: plan.pty.unwrap_or_default(),
        cgroup_dir: running.cgroup_dir().map(Into::into),
        rlimit_pids_mem: conf.rlimit_pids_mem,
    };
    let attacher = match sys::fork_process()? {
        ForkResult::Child => {
            drop(err_read);
            drop(pty_parent);
            attacher(child_plan, holder)
        }
        ForkResult::Parent { child } => child,
    };
    drop(child_plan);
    drop(holder);
    drop(plan.stdio);
    let (attacher_fd, pty_master) = collect_started(
        attacher,
        Ok(()),
        pty_parent,
        SetupErrors::drain(err_read),
        Instant::now() + SETUP_DEADLINE,
    )?;
    Ok(Attached {
        attacher,
        attacher_fd,
        pty_master,
    })
}

/// The attacher (a forked child of nsd): join, confine, fork the command, forward signals,
/// exit with its status. Never returns.
fn attacher(mut plan: Plan, holder: OwnedFd) -> ! {
    // Nothing in the namespace may ptrace or read the memory of this still-privileged process.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        fail(&plan.err_pipe, &format!("non-dumpable: {e}"), SETUP_FAILED);
    }
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // A session of its own: terminal signals reach only the launcher, which forwards them.
    let _ = nix::unistd::setsid();
    match join(&mut plan, holder) {
        Ok(()) => {}
        Err(m) => fail(&plan.err_pipe, &m, SETUP_FAILED),
    }
    if let Err(m) = init::block_signals() {
        fail(&plan.err_pipe, &m, SETUP_FAILED);
    }
    match sys::fork_process() {
        Ok(ForkResult::Child) => {
            // The attacher is outside this pid namespace (getppid says 0); if it is already
            // gone, the PDEATHSIG came too late: leave.
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            if nix::unistd::getppid().as_raw() != 0 {
                sys::exit_now(SETUP_FAILED);
            }
            confine::payload(&plan)
        }
        Ok(ForkResult::Parent { child }) => {
            // Our copies must close: the launcher sees EOF at the command's exec, and the relay
            // ends with the command.
            plan.err_pipe = None;
            plan.pty_slave = None;
            sys::exit_now(init::supervise(child, None, false))
        }
        Err(e) => fail(&plan.err_pipe, &format!("fork: {e}"), SETUP_FAILED),
    }
}

/// In the attacher: stdio, `close_range`, cgroup, `setns` through the holder's pidfd, `chdir /`,
/// the pty, then the namespace's own confinement.
fn join(plan: &mut Plan, holder: OwnedFd) -> Result<(), String> {
    if let Some(fds) = plan.stdio {
        for (target, fd) in fds.into_iter().enumerate() {
            sys::dup_onto(fd, target as RawFd).map_err(|e| format!("stdio: {e}"))?;
        }
    }
    let mut keep: Vec<RawFd> = vec![0, 1, 2, holder.as_raw_fd()];
    keep.extend(plan.err_pipe.as_ref().map(|f| f.as_raw_fd()));
    keep.extend(plan.pty_sock.as_ref().map(|s| s.as_raw_fd()));
    sys::close_all_but(&keep).map_err(|e| format!("close_range: {e}"))?;
    if let Some(dir) = &plan.cgroup_dir {
        std::fs::write(dir.join("cgroup.procs"), "0")
            .map_err(|e| format!("joining cgroup {}: {e}", dir.display()))?;
    }
    let pid_ns = sys::pidfd_namespace(holder.as_fd(), sys::PIDFD_GET_PID_FOR_CHILDREN_NAMESPACE)
        .map_err(|e| format!("the namespace's pid namespace: {e}"))?;
    let mut flags = JOINED;
    if joins_a_user_namespace(&holder)? {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    nix::sched::setns(&holder, flags).map_err(|e| format!("setns through the holder: {e}"))?;
    nix::sched::setns(&pid_ns, CloneFlags::CLONE_NEWPID)
        .map_err(|e| format!("setns pid namespace: {e}"))?;
    drop(pid_ns);
    drop(holder);
    // setns(mnt) moved root and cwd to the namespace's root; say so explicitly.
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    let uid = plan.uid.ok_or("no payload uid")?;
    if let Some(sock) = plan.pty_sock.take() {
        plan.pty_slave = Some(confine::open_pty(&sock, uid, plan.pty_winsize)?);
    }
    let root = std::fs::File::open("/").map_err(|e| format!("opening /: {e}"))?;
    let mount_points = plan
        .spec
        .mounts
        .iter()
        .map(|m| open_mount_root(root.as_fd(), &m.path))
        .collect::<Result<Vec<_>, _>>()?;
    drop(root);
    confine::lock_down(&plan.spec, uid, mount_points, plan.weaker_landlock)
}

/// Whether the holder is in a user namespace other than ours (warren's namespaces have none
/// today; joining one first would be required if they did).
fn joins_a_user_namespace(holder: &OwnedFd) -> Result<bool, String> {
    let theirs = sys::pidfd_namespace(holder.as_fd(), sys::PIDFD_GET_USER_NAMESPACE)
        .map_err(|e| format!("the namespace's user namespace: {e}"))?;
    let theirs = std::fs::File::from(theirs)
        .metadata()
        .map_err(|e| format!("stat user namespace: {e}"))?;
    let ours = std::fs::metadata("/proc/self/ns/user")
        .map_err(|e| format!("stat /proc/self/ns/user: {e}"))?;
    Ok((theirs.dev(), theirs.ino()) != (ours.dev(), ours.ino()))
}
