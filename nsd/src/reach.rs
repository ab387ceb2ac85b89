//! A non-root operator's namespace may name only what that operator can reach on the host.
//!
//! nsd builds namespaces as root, so a bind source it opened by name would let an operator in
//! the `warren` group see a file under a directory they cannot search (`/root/x`, another
//! user's 0700 home). Instead nsd opens every bind source with the operator's filesystem
//! credentials — fsuid, fsgid and supplementary groups, set on a thread of its own, as Linux
//! keeps them per thread — and builds from those handles (`warren_ns::handles`), never from the
//! names again: bind sources and tool roots alike. A keyed mount's `-k` names a peer in the
//! operator's peers file, not a path, so there is nothing of it to open here.

use std::ffi::CString;
use std::io;

use warren_ns::confine::guard::Guard;
use warren_ns::handles::{Built, OpenError, open_spec};
use warren_ns::spec::Spec;

/// The credentials the host gives `uid`: its passwd group and every group it is a member of.
struct Credentials {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Credentials {
    fn of(uid: u32) -> io::Result<Credentials> {
        let user = nix::unistd::User::from_uid(uid.into())
            .map_err(io::Error::from)?
            .ok_or_else(|| io::Error::other(format!("uid {uid} has no passwd entry")))?;
        let name = CString::new(user.name.as_str()).map_err(io::Error::other)?;
        let groups = nix::unistd::getgrouplist(&name, user.gid).map_err(io::Error::from)?;
        Ok(Credentials {
            uid,
            gid: user.gid.as_raw(),
            groups: groups.into_iter().map(|g| g.as_raw()).collect(),
        })
    }

    /// Takes these credentials for filesystem access, on the calling thread only (raw
    /// syscalls: glibc's wrappers would apply setgroups to every thread of nsd).
    fn assume(&self) -> io::Result<()> {
        // SAFETY: setgroups reads `groups.len()` gids from a live slice; it changes only this
        // thread's credentials.
        let r =
            unsafe { libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: setfsgid/setfsuid take an id by value and change only this thread's ids.
        // They report no error; an id of -1 is refused and only returns the current one,
        // which is how the change is checked.
        let (gid, uid) = unsafe {
            libc::syscall(libc::SYS_setfsgid, self.gid);
            libc::syscall(libc::SYS_setfsuid, self.uid);
            (
                libc::syscall(libc::SYS_setfsgid, u32::MAX),
                libc::syscall(libc::SYS_setfsuid, u32::MAX),
            )
        };
        if gid != i64::from(self.gid) || uid != i64::from(self.uid) {
            return Err(io::Error::other(format!(
                "could not take uid {}'s filesystem credentials",
                self.uid
            )));
        }
        Ok(())
    }
}

/// Runs `f` with operator `uid`'s filesystem credentials, on a thread of its own (Linux keeps
/// them per thread; nsd's other threads keep root's).
pub fn as_operator<T: Send>(uid: u32, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let creds = Credentials::of(uid)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            creds.assume()?;
            Ok(f())
        })
        .join()
    })
    .map_err(|_| io::Error::other("work done as the operator panicked"))?
}

/// `spec` made buildable for operator `uid`: every bind source and tool root opened once, as
/// they would open it, and held (`warren_ns::handles`). Refused, naming the path, when they cannot.
pub fn open_as(spec: &Spec, uid: u32, guard: &Guard) -> io::Result<Built> {
    as_operator(uid, || {
        open_spec(spec, guard).map_err(|e| match e {
            OpenError::Unreachable { what, path, source } => io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("uid {uid} cannot reach {what} `{path}` on the host: {source}"),
            ),
            refused => refused.into(),
        })
    })?
}

/// A directory tree for tests: `open/` anyone can reach, `private/inner/` (0755) under a 0700
/// `private/` only root can.
#[cfg(test)]
pub(crate) struct Fixture {
    pub dir: tempfile::TempDir,
}

#[cfg(test)]
impl Fixture {
    pub(crate) fn new() -> Fixture {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("wreach")
            .tempdir_in("/tmp")
            .unwrap();
        let mode = |p: &std::path::Path, m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        std::fs::create_dir_all(dir.path().join("private/inner")).unwrap();
        std::fs::create_dir(dir.path().join("open")).unwrap();
        mode(dir.path(), 0o755);
        mode(&dir.path().join("private"), 0o700);
        mode(&dir.path().join("private/inner"), 0o755);
        Fixture { dir }
    }

    pub(crate) fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nowhere() -> Guard {
        Guard::new(&warren_ns::ProtectedDirs {
            runtime: "/nonexistent/warren/run".into(),
            data: "/nonexistent/warren/data".into(),
            secrets: "/nonexistent/warren/secrets".into(),
        })
        .unwrap()
    }

    /// As `nobody`, a directory under a 0700 one is refused (by name), while a bind it can reach
    /// is opened and named by its handle; root's own credentials are untouched on the calling
    /// thread.
    #[test]
    fn a_path_the_operator_cannot_search_is_refused() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test changes credentials and needs root (scripts/test runs as root)"
        );
        let f = Fixture::new();
        let (open_dir, inner) = (f.path("open"), f.path("private/inner"));
        let text = format!("bind -r {open_dir} /o\nbind -r {inner} /p\n");
        let spec = warren_ns::spec::parse("<t>", &text).unwrap();
        let e = open_as(&spec, 65534, &nowhere()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains(&format!("bind `{inner}`")), "{e}");
        // Root (the caller) still searches it: only the check's thread changed credentials.
        assert!(std::fs::metadata(&inner).is_ok());

        let reachable = warren_ns::spec::parse("<t>", &format!("bind -r {open_dir} /o\n")).unwrap();
        let built = open_as(&reachable, 65534, &nowhere()).unwrap();
        let held = built.handles.bind(0).unwrap();
        assert_eq!(
            built.build.binds[0].host,
            warren_ns::handles::handle_name(held)
        );
    }
}
