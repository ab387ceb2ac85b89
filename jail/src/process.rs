//! Processes: fork, `_exit`, pidfds and the namespaces they name.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::syscall_ret::{check, owned};

/// `fork()`. The launcher may be multi-threaded (a test harness, a tokio runtime); the child
/// only builds the namespace and execs. glibc's fork resets its malloc locks in the child, so
/// allocating there is sound; the child never touches another thread's locks (no logging).
pub fn fork_process() -> io::Result<nix::unistd::ForkResult> {
    // SAFETY: see above — the child runs only this crate's single-threaded setup code, then
    // execs or _exits.
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

/// SIGKILLs every process whose uid is `uid` (none of which is ours: it must not be 0), in any
/// user or pid namespace: a child takes `uid` and calls `kill(-1)`, which reaches exactly the
/// processes that uid may signal. Returns once that child is gone.
pub fn kill_every_process_of(uid: u32) -> io::Result<()> {
    if uid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to kill every process of uid 0",
        ));
    }
    match fork_process()? {
        nix::unistd::ForkResult::Child => {
            let id = nix::unistd::Uid::from_raw(uid);
            let code = match nix::unistd::setresuid(id, id, id) {
                Ok(()) => match nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(-1),
                    nix::sys::signal::Signal::SIGKILL,
                ) {
                    // ESRCH: there was nothing of that uid to kill.
                    Ok(()) | Err(nix::errno::Errno::ESRCH) => 0,
                    Err(_) => 2,
                },
                Err(_) => 1,
            };
            exit_now(code)
        }
        nix::unistd::ForkResult::Parent { child } => {
            match nix::sys::wait::waitpid(child, None).map_err(io::Error::from)? {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                other => Err(io::Error::other(format!(
                    "killing the processes of uid {uid}: {other:?}"
                ))),
            }
        }
    }
}

/// `_exit` without running destructors or atexit handlers (they belong to the launcher).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it never returns.
    unsafe { libc::_exit(code) }
}

/// A pidfd for a child we forked (and have not reaped).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; returns a new fd.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })
}

/// A signal through a pidfd (never hits a recycled pid).
pub fn pidfd_signal(pidfd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    // SAFETY: valid pidfd, a signal number, no siginfo, no flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// `PIDFD_GET_PID_FOR_CHILDREN_NAMESPACE` (Linux 6.11): `_IO(PIDFS_IOCTL_MAGIC = 0xFF, 6)`.
pub const PIDFD_GET_PID_FOR_CHILDREN_NAMESPACE: libc::c_ulong = 0xFF06;
/// `PIDFD_GET_USER_NAMESPACE`: `_IO(0xFF, 9)`.
pub const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = 0xFF09;

/// A namespace fd of the process `pidfd` names (`PIDFD_GET_*_NAMESPACE`): no path, no pid.
pub fn pidfd_namespace(pidfd: BorrowedFd<'_>, which: libc::c_ulong) -> io::Result<OwnedFd> {
    // SAFETY: an argument-less ioctl on a valid pidfd; returns a new fd.
    owned(unsafe { libc::ioctl(pidfd.as_raw_fd(), which as _, 0) } as libc::c_long)
}

/// SIGPIPE back to its default action (the Rust runtime ignores it, so a write to a closed pipe
/// fails with EPIPE and `println!` panics on it). A command-line program then ends as coreutils
/// do when the reader of its output goes away (`warren keys init | head -1`): killed by SIGPIPE,
/// quietly. Called first thing in `main`, before any thread exists.
pub fn default_sigpipe() -> io::Result<()> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: SIG_DFL installs no handler, so no handler can run with broken invariants.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }?;
    Ok(())
}
