//! Naming inside a tool's roots. An argument path picks a root (the longest `path` prefix, or the
//! first root for a relative path); the rest is resolved by the kernel with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from that root's fd, so neither `..` nor a
//! symlink — absolute or relative, planted before or during the call — can name anything outside.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, SFlag, fstat};

use super::{RootDir, ToolContext, deny};

/// How often a resolution that the kernel reports as racing (EAGAIN) is retried.
const EAGAIN_RETRIES: usize = 64;

/// An argument path bound to its root.
pub struct Target<'a> {
    pub root: &'a RootDir,
    /// Components below the root (`.` dropped, `..` kept for the kernel to clamp).
    pub components: Vec<String>,
    /// The path as the caller wrote it, for messages.
    pub shown: String,
}

impl<'a> Target<'a> {
    /// Picks the root for `path` and applies the deny-list.
    pub fn new(ctx: &'a ToolContext, path: &str) -> Result<Target<'a>, String> {
        if path.is_empty() {
            return Err("path is empty".into());
        }
        if path.contains('\0') {
            return Err("path contains a NUL byte".into());
        }
        let Some(first) = ctx.roots.first() else {
            return Err("this tool has no roots".into());
        };
        let arg: Vec<&str> = split(path);
        let (root, rest) = if path.starts_with('/') {
            let best = ctx
                .roots
                .iter()
                .filter_map(|root| {
                    let prefix = split(&root.path);
                    arg.starts_with(&prefix).then_some((root, prefix.len()))
                })
                .max_by_key(|(_, len)| *len);
            match best {
                Some((root, len)) => (root, &arg[len..]),
                None => {
                    let roots: Vec<&str> = ctx.roots.iter().map(|r| r.path.as_str()).collect();
                    return Err(format!(
                        "{path}: outside this tool's roots ({})",
                        roots.join(", ")
                    ));
                }
            }
        } else {
            (first, &arg[..])
        };
        let components: Vec<String> = rest.iter().map(|c| c.to_string()).collect();
        deny::check(path, &components)?;
        Ok(Target {
            root,
            components,
            shown: path.to_string(),
        })
    }

    /// The path below the root, as openat2 takes it (`.` for the root itself).
    pub fn relative(&self) -> String {
        join(&self.components)
    }

    /// The parent's components and the final name, which must be a real name (not `.`/`..`).
    pub fn parent_and_name(&self) -> Result<(&[String], &str), String> {
        match self.components.split_last() {
            Some((name, parent)) if name != ".." => Ok((parent, name)),
            _ => Err(format!("{}: names a directory, not a file", self.shown)),
        }
    }

    /// Opens the target as a regular file for reading: first with O_PATH to learn its type
    /// without side effects, then for real, checking it is still the same regular file.
    pub fn open_regular(&self) -> Result<(File, FileStat), String> {
        let rel = self.relative();
        let probe =
            open_in_root(self.root, &rel, OFlag::O_PATH).map_err(|e| describe(e, &self.shown))?;
        let first = fstat(&probe).map_err(|e| describe(e, &self.shown))?;
        require_regular(&first, &self.shown)?;
        let fd =
            open_in_root(self.root, &rel, OFlag::O_RDONLY).map_err(|e| describe(e, &self.shown))?;
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
        let probe =
            open_in_root(self.root, &rel, OFlag::O_PATH).map_err(|e| describe(e, &self.shown))?;
        let st = fstat(&probe).map_err(|e| describe(e, &self.shown))?;
        if kind(&st) != SFlag::S_IFDIR {
            return Err(format!(
                "{}: is a {}, not a directory",
                self.shown,
                type_name(&st)
            ));
        }
        open_in_root(self.root, &rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
            .map_err(|e| describe(e, &self.shown))
    }
}

/// Path components, `.` and empty ones dropped.
fn split(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

pub fn join(components: &[String]) -> String {
    if components.is_empty() {
        ".".to_string()
    } else {
        components.join("/")
    }
}

/// openat2 from the root fd with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS, O_NOFOLLOW and (for
/// real opens) O_NONBLOCK | O_NOCTTY, so a FIFO or a device never blocks the worker.
pub fn open_in_root(root: &RootDir, relative: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    open_beneath(
        root.fd.as_fd(),
        relative,
        flags,
        ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    )
}

/// openat2 with the given resolve flags and the same open flags as [`open_in_root`].
pub fn open_beneath(
    dir: std::os::fd::BorrowedFd<'_>,
    relative: &str,
    flags: OFlag,
    resolve: ResolveFlag,
) -> nix::Result<OwnedFd> {
    let flags = if flags.contains(OFlag::O_PATH) {
        // openat2 refuses any other flag beside O_PATH.
        flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW
    } else {
        flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY
    };
    let how = OpenHow::new().flags(flags).resolve(resolve);
    let mut tries = 0;
    loop {
        match openat2(dir, relative, how) {
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
