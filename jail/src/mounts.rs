//! The namespace's mount tree, built inside the new mount namespace by its pid 1, one step per
//! function, in `docs/confinement.md`'s order. Every mount is a new filesystem instance (fsopen/fsmount) or a
//! cloned tree (open_tree), attached with move_mount onto a target resolved under the new root
//! with RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};

use nix::mount::{MntFlags, MsFlags};

use crate::binds::PreparedBind;
use crate::mount_api as sys;
use crate::openat2::{Dir, openat2};

const RESOLVE: u64 = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH;

fn ctx<E: std::fmt::Display>(step: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{step}: {e}")
}

/// Step 2a: never rely on the host's propagation (systemd makes `/` shared): nothing we mount
/// may propagate out, and nothing the host mounts later may propagate in.
pub fn make_root_private() -> Result<(), String> {
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| e.to_string())
}

/// Step 2b: a fresh tmpfs that becomes `/`. It is attached over `/tmp` of this (private) mount
/// namespace only so that pivot_root has a mount point; the returned fd is its root.
pub fn tmpfs_root() -> Result<OwnedFd, String> {
    let root = sys::new_fs(
        "tmpfs",
        &[("mode", "0755"), ("size", "16m")],
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
    )
    .map_err(ctx("creating"))?;
    let anchor = openat2(
        Dir::Cwd,
        "/tmp",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(ctx("anchor /tmp"))?;
    sys::move_mount(root.as_fd(), anchor.as_fd()).map_err(ctx("attaching"))?;
    Ok(root)
}

fn attach_new_fs(
    root: &OwnedFd,
    path: &str,
    fstype: &str,
    options: &[(&str, &str)],
    attrs: u64,
) -> Result<OwnedFd, String> {
    let fs =
        sys::new_fs(fstype, options, attrs).map_err(|e| format!("{fstype} for {path}: {e}"))?;
    let target = make_target(root, path, true).map_err(|e| format!("target {path}: {e}"))?;
    sys::move_mount(fs.as_fd(), target.as_fd()).map_err(|e| format!("attaching {path}: {e}"))?;
    Ok(fs)
}

/// A host file bound over `path` (which must exist, or is created when `create`).
fn bind_host_file(root: &OwnedFd, host: &str, path: &str, attrs: u64) -> Result<(), String> {
    let tree = sys::open_tree_clone(Dir::Cwd, host, false).map_err(|e| format!("{host}: {e}"))?;
    sys::mount_setattr(tree.as_fd(), attrs, false).map_err(|e| format!("{host} attrs: {e}"))?;
    let target = make_target(root, path, false).map_err(|e| format!("target {path}: {e}"))?;
    sys::move_mount(tree.as_fd(), target.as_fd()).map_err(|e| format!("attaching {path}: {e}"))
}

/// The harmless character devices /dev gets from the host.
const HOST_DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// /dev's device nodes and its pts dir, as paths: what Landlock must leave writable.
pub fn dev_nodes() -> Vec<String> {
    HOST_DEVICES
        .iter()
        .chain(&["ptmx", "pts"])
        .map(|d| format!("/dev/{d}"))
        .collect()
}

/// Step 2d: a /dev like bubblewrap's: the harmless character devices bound from the host's
/// nodes, a devpts of our own with its ptmx, a tmpfs shm, and the fd/std* links; and an empty
/// directory for each of `mount_points` (names in /dev: only nsd's own mounts land there, e.g.
/// the client-asks mount), made before /dev turns read-only.
pub fn mount_dev(root: &OwnedFd, mount_points: &[&str]) -> Result<(), String> {
    let dev = attach_new_fs(
        root,
        "/dev",
        "tmpfs",
        &[("mode", "0755"), ("size", "64k")],
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
    )?;
    for node in HOST_DEVICES {
        let host = format!("/dev/{node}");
        if std::fs::symlink_metadata(&host).is_err() {
            continue;
        }
        bind_host_file(
            root,
            &host,
            &host,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
        )?;
    }
    attach_new_fs(
        root,
        "/dev/pts",
        "devpts",
        &[("ptmxmode", "0666"), ("mode", "0620")],
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
    )?;
    attach_new_fs(
        root,
        "/dev/shm",
        "tmpfs",
        &[("mode", "1777"), ("size", "64m")],
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC,
    )?;
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        nix::unistd::symlinkat(target, dev.as_fd(), name)
            .map_err(|e| format!("/dev/{name} link: {e}"))?;
    }
    for name in mount_points {
        nix::sys::stat::mkdirat(
            dev.as_fd(),
            *name,
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        )
        .map_err(|e| format!("/dev/{name} mount point: {e}"))?;
    }
    sys::mount_setattr(
        dev.as_fd(),
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
        false,
    )
    .map_err(ctx("/dev read-only"))
}

/// runc's read-only proc paths.
const PROC_READONLY: &[&str] = &["sys", "bus", "fs", "irq"];
/// runc's masked proc files, covered with /dev/null.
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "sysrq-trigger",
    "timer_list",
    "timer_stats",
    "latency_stats",
    "sched_debug",
];
/// runc's masked proc directories, covered with an empty read-only tmpfs.
const PROC_MASKED_DIRS: &[&str] = &["acpi", "scsi", "asound"];

fn open_existing(root: &OwnedFd, path: &str) -> Result<Option<OwnedFd>, String> {
    match openat2(Dir::Fd(root.as_fd()), path, libc::O_PATH, 0, RESOLVE) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(format!("{path}: {e}")),
    }
}

/// Step 2e: a fresh proc for the new pid namespace, mounted BEFORE pivot_root (a fresh proc
/// after detaching the old root is refused in user namespaces: mount_too_revealing), with
/// runc's masks.
pub fn mount_proc(root: &OwnedFd) -> Result<(), String> {
    let all = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;
    attach_new_fs(root, "/proc", "proc", &[], all)?;
    for name in PROC_READONLY {
        let path = format!("proc/{name}");
        let Some(fd) = open_existing(root, &path)? else {
            continue;
        };
        let tree = sys::open_tree_clone(Dir::Fd(fd.as_fd()), "", false)
            .map_err(|e| format!("/{path}: {e}"))?;
        sys::mount_setattr(tree.as_fd(), all | libc::MOUNT_ATTR_RDONLY, false)
            .map_err(|e| format!("/{path} ro: {e}"))?;
        sys::move_mount(tree.as_fd(), fd.as_fd()).map_err(|e| format!("/{path} ro: {e}"))?;
    }
    for name in PROC_MASKED_FILES {
        let path = format!("/proc/{name}");
        if open_existing(root, &path[1..])?.is_none() {
            continue;
        }
        bind_host_file(root, "/dev/null", &path, all | libc::MOUNT_ATTR_RDONLY)?;
    }
    for name in PROC_MASKED_DIRS {
        let path = format!("/proc/{name}");
        if open_existing(root, &path[1..])?.is_none() {
            continue;
        }
        attach_new_fs(
            root,
            &path,
            "tmpfs",
            &[("mode", "0555"), ("size", "4k")],
            all | libc::MOUNT_ATTR_RDONLY,
        )?;
    }
    Ok(())
}

/// Step 2f: a tmpfs /tmp and a writable `home` owned by the payload's uid.
pub fn mount_tmp_and_home(
    root: &OwnedFd,
    home: &str,
    uid: u32,
    size: Option<u64>,
) -> Result<(), String> {
    let size = size.map_or_else(|| "256m".to_string(), |s| s.to_string());
    let attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    attach_new_fs(
        root,
        "/tmp",
        "tmpfs",
        &[("mode", "1777"), ("size", &size)],
        attrs,
    )?;
    let id = uid.to_string();
    attach_new_fs(
        root,
        home,
        "tmpfs",
        &[
            ("mode", "0700"),
            ("uid", &id),
            ("gid", &id),
            ("size", &size),
        ],
        attrs,
    )?;
    Ok(())
}

/// Step 2g (part): the /etc files written fresh for this namespace: passwd and group with the
/// agent's entry, hosts, hostname. Host files (ld.so.cache, nsswitch.conf, certs, …) are binds
/// prepared by the launcher; /etc is never bound whole.
pub fn write_etc(root: &OwnedFd, uid: u32, home: &str, hostname: &str) -> Result<(), String> {
    let etc = make_target(root, "/etc", true).map_err(ctx("/etc"))?;
    let etc = openat2(
        Dir::Fd(etc.as_fd()),
        ".",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        RESOLVE,
    )
    .map_err(ctx("/etc"))?;
    let files = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 agent:x:{uid}:{uid}:warren agent:{home}:/bin/sh\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nagent:x:{uid}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n"),
        ),
        ("hostname", format!("{hostname}\n")),
    ];
    for (name, body) in files {
        let fd = openat2(
            Dir::Fd(etc.as_fd()),
            name,
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
            RESOLVE,
        )
        .map_err(|e| format!("/etc/{name}: {e}"))?;
        std::fs::File::from(fd)
            .write_all(body.as_bytes())
            .map_err(|e| format!("/etc/{name}: {e}"))?;
    }
    Ok(())
}

/// Step 4: pivot_root into the new root, detach the old one, and make `/` read-only.
pub fn pivot(root: &OwnedFd) -> Result<(), String> {
    nix::unistd::fchdir(root.as_fd()).map_err(ctx("chdir to new root"))?;
    sys::pivot_root_here().map_err(ctx("pivot_root"))?;
    nix::mount::umount2(".", MntFlags::MNT_DETACH).map_err(ctx("detaching old root"))?;
    nix::unistd::chdir("/").map_err(ctx("chdir /"))?;
    sys::mount_setattr(
        root.as_fd(),
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        false,
    )
    .map_err(ctx("root read-only"))
}

/// Creates (if missing) and opens `path` under `root` without following any symlink or leaving
/// the root; the last component is a directory or an empty file to mount a file on.
pub fn make_target(root: &OwnedFd, path: &str, is_dir: bool) -> io::Result<OwnedFd> {
    const RESOLVE: u64 = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH;
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let Some((last, parents)) = comps.split_last() else {
        return openat2(Dir::Fd(root.as_fd()), ".", libc::O_PATH, 0, RESOLVE);
    };
    let mut dir = openat2(Dir::Fd(root.as_fd()), ".", libc::O_PATH, 0, RESOLVE)?;
    for comp in parents {
        mkdir_at(&dir, comp)?;
        dir = openat2(
            Dir::Fd(dir.as_fd()),
            *comp,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            RESOLVE,
        )?;
    }
    if is_dir {
        mkdir_at(&dir, last)?;
        openat2(
            Dir::Fd(dir.as_fd()),
            *last,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            RESOLVE,
        )
    } else {
        // O_CREAT without O_EXCL: an existing file is fine; a symlink is refused by RESOLVE.
        drop(openat2(
            Dir::Fd(dir.as_fd()),
            *last,
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
            RESOLVE,
        )?);
        openat2(Dir::Fd(dir.as_fd()), *last, libc::O_PATH, 0, RESOLVE)
    }
}

fn mkdir_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    match nix::sys::stat::mkdirat(
        dir.as_fd(),
        name,
        nix::sys::stat::Mode::from_bits_truncate(0o755),
    ) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Step 2c: attaches every prepared bind, parents before children.
pub fn attach_binds(root: &OwnedFd, binds: &mut [PreparedBind]) -> Result<(), String> {
    binds.sort_by(|a, b| a.path.cmp(&b.path));
    for b in binds.iter() {
        let target =
            make_target(root, &b.path, b.is_dir).map_err(|e| format!("target {}: {e}", b.path))?;
        sys::move_mount(b.tree.as_fd(), target.as_fd())
            .map_err(|e| format!("attaching at {}: {e}", b.path))?;
    }
    Ok(())
}
