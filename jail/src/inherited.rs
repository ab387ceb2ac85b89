//! File descriptors a process was handed by its parent under a number (on its argv or in its
//! environment): looked at, then taken into ownership once, at startup.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::syscall_ret::check;

/// Fails unless `fd` names an open descriptor (F_GETFD; EBADF otherwise).
fn check_open(fd: RawFd) -> io::Result<()> {
    if fd < 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} is not a descriptor number"),
        ));
    }
    // SAFETY: fcntl(F_GETFD) takes plain integers, touches no memory and only reads the
    // descriptor's flags; a number that is not open fails with EBADF.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) } as libc::c_long)?;
    Ok(())
}

/// Runs `look` on inherited descriptor `fd`, borrowed for the call only, after checking it is
/// open (to fstat it, or read a socket option, before deciding to take it).
pub fn inspect<T>(fd: RawFd, look: impl FnOnce(BorrowedFd<'_>) -> T) -> io::Result<T> {
    check_open(fd)?;
    // SAFETY: `fd` is open (checked above) and the borrow lives only for `look`; inherited fds
    // are inspected at startup, before this process closes or reuses any descriptor number.
    Ok(look(unsafe { BorrowedFd::borrow_raw(fd) }))
}

/// Takes ownership of inherited descriptor `fd`, after checking it is open, and marks it
/// close-on-exec (nothing this process starts inherits it by accident). The caller takes each
/// number once, at startup: the parent handed it to this process alone, and nothing else here
/// owns it.
pub fn take(fd: RawFd) -> io::Result<OwnedFd> {
    check_open(fd)?;
    // SAFETY: `fd` is open (checked above); by this function's contract it was handed to this
    // process by its parent for this use alone and is taken once, so the `OwnedFd` is its only
    // owner.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(owned)
}
