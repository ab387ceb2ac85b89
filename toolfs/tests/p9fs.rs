//! Interop: Python p9fs (an independent 9P2000.L client) on a connection handed over with a
//! grant lists `/`, reads `tools` and runs calls — and sees exactly the grant.

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use common::*;

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");

fn run_p9fs(
    d: &Daemon,
    record: &warren_toolfs::GrantRecord,
    roots: &[std::os::fd::BorrowedFd<'_>],
    calls: &serde_json::Value,
) -> serde_json::Value {
    let sock = d.hand_over(record, roots).unwrap();
    // Inherited by python (and nothing else holds it open afterwards).
    nix::fcntl::fcntl(
        &sock,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let out = Command::new(PYTHON)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/p9fs_peer.py"))
        .arg(sock.as_raw_fd().to_string())
        .arg(calls.to_string())
        .output()
        .unwrap();
    drop(sock);
    assert!(
        out.status.success(),
        "p9fs failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The venv's Python with p9fs, a peer: missing is a failure.
fn need_p9fs() {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: run scripts/install-test-deps (it installs p9fs)"
    );
}

#[test]
fn p9fs_lists_the_grant_and_runs_echo() {
    need_p9fs();
    let d = Daemon::start();
    let seen = run_p9fs(
        &d,
        &record(&["echo"]),
        &[],
        &serde_json::json!([["echo", r#"{"via": "p9fs"}"#]]),
    );
    assert_eq!(seen["root"], serde_json::json!(["echo", "tools"]));
    let tools = seen["tools"].as_str().unwrap();
    assert!(
        tools.starts_with("echo\tread\t") && tools.lines().count() == 1,
        "{tools}"
    );
    let call = &seen["calls"][0];
    assert_eq!(call["envelope"]["status"], "ok");
    assert_eq!(call["envelope"]["content"], r#"{"via":"p9fs"}"#);
    assert_eq!(call["envelope"]["taint"], "untrusted");
    assert_eq!(call["tail"], 0);
}

#[test]
fn p9fs_runs_fs_read_in_a_granted_root() {
    need_p9fs();
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    let (dir, fd) = tool_root(&d, "proj");
    std::fs::write(dir.join("README"), "read me via p9fs\n").unwrap();
    std::fs::set_permissions(dir.join("README"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let grant = record_with_root(&["echo", "fs_read"], "/proj");
    let seen = run_p9fs(
        &d,
        &grant,
        &[fd.as_fd()],
        &serde_json::json!([["fs_read", r#"{"path":"/proj/README"}"#], ["echo", "{}"]]),
    );
    assert_eq!(
        seen["root"],
        serde_json::json!(["echo", "fs_read", "tools"])
    );
    let listed: Vec<&str> = seen["tools"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(listed, ["echo", "fs_read"]);
    let read = &seen["calls"][0]["envelope"];
    assert_eq!(read["status"], "ok", "{read}");
    assert!(
        read["content"]
            .as_str()
            .unwrap()
            .contains("read me via p9fs"),
        "{read}"
    );
    assert_eq!(read["taint"], "untrusted");
    assert_eq!(seen["calls"][1]["envelope"]["content"], "{}");
}
