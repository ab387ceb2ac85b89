//! Interop: diod's client tools (`diodls`, `diodcat`) list and read a tree whose connection was
//! handed over with a grant — the test plays nsd: it accepts diod's connection on a socket of its
//! own and hands the accepted socket to toolfs with the grant. What they list equals the grant.

mod common;

use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Runs `tool args…` against a socket whose one connection toolfs serves with `record`.
fn run_granted(
    d: &Daemon,
    record: &warren_toolfs::GrantRecord,
    tool: &str,
    args: &[&str],
) -> String {
    let sock: PathBuf = d.dir.path().join(format!("{tool}.sock"));
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    let ctl = d.ctl();
    let record = record.clone();
    let nsd = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        warren_toolfs::hand_over(&ctl, &record, conn.as_fd(), &[]).unwrap();
    });
    let out = Command::new(tool)
        .arg("-s")
        .arg(&sock)
        .args(["-a", "/ignored"])
        .args(args)
        .output()
        .unwrap();
    nsd.join().unwrap();
    assert!(
        out.status.success(),
        "{tool} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One of diod's tools, a peer: missing is a failure.
fn need(tool: &str) {
    let found = ["/usr/sbin", "/usr/bin"]
        .iter()
        .any(|d| Path::new(d).join(tool).exists());
    assert!(
        found,
        "{tool} is missing: run scripts/install-test-deps (Debian package diod)"
    );
}

#[test]
fn diodls_and_diodcat_see_exactly_the_grant() {
    need("diodls");
    need("diodcat");
    let d = Daemon::start();
    for grant in [
        vec!["echo"],
        vec!["echo", "fs_read", "shell"],
        vec!["fs_list"],
    ] {
        let record = record(&grant);
        let mut listed: Vec<String> = run_granted(&d, &record, "diodls", &[])
            .lines()
            .map(str::to_owned)
            .collect();
        listed.sort();
        let mut want: Vec<String> = grant.iter().map(|s| s.to_string()).collect();
        want.push("tools".into());
        want.sort();
        assert_eq!(listed, want, "diodls / for grant {grant:?}");
        let tools = run_granted(&d, &record, "diodcat", &["tools"]);
        let names: Vec<&str> = tools
            .lines()
            .map(|l| l.split('\t').next().unwrap())
            .collect();
        assert_eq!(names, grant, "diodcat tools for grant {grant:?}");
    }
    // An empty grant: nothing to list.
    assert_eq!(run_granted(&d, &record(&[]), "diodls", &[]), "");
}
