//! Binds, prepared in the launcher (still in the host mount namespace) and attached inside by
//! [`crate::mounts::attach_binds`].
//!
//! Each source is opened once (O_PATH) by the caller, which checks that handle; `open_tree(OPEN_TREE_CLONE)`
//! copies exactly that handle's mount into a detached tree; `mount_setattr` makes it
//! ro/nosuid/nodev (on every submount with `-R`). The tree fd crosses into the new mount
//! namespace by inheritance and is attached there with `move_mount` onto a target resolved under
//! the new root with RESOLVE_NO_SYMLINKS. Nothing is re-resolved by name between check and use.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::inode::ident;
use crate::mount_api;
use crate::openat2::Dir;

/// A detached, attribute-set copy of a bind source, waiting to be attached at `path`.
pub struct PreparedBind {
    pub tree: OwnedFd,
    pub path: String,
    pub is_dir: bool,
}

/// What a bind is, in the words of whoever asked for it.
pub struct BindSource<'a> {
    /// The source as the operator named it (messages only: the handle is what counts).
    pub shown: &'a str,
    /// Where it lands in the new root.
    pub path: &'a str,
    pub writable: bool,
    /// `-R`: the source's submounts come too.
    pub recursive: bool,
}

/// Filesystems that are kernel interfaces, not data: never carried in by `-R`.
const REFUSED_SUBMOUNT_TYPES: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "fuse",
    "fuseblk",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "bpf",
    "configfs",
    "efivarfs",
    "pstore",
    "binfmt_misc",
    "mqueue",
];

fn is_refused_type(fstype: &str) -> bool {
    REFUSED_SUBMOUNT_TYPES.contains(&fstype) || fstype.starts_with("fuse.")
}

/// Undo mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The filesystem type of the mount with id `mnt_id`, from mountinfo.
fn mount_fstype(mnt_id: u64) -> Result<String, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading mountinfo: {e}"))?;
    info.lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let id: u64 = fields.first()?.parse().ok()?;
            let dash = fields.iter().position(|f| *f == "-")?;
            (id == mnt_id).then(|| fields.get(dash + 1).map(|t| t.to_string()))?
        })
        .ok_or_else(|| format!("mount {mnt_id} is not in mountinfo"))
}

/// Refuses `-R` when a kernel-interface filesystem is mounted anywhere beneath `source`.
fn check_submounts(source: &str, shown_as: &str) -> Result<(), String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading mountinfo for `{shown_as}`: {e}"))?;
    let prefix = if source == "/" {
        "/".to_string()
    } else {
        format!("{source}/")
    };
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(fstype)) = (fields.get(4), fields.get(dash + 1)) else {
            continue;
        };
        let point = unescape(point);
        if point.starts_with(&prefix) && point != source && is_refused_type(fstype) {
            return Err(format!(
                "bind -R of `{shown_as}` refused: it holds a {fstype} mount at {point}"
            ));
        }
    }
    Ok(())
}

/// Checks and clones a bind source that is already open (and already checked against warren's
/// own directories by the caller): what is checked is what gets bound, never re-resolved by name.
pub fn prepare(fd: BorrowedFd<'_>, bind: &BindSource<'_>) -> Result<PreparedBind, String> {
    let shown = bind.shown;
    // A kernel interface is never bound, as a source any more than as a submount: the host's
    // proc or sys would show the host's processes and knobs.
    let mnt_id = ident(fd)
        .map_err(|e| format!("bind source `{shown}`: {e}"))?
        .mnt_id;
    let fstype = mount_fstype(mnt_id)?;
    if is_refused_type(&fstype) {
        return Err(format!(
            "bind of `{shown}` refused: it is on a {fstype} mount (a kernel interface)"
        ));
    }
    if bind.path == "/" {
        return Err(format!(
            "bind of `{shown}` at / refused: it would hide the namespace's own /proc, /dev and /etc"
        ));
    }
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("bind source `{shown}`: {e}"))?;
    let is_dir = meta.is_dir();
    if !is_dir && !meta.is_file() {
        return Err(format!(
            "bind source `{shown}` is neither a directory nor a regular file"
        ));
    }
    if bind.recursive {
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| format!("bind source `{shown}`: {e}"))?;
        check_submounts(&real.to_string_lossy(), shown)?;
    }
    let tree = mount_api::open_tree_clone(Dir::Fd(fd), "", bind.recursive)
        .map_err(|e| format!("cloning bind source `{shown}`: {e}"))?;
    let mut attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if !bind.writable {
        attrs |= libc::MOUNT_ATTR_RDONLY;
    }
    mount_api::mount_setattr(tree.as_fd(), attrs, bind.recursive)
        .map_err(|e| format!("setting ro/nosuid/nodev on `{shown}`: {e}"))?;
    Ok(PreparedBind {
        tree,
        path: bind.path.to_string(),
        is_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\\b"), r"/a\\b");
        assert_eq!(unescape(r"/x\04"), r"/x\04");
    }

    #[test]
    fn refused_types() {
        assert!(is_refused_type("proc"));
        assert!(is_refused_type("fuse.sshfs"));
        assert!(!is_refused_type("ext4"));
        assert!(!is_refused_type("tmpfs"));
    }
}
