//! Filesystem credentials of one thread: Linux keeps fsuid, fsgid and the supplementary groups
//! per thread, so a thread can open files as another user while the process's other threads
//! keep their own.

use std::io;

use nix::unistd::{Gid, Uid, setfsgid, setfsuid};

/// Takes `uid`, `gid` and exactly `groups` as the calling thread's filesystem credentials, on
/// that thread only (raw setgroups: glibc's wrapper would apply it to every thread). Checked:
/// setfsuid/setfsgid report no error, so the ids are read back.
pub fn assume_fs_creds(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups reads `groups.len()` gids from a live slice of u32 (gid_t); the raw
    // syscall changes only the calling thread's credentials.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    setfsgid(Gid::from_raw(gid));
    setfsuid(Uid::from_raw(uid));
    // An id of -1 is refused and only returns the current one, which is how the change is read.
    let now_gid = setfsgid(Gid::from_raw(u32::MAX));
    let now_uid = setfsuid(Uid::from_raw(u32::MAX));
    if now_gid.as_raw() != gid || now_uid.as_raw() != uid {
        return Err(io::Error::other(format!(
            "could not take uid {uid}'s filesystem credentials"
        )));
    }
    Ok(())
}
