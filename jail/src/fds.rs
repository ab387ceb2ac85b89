//! Descriptors across the setup: which survive into a confined process, and which cross its
//! exec. One function closes everything but a keep-list, for every profile.

use std::io;
use std::os::fd::RawFd;

use crate::syscall_ret::check;

/// Marks every fd from `first` up close-on-exec, so nothing but stdio crosses the exec while
/// our error pipe still reports a failed exec.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range takes plain integers; CLOSE_RANGE_CLOEXEC closes nothing now.
    let r = unsafe { libc::close_range(first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor except those in `keep` (close_range over the gaps).
pub fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|&fd| u32::try_from(fd).ok())
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first = 0u32;
    for fd in keep.into_iter().chain(std::iter::once(u32::MAX)) {
        if fd > first {
            // SAFETY: close_range takes plain integers; nothing in [first, fd - 1] is kept.
            let r = unsafe { libc::close_range(first, fd - 1, 0) };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        first = fd.saturating_add(1);
    }
    Ok(())
}

/// `dup2(fd, target)` (the result is not close-on-exec: it is meant to cross the exec).
pub fn dup_onto(fd: RawFd, target: RawFd) -> io::Result<()> {
    if fd == target {
        return Ok(());
    }
    // SAFETY: dup2 on plain integers; `target` is one of 0, 1, 2, which we mean to replace.
    check(unsafe { libc::dup2(fd, target) } as libc::c_long)?;
    Ok(())
}

/// Clears close-on-exec on the number `fd`, which is meant to cross the exec (a tool worker's
/// channel and root handles; a spawned child's kept fds, from its `pre_exec`). EBADF if it is
/// not open.
pub fn keep_across_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) takes plain integers and touches no memory; on a number that is
    // not open it fails with EBADF.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } as libc::c_long)?;
    Ok(())
}
