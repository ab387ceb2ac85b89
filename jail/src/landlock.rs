//! Step 5: Landlock (ABI V7, pinned and tested here). The filesystem rights are always handled:
//! read and execute on the view, write only where the namespace may write. TCP is handled (and
//! so denied) under `net none`, and under `net proxy` but for connect to the proxy's port;
//! abstract-socket and signal scopes always. Anything short of
//! FullyEnforced is refused unless the operator passed `--weaker-landlock`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The network a confined process has, as Landlock sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// No network at all: TCP bind and connect denied (the namespace has only a down `lo`).
    None,
    /// `lo` up, TCP unrestricted on it (there is nothing else).
    Loopback,
    /// TCP connect to this port only (the egress proxy's listener), no bind.
    Proxy { port: u16 },
}

pub const LANDLOCK_ABI: ABI = ABI::V7;

/// What the payload may read and write, as paths in the new root.
pub struct View {
    pub read: Vec<String>,
    pub write: Vec<String>,
    /// Device files that must stay writable (null, zero, full, tty, ptmx) and the pts dir.
    pub devices: Vec<String>,
    /// 9P mounts, as O_PATH fds of their FUSE roots (an O_PATH open of a mount root sends no FUSE
    /// request). Files there may be read and written (a call file is written, then read) but
    /// nothing may be created, removed or linked; the bridge and the server decide the rest.
    pub ninep: Vec<std::os::fd::OwnedFd>,
    pub net: Network,
}

/// Restricts the calling thread (and what it forks and execs). Returns a one-line status.
pub fn restrict(view: &View, weaker_landlock: bool) -> Result<String, String> {
    let abi = LANDLOCK_ABI;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| format!("landlock fs: {e}"))?
        .scope(Scope::from_all(abi))
        .map_err(|e| format!("landlock scope: {e}"))?;
    if matches!(view.net, Network::None | Network::Proxy { .. }) {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| format!("landlock net: {e}"))?;
    }
    let mut created = ruleset
        .create()
        .map_err(|e| format!("landlock create: {e}"))?;
    if let Network::Proxy { port } = view.net {
        // TCP connect to the proxy's port only (on any address: the network namespace has
        // nothing but `lo`); no bind at all.
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| format!("landlock net rule: {e}"))?;
    }
    let rules = view
        .read
        .iter()
        .map(|p| (p, AccessFs::from_read(abi)))
        .chain(view.write.iter().map(|p| (p, AccessFs::from_all(abi))))
        .chain(view.devices.iter().map(|p| (p, AccessFs::from_all(abi))));
    if !view.ninep.is_empty() {
        // A dup of the ruleset's fd: rules added through it land in the same ruleset.
        let ruleset: Option<std::os::fd::OwnedFd> = created
            .try_clone()
            .map_err(|e| format!("landlock ruleset: {e}"))?
            .into();
        let ruleset = ruleset.ok_or("landlock ruleset has no fd")?;
        let access = (AccessFs::from_read(abi) | AccessFs::WriteFile | AccessFs::Truncate).bits();
        for fd in &view.ninep {
            landlock_add_path_rule(
                std::os::fd::AsFd::as_fd(&ruleset),
                std::os::fd::AsFd::as_fd(fd),
                access,
            )
            .map_err(|e| format!("landlock rule on a 9P mount: {e}"))?;
        }
    }
    for (path, access) in rules {
        let fd = match PathFd::new(path) {
            Ok(fd) => fd,
            // A device the host lacks (e.g. no /dev/tty) simply has no rule.
            Err(_) if view.devices.contains(path) => continue,
            Err(e) => return Err(format!("landlock rule {path}: {e}")),
        };
        let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
        let access = if is_dir {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| format!("landlock rule {path}: {e}"))?;
    }
    let status = created
        .restrict_self()
        .map_err(|e| format!("landlock restrict_self: {e}"))?;
    let line = format!(
        "landlock {:?} no_new_privs={} abi={:?}",
        status.ruleset, status.no_new_privs, abi
    );
    accept(status.ruleset, weaker_landlock, line)
}

/// The floor: FullyEnforced, or the operator's loud `--weaker-landlock` (never NotEnforced).
fn accept(ruleset: RulesetStatus, weaker_landlock: bool, line: String) -> Result<String, String> {
    match (ruleset, weaker_landlock) {
        (RulesetStatus::FullyEnforced, _) => Ok(line),
        (RulesetStatus::PartiallyEnforced, true) => {
            Ok(format!("{line} (WEAKER: --weaker-landlock)"))
        }
        (RulesetStatus::NotEnforced, _) => Err(format!(
            "{line}: Landlock is not enforced at all; refusing to run"
        )),
        (_, false) => Err(format!(
            "{line}: refusing to run without a fully enforced Landlock V7 ruleset \
             (pass --weaker-landlock to accept it, loudly)"
        )),
    }
}

/// `landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, {access, parent})`, without the
/// `fstat` of `parent` the landlock crate makes: on a FUSE root that stat waits for the bridge's
/// INIT (or fails if the server is gone), while the kernel itself only looks at the dentry's type.
fn landlock_add_path_rule(
    ruleset: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    access: u64,
) -> io::Result<()> {
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: the kernel reads the packed attr (uapi struct landlock_path_beneath_attr) from a
    // pointer to a live local; both fds are borrowed and stay open for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_enforcement_passes_without_the_weaker_flag() {
        let l = || "landlock".to_string();
        assert!(accept(RulesetStatus::FullyEnforced, false, l()).is_ok());
        let e = accept(RulesetStatus::PartiallyEnforced, false, l()).unwrap_err();
        assert!(e.contains("--weaker-landlock"), "{e}");
        let ok = accept(RulesetStatus::PartiallyEnforced, true, l()).unwrap();
        assert!(ok.contains("WEAKER"), "{ok}");
        assert!(accept(RulesetStatus::NotEnforced, true, l()).is_err());
        assert!(accept(RulesetStatus::NotEnforced, false, l()).is_err());
    }
}
