//! `openat2`, the one way warren opens a path beneath a directory handle (RESOLVE_BENEATH,
//! RESOLVE_IN_ROOT, RESOLVE_NO_SYMLINKS, …): nsd's namespace trees, its narrowed handles and
//! toolfs's workers all call this. Every open is close-on-exec.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::NixPath;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// Where a path lookup starts: a directory fd, or the cwd.
#[derive(Clone, Copy)]
pub enum Dir<'a> {
    Fd(BorrowedFd<'a>),
    Cwd,
}

impl<'a> Dir<'a> {
    fn fd(self) -> BorrowedFd<'a> {
        match self {
            Dir::Fd(fd) => fd,
            Dir::Cwd => nix::fcntl::AT_FDCWD,
        }
    }
}

/// `openat2(dir, path, how)` with the given O_ flags (O_CLOEXEC always added), mode and
/// RESOLVE_ flags.
pub fn openat2<P: NixPath + ?Sized>(
    dir: Dir<'_>,
    path: &P,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::from_bits_retain(flags | libc::O_CLOEXEC))
        .mode(Mode::from_bits_retain(mode))
        .resolve(ResolveFlag::from_bits_retain(resolve));
    nix::fcntl::openat2(dir.fd(), path, how).map_err(io::Error::from)
}
