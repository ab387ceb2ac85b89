//! The worker's own hardening, run once at start before it serves anything: keep only the fds it
//! was given, become the tool's uid/gid for good, and make itself unreachable by ptrace.

use std::io;
use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::prctl;
use nix::unistd::{Gid, Uid, getresgid, getresuid, setgroups, setresgid, setresuid};

/// Marks `keep` close-on-exec (so a shell command inherits none of them) and closes every fd
/// above 2 that is not in `keep`.
pub fn seal_fds(keep: &[RawFd]) -> io::Result<()> {
    let mut keep = keep.to_vec();
    keep.sort_unstable();
    keep.dedup();
    for &fd in &keep {
        fcntl(inherited_fd(fd), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
            .map_err(|e| io::Error::other(format!("fd {fd}: {e}")))?;
    }
    let mut next = 3;
    for &fd in &keep {
        if fd > next {
            close_range(next, fd - 1)?;
        }
        next = next.max(fd + 1);
    }
    close_range(next, RawFd::MAX)
}

/// Borrows an fd this process inherited and keeps open until it exits.
pub fn inherited_fd(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the fds passed here are the worker's inherited socket and root fds, which stay open
    // for the life of the process (they are only ever closed by process exit).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// close_range(first, last, 0).
fn close_range(first: RawFd, last: RawFd) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the worker calls this at start, before it
    // holds anything in the range other than fds it was handed and does not use.
    let rc = unsafe { libc::close_range(first as libc::c_uint, last as libc::c_uint, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Becomes `uid`/`gid` with no supplementary groups, irrevocably, then sets no_new_privs and
/// non-dumpable. Refuses uid or gid 0.
pub fn drop_to(uid: u32, gid: u32) -> io::Result<()> {
    if uid == 0 || gid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a tool worker never runs as uid or gid 0",
        ));
    }
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    match setgroups(&[]) {
        Ok(()) => {}
        // An unprivileged parent cannot clear its groups; it cannot gain any either.
        Err(Errno::EPERM) if !Uid::effective().is_root() => {}
        Err(e) => return Err(io::Error::other(format!("setgroups([]): {e}"))),
    }
    setresgid(g, g, g).map_err(|e| io::Error::other(format!("setresgid({gid}): {e}")))?;
    setresuid(u, u, u).map_err(|e| io::Error::other(format!("setresuid({uid}): {e}")))?;
    // A uid change from a non-root uid keeps the capability sets: a toolfs running under its own
    // uid with ambient CAP_SETUID would hand it to the worker. Clear every set.
    clear_capabilities()?;
    verify_dropped(u, g)?;
    prctl::set_no_new_privs().map_err(|e| io::Error::other(format!("no_new_privs: {e}")))?;
    prctl::set_dumpable(false).map_err(|e| io::Error::other(format!("set_dumpable: {e}")))?;
    // No parent-death signal: it fires when the *thread* that spawned us exits, and toolfs
    // spawns from a blocking pool whose threads come and go. The worker ends on socket EOF.
    Ok(())
}

/// Empties the ambient, inheritable, effective and permitted capability sets.
fn clear_capabilities() -> io::Result<()> {
    use caps::CapSet;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set)
            .map_err(|e| io::Error::other(format!("clear {set:?} capabilities: {e}")))?;
    }
    Ok(())
}

/// All three ids of each kind are the target, and uid 0 / gid 0 cannot be regained.
fn verify_dropped(u: Uid, g: Gid) -> io::Result<()> {
    let r = getresuid().map_err(io::Error::other)?;
    let rg = getresgid().map_err(io::Error::other)?;
    if [r.real, r.effective, r.saved] != [u, u, u] || [rg.real, rg.effective, rg.saved] != [g, g, g]
    {
        return Err(io::Error::other("the uid/gid change did not take"));
    }
    if setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).is_ok() {
        return Err(io::Error::other("uid 0 could be regained after the drop"));
    }
    if setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0)).is_ok() {
        return Err(io::Error::other("gid 0 could be regained after the drop"));
    }
    Ok(())
}
