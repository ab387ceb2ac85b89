//! Process hardening and dropping to a daemon's own uid.

use std::io;

use nix::sys::resource::{Resource, setrlimit};
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

/// Non-dumpable and no core files: a crash must not leave a daemon's memory (keys, grants) on disk,
/// and a same-uid process must not ptrace it.
pub fn harden() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
    Ok(())
}

/// Drops every uid and gid to `uid`/`gid` with exactly `groups` as supplementary groups. Refuses
/// uid 0. Checks afterwards that uid 0 cannot be regained.
pub fn drop_to(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    if uid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to drop to uid 0",
        ));
    }
    let groups: Vec<Gid> = groups.iter().map(|&g| Gid::from_raw(g)).collect();
    setgroups(&groups)?;
    let (g, u) = (Gid::from_raw(gid), Uid::from_raw(uid));
    setresgid(g, g, g)?;
    setresuid(u, u, u)?;
    if setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).is_ok() {
        return Err(io::Error::other(
            "uid 0 could be regained after dropping privileges",
        ));
    }
    // setresuid cleared the effective and permitted capability sets; non-dumpable again, since a
    // uid change resets it.
    harden()
}
