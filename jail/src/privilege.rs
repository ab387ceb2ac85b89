//! The one privilege drop: how a daemon, a tool worker, a namespace's payload and every process
//! the supervisor starts leave root (or whatever they started as) for good, and the checks that
//! the drop held. Each step is a function of its own, run in [`drop_to`]'s order; a failure names
//! its step ([`DropError`]).

use std::fmt;
use std::io;

use caps::{CapSet, Capability};
use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::unistd::{Gid, Uid, getgroups, getresgid, getresuid, setgroups, setresgid, setresuid};

/// Who a process becomes: all three uids `uid`, all three gids `gid`, exactly `groups` as its
/// supplementary groups. Never uid or gid 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Identity {
    /// `uid` and `gid`, no supplementary group.
    pub fn new(uid: u32, gid: u32) -> Identity {
        Identity {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    /// With exactly `groups` as supplementary groups.
    pub fn with_groups(mut self, groups: impl IntoIterator<Item = u32>) -> Identity {
        self.groups = groups.into_iter().collect();
        self
    }
}

/// The steps of [`drop_to`], in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropStep {
    /// The target is uid or gid 0.
    Target,
    /// Emptying the bounding set (while CAP_SETPCAP is still effective).
    Bounding,
    /// Emptying the ambient and inheritable sets.
    InheritedCaps,
    /// setgroups.
    Groups,
    /// setresgid.
    Gid,
    /// setresuid.
    Uid,
    /// Emptying the effective and permitted sets (a uid change from a non-root uid keeps them).
    Capabilities,
    /// PR_SET_NO_NEW_PRIVS.
    NoNewPrivs,
    /// PR_SET_DUMPABLE 0 (a uid change resets it).
    Dumpable,
    /// The checks after the drop: ids, groups, no capability, no way back to 0, no_new_privs.
    Verify,
}

impl fmt::Display for DropStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropStep::Target => "target",
            DropStep::Bounding => "bounding set",
            DropStep::InheritedCaps => "ambient and inheritable capabilities",
            DropStep::Groups => "setgroups",
            DropStep::Gid => "setresgid",
            DropStep::Uid => "setresuid",
            DropStep::Capabilities => "effective and permitted capabilities",
            DropStep::NoNewPrivs => "no_new_privs",
            DropStep::Dumpable => "non-dumpable",
            DropStep::Verify => "check after the drop",
        })
    }
}

/// A privilege drop that failed at `step`. The process must not go on: it may be half-dropped.
#[derive(Debug, thiserror::Error)]
#[error("dropping privileges to uid {uid} gid {gid}: {step}: {source}")]
pub struct DropError {
    pub step: DropStep,
    pub uid: u32,
    pub gid: u32,
    #[source]
    pub source: io::Error,
}

impl From<DropError> for io::Error {
    fn from(e: DropError) -> io::Error {
        let kind = e.source.kind();
        io::Error::new(kind, e)
    }
}

/// Becomes `who` irrevocably: bounding set emptied while it still can be, ambient and
/// inheritable sets emptied, supplementary groups set, gid then uid changed (all three of each),
/// effective and permitted sets emptied, no_new_privs set, non-dumpable. Then checks that it
/// held (see [`verify`]). Safe to run again in a process that already is `who` (a tool worker
/// execs with its nsd-made identity and drops once more): what it cannot change there it
/// already does not hold.
pub fn drop_to(who: &Identity) -> Result<(), DropError> {
    let fail = |step| {
        move |source: io::Error| DropError {
            step,
            uid: who.uid,
            gid: who.gid,
            source,
        }
    };
    refuse_root(who).map_err(fail(DropStep::Target))?;
    let bounding_cleared = clear_bounding_set().map_err(fail(DropStep::Bounding))?;
    clear_inherited_caps().map_err(fail(DropStep::InheritedCaps))?;
    let groups_set = set_groups(&who.groups).map_err(fail(DropStep::Groups))?;
    let gid = Gid::from_raw(who.gid);
    setresgid(gid, gid, gid)
        .map_err(io::Error::from)
        .map_err(fail(DropStep::Gid))?;
    let uid = Uid::from_raw(who.uid);
    setresuid(uid, uid, uid)
        .map_err(io::Error::from)
        .map_err(fail(DropStep::Uid))?;
    clear_held_caps().map_err(fail(DropStep::Capabilities))?;
    nix::sys::prctl::set_no_new_privs()
        .map_err(io::Error::from)
        .map_err(fail(DropStep::NoNewPrivs))?;
    nix::sys::prctl::set_dumpable(false)
        .map_err(io::Error::from)
        .map_err(fail(DropStep::Dumpable))?;
    verify(who, groups_set, bounding_cleared).map_err(fail(DropStep::Verify))
}

fn refuse_root(who: &Identity) -> io::Result<()> {
    if who.uid == 0 || who.gid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "refusing to drop to uid or gid 0",
        ));
    }
    Ok(())
}

/// Empties the bounding set: nothing this process execs can gain a capability, whatever the
/// file. Needs CAP_SETPCAP, so it comes before the uid change; a process without it (already
/// unprivileged) cannot change the set, and no_new_privs makes it moot. Whether it was emptied.
fn clear_bounding_set() -> io::Result<bool> {
    if !caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).map_err(caps_error)? {
        return Ok(false);
    }
    caps::clear(None, CapSet::Bounding).map_err(caps_error)?;
    Ok(true)
}

/// Empties the ambient and inheritable sets (lowering them needs no privilege).
fn clear_inherited_caps() -> io::Result<()> {
    for set in [CapSet::Ambient, CapSet::Inheritable] {
        caps::clear(None, set).map_err(caps_error)?;
    }
    Ok(())
}

/// Sets exactly `groups`. A process that may not (no CAP_SETGID) and is no longer root is
/// unprivileged already: it cannot gain a group either, and keeps the ones it has. A root
/// process that may not is refused: it would keep root's groups (gid 0 among them) through a
/// drop that reported success. Whether they were set.
fn set_groups(groups: &[u32]) -> io::Result<bool> {
    let groups: Vec<Gid> = groups.iter().map(|&g| Gid::from_raw(g)).collect();
    match setgroups(&groups) {
        Ok(()) => Ok(true),
        Err(Errno::EPERM)
            if !nix::unistd::geteuid().is_root()
                && !caps::has_cap(None, CapSet::Effective, Capability::CAP_SETGID)
                    .map_err(caps_error)? =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Empties the effective and permitted sets. Leaving uid 0 does that already; a non-root uid
/// that held capabilities (ambient CAP_SETUID, say) keeps them through setresuid.
fn clear_held_caps() -> io::Result<()> {
    for set in [CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(caps_error)?;
    }
    Ok(())
}

/// That the drop held, checked rather than assumed: every uid and gid is the target; the groups
/// are exactly the target's (when they could be set); no capability in any set (the bounding
/// set too, when it could be emptied); uid 0 and gid 0 cannot be taken back; no_new_privs is on.
fn verify(who: &Identity, groups_set: bool, bounding_cleared: bool) -> io::Result<()> {
    let (u, g) = (Uid::from_raw(who.uid), Gid::from_raw(who.gid));
    let r = getresuid()?;
    let rg = getresgid()?;
    if [r.real, r.effective, r.saved] != [u, u, u] || [rg.real, rg.effective, rg.saved] != [g, g, g]
    {
        return Err(io::Error::other("the uid/gid change did not take"));
    }
    if groups_set {
        let mut held: Vec<u32> = getgroups()?.iter().map(|g| g.as_raw()).collect();
        let mut want = who.groups.clone();
        held.sort_unstable();
        held.dedup();
        want.sort_unstable();
        want.dedup();
        if held != want {
            return Err(io::Error::other(format!(
                "supplementary groups are {held:?}, not {want:?}"
            )));
        }
    }
    let mut sets = vec![
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Inheritable,
        CapSet::Ambient,
    ];
    if bounding_cleared {
        sets.push(CapSet::Bounding);
    }
    for set in sets {
        let held = caps::read(None, set).map_err(caps_error)?;
        if !held.is_empty() {
            return Err(io::Error::other(format!(
                "{set:?} capabilities still held: {held:?}"
            )));
        }
    }
    let root = Uid::from_raw(0);
    if setresuid(root, root, root).is_ok() {
        return Err(io::Error::other("uid 0 could be regained"));
    }
    let root = Gid::from_raw(0);
    if setresgid(root, root, root).is_ok() {
        return Err(io::Error::other("gid 0 could be regained"));
    }
    if !nix::sys::prctl::get_no_new_privs()? {
        return Err(io::Error::other("no_new_privs is not set"));
    }
    Ok(())
}

fn caps_error(e: caps::errors::CapsError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Non-dumpable and no core files: a crash must not leave a daemon's memory (keys, grants) on
/// disk, and a same-uid process must not ptrace it. Every daemon runs this first; the core limit
/// survives [`drop_to`] and non-dumpable is set again by it.
pub fn harden() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
    Ok(())
}

/// Raises the soft limit on open descriptors to the hard one (no privilege needed) and says
/// what it now is. A server of many connections (`warren-mcp-server --http`) must not run out
/// at a default soft limit of 1 024 that the hard limit (systemd's `LimitNOFILE`) would allow
/// far beyond.
pub fn raise_fd_limit() -> io::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_soft_limit_is_raised_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(512), hard).unwrap();
        assert_eq!(raise_fd_limit().unwrap(), hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
    }
}
