//! Identities of host paths as the kernel knows them: (st_dev, st_ino) plus the mount id.
//! warren compares paths by these, never by their strings.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;

/// What a path resolves to: the file (dev, ino) and the mount it was reached through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u64,
}

impl Ident {
    /// Same file (whatever mount it is seen through).
    pub fn same_file(&self, other: &Ident) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

/// Opens `path` as an O_PATH handle, following symlinks (host paths are the operator's words).
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?)
}

/// (dev, ino, mount id) of an open handle.
pub fn ident(fd: BorrowedFd<'_>) -> io::Result<Ident> {
    // SAFETY: statx is zero-initialisable plain data.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, empty NUL-terminated path with AT_EMPTY_PATH, and a valid out pointer.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_INO | libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Ident {
        dev: libc::makedev(stx.stx_dev_major, stx.stx_dev_minor),
        ino: stx.stx_ino,
        mnt_id: stx.stx_mnt_id,
    })
}

/// The handle's identity and every ancestor's up to the root, self first. `..` is walked by
/// the kernel (crossing mounts as it does), so renames or symlinks in the path string do not
/// matter.
pub fn ancestry(fd: BorrowedFd<'_>) -> io::Result<Vec<Ident>> {
    let mut chain = vec![ident(fd)?];
    let mut cur: Option<OwnedFd> = None;
    loop {
        let base = cur.as_ref().map_or(fd, |f| f.as_fd());
        let up = match openat(
            base,
            "..",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(up) => up,
            // ENOTDIR: `fd` is a file, so take its containing directory by name.
            Err(Errno::ENOTDIR) if cur.is_none() => parent_of_file(fd)?,
            Err(e) => return Err(e.into()),
        };
        let id = ident(up.as_fd())?;
        if chain
            .last()
            .is_some_and(|last| last.same_file(&id) && last.mnt_id == id.mnt_id)
        {
            return Ok(chain);
        }
        chain.push(id);
        cur = Some(up);
    }
}

/// The directory holding a non-directory handle, via the kernel's name for it.
fn parent_of_file(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let name = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let parent = name
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file has no parent"))?;
    let dir = open_path(parent)?;
    // The name could have been swapped since; make sure the file is still in that directory.
    let file_name = name
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?;
    let again = openat(
        &dir,
        file_name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if !ident(again.as_fd())?.same_file(&ident(fd)?) {
        return Err(io::Error::other("file moved while resolving its parent"));
    }
    Ok(dir)
}
