//! What a child started with [`std::process::Command`] does between its fork and its exec: the
//! only `pre_exec` in warren. The steps run in a fixed order — signals, session, inherited fds,
//! privilege drop, no_new_privs — each one only if asked for.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};

use crate::fds::keep_across_exec;
use crate::privilege::{Identity, drop_to};

/// The steps a child takes before its exec; [`BeforeExec::install`] puts them on a `Command`.
#[derive(Clone, Debug, Default)]
pub struct BeforeExec {
    default_signals: bool,
    new_session: bool,
    keep_fds: Vec<RawFd>,
    identity: Option<Identity>,
    no_new_privs: bool,
}

impl BeforeExec {
    pub fn new() -> BeforeExec {
        BeforeExec::default()
    }

    /// Every signal at its default disposition and none blocked: a child inherits the mask across
    /// exec, and one started from a thread that blocks signals for a signalfd would never see
    /// them.
    pub fn default_signals(mut self) -> BeforeExec {
        self.default_signals = true;
        self
    }

    /// setsid: a session (and process group) of its own, with no controlling terminal.
    pub fn new_session(mut self) -> BeforeExec {
        self.new_session = true;
        self
    }

    /// These fds, open in the parent until the spawn returns, cross the exec at the same numbers
    /// (close-on-exec cleared in the child only; the parent's flags are untouched).
    pub fn keep_fds(mut self, fds: impl IntoIterator<Item = RawFd>) -> BeforeExec {
        self.keep_fds.extend(fds);
        self
    }

    /// Becomes `who` ([`drop_to`]: no_new_privs included).
    pub fn drop_to(mut self, who: Identity) -> BeforeExec {
        self.identity = Some(who);
        self
    }

    /// No setuid or file-capability binary may give the child more than it holds.
    pub fn no_new_privs(mut self) -> BeforeExec {
        self.no_new_privs = true;
        self
    }

    /// Runs these steps in `cmd`'s child before its exec; a failed step fails the spawn.
    pub fn install(self, cmd: &mut Command) {
        // SAFETY: the closure runs in the forked child before exec. It makes syscalls only
        // (rt_sigaction, rt_sigprocmask, setsid, fcntl on plain integers, and the drop's
        // prctl, capget/capset, setgroups, setres[ug]id, getgroups); the drop's capability and
        // group reads build small vectors, and glibc's fork handlers leave malloc usable in the
        // child. Nothing it touches is shared with another thread of the child (it has none).
        unsafe {
            cmd.pre_exec(move || self.run());
        }
    }

    fn run(&self) -> io::Result<()> {
        if self.default_signals {
            reset_signals()?;
        }
        if self.new_session {
            nix::unistd::setsid()?;
        }
        for &fd in &self.keep_fds {
            keep_across_exec(fd)?;
        }
        if let Some(who) = &self.identity {
            // Only an errno crosses back to the parent's spawn, so the step's own errno.
            drop_to(who).map_err(|e| match e.source.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => e.into(),
            })?;
        }
        if self.no_new_privs {
            nix::sys::prctl::set_no_new_privs()?;
        }
        Ok(())
    }
}

/// Every catchable signal to SIG_DFL, and an empty mask.
fn reset_signals() -> io::Result<()> {
    for sig in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
        // SAFETY: SIG_DFL installs no handler, so no handler can run with broken invariants;
        // this process execs next.
        unsafe { signal(sig, SigHandler::SigDfl) }?;
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    Ok(())
}
