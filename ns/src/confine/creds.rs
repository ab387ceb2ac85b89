//! Step 6 (identity): the payload never runs as uid 0 of the initial user namespace, and holds
//! no capability at all.

use caps::CapSet;
use nix::unistd::{Gid, Uid};

/// Clears the ambient, bounding and inheritable sets — bounding while CAP_SETPCAP is still
/// effective, which is why it comes before the uid change — then moves to `uid`/`uid` with no
/// supplementary groups. Leaving uid 0 without SECBIT_KEEP_CAPS clears permitted and effective;
/// that is checked, not assumed.
pub fn drop_to(uid: u32) -> Result<(), String> {
    drop_to_user(uid, uid)
}

/// As [`drop_to`], to `uid` and a gid of its own (a tool worker writing as a directory's owner
/// takes the directory's group too). Neither may be 0.
pub fn drop_to_user(uid: u32, gid: u32) -> Result<(), String> {
    if uid == 0 || gid == 0 {
        return Err("refusing to run the payload as uid or gid 0".into());
    }
    for set in [CapSet::Ambient, CapSet::Bounding, CapSet::Inheritable] {
        caps::clear(None, set).map_err(|e| format!("clearing {set:?} capabilities: {e}"))?;
    }
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    let (g, u) = (Gid::from_raw(gid), Uid::from_raw(uid));
    nix::unistd::setresgid(g, g, g).map_err(|e| format!("setresgid {gid}: {e}"))?;
    nix::unistd::setresuid(u, u, u).map_err(|e| format!("setresuid {uid}: {e}"))?;
    for set in [
        CapSet::Permitted,
        CapSet::Effective,
        CapSet::Bounding,
        CapSet::Ambient,
    ] {
        let held = caps::read(None, set).map_err(|e| format!("reading {set:?}: {e}"))?;
        if !held.is_empty() {
            return Err(format!(
                "{set:?} capabilities still held after the uid change: {held:?}"
            ));
        }
    }
    Ok(())
}
