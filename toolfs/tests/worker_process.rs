//! The worker process itself: who it runs as, what it holds, how it survives bad requests and
//! failing tools, and how toolfs kills it.

mod tools_support;

use std::time::Duration;

use serde_json::json;
use tools_support::*;
use warren_toolfs::worker::Worker;

fn status_field(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn the_worker_runs_as_the_given_uid_holding_only_its_fds() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    let b = scratch.worker_dir("b");
    let w = spawn("shell", &[("/a", &a, true), ("/b", &b, false)]);
    let out = call(
        &w,
        json!({"command": "id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapEff)' /proc/self/status"}),
    )
    .await;
    assert_eq!(
        assert_ok(&out),
        "65534\n65534\n65534\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\n[exit status 0]"
    );
    let pid = w.pid();
    assert_eq!(status_field(pid, "Uid"), "65534 65534 65534 65534");
    assert_eq!(status_field(pid, "Gid"), "65534 65534 65534 65534");
    assert_eq!(status_field(pid, "Groups"), "");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm"), "0000000000000000");
    // stdin, stdout, stderr, the socket and the two roots: nothing else crossed over.
    let mut held: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let fd: i32 = name.parse().unwrap();
            let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
            match fd {
                0..=2 => format!("std{fd}"),
                _ if target.to_string_lossy().starts_with("socket:") => "socket".to_string(),
                _ => target.display().to_string(),
            }
        })
        .collect();
    held.sort();
    let mut expected = vec![
        "socket".to_string(),
        "std0".into(),
        "std1".into(),
        "std2".into(),
        a.display().to_string(),
        b.display().to_string(),
    ];
    expected.sort();
    assert_eq!(held, expected);
    // The command inherits none of the worker's fds beyond 0-2.
    let fds = call(&w, json!({"command": "ls /proc/self/fd"})).await;
    assert_eq!(
        assert_ok(&fds),
        "0\n1\n2\n3\n[exit status 0]",
        "fd 3 is ls's own directory handle"
    );
}

/// The drop sets the groups; it does not merely inherit none: a toolfs that holds supplementary
/// groups (here, this test process) must not pass them to its worker.
#[tokio::test]
async fn a_worker_started_by_a_process_with_groups_holds_none() {
    nix::unistd::setgroups(&[
        nix::unistd::Gid::from_raw(4),
        nix::unistd::Gid::from_raw(27),
    ])
    .expect("setgroups: the test runs as root");
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    let w = spawn("shell", &[("/a", &a, true)]);
    assert_eq!(status_field(w.pid(), "Groups"), "");
    assert_eq!(status_field(w.pid(), "Uid"), "65534 65534 65534 65534");
}

#[test]
fn uid_or_gid_zero_is_refused() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    for (uid, gid) in [(0, WORKER_GID), (WORKER_UID, 0), (0, 0)] {
        let err = Worker::spawn_unconfined("fs_read", &authority(&[("/a", &a, false)]), uid, gid)
            .err()
            .expect("spawn as 0 must fail");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    }
    let err = Worker::spawn_unconfined(
        "echo",
        &authority(&[("/a", &a, false)]),
        WORKER_UID,
        WORKER_GID,
    )
    .err()
    .expect("echo has no worker");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let err = Worker::spawn_unconfined(
        "fs_read",
        &authority(&[("relative", &a, false)]),
        WORKER_UID,
        WORKER_GID,
    )
    .err()
    .expect("relative root path");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn malformed_requests_and_tool_errors_leave_the_worker_serving() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    worker_file(&a.join("f"), b"content");
    let w = spawn("fs_read", &[("/a", &a, false)]);
    for bad in [
        &b"{not json"[..],
        b"[]",
        br#"{"path":"f","extra":1}"#,
        br#"{"path":7}"#,
        br#"{"path":"f","offset":-1}"#,
    ] {
        let out = w
            .call(bad, CALL_TIMEOUT)
            .await
            .expect("an error answer, not a dead worker");
        assert_refused(&out, &["fs_read: bad arguments"]);
    }
    let err = w
        .call(&[0xff, 0xfe], CALL_TIMEOUT)
        .await
        .expect_err("non-UTF-8 arguments");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_refused(
        &call(&w, json!({"path": "missing"})).await,
        &["no such file"],
    );
    assert_eq!(assert_ok(&call(&w, json!({"path": "f"})).await), "content");
    assert!(w.is_alive());
}

#[tokio::test]
async fn a_stuck_worker_is_killed_at_the_timeout_and_reaped() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    worker_file(&a.join("f"), b"content");
    let w = spawn("fs_read", &[("/a", &a, false)]);
    let pid = w.pid();
    // Freeze the worker: it can neither answer nor apply its own deadline.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let err = w
        .call(br#"{"path":"f"}"#, Duration::from_millis(500))
        .await
        .expect_err("no answer from a stopped worker");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(!w.is_alive());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "killed and reaped, not a zombie"
    );
    let err = w
        .call(br#"{"path":"f"}"#, CALL_TIMEOUT)
        .await
        .expect_err("a dead worker answers nothing");
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
}

#[tokio::test]
async fn dropping_the_worker_kills_and_reaps_it() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    let w = spawn("fs_list", &[("/a", &a, false)]);
    let pid = w.pid();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    drop(w);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[tokio::test]
async fn a_worker_that_dies_mid_call_is_an_error_not_a_hang() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    let w = std::sync::Arc::new(spawn("shell", &[("/a", &a, true)]));
    // (The command itself cannot reach its worker: it is pid 1 of its own pid namespace, where
    // the worker has no pid. The test kills the worker from outside, mid-call.)
    let running = {
        let w = w.clone();
        tokio::spawn(async move {
            w.call(br#"{"command":"touch started; sleep 5"}"#, CALL_TIMEOUT)
                .await
        })
    };
    let started = a.join("started");
    for _ in 0..2000 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(started.exists(), "the command never started");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let err = running.await.unwrap().expect_err("the worker died");
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
    assert!(!w.is_alive());
}

#[tokio::test]
async fn dropping_the_worker_mid_call_kills_the_running_command_group() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    let w = std::sync::Arc::new(spawn("shell", &[("/a", &a, true)]));
    let job = unique_sleep();
    let running = {
        let w = w.clone();
        let args = serde_json::json!({
            "command": format!("sleep {job} >/dev/null 2>&1 & touch started; sleep 1000")
        })
        .to_string();
        tokio::spawn(async move {
            let _ = w.call(args.as_bytes(), CALL_TIMEOUT).await;
        })
    };
    let started = a.join("started");
    for _ in 0..2000 {
        if started.exists() && !pids_with_arg(&job).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        !pids_with_arg(&job).is_empty(),
        "the background job never ran"
    );
    // The connection goes away: its call is withdrawn and its worker dropped.
    running.abort();
    let _ = running.await;
    let worker_pid = w.pid();
    drop(w);
    assert!(!std::path::Path::new(&format!("/proc/{worker_pid}")).exists());
    assert!(
        wait_no_process_with_arg(&job),
        "the command's background job outlived its worker"
    );
}
