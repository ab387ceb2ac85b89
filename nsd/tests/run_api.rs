//! The library API: `spawn` → `Running`, and what the namespace's own processes hold.

mod common;

use common::*;
use warren_ns::{CliGrants, RunOptions, spawn, spec_from_cli};

fn fds_of(pid: u32) -> Vec<(i32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((n, target.display().to_string()))
        })
        .collect()
}

/// Neither the holder nor the namespace's pid 1 keeps a descriptor the launcher had open (a
/// launcher like nsd holds operator connections). Planted: a non-CLOEXEC file of the launcher.
#[test]
fn namespace_processes_hold_none_of_the_launchers_descriptors() {
    need_root();
    let dir = tempdir("wfds");
    let marker = dir.path().join("launcher-secret");
    let file = std::fs::File::create(&marker).unwrap();
    // Make it inheritable, as a careless launcher's would be.
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let spec = spec_from_cli(None, &CliGrants::default()).unwrap();
    let running = spawn(
        &spec,
        &["/bin/sleep".into(), "600".into()],
        &RunOptions::default(),
    )
    .unwrap();
    let holder = running.holder_pid();
    let children =
        std::fs::read_to_string(format!("/proc/{holder}/task/{holder}/children")).unwrap();
    let pid1: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let name = marker.display().to_string();
    for (who, pid) in [("holder", holder), ("pid 1", pid1)] {
        let fds = fds_of(pid);
        assert!(
            !fds.iter().any(|(_, t)| *t == name),
            "{who} holds the launcher's file: {fds:?}"
        );
    }
    running.kill().unwrap();
    assert_eq!(running.wait().unwrap(), 128 + 9);
    // After the end, the pidfd names a dead process: ESRCH, never another process.
    let again = running.kill().unwrap_err();
    assert_eq!(again.raw_os_error(), Some(libc::ESRCH), "{again}");
}
