//! The new mount API (open_tree, move_mount, mount_setattr, fsopen/fsconfig/fsmount) and
//! pivot_root by the cwd, which nix 0.30 lacks.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::openat2::Dir;
use crate::syscall_ret::{check, cstring, owned};

fn raw(dir: Dir<'_>) -> libc::c_int {
    match dir {
        Dir::Fd(fd) => fd.as_raw_fd(),
        Dir::Cwd => libc::AT_FDCWD,
    }
}

/// `open_tree(dir, path, OPEN_TREE_CLONE | flags)`: a detached copy of the mount at `path`
/// (recursive with `AT_RECURSIVE`). `path` may be "" with `AT_EMPTY_PATH`.
pub fn open_tree_clone(dir: Dir<'_>, path: &str, recursive: bool) -> io::Result<OwnedFd> {
    let p = cstring(path)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if path.is_empty() {
        flags |= libc::AT_EMPTY_PATH as libc::c_uint;
    }
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: valid dirfd or AT_FDCWD, NUL-terminated path, plain flag word; returns a new fd.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, raw(dir), p.as_ptr(), flags) })
}

/// `mount_setattr` on the mount `fd` refers to: set `attr_set` bits, optionally on every
/// submount too.
pub fn mount_setattr(fd: BorrowedFd<'_>, attr_set: u64, recursive: bool) -> io::Result<()> {
    let mut attr: libc::mount_attr = libc::mount_attr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: valid fd, empty path with AT_EMPTY_PATH, pointer to a correctly sized mount_attr.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &mut attr as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })?;
    Ok(())
}

/// `move_mount(tree, "", target, "", F_EMPTY_PATH | T_EMPTY_PATH)`: attach a detached tree (or
/// move a mount) onto the object `target` refers to.
pub fn move_mount(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: two valid fds and empty NUL-terminated paths with the EMPTY_PATH flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// A new, detached filesystem instance: `fsopen(fstype)`, `fsconfig` each option, create,
/// `fsmount` with `attrs` (MOUNT_ATTR_*). Key-only options are given with an empty value.
pub fn new_fs(fstype: &str, options: &[(&str, &str)], attrs: u64) -> io::Result<OwnedFd> {
    let t = cstring(fstype)?;
    // SAFETY: NUL-terminated fs type name and a flag word; returns a new fs-context fd.
    let ctx = owned(unsafe { libc::syscall(libc::SYS_fsopen, t.as_ptr(), libc::FSOPEN_CLOEXEC) })?;
    for (key, value) in options {
        let k = cstring(key)?;
        let v = cstring(value)?;
        let (cmd, vptr) = if value.is_empty() {
            (libc::FSCONFIG_SET_FLAG, std::ptr::null())
        } else {
            (libc::FSCONFIG_SET_STRING, v.as_ptr())
        };
        // SAFETY: valid context fd, NUL-terminated key, NUL-terminated value or NULL for flags.
        check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                ctx.as_raw_fd(),
                cmd,
                k.as_ptr(),
                vptr,
                0,
            )
        })
        .map_err(|e| io::Error::new(e.kind(), format!("{fstype} option {key}: {e}")))?;
    }
    // SAFETY: valid context fd; CMD_CREATE takes no key or value.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })
    .map_err(|e| io::Error::new(e.kind(), format!("creating {fstype}: {e}")))?;
    // SAFETY: valid context fd, flag word and attribute word; returns a new mount fd.
    owned(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            ctx.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs,
        )
    })
}

/// `pivot_root(".", ".")` after fchdir to the new root: the old root ends up stacked beneath,
/// ready for `umount2(".", MNT_DETACH)` (runc's trick; no put_old directory needed).
pub fn pivot_root_here() -> io::Result<()> {
    // SAFETY: two valid NUL-terminated paths.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) })?;
    Ok(())
}
