//! Naming inside a tool's roots. An argument path picks a root (the longest `path` prefix, or the
//! first root for a relative path); the rest is resolved by the kernel with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from that root's fd, so neither `..` nor a
//! symlink — absolute or relative, planted before or during the call — can name anything outside.
//!
//! A path argument is read in the escaping rule's form (`warren_daemon::escape`), the form
//! `fs_list` prints names in: `\\` is a `\`, `\u{XXXX}` a code point, `\x{HH}` a byte that is
//! not UTF-8; every other character stands for itself. So every name a listing shows (a newline,
//! a bidi override, invalid UTF-8) can be named back, and messages show the path in that form.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

use nix::NixPath;
use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag};
use nix::sys::stat::{FileStat, SFlag, fstat};
use warren_daemon::escape::{escape, escape_bytes, unescape};

use super::{RootDir, ToolContext, deny};

/// How often a resolution that the kernel reports as racing (EAGAIN) is retried.
const EAGAIN_RETRIES: usize = 64;

/// An argument path bound to its root.
pub struct Target<'a> {
    pub root: &'a RootDir,
    /// Components below the root (`.` dropped, `..` kept for the kernel to clamp), as bytes: a
    /// name need not be UTF-8.
    pub components: Vec<OsString>,
    /// The path in the escaping rule's form, for messages.
    pub shown: String,
}

impl<'a> Target<'a> {
    /// Reads `path` (escaped form), picks its root and applies the deny-list.
    pub fn new(ctx: &'a ToolContext, path: &str) -> Result<Target<'a>, String> {
        if path.is_empty() {
            return Err("path is empty".into());
        }
        let bytes = unescape(path).map_err(|e| format!("path {}: {e}", escape(path)))?;
        let shown = escape_bytes(&bytes);
        if bytes.contains(&0) {
            return Err(format!("{shown}: path contains a NUL byte"));
        }
        let Some(first) = ctx.roots.first() else {
            return Err("this tool has no roots".into());
        };
        let arg: Vec<&[u8]> = split(&bytes);
        let (root, rest) = if bytes.starts_with(b"/") {
            let best = ctx
                .roots
                .iter()
                .filter_map(|root| {
                    let prefix = split(root.path.as_bytes());
                    arg.starts_with(&prefix).then_some((root, prefix.len()))
                })
                .max_by_key(|(_, len)| *len);
            match best {
                Some((root, len)) => (root, &arg[len..]),
                None => {
                    let roots: Vec<&str> = ctx.roots.iter().map(|r| r.path.as_str()).collect();
                    return Err(format!(
                        "{shown}: outside this tool's roots ({})",
                        roots.join(", ")
                    ));
                }
            }
        } else {
            (first, &arg[..])
        };
        let components: Vec<OsString> = rest
            .iter()
            .map(|c| OsString::from_vec(c.to_vec()))
            .collect();
        deny::check(&shown, &components)?;
        Ok(Target {
            root,
            components,
            shown,
        })
    }

    /// The path below the root, as openat2 takes it (`.` for the root itself).
    pub fn relative(&self) -> OsString {
        join(&self.components)
    }

    /// The parent's components and the final name, which must be a real name (not `.`/`..`).
    pub fn parent_and_name(&self) -> Result<(&[OsString], &OsStr), String> {
        match self.components.split_last() {
            Some((name, parent)) if name != ".." => Ok((parent, name)),
            _ => Err(format!("{}: names a directory, not a file", self.shown)),
        }
    }

    /// Opens the target as a regular file for reading: first with O_PATH to learn its type
    /// without side effects, then for real, checking it is still the same regular file.
    pub fn open_regular(&self) -> Result<(File, FileStat), String> {
        let rel = self.relative();
        let probe = open_in_root(self.root, rel.as_os_str(), OFlag::O_PATH)
            .map_err(|e| describe(e, &self.shown))?;
        let first = fstat(&probe).map_err(|e| describe(e, &self.shown))?;
        require_regular(&first, &self.shown)?;
        let fd = open_in_root(self.root, rel.as_os_str(), OFlag::O_RDONLY)
            .map_err(|e| describe(e, &self.shown))?;
        let st = fstat(&fd).map_err(|e| describe(e, &self.shown))?;
        require_regular(&st, &self.shown)?;
        if (st.st_dev, st.st_ino) != (first.st_dev, first.st_ino) {
            return Err(format!(
                "{}: changed while being opened; try again",
                self.shown
            ));
        }
        Ok((File::from(fd), st))
    }

    /// Opens the target as a directory for reading its entries.
    pub fn open_directory(&self) -> Result<OwnedFd, String> {
        let rel = self.relative();
        let probe = open_in_root(self.root, rel.as_os_str(), OFlag::O_PATH)
            .map_err(|e| describe(e, &self.shown))?;
        let st = fstat(&probe).map_err(|e| describe(e, &self.shown))?;
        if kind(&st) != SFlag::S_IFDIR {
            return Err(format!(
                "{}: is a {}, not a directory",
                self.shown,
                type_name(&st)
            ));
        }
        open_in_root(
            self.root,
            rel.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        )
        .map_err(|e| describe(e, &self.shown))
    }
}

/// Path components, `.` and empty ones dropped.
fn split(path: &[u8]) -> Vec<&[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect()
}

pub fn join(components: &[OsString]) -> OsString {
    if components.is_empty() {
        ".".into()
    } else {
        components.join(OsStr::new("/"))
    }
}

/// openat2 from the root fd with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS, O_NOFOLLOW and (for
/// real opens) O_NONBLOCK | O_NOCTTY, so a FIFO or a device never blocks the worker.
pub fn open_in_root<P: NixPath + ?Sized>(
    root: &RootDir,
    relative: &P,
    flags: OFlag,
) -> nix::Result<OwnedFd> {
    open_beneath(
        root.fd.as_fd(),
        relative,
        flags,
        ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    )
}

/// openat2 with the given resolve flags and the same open flags as [`open_in_root`].
pub fn open_beneath<P: NixPath + ?Sized>(
    dir: std::os::fd::BorrowedFd<'_>,
    relative: &P,
    flags: OFlag,
    resolve: ResolveFlag,
) -> nix::Result<OwnedFd> {
    let flags = if flags.contains(OFlag::O_PATH) {
        // openat2 refuses any other flag beside O_PATH.
        flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW
    } else {
        flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY
    };
    let mut tries = 0;
    loop {
        let opened = warren_jail::openat2(
            warren_jail::Dir::Fd(dir),
            relative,
            flags.bits(),
            0,
            resolve.bits(),
        )
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)));
        match opened {
            Err(Errno::EAGAIN) if tries < EAGAIN_RETRIES => tries += 1,
            other => return other,
        }
    }
}

pub fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

pub fn type_name(st: &FileStat) -> &'static str {
    match kind(st) {
        SFlag::S_IFREG => "file",
        SFlag::S_IFDIR => "dir",
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFIFO => "fifo",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "chardev",
        SFlag::S_IFBLK => "blockdev",
        _ => "unknown",
    }
}

pub fn require_regular(st: &FileStat, shown: &str) -> Result<(), String> {
    if kind(st) == SFlag::S_IFREG {
        Ok(())
    } else if kind(st) == SFlag::S_IFLNK {
        Err(describe(Errno::ELOOP, shown))
    } else {
        Err(format!(
            "refused: {shown}: is a {}; file tools touch only regular files and directories",
            type_name(st)
        ))
    }
}

/// A message naming the path and what the kernel said.
pub fn describe(errno: Errno, shown: &str) -> String {
    match errno {
        Errno::ENOENT => format!("{shown}: no such file or directory"),
        Errno::ELOOP => {
            format!("refused: {shown}: is a symbolic link (tools never follow a final symlink)")
        }
        Errno::ENOTDIR => format!("{shown}: a component is not a directory"),
        Errno::EXDEV => format!("refused: {shown}: resolution would leave the tool's root"),
        Errno::EACCES | Errno::EPERM => format!("{shown}: permission denied"),
        Errno::ENXIO => format!("refused: {shown}: not a regular file (no such device or address)"),
        other => format!("{shown}: {}", other.desc()),
    }
}

/// How deep below its root a directory's name is looked for (a bound on the walk up).
const MAX_DEPTH: usize = 4096;

/// Where `dir` (resolved in `root`) really is, named as the root's path plus the names below it
/// (escaping rule's form): found by walking up from the fd (`..`, then the entry of the parent
/// that is the directory just left) until the root, so it is the path the kernel resolved —
/// `docs/../.git` at a root `…/docs` is `…/docs/.git`, a symlink is named as its target — not
/// the argument as written.
pub fn resolved_path(root: &RootDir, dir: &OwnedFd) -> Result<String, Errno> {
    let root_st = fstat(&root.fd)?;
    let mut st = fstat(dir)?;
    let mut here = dir.try_clone().map_err(|_| Errno::EBADF)?;
    let mut names: Vec<Vec<u8>> = Vec::new();
    for _ in 0..MAX_DEPTH {
        if (st.st_dev, st.st_ino) == (root_st.st_dev, root_st.st_ino) {
            let mut path = root.path.as_bytes().to_vec();
            for n in names.iter().rev() {
                if !path.ends_with(b"/") {
                    path.push(b'/');
                }
                path.extend_from_slice(n);
            }
            return Ok(escape_bytes(&path));
        }
        let up = nix::fcntl::openat(
            &here,
            "..",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        names.push(entry_naming(&up, &st)?.ok_or(Errno::ENOENT)?);
        st = fstat(&up)?;
        here = up;
    }
    Err(Errno::ELOOP)
}

/// The name in directory `up` of the file `st` is. This runs on every write: entries whose
/// `d_ino` is the file's are checked first, one `fstatat` each (the usual case: one); only when
/// none is the file — a mount point, whose entry carries the covered inode's number — is every
/// entry stat'ed.
fn entry_naming(up: &OwnedFd, st: &FileStat) -> Result<Option<Vec<u8>>, Errno> {
    let is_it = |name: &std::ffi::CStr| {
        nix::sys::stat::fstatat(up, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|s| (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino))
    };
    let mut entries = nix::dir::Dir::from_fd(up.try_clone().map_err(|_| Errno::EBADF)?)?;
    // Each `iter` starts from the first entry (nix rewinds the stream when one is dropped).
    for by_ino in [true, false] {
        for entry in entries.iter() {
            let entry = entry?;
            let name = entry.file_name();
            if matches!(name.to_bytes(), b"." | b"..") || (by_ino && entry.ino() != st.st_ino) {
                continue;
            }
            if is_it(name) {
                return Ok(Some(name.to_bytes().to_vec()));
            }
        }
    }
    Ok(None)
}
