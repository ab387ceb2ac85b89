//! Thin wrappers over the syscalls nix 0.30 lacks: the new mount API (open_tree, move_mount,
//! mount_setattr, fsopen/fsconfig/fsmount), openat2, pivot_root by fd, close_range, a raw
//! seccomp filter, and the SIOCSIFFLAGS ioctl. Every `unsafe` of the crate's confinement lives
//! here, each with its reason.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(r: libc::c_long) -> io::Result<OwnedFd> {
    let fd = check(r)? as RawFd;
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// Where a path lookup starts: a directory fd, or the cwd.
#[derive(Clone, Copy)]
pub enum Dir<'a> {
    Fd(BorrowedFd<'a>),
    Cwd,
}

impl Dir<'_> {
    fn raw(self) -> RawFd {
        match self {
            Dir::Fd(fd) => fd.as_raw_fd(),
            Dir::Cwd => libc::AT_FDCWD,
        }
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
    owned(unsafe { libc::syscall(libc::SYS_open_tree, dir.raw(), p.as_ptr(), flags) })
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

/// `openat2(dir, path, how)` with the given O_ flags, mode and RESOLVE_ flags.
pub fn openat2(
    dir: Dir<'_>,
    path: &str,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let p = cstring(path)?;
    // SAFETY: open_how is plain data (non-exhaustive in libc, so built from zero).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = mode as u64;
    how.resolve = resolve;
    // SAFETY: valid dirfd, NUL-terminated path, pointer to an initialised open_how and its size.
    owned(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.raw(),
            p.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
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

/// Installs a classic BPF seccomp program. The caller has set no_new_privs.
pub fn seccomp_install(program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies it.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    })?;
    Ok(())
}

/// Sets IFF_UP on a network interface of the current netns (`ip link set lo up`, without
/// netlink).
pub fn interface_up(name: &CStr) -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.to_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: valid socket fd, request number matching the pointed-to ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } as libc::c_long)?;
    // SAFETY: reading the union member SIOCGIFFLAGS just filled in.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above, setting the flags.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) } as libc::c_long)?;
    Ok(())
}

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

/// `dup2(fd, target)` (the result is not close-on-exec: it is meant to cross the exec).
pub fn dup_onto(fd: RawFd, target: RawFd) -> io::Result<()> {
    if fd == target {
        return Ok(());
    }
    // SAFETY: dup2 on plain integers; `target` is one of 0, 1, 2, which we mean to replace.
    check(unsafe { libc::dup2(fd, target) } as libc::c_long)?;
    Ok(())
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

/// Opens the namespace's own pty pair: the master from `ptmx` (a path in the current root),
/// unlocked, and the slave straight from it with TIOCGPTPEER (no path lookup, no race).
pub fn open_pty(ptmx: &CStr) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: NUL-terminated path and flags; returns a new fd.
    let master = owned(unsafe {
        libc::open(
            ptmx.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ) as libc::c_long
    })?;
    // SAFETY: valid master fd; unlockpt only issues TIOCSPTLCK on it.
    check(unsafe { libc::unlockpt(master.as_raw_fd()) } as libc::c_long)?;
    // SAFETY: valid master fd, TIOCGPTPEER takes open flags by value; returns a new fd.
    let slave = owned(unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ) as libc::c_long
    })?;
    Ok((master, slave))
}

/// In the payload: a new session whose controlling terminal is `tty`.
pub fn take_controlling_tty(tty: BorrowedFd<'_>) -> io::Result<()> {
    nix::unistd::setsid()?;
    // SAFETY: valid tty fd; TIOCSCTTY takes an int argument (0: do not steal).
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSCTTY, 0) } as libc::c_long)?;
    Ok(())
}

/// A terminal's window size (TIOCGWINSZ): rows, columns, x pixels, y pixels.
pub fn get_winsize(tty: BorrowedFd<'_>) -> io::Result<[u16; 4]> {
    // SAFETY: winsize is plain data.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a winsize, as TIOCGWINSZ expects.
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } as libc::c_long)?;
    Ok([ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel])
}

/// Sets a terminal's window size (TIOCSWINSZ).
pub fn set_winsize(tty: BorrowedFd<'_>, size: [u16; 4]) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size[0],
        ws_col: size[1],
        ws_xpixel: size[2],
        ws_ypixel: size[3],
    };
    // SAFETY: valid fd and a pointer to an initialised winsize, as TIOCSWINSZ expects.
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &ws) } as libc::c_long)?;
    Ok(())
}

/// `landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, {access, parent})`, without the
/// `fstat` of `parent` the landlock crate makes: on a FUSE root that stat waits for the bridge's
/// INIT (or fails if the server is gone), while the kernel itself only looks at the dentry's type.
pub fn landlock_add_path_rule(
    ruleset: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    access: u64,
) -> io::Result<()> {
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: the kernel reads the packed attr (uapi struct landlock_path_beneath_attr) from a
    // pointer to a live local; both fds are borrowed and stay open for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
