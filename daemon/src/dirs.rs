//! warren's three directories, and how they and the daemons' files in them are opened: never
//! through a symlink, never one another user could have planted. None of the directories may
//! ever enter a namespace (nsd checks by inode).

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{FileStat, Mode, fchmod, fstat, mkdirat};
use nix::unistd::fchown;

/// The runtime dir holds the daemons' sockets and the `warren up` lock; the data dir holds their
/// databases; the secrets dir holds the receipt signing key and nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    pub runtime: PathBuf,
    pub data: PathBuf,
    pub secrets: PathBuf,
}

pub const DEFAULT_RUNTIME: &str = "/run/warren";
pub const DEFAULT_DATA: &str = "/var/lib/warren";
pub const DEFAULT_SECRETS: &str = "/etc/warren/secrets";

impl Dirs {
    /// From `WARREN_RUNTIME_DIR`, `WARREN_DATA_DIR` and `WARREN_SECRETS_DIR`, else the defaults.
    pub fn from_env() -> Dirs {
        let var = |name: &str, default: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Dirs {
            runtime: var("WARREN_RUNTIME_DIR", DEFAULT_RUNTIME),
            data: var("WARREN_DATA_DIR", DEFAULT_DATA),
            secrets: var("WARREN_SECRETS_DIR", DEFAULT_SECRETS),
        }
    }

    /// All three under one base directory (tests, `warren demo`).
    pub fn under(base: impl Into<PathBuf>) -> Dirs {
        let base = base.into();
        Dirs {
            runtime: base.join("run"),
            data: base.join("data"),
            secrets: base.join("secrets"),
        }
    }

    /// The operator socket of a daemon: `tool` → `<runtime>/tool.sock`.
    pub fn socket(&self, server: &str) -> PathBuf {
        self.runtime.join(format!("{server}.sock"))
    }

    /// The control socket of a daemon (trusted peers only): `toolfs` → `<runtime>/toolfs.ctl`.
    pub fn control(&self, daemon: &str) -> PathBuf {
        self.runtime.join(format!("{daemon}.ctl"))
    }
}

/// Opens the directory `path`, creating what is missing, without following a symlink at any
/// step: each component is opened (or made) from its parent's fd with `O_NOFOLLOW |
/// O_DIRECTORY`, and the last one is given `uid`, `gid` and `mode` on its fd. Refused, before
/// anything is changed: a component that is a symlink or not a directory; a component whose
/// parent others may write to (write for others, or for a group other than root's), unless that
/// parent is sticky and the component belongs to root or `uid`; a component whose parent
/// belongs to anyone but root or `uid` (its owner could rename it away); and a last component that
/// existed but belongs to neither root nor `uid`, or that others may write to. Missing
/// components above the last are made 0755 (root's, or the caller's). Returns the directory's fd.
pub fn make_dir(path: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<OwnedFd> {
    walk_dir(path, uid, Some((gid, mode)))
}

/// Opens the operator's directory `path` (one warren reads but never makes, such as the config
/// dir the peers file is in) with every check of [`make_dir`] and none of its changes: nothing
/// is created, and its owner and mode are left as they are, so a directory that others may write
/// to, or that belongs to neither root nor `uid`, is refused. Returns the directory's fd, from
/// which its files are opened (never by their path a second time).
pub fn open_checked_dir(path: &Path, uid: u32) -> io::Result<OwnedFd> {
    walk_dir(path, uid, None)
}

/// [`make_dir`]'s walk; `make`: the last component's (gid, mode), and leave to create what is
/// missing. None: only check.
fn walk_dir(path: &Path, uid: u32, make: Option<(u32, u32)>) -> io::Result<OwnedFd> {
    let absolute = std::path::absolute(path)?;
    let refuse = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, why);
    let names: Vec<&OsStr> = absolute
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::ParentDir => Some(Err(())),
            _ => None,
        })
        .collect::<Result<_, ()>>()
        .map_err(|()| refuse(format!("{}: `..` in warren's directory", path.display())))?;
    let search = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dir = open(Path::new("/"), search | OFlag::O_PATH, Mode::empty())?;
    let mut here = PathBuf::from("/");
    let mut dir_stat = fstat(&dir)?;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        here.push(name);
        // The last component is read-only opened (fchown and fchmod need more than O_PATH);
        // those above need search permission only.
        let flags = search | if last { OFlag::O_RDONLY } else { OFlag::O_PATH };
        let parent = here.parent().unwrap_or(Path::new("/"));
        // Its owner can rename what is in it, whatever the mode bits say.
        if dir_stat.st_uid != 0 && dir_stat.st_uid != uid {
            return Err(refuse(format!(
                "{} belongs to uid {}, who could rename {} away and put another in its place: \
                 choose a directory whose ancestors are root's",
                parent.display(),
                dir_stat.st_uid,
                here.display()
            )));
        }
        let parent_shared = writable_by_others(&dir_stat);
        if parent_shared && dir_stat.st_mode & libc::S_ISVTX == 0 {
            return Err(refuse(format!(
                "{} (mode {:o}) is writable by others and not sticky, so anyone could replace \
                 {}: choose a directory only root can write to",
                parent.display(),
                dir_stat.st_mode & 0o7777,
                here.display()
            )));
        }
        let mut created = false;
        let child = match openat(&dir, *name, flags, Mode::empty()) {
            Err(Errno::ENOENT) if make.is_some() => {
                let new_mode = if last { 0o700 } else { 0o755 };
                match mkdirat(&dir, *name, Mode::from_bits_truncate(new_mode)) {
                    Ok(()) => created = true,
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(with_path(e, "create", &here)),
                }
                openat(&dir, *name, flags, Mode::empty())
            }
            other => other,
        }
        .map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR => refuse(format!(
                "{} is a symlink or not a directory; warren follows no symlink to its \
                 directories",
                here.display()
            )),
            e => with_path(e, "open", &here),
        })?;
        let child_stat = fstat(&child)?;
        let child_is_ours = child_stat.st_uid == 0 || child_stat.st_uid == uid;
        if parent_shared && !child_is_ours {
            return Err(refuse(format!(
                "{} belongs to uid {}, in the world-writable {}: refusing it (remove it, or \
                 choose another directory)",
                here.display(),
                child_stat.st_uid,
                parent.display()
            )));
        }
        if last && !created && (!child_is_ours || writable_by_others(&child_stat)) {
            return Err(refuse(format!(
                "{} exists with owner uid {} and mode {:o}: warren refuses a directory of its \
                 own that belongs to someone else or that others may write to",
                here.display(),
                child_stat.st_uid,
                child_stat.st_mode & 0o7777
            )));
        }
        if let (true, Some((gid, mode))) = (last, make) {
            if (child_stat.st_uid, child_stat.st_gid) != (uid, gid) {
                fchown(&child, Some(uid.into()), Some(gid.into()))
                    .map_err(|e| with_path(e, "chown", &here))?;
            }
            if child_stat.st_mode & 0o7777 != mode {
                fchmod(&child, Mode::from_bits_truncate(mode))
                    .map_err(|e| with_path(e, "chmod", &here))?;
            }
        }
        dir = child;
        dir_stat = child_stat;
    }
    Ok(dir)
}

/// [`make_dir`] for a daemon's own directory: the caller's uid and gid, mode 0700.
pub fn make_own_dir(path: &Path) -> io::Result<OwnedFd> {
    make_dir(
        path,
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
        0o700,
    )
}

/// Opens a daemon's file (a database, a lock, a key) read-write without following a symlink,
/// creating it 0600 if `create` and it is missing, making it 0600 if others could read it;
/// refuses one that is not a regular file, not the caller's, or writable by group or others. Its directory must be one [`make_dir`] vouched
/// for (only its owner can put a file there).
pub fn open_own_file(path: &Path, create: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is a symlink: refusing it", path.display()),
            ),
            _ => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })?;
    let meta = file.metadata()?;
    check_own_file(path, &meta)?;
    if meta.mode() & 0o077 != 0 {
        // Readable by others: private from now on (the check above refused a writable one).
        fchmod(&file, Mode::from_bits_truncate(0o600)).map_err(|e| with_path(e, "chmod", path))?;
    }
    Ok(file)
}

/// A SQLite database of this daemon's, before SQLite opens it: the file made or checked with
/// [`open_own_file`] (0600 from its first byte; SQLite gives its `-wal` and `-shm` the
/// database's mode), and a `-wal` or `-shm` already there checked the same way. A database
/// another uid planted, or could write to, is refused rather than adopted.
pub fn check_own_database(path: &Path) -> io::Result<()> {
    open_own_file(path, true)?;
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        check_own_file_if_present(Path::new(&side))?;
    }
    Ok(())
}

/// Refuses `path` if it exists and is a symlink, not a regular file, not the caller's, or
/// writable by group or others (SQLite's `-wal` and `-shm` beside a database).
pub fn check_own_file_if_present(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => check_own_file(path, &meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

fn check_own_file(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_file() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} ({}, owner uid {}, mode {:o}) is not a private file of uid {me}: refusing it",
                path.display(),
                if meta.file_type().is_symlink() {
                    "a symlink"
                } else if meta.file_type().is_file() {
                    "a file"
                } else {
                    "not a regular file"
                },
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Creates, or empties, a file warren writes for the operator at a path the operator named (a
/// transcript, a manual page): the one way the front door makes such a file. The path may be
/// in a directory someone else can write to (an agent's output directory), so nothing there is
/// trusted: the open does not follow a symlink (`O_NOFOLLOW`) nor block on a FIFO
/// (`O_NONBLOCK`), and does not truncate; what it opened is then checked by its fd — a regular
/// file of the caller's, with no other name (one link) — and only then emptied and given
/// `mode`. Anything else is refused with an error naming the path, and left as it was.
pub fn create_operator_file(path: &Path, mode: u32) -> io::Result<File> {
    let refuse = |why: &str| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}: refusing to write it", path.display()),
        )
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse("is a symbolic link"),
            Some(libc::EISDIR) => refuse("is a directory"),
            // O_NONBLOCK: a FIFO with no reader, or a device with nothing behind it.
            Some(libc::ENXIO) => refuse("is not a regular file"),
            _ => io::Error::new(e.kind(), format!("create {}: {e}", path.display())),
        })?;
    let st = fstat(&file).map_err(|e| with_path(e, "stat", path))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refuse("is not a regular file"));
    }
    if st.st_uid != me {
        return Err(refuse(&format!(
            "belongs to uid {}, not to uid {me}",
            st.st_uid
        )));
    }
    if st.st_nlink != 1 {
        return Err(refuse(&format!(
            "has {} names (hard links), so it is also another file",
            st.st_nlink
        )));
    }
    file.set_len(0)
        .map_err(|e| io::Error::new(e.kind(), format!("empty {}: {e}", path.display())))?;
    fchmod(&file, Mode::from_bits_truncate(mode)).map_err(|e| with_path(e, "chmod", path))?;
    Ok(file)
}

/// Write permission for others, or for a group other than root's.
fn writable_by_others(st: &FileStat) -> bool {
    st.st_mode & 0o002 != 0 || (st.st_mode & 0o020 != 0 && st.st_gid != 0)
}

fn with_path(e: Errno, what: &str, path: &Path) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A symlink, a directory, a FIFO, a hard link or another uid's file at an operator's output
    /// path is refused, and left as it was; a file of the caller's is emptied and given its mode.
    #[test]
    fn an_operators_output_file_is_never_written_through_anything_planted() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep me\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&victim, &hard).unwrap();
        for (path, why) in [
            (&link, "is a symbolic link"),
            (&dir.path().to_path_buf(), "is a directory"),
            (&fifo, "is not a regular file"),
            (&hard, "names (hard links)"),
        ] {
            let e = create_operator_file(path, 0o600).unwrap_err();
            assert!(e.to_string().contains(why), "{}: {e}", path.display());
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
        assert_eq!(
            std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        let out = dir.path().join("out");
        std::fs::write(&out, "old content").unwrap();
        let mut f = create_operator_file(&out, 0o600).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            std::fs::write(&theirs, "theirs").unwrap();
            nix::unistd::chown(&theirs, Some(65534.into()), None).unwrap();
            let e = create_operator_file(&theirs, 0o600).unwrap_err();
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
            assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "theirs");
        }
    }

    const STRANGER: u32 = 4242;

    use warren_test_support::dirs::with_mode as base;

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn refused(r: io::Result<impl std::fmt::Debug>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        e.to_string()
    }

    #[test]
    fn a_symlink_planted_at_the_dir_or_above_it_is_not_followed() {
        let shared = base(0o1777);
        let target = base(0o755);
        let link = shared.path().join("run");
        std::os::unix::fs::symlink(target.path(), &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(STRANGER), Some(STRANGER)).unwrap();
        let e = refused(make_dir(&link, 0, 0, 0o750));
        assert!(e.contains("symlink"), "{e}");
        let e = refused(make_dir(&link.join("sub"), 0, 0, 0o750));
        assert!(e.contains("symlink"), "{e}");
        let meta = std::fs::metadata(target.path()).unwrap();
        assert_eq!((meta.uid(), mode_of(target.path())), (0, 0o755));
        assert!(!target.path().join("sub").exists());
    }

    #[test]
    fn a_world_writable_ancestor_that_is_not_sticky_is_refused() {
        let open = base(0o777);
        let e = refused(make_dir(&open.path().join("a/run"), 0, 0, 0o750));
        assert!(e.contains("not sticky"), "{e}");
        assert!(!open.path().join("a").exists(), "nothing is made under it");
        // Group-writable for a group other than root's counts as writable by others.
        let group = base(0o770);
        std::os::unix::fs::chown(group.path(), None, Some(STRANGER)).unwrap();
        refused(make_dir(&group.path().join("run"), 0, 0, 0o750));
    }

    #[test]
    fn a_foreign_child_of_a_sticky_ancestor_is_refused_and_ours_is_taken() {
        let shared = base(0o1777);
        let theirs = shared.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(STRANGER), Some(STRANGER)).unwrap();
        let e = refused(make_dir(&theirs, 0, 0, 0o750));
        assert!(e.contains("belongs to uid 4242"), "{e}");
        refused(make_dir(&theirs.join("run"), 0, 0, 0o750));
        assert_eq!(std::fs::metadata(&theirs).unwrap().uid(), STRANGER);
        assert!(!theirs.join("run").exists());
        // Ours (made here, or root's already) is taken, and given its owner and mode.
        let ours = shared.path().join("ours/run");
        make_dir(&ours, STRANGER, STRANGER, 0o750).unwrap();
        let meta = std::fs::metadata(&ours).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), mode_of(&ours)),
            (STRANGER, STRANGER, 0o750)
        );
        assert_eq!(mode_of(&shared.path().join("ours")), 0o755);
        make_dir(&ours, STRANGER, STRANGER, 0o700).unwrap();
        assert_eq!(mode_of(&ours), 0o700);
    }

    /// Attack: an ancestor that another user owns (0755: no write bit for group or others) is
    /// writable by that user all the same, who can rename warren's dir away and put their own in
    /// its place (sockets that answer root's `warren approvals`, a data dir of theirs) once `up`
    /// has checked and made it. It must be refused like a world-writable one.
    #[test]
    fn an_ancestor_another_user_owns_is_refused() {
        let parent = base(0o755);
        let theirs = parent.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(STRANGER), Some(STRANGER)).unwrap();
        let run = theirs.join("run");
        let made = make_dir(&run, 0, 0, 0o750);
        assert!(
            made.is_err(),
            "{} was made and taken under {} (uid {STRANGER}'s), who can rename it away",
            run.display(),
            theirs.display()
        );
    }

    #[test]
    fn an_existing_dir_of_another_uid_or_writable_by_others_is_refused() {
        let parent = base(0o755);
        let theirs = parent.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(STRANGER), None).unwrap();
        refused(make_dir(&theirs, 0, 0, 0o700));
        let open = parent.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        refused(make_dir(&open, 0, 0, 0o700));
        assert_eq!(mode_of(&open), 0o777, "refused before any change");
    }

    #[test]
    fn a_planted_or_shared_file_is_refused() {
        let dir = base(0o700);
        let planted = dir.path().join("receipts.db");
        std::fs::write(&planted, b"").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::chown(&planted, Some(STRANGER), Some(STRANGER)).unwrap();
        let e = refused(open_own_file(&planted, true));
        assert!(e.contains("owner uid 4242"), "{e}");
        refused(check_own_file_if_present(&planted));
        std::os::unix::fs::chown(&planted, Some(0), Some(0)).unwrap();
        refused(open_own_file(&planted, true));
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).unwrap();
        open_own_file(&planted, false).unwrap();
        let link = dir.path().join("gate.db");
        std::os::unix::fs::symlink(&planted, &link).unwrap();
        let e = refused(open_own_file(&link, true));
        assert!(e.contains("symlink"), "{e}");
        refused(check_own_file_if_present(&link));
        check_own_file_if_present(&dir.path().join("absent-wal")).unwrap();
        let made = dir.path().join("new.db");
        open_own_file(&made, true).unwrap();
        assert_eq!(mode_of(&made), 0o600);
    }
}
