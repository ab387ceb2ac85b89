//! The one write path of `fs_write` and `fs_edit`: the parent directory is resolved in the root
//! (openat2 IN_ROOT) and held as an fd; everything after happens relative to that fd —
//! the old file is opened O_NOFOLLOW, a temp `.<name>.warren-tmp.<random>` is created
//! O_CREAT|O_EXCL|O_NOFOLLOW beside it, written, given the old owner and mode, fsync'd and
//! renamed over the name on the SAME parent fd; then the parent is fsync'd. A reader sees the old
//! file or the new one, never a mix; a symlink swapped into the path at any moment can only
//! redirect the resolution to somewhere else inside the root.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use std::ffi::{OsStr, OsString};

use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fsync, unlinkat};
use warren_daemon::escape::escape_bytes;

use super::resolve::{Target, describe, join, kind, open_in_root, require_regular, resolved_path};
use super::{elision, versions};

/// The largest file these tools replace or write (an existing file is read whole, for the
/// version ring and the elision check; a larger new one could never be replaced again).
pub const MAX_EXISTING: u64 = 16 << 20;

/// Mode of a newly created file (before the worker's umask 022).
const NEW_FILE_MODE: u32 = 0o644;
const NEW_DIR_MODE: u32 = 0o755;

/// What a replacement did, for the result text.
pub struct Replaced {
    pub bytes: usize,
    pub created: bool,
    /// The file's path as resolved (`resolve::resolved_path` of its parent, and its name), in
    /// the escaping rule's form: what the result names, not the argument as written.
    pub path: String,
}

/// Replaces the file `target` names with what `make_new` returns given the current content
/// (`None`: no such file yet): the new bytes and the text the caller supplied, which is checked
/// for new elision markers. Refuses a read-only root, a non-regular file and a file too large.
pub fn replace_file(
    target: &Target<'_>,
    create_dirs: bool,
    make_new: impl FnOnce(Option<&[u8]>) -> Result<(Vec<u8>, String), String>,
) -> Result<Replaced, String> {
    if !target.root.writable {
        return Err(format!(
            "refused: {}: the root {} is read-only for this tool",
            target.shown, target.root.path
        ));
    }
    let (parent_components, name) = target.parent_and_name()?;
    if target
        .components
        .iter()
        .any(|c| c == versions::VERSIONS_DIR)
    {
        return Err(format!(
            "refused: {}: {} is the version ring, kept by the tools themselves",
            target.shown,
            versions::VERSIONS_DIR
        ));
    }
    let parent = open_parent(target, parent_components, create_dirs)?;
    let path = resolved_path(target.root, &parent)
        .map(|dir| {
            let sep = if dir.ends_with('/') { "" } else { "/" };
            format!("{dir}{sep}{}", escape_bytes(name.as_encoded_bytes()))
        })
        .map_err(|e| format!("{}: where it resolved: {}", target.shown, e.desc()))?;
    let existing = read_existing(&parent, name, &target.shown)?;
    let old_text = existing
        .as_ref()
        .map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned());
    let (new, supplied) = make_new(existing.as_ref().map(|(_, bytes)| bytes.as_slice()))?;
    if new.len() as u64 > MAX_EXISTING {
        return Err(format!(
            "refused: {}: {} bytes; these tools write files of at most {MAX_EXISTING} bytes",
            target.shown,
            new.len()
        ));
    }
    elision::check(&target.shown, old_text.as_deref(), &supplied)?;
    let mode = existing
        .as_ref()
        .map_or(NEW_FILE_MODE, |(st, _)| st.st_mode & 0o777);
    let temp = TempFile::create(&parent, name, mode, &target.shown)?;
    let mut file = File::from(
        temp.fd
            .try_clone()
            .map_err(|e| format!("{}: {e}", target.shown))?,
    );
    file.write_all(&new)
        .map_err(|e| format!("{}: write: {e}", target.shown))?;
    if let Some((st, _)) = &existing {
        keep_owner_and_mode(&file, st, &target.shown)?;
    }
    fsync(&file).map_err(|e| format!("{}: fsync: {}", target.shown, e.desc()))?;
    // The old content joins the ring only once the new file is ready to take its place.
    if let Some((_, old)) = &existing {
        versions::save(target.root, &target.components, old)?;
    }
    let renamed = if existing.is_some() {
        renameat(&parent, temp.name.as_str(), &parent, name)
    } else {
        // A file that appeared meanwhile is not silently replaced (its content has no version).
        renameat2(
            &parent,
            temp.name.as_str(),
            &parent,
            name,
            RenameFlags::RENAME_NOREPLACE,
        )
    };
    match renamed {
        Ok(()) => temp.disarm(),
        Err(Errno::EEXIST) => {
            return Err(format!(
                "{}: the file appeared while being written; not replaced, try again",
                target.shown
            ));
        }
        Err(e) => return Err(format!("{}: rename: {}", target.shown, e.desc())),
    }
    fsync(&parent)
        .map_err(|e| format!("{}: fsync of the directory: {}", target.shown, e.desc()))?;
    Ok(Replaced {
        bytes: new.len(),
        created: existing.is_none(),
        path,
    })
}

/// The parent directory as an fd resolved in the root; with `create`, missing directories are
/// made one at a time, each relative to the fd of the one before.
fn open_parent(
    target: &Target<'_>,
    components: &[OsString],
    create: bool,
) -> Result<OwnedFd, String> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    match open_in_root(target.root, join(components).as_os_str(), flags) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) if create => {}
        Err(Errno::ENOENT) => {
            return Err(format!(
                "{}: the parent directory does not exist (create_dirs is false)",
                target.shown
            ));
        }
        Err(e) => return Err(describe(e, &target.shown)),
    }
    let mut dir = open_in_root(target.root, ".", flags).map_err(|e| describe(e, &target.shown))?;
    for depth in 1..=components.len() {
        let prefix = join(&components[..depth]);
        dir = match open_in_root(target.root, prefix.as_os_str(), flags) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match mkdirat(
                    &dir,
                    components[depth - 1].as_os_str(),
                    Mode::from_bits_truncate(NEW_DIR_MODE),
                ) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => {
                        return Err(format!(
                            "{}: cannot create {}: {}",
                            target.shown,
                            escape_bytes(prefix.as_encoded_bytes()),
                            e.desc()
                        ));
                    }
                }
                open_in_root(target.root, prefix.as_os_str(), flags)
                    .map_err(|e| describe(e, &target.shown))?
            }
            Err(e) => return Err(describe(e, &target.shown)),
        };
    }
    Ok(dir)
}

/// The current file under `name` in `parent`, if any: stat without following, refuse anything
/// but a regular file, open O_NOFOLLOW|O_NONBLOCK, check it is the file stat'ed, read it whole.
fn read_existing(
    parent: &OwnedFd,
    name: &OsStr,
    shown: &str,
) -> Result<Option<(FileStat, Vec<u8>)>, String> {
    let st = match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(describe(e, shown)),
    };
    if kind(&st) == SFlag::S_IFLNK {
        return Err(describe(Errno::ELOOP, shown));
    }
    require_regular(&st, shown)?;
    if st.st_size as u64 > MAX_EXISTING {
        return Err(format!(
            "refused: {shown}: {} bytes; these tools replace files of at most {MAX_EXISTING} bytes",
            st.st_size
        ));
    }
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = openat(parent, name, flags, Mode::empty()).map_err(|e| describe(e, shown))?;
    let opened = fstat(&fd).map_err(|e| describe(e, shown))?;
    require_regular(&opened, shown)?;
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) {
        return Err(format!("{shown}: changed while being opened; try again"));
    }
    let mut bytes = Vec::with_capacity(opened.st_size as usize);
    File::from(fd)
        .take(MAX_EXISTING + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{shown}: read: {e}"))?;
    if bytes.len() as u64 > MAX_EXISTING {
        return Err(format!(
            "refused: {shown}: grew beyond {MAX_EXISTING} bytes while being read"
        ));
    }
    Ok(Some((opened, bytes)))
}

/// The temp file gets the old file's owner (if it differs from ours: refused if we may not
/// give it) and then its permission bits (after the chown, which clears set-id bits).
fn keep_owner_and_mode(file: &File, old: &FileStat, shown: &str) -> Result<(), String> {
    let ours = fstat(file).map_err(|e| describe(e, shown))?;
    if (ours.st_uid, ours.st_gid) != (old.st_uid, old.st_gid) {
        fchown(
            file,
            Some(Uid::from_raw(old.st_uid)),
            Some(Gid::from_raw(old.st_gid)),
        )
        .map_err(|e| {
            format!(
                "refused: {shown}: cannot keep its owner {}:{} ({}); not written",
                old.st_uid,
                old.st_gid,
                e.desc()
            )
        })?;
    }
    fchmod(file, Mode::from_bits_truncate(old.st_mode & 0o777))
        .map_err(|e| format!("{shown}: fchmod: {}", e.desc()))
}

/// A temp file beside the target, removed on drop unless renamed into place.
struct TempFile<'a> {
    parent: &'a OwnedFd,
    name: String,
    fd: OwnedFd,
    armed: bool,
}

impl<'a> TempFile<'a> {
    fn create(
        parent: &'a OwnedFd,
        target_name: &OsStr,
        mode: u32,
        shown: &str,
    ) -> Result<TempFile<'a>, String> {
        // The stem is for people finding a left-over temp file; the random part makes it unique.
        let mut stem: String = target_name.to_string_lossy().chars().take(64).collect();
        while stem.len() > 128 {
            stem.pop();
        }
        for _ in 0..8 {
            let mut random = [0u8; 8];
            getrandom::fill(&mut random).map_err(|e| format!("{shown}: getrandom: {e}"))?;
            let name = format!(".{stem}.warren-tmp.{}", hex::encode(random));
            let flags = OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_WRONLY
                | OFlag::O_CLOEXEC;
            match openat(parent, name.as_str(), flags, Mode::from_bits_truncate(mode)) {
                Ok(fd) => {
                    return Ok(TempFile {
                        parent,
                        name,
                        fd,
                        armed: true,
                    });
                }
                Err(Errno::EEXIST) => continue,
                Err(Errno::EACCES) => {
                    // Say who was refused: a file tool writes as its root's owner, or (a root
                    // owned by root) as warren's worker uid, which such a directory keeps out.
                    return Err(format!(
                        "{shown}: cannot create a temp file beside it: {} (this tool writes as \
                         uid {}; a directory root owns is written only where its mode lets \
                         that uid in)",
                        Errno::EACCES.desc(),
                        nix::unistd::geteuid()
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "{shown}: cannot create a temp file beside it: {}",
                        e.desc()
                    ));
                }
            }
        }
        Err(format!("{shown}: cannot find a free temp file name"))
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort cleanup of our own temp name (never followed: unlinkat removes the name).
            let _ = unlinkat(
                self.parent.as_fd(),
                self.name.as_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}
