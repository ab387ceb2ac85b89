//! warren's three directories, made with their owners and modes before any daemon starts (by
//! `up` and again by the supervisor, which systemd may start alone), and the operator group.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_daemon::identity::Role;

use crate::daemons::DAEMONS;
use crate::state::operator_gid;

/// Creates the `warren` system group if the host has none: its members are operators, and the
/// daemons carry it so they can reach each other's sockets in the 0750 runtime dir.
pub(crate) fn ensure_operator_group() -> Result<()> {
    if nix::unistd::Group::from_name("warren")?.is_some() {
        return Ok(());
    }
    let status = std::process::Command::new("groupadd")
        .args(["--system", "warren"])
        .status()
        .context("run groupadd to create the warren group")?;
    if !status.success() && nix::unistd::Group::from_name("warren")?.is_none() {
        bail!("groupadd --system warren failed ({status})");
    }
    Ok(())
}

/// The daemons run under their own uids: every directory above warren's three must let them
/// pass (search permission for others), or they die at start with EACCES.
pub(crate) fn check_reachable(dirs: &Dirs) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    for dir in [&dirs.runtime, &dirs.data, &dirs.secrets] {
        let absolute = std::path::absolute(dir)?;
        for ancestor in absolute.ancestors().skip(1) {
            let Ok(meta) = fs::metadata(ancestor) else {
                continue;
            };
            if meta.mode() & 0o001 == 0 {
                bail!(
                    "{} (mode {:o}) is not searchable by others, so the daemons, each under its \
                     own uid, could not reach {}: give it o+x or choose other directories",
                    ancestor.display(),
                    meta.mode() & 0o7777,
                    dir.display()
                );
            }
        }
    }
    Ok(())
}

/// Creates the three directories with their owners and modes, following no symlink and taking
/// none another user could have made or could replace (warren_daemon::dirs::make_dir).
pub(crate) fn prepare_dirs(dirs: &Dirs) -> Result<()> {
    check_reachable(dirs)?;
    let make = |path: &Path, mode: u32, uid: u32, gid: u32| -> Result<()> {
        warren_daemon::dirs::make_dir(path, uid, gid, mode)
            .with_context(|| format!("prepare {}", path.display()))?;
        Ok(())
    };
    make(&dirs.runtime, 0o750, 0, operator_gid())?;
    make(&dirs.data, 0o751, 0, 0)?;
    make(
        &dirs.secrets,
        0o700,
        Role::Receiptd.uid(),
        Role::Receiptd.uid(),
    )?;
    for d in DAEMONS {
        make(&dirs.data.join(d.name), 0o700, d.uid(), d.uid())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const STRANGER: u32 = 4242;

    use warren_test_support::dirs::with_mode as base;

    fn dirs_in(base: &Path, runtime: &Path, data: &Path) -> Dirs {
        Dirs {
            runtime: runtime.to_path_buf(),
            data: data.to_path_buf(),
            secrets: base.join("secrets"),
        }
    }

    fn owner_and_mode(p: &Path) -> (u32, u32) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.mode() & 0o7777)
    }

    /// Another user plants `<shared>/run` as a symlink to a directory of theirs: `up` neither
    /// follows it nor chowns the target.
    #[test]
    fn up_follows_no_symlink_planted_at_its_runtime_dir() {
        let shared = base(0o1777);
        let target = base(0o755);
        std::os::unix::fs::chown(target.path(), Some(STRANGER), Some(STRANGER)).unwrap();
        let link = shared.path().join("run");
        std::os::unix::fs::symlink(target.path(), &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(STRANGER), Some(STRANGER)).unwrap();
        let dirs = dirs_in(shared.path(), &link, &shared.path().join("data"));
        let e = format!("{:#}", prepare_dirs(&dirs).unwrap_err());
        assert!(e.contains("symlink"), "{e}");
        assert_eq!(owner_and_mode(target.path()), (STRANGER, 0o755));
    }

    /// Another user pre-creates `<shared>/data` in a sticky world-writable dir: `up` refuses it
    /// rather than taking it over (they could have planted files in it, or keep a handle).
    #[test]
    fn up_refuses_a_data_dir_another_user_made_in_a_sticky_dir() {
        let shared = base(0o1777);
        let data = shared.path().join("data");
        fs::create_dir(&data).unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&data, Some(STRANGER), Some(STRANGER)).unwrap();
        let dirs = dirs_in(shared.path(), &shared.path().join("run"), &data);
        let e = format!("{:#}", prepare_dirs(&dirs).unwrap_err());
        assert!(e.contains("belongs to uid 4242"), "{e}");
        assert_eq!(owner_and_mode(&data), (STRANGER, 0o755));
        assert!(!data.join("receiptd").exists());
    }

    /// A world-writable parent that is not sticky lets anyone rename warren's dir away and put
    /// their own in its place: refused.
    #[test]
    fn up_refuses_a_world_writable_ancestor_that_is_not_sticky() {
        let open = base(0o777);
        let dirs = Dirs::under(open.path());
        let e = format!("{:#}", prepare_dirs(&dirs).unwrap_err());
        assert!(e.contains("not sticky"), "{e}");
        assert!(!open.path().join("run").exists());
    }

    /// Under a sticky world-writable dir, directories `up` makes itself are fine.
    #[test]
    fn up_makes_its_dirs_in_a_sticky_dir() {
        let shared = base(0o1777);
        let dirs = Dirs::under(shared.path().join("w"));
        prepare_dirs(&dirs).unwrap();
        assert_eq!(owner_and_mode(&dirs.runtime), (0, 0o750));
        assert_eq!(owner_and_mode(&dirs.data), (0, 0o751));
        assert_eq!(
            owner_and_mode(&dirs.data.join("receiptd")),
            (Role::Receiptd.uid(), 0o700)
        );
        assert_eq!(owner_and_mode(&dirs.secrets), (Role::Receiptd.uid(), 0o700));
    }
}
