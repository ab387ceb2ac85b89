//! `warren attach` against the real daemons: a command inside a namespace `warren run` started,
//! confined as that namespace's payload. Needs root, /dev/fuse and the workspace's binaries.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::Warren;

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The children of `pid` (its main thread's).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn real_uid(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string()
}

/// The namespace started by `spawn_sh`: its id and holder pid, once its command runs.
fn started(w: &Warren) -> (String, u32) {
    let mut found = None;
    wait_until("the namespace's command starts", || {
        let out = w.run(&["ls", "/ns"]);
        let Some(id) = text(&out.stdout)
            .lines()
            .map(|l| l.trim_end_matches('/').to_string())
            .find(|l| l.parse::<u64>().is_ok())
        else {
            return false;
        };
        let info = text(&w.run(&["cat", &format!("/ns/{id}/info")]).stdout);
        found = info
            .lines()
            .find_map(|l| l.strip_prefix("holder "))
            .and_then(|h| h.parse().ok())
            .map(|h| (id, h));
        found.is_some()
    });
    found.unwrap()
}

/// `warren attach ID -- sh -c 'id -u; cat /tool/tools'` runs under the namespace's own uid (its
/// payload's, never 0) and sees exactly the namespace's tools; no host secret and no daemon
/// socket is there; the namespace runs on after the attached command ends. A missing id is a
/// clear error (exit 1), and a peer that is no operator is refused before nsd reads a byte.
#[test]
fn an_attached_shell_is_the_namespaces_uid_tools_and_nothing_more() {
    let w = Warren::up();
    let mut launcher = w.spawn_sh(
        &["--asks", "operator", "--tool", "echo", "--tool", "fs_read"],
        "sleep 600",
    );
    let (id, holder) = started(&w);
    // The payload: pid 1's child (pid 1 is the holder's only child).
    let mut payload = None;
    wait_until("the payload runs", || {
        payload = children(holder)
            .first()
            .and_then(|pid1| children(*pid1).first().copied());
        payload.is_some()
    });
    let payload_uid = real_uid(payload.unwrap());
    assert_ne!(payload_uid, "0");

    let out = w.run(&["attach", &id, "--", "sh", "-c", "id -u; cat /tool/tools"]);
    assert!(out.status.success(), "attach: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(payload_uid.as_str()), "{stdout}");
    let tools: Vec<&str> = lines.map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(tools, ["echo", "fs_read"], "{stdout}");

    let runtime = w.runtime().display().to_string();
    let script = format!(
        "for p in /etc/shadow {runtime}/ns.run {runtime}/ns.sock {runtime}/tool.sock \
         {runtime}/gate.sock {runtime}/receipts.sock /tool/shell; do \
           test -e \"$p\" && echo \"PRESENT $p\"; done; hostname; echo done"
    );
    let out = w.run(&["attach", &id, "--", "sh", "-c", &script]);
    assert!(out.status.success(), "attach: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "warren\ndone\n", "{}", text(&out.stderr));
    // The controls: the same paths exist outside.
    for p in ["ns.run", "ns.sock", "tool.sock"] {
        assert!(w.runtime().join(p).exists(), "{p} missing outside");
    }
    // The exit status comes back; the namespace runs on.
    let out = w.run(&["attach", &id, "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert!(
        std::path::Path::new(&format!("/proc/{holder}")).exists(),
        "the namespace ended with an attached command"
    );

    // A missing id: a clear error, exit 1.
    let out = w.run(&["attach", "99999", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no running namespace 99999"),
        "{}",
        text(&out.stderr)
    );

    // A non-operator (nobody, not in the warren group) who can reach the socket — opened up
    // here on purpose, past the filesystem's own 0660 — is refused by nsd itself.
    for dir in [w.base.path().to_path_buf(), w.runtime()] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o005)).unwrap();
    }
    let sock = w.runtime().join("ns.run");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = w
        .cmd(&["attach", &id, "--", "id", "-u"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("only an operator"),
        "{}",
        text(&out.stderr)
    );

    launcher.kill().unwrap();
    launcher.wait().unwrap();
}
