//! warren's own directories (runtime, data, secrets) can never enter a namespace: a bind whose
//! source contains one, or lies inside one, is refused. Compared by (st_dev, st_ino) along the
//! kernel's `..` walk from an already-open handle, never by path strings, so symlinks, bind
//! mounts and `/./` spellings of the same place are all the same place.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use warren_jail::inode::{Ident, ancestry, open_path};

/// The directories no namespace may see: warren-daemon's `Dirs` (WARREN_RUNTIME_DIR,
/// WARREN_DATA_DIR, WARREN_SECRETS_DIR).
pub use warren_daemon::Dirs as ProtectedDirs;

fn named(dirs: &ProtectedDirs) -> [(&'static str, &Path); 3] {
    [
        ("runtime", &dirs.runtime),
        ("data", &dirs.data),
        ("secrets", &dirs.secrets),
    ]
}

struct Protected {
    name: &'static str,
    path: PathBuf,
    /// The directory itself, when it exists.
    itself: Option<Ident>,
    /// The directory (or its deepest existing ancestor) and every ancestor up to `/`.
    chain: Vec<Ident>,
}

/// The protected directories, resolved once.
pub struct Guard {
    protected: Vec<Protected>,
}

impl Guard {
    pub fn new(dirs: &ProtectedDirs) -> io::Result<Guard> {
        let mut protected = Vec::new();
        for (name, path) in named(dirs) {
            // A directory that does not exist yet may be created later, under whatever holds
            // it: protect its deepest existing ancestor's chain so no bind can contain it.
            let mut probe: &Path = path;
            let (itself, fd) = loop {
                match open_path(probe) {
                    Ok(fd) => break (probe == path, fd),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        probe = probe.parent().ok_or(e)?;
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("resolving warren {name} dir {}: {e}", path.display()),
                        ));
                    }
                }
            };
            let chain = ancestry(fd.as_fd())?;
            protected.push(Protected {
                name,
                path: path.to_path_buf(),
                itself: itself.then(|| chain[0]),
                chain,
            });
        }
        Ok(Guard { protected })
    }

    /// Refuses a bind source (already opened, so what is checked is what gets bound).
    pub fn check(&self, source: BorrowedFd<'_>, shown_as: &str) -> Result<(), String> {
        self.check_as("bind", source, shown_as)
    }

    /// [`Guard::check`] for anything else a namespace could reach (`what`: "mount", …).
    pub fn check_as(
        &self,
        what: &str,
        source: BorrowedFd<'_>,
        shown_as: &str,
    ) -> Result<(), String> {
        let chain = ancestry(source).map_err(|e| format!("resolving `{shown_as}`: {e}"))?;
        let me = chain[0];
        for p in &self.protected {
            if p.chain.iter().any(|a| a.same_file(&me)) {
                return Err(format!(
                    "{what} of `{shown_as}` refused: it contains warren's {} dir {}",
                    p.name,
                    p.path.display()
                ));
            }
            if let Some(it) = p.itself
                && chain.iter().any(|a| a.same_file(&it))
            {
                return Err(format!(
                    "{what} of `{shown_as}` refused: it lies inside warren's {} dir {}",
                    p.name,
                    p.path.display()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dirs_in(base: &Path) -> ProtectedDirs {
        ProtectedDirs {
            runtime: base.join("run/warren"),
            data: base.join("var/lib/warren"),
            secrets: base.join("etc/warren/secrets"),
        }
    }

    #[test]
    fn refuses_containing_and_inside_by_inode() {
        let t = tempfile::Builder::new()
            .prefix("wgrd")
            .tempdir_in("/tmp")
            .unwrap();
        let b = t.path();
        std::fs::create_dir_all(b.join("run/warren/sub")).unwrap();
        std::fs::create_dir_all(b.join("var/lib/warren")).unwrap();
        std::fs::create_dir_all(b.join("etc/ssl")).unwrap();
        std::fs::create_dir_all(b.join("home/me")).unwrap();
        symlink(b.join("run"), b.join("home/me/sneaky")).unwrap();
        symlink(b.join("run/warren/sub"), b.join("home/me/deep")).unwrap();
        let g = Guard::new(&dirs_in(b)).unwrap();
        let check = |p: &Path| {
            let fd = open_path(p).unwrap();
            g.check(fd.as_fd(), &p.display().to_string())
        };
        for bad in [
            b.to_path_buf(),
            b.join("run"),
            b.join("run/warren"),
            b.join("run/warren/sub"),
            b.join("home/me/sneaky"),
            b.join("home/me/deep"),
            // the secrets dir does not exist: its existing ancestors are protected
            b.join("etc"),
            PathBuf::from("/"),
        ] {
            let e = check(&bad).expect_err(&bad.display().to_string());
            assert!(e.contains("refused"), "{e}");
        }
        assert!(
            check(&b.join("home/me/deep"))
                .unwrap_err()
                .contains("inside warren's runtime")
        );
        assert!(
            check(&b.join("run"))
                .unwrap_err()
                .contains("contains warren's runtime")
        );
        // var/lib contains the data dir; etc/ssl and home are clean.
        assert!(check(&b.join("var/lib")).is_err());
        check(&b.join("etc/ssl")).unwrap();
        check(&b.join("home/me")).unwrap();
    }
}
