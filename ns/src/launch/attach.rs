//! `warren attach`: a command run inside a live namespace, confined exactly as the namespace's
//! payload (its uid, Landlock ruleset, capabilities, no_new_privs, seccomp filters, limits).
//!
//! nsd forks an *attacher* (`warren_jail::setup::attacher`): it joins the namespace through a
//! pidfd of the holder (never a pid), non-dumpable from the start, with every inherited fd
//! closed, then applies the namespace's confinement with the same function pid 1 uses
//! (`warren_jail::setup::lock_down`, from the same plan) and forks the command, which lands in
//! the namespace's pid namespace (a pid-namespace `setns` applies to children only). The
//! attacher stays outside that pid namespace, forwards signals to the command and exits with
//! its status; the command dies with it (PDEATHSIG) and, like everything in the namespace,
//! with the namespace's pid 1.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, Pid};
use warren_jail::setup::Identity;
use warren_jail::{init, process as sys};

use crate::confine::{self, Launch};
use crate::run::{
    PayloadStdio, Running, SETUP_DEADLINE, SetupErrors, collect_started, payload_env,
};
use crate::spec::Spec;

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
    let child_plan = confine::plan(
        spec,
        Launch {
            binds: Vec::new(),
            argv,
            env,
            identity: Identity::Fixed {
                uid: conf.uid,
                gid: conf.uid,
            },
            weaker_landlock: conf.weaker_landlock,
            err_pipe: err_write,
            stdio: plan.stdio.as_ref().map(|s| s.raw_fds()),
            fuse_sock: None,
            pty_sock: pty_child,
            pty_winsize: plan.pty.unwrap_or_default(),
            cgroup_dir: running.cgroup_dir().map(Into::into),
            rlimit_pids_mem: conf.rlimit_pids_mem,
            net_ns: None,
            cwd: crate::HOME.into(),
        },
    );
    let attacher = match sys::fork_process()? {
        ForkResult::Child => {
            drop(err_read);
            drop(pty_parent);
            warren_jail::setup::attacher(child_plan, holder)
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
