//! The version ring: before `fs_write`/`fs_edit` replaces a file, its old content is kept under
//! `<root>/.warren-versions/<key>/<stamp>`, where `<key>` is the first 32 hex digits of the SHA-256
//! of the file's path below the root (lexically normalised) and `<stamp>` a zero-padded
//! nanosecond time, so names sort oldest first. `<key>/path` holds the path, for people.
//! At most [`KEEP`] versions per file; at most [`QUOTA`] bytes of versions per root, the oldest
//! (across all files) evicted first. Every open here is `O_NOFOLLOW` and resolved with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so a symlink planted in the ring is never followed,
//! only removed.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, ResolveFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use sha2::{Digest, Sha256};

use super::RootDir;
use super::resolve::{kind, open_beneath};

pub const VERSIONS_DIR: &str = ".warren-versions";
pub const KEEP: usize = 5;
pub const QUOTA: u64 = 64 << 20;

// Every file these tools replace fits in the ring (atomic::MAX_EXISTING is the larger bound).
const _: () = assert!(super::atomic::MAX_EXISTING <= QUOTA);

/// Keeps `old` as the newest version of the file at `components` (below `root`).
pub fn save(root: &RootDir, components: &[OsString], old: &[u8]) -> Result<(), String> {
    let ring = open_or_make_dir(root.fd.as_fd(), VERSIONS_DIR)?;
    let normalised = normalise(components);
    let key = hex::encode(&Sha256::digest(&normalised)[..16]);
    let file_dir = open_or_make_dir(ring.as_fd(), &key)?;
    if let Ok(fd) = create_new(file_dir.as_fd(), "path") {
        // Best effort: the label is for people; the key alone identifies the file.
        let label = warren_daemon::escape::escape_bytes(&normalised);
        let _ = File::from(fd).write_all(format!("{label}\n").as_bytes());
    }
    write_version(file_dir.as_fd(), old)?;
    trim_file(file_dir.as_fd())?;
    enforce_quota(ring.as_fd())
}

/// `..` pops (never above the root), `.` and empty components vanish; the bytes of the path.
fn normalise(components: &[OsString]) -> Vec<u8> {
    let mut out: Vec<&[u8]> = Vec::new();
    for c in components {
        match c.as_bytes() {
            b".." => {
                out.pop();
            }
            b"." | b"" => {}
            name => out.push(name),
        }
    }
    out.join(&b'/')
}

fn open_or_make_dir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, String> {
    match mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(format!("version ring: cannot create {name}: {}", e.desc())),
    }
    open_beneath(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| format!("version ring: cannot open {name}: {} (refused)", e.desc()))
}

fn create_new(dir: BorrowedFd<'_>, name: &str) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
}

fn write_version(dir: BorrowedFd<'_>, old: &[u8]) -> Result<(), String> {
    let mut stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    loop {
        match create_new(dir, &format!("{stamp:020}")) {
            Ok(fd) => {
                return File::from(fd)
                    .write_all(old)
                    .map_err(|e| format!("version ring: write: {e}"));
            }
            Err(Errno::EEXIST) => stamp += 1,
            Err(e) => return Err(format!("version ring: create: {}", e.desc())),
        }
    }
}

/// The version files in one file's dir: (stamp name, size), oldest first. Anything that is not a
/// regular file with a numeric name (a planted symlink, a stray dir) is removed or ignored.
fn versions_in(dir: BorrowedFd<'_>) -> Result<Vec<(String, u64)>, String> {
    let fd = open_beneath(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        ResolveFlag::RESOLVE_BENEATH,
    )
    .map_err(|e| format!("version ring: {}", e.desc()))?;
    let mut listing = Dir::from_fd(fd).map_err(|e| format!("version ring: {}", e.desc()))?;
    let mut found = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| format!("version ring: {}", e.desc()))?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if kind(&st) == SFlag::S_IFREG => {
                found.push((name.to_string(), st.st_size as u64))
            }
            Ok(_) => remove(dir, name),
            Err(_) => {}
        }
    }
    found.sort();
    Ok(found)
}

fn remove(dir: BorrowedFd<'_>, name: &str) {
    // Removal is best effort: a name already gone is what we wanted.
    let _ = unlinkat(dir, name, UnlinkatFlags::NoRemoveDir);
}

fn trim_file(dir: BorrowedFd<'_>) -> Result<(), String> {
    let versions = versions_in(dir)?;
    let excess = versions.len().saturating_sub(KEEP);
    for (name, _) in &versions[..excess] {
        remove(dir, name);
    }
    Ok(())
}

fn enforce_quota(ring: BorrowedFd<'_>) -> Result<(), String> {
    let fd = open_beneath(
        ring,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        ResolveFlag::RESOLVE_BENEATH,
    )
    .map_err(|e| format!("version ring: {}", e.desc()))?;
    let mut listing = Dir::from_fd(fd).map_err(|e| format!("version ring: {}", e.desc()))?;
    let mut all: Vec<(String, u64, std::rc::Rc<OwnedFd>)> = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| format!("version ring: {}", e.desc()))?;
        let Ok(key) = entry.file_name().to_str() else {
            continue;
        };
        if key.len() != 32 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(dir) = open_beneath(
            ring,
            key,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS,
        ) else {
            continue;
        };
        let dir = std::rc::Rc::new(dir);
        for (name, size) in versions_in(dir.as_fd())? {
            all.push((name, size, dir.clone()));
        }
    }
    let mut total: u64 = all.iter().map(|(_, size, _)| size).sum();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, size, dir) in &all {
        if total <= QUOTA {
            break;
        }
        remove(dir.as_fd(), name);
        total -= size;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::normalise;
    use std::ffi::OsString;

    #[test]
    fn normalise_clamps_at_the_root() {
        let c = |s: &str| s.split('/').map(OsString::from).collect::<Vec<_>>();
        assert_eq!(normalise(&c("a/./b/../c")), b"a/c");
        assert_eq!(normalise(&c("../../x")), b"x");
    }
}
