//! `limit mem= pids= cpu= wall=`.
//!
//! pids and mem go to a cgroup v2 (`/sys/fs/cgroup/warren/<id>`: pids.max, memory.max,
//! memory.swap.max) when /sys/fs/cgroup is a writable cgroup2 root; otherwise they fall back to
//! RLIMIT_NPROC and RLIMIT_AS (said so in the run's status). RLIMIT_NPROC counts processes per
//! real uid, which is per namespace here because each namespace run by root gets its own uid.
//! cpu is total CPU seconds, which only RLIMIT_CPU expresses; wall is a SIGKILL from the
//! namespace's init (`warren_jail::init::supervise`). The rlimits are set by warren-jail
//! (`jail/src/setup.rs`, `apply_rlimits`).

use std::io;
use std::path::{Path, PathBuf};

use crate::spec::Limits;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How pids/mem are enforced for one run.
#[derive(Debug)]
pub enum Enforcement {
    Cgroup(Cgroup),
    Rlimits,
}

impl Enforcement {
    pub fn describe(&self) -> String {
        match self {
            Enforcement::Cgroup(c) => format!("cgroup v2 {}", c.dir.display()),
            Enforcement::Rlimits => {
                "rlimits (no writable cgroup v2 at /sys/fs/cgroup: RLIMIT_NPROC, RLIMIT_AS)".into()
            }
        }
    }
}

/// A cgroup v2 directory owned by one namespace; removed (after cgroup.kill) on drop.
#[derive(Debug)]
pub struct Cgroup {
    pub dir: PathBuf,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Whether namespaces get a cgroup v2 of their own: /sys/fs/cgroup is a cgroup2 root this
/// process may write (`warren doctor` reports the same).
pub fn cgroup2_available() -> bool {
    let root = Path::new(CGROUP_ROOT);
    root.join("cgroup.controllers").exists()
        && nix::unistd::access(root, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// Chooses the enforcement for `limits`, creating the namespace's cgroup when v2 is usable.
pub fn enforcement(limits: &Limits, id: &str) -> io::Result<Enforcement> {
    if (limits.pids.is_none() && limits.mem.is_none()) || !cgroup2_available() {
        return Ok(Enforcement::Rlimits);
    }
    let parent = Path::new(CGROUP_ROOT).join("warren");
    match std::fs::create_dir(&parent) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    write(
        &Path::new(CGROUP_ROOT).join("cgroup.subtree_control"),
        "+pids +memory",
    )?;
    write(&parent.join("cgroup.subtree_control"), "+pids +memory")?;
    let dir = parent.join(id);
    std::fs::create_dir(&dir)?;
    let cg = Cgroup { dir };
    if let Some(p) = limits.pids {
        write(&cg.dir.join("pids.max"), &p.to_string())?;
    }
    if let Some(m) = limits.mem {
        write(&cg.dir.join("memory.max"), &m.to_string())?;
        write(&cg.dir.join("memory.swap.max"), "0")?;
    }
    Ok(Enforcement::Cgroup(cg))
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        let _ = std::fs::remove_dir(&self.dir);
    }
}
