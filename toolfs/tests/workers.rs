//! Worker tools through toolfs: a granted root reaches the tool's worker (never toolfs), the
//! worker runs unprivileged, one worker per (connection, tool), gone with its connection.

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;
use warren_toolfs::{Status, Taint};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_read_reads_inside_its_granted_root_as_an_unprivileged_uid() {
    let d = Daemon::start();
    let (dir, fd) = tool_root(&d, "repo");
    std::fs::write(dir.join("notes.md"), "hello from the root\n").unwrap();
    std::fs::set_permissions(dir.join("notes.md"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(dir.join("root-only.txt"), "secret\n").unwrap();
    std::fs::set_permissions(
        dir.join("root-only.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();

    let (_c, root) = d
        .granted(
            &record_with_root(&["fs_read", "echo"], "/repo"),
            &[fd.as_fd()],
        )
        .await;
    assert_eq!(tools_file_names(&root).await, ["echo", "fs_read"]);
    let env = call_envelope(&root, "fs_read", br#"{"path":"/repo/notes.md"}"#).await;
    assert_eq!(env.status, Status::Ok, "{}", env.content);
    assert_eq!(env.taint, Taint::Untrusted);
    assert!(
        env.content.contains("hello from the root"),
        "{}",
        env.content
    );
    assert!(env.digest_matches());
    // The worker is not root: a root-only file stays closed to it.
    let env = call_envelope(&root, "fs_read", br#"{"path":"/repo/root-only.txt"}"#).await;
    assert_eq!(env.status, Status::Error, "{}", env.content);
    assert!(!env.content.contains("secret"));
    // Outside the root there is nothing.
    let env = call_envelope(
        &root,
        "fs_read",
        br#"{"path":"/repo/../../../../etc/passwd"}"#,
    )
    .await;
    assert_eq!(env.status, Status::Error, "{}", env.content);
    assert!(!env.content.contains("root:"), "{}", env.content);
    // Schema violations never reach the worker and name the field.
    let env = call_envelope(&root, "fs_read", br#"{"path":7}"#).await;
    assert_eq!(env.status, Status::Error);
    assert!(
        env.content.contains(r#"/path: 7 is not of type "string""#),
        "{}",
        env.content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_per_connection_and_tool_gone_with_its_connection() {
    let d = Daemon::start();
    let (dir, fd) = tool_root(&d, "r");
    std::fs::write(dir.join("f"), "x").unwrap();
    std::fs::set_permissions(dir.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let grant = record_with_root(&["fs_read", "fs_list"], "/r");
    assert!(d.workers().is_empty(), "workers start lazily");

    let (c1, root1) = d.granted(&grant, &[fd.as_fd(), fd.as_fd()]).await;
    assert!(
        d.workers().is_empty(),
        "workers start lazily, on the first call"
    );
    for _ in 0..3 {
        assert_eq!(
            call_envelope(&root1, "fs_read", br#"{"path":"/r/f"}"#)
                .await
                .status,
            Status::Ok
        );
    }
    assert_eq!(d.workers().len(), 1, "one fs_read worker for three calls");
    assert_eq!(
        call_envelope(&root1, "fs_list", br#"{"path":"/r"}"#)
            .await
            .status,
        Status::Ok
    );
    assert_eq!(d.workers().len(), 2, "a worker per tool");
    let first = d.workers();
    for pid in &first {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid_line
                .split_whitespace()
                .skip(1)
                .all(|u| u == nsd_worker_uid().to_string()),
            "{uid_line}"
        );
    }

    let (_c2, root2) = d.granted(&grant, &[fd.as_fd(), fd.as_fd()]).await;
    assert_eq!(
        call_envelope(&root2, "fs_read", br#"{"path":"/r/f"}"#)
            .await
            .status,
        Status::Ok
    );
    assert_eq!(
        d.workers().len(),
        3,
        "another connection gets its own worker"
    );

    drop(root1);
    drop(c1);
    for _ in 0..500 {
        if d.workers().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = d.workers();
    assert_eq!(
        left.len(),
        1,
        "the first connection's workers are gone: {left:?}"
    );
    assert!(!first.contains(&left[0]));
    // The second connection still works.
    assert_eq!(
        call_envelope(&root2, "fs_read", br#"{"path":"/r/f"}"#)
            .await
            .status,
        Status::Ok
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_its_worker_is_withdrawn_by_a_flush_and_never_runs() {
    let d = Daemon::start();
    let (dir, fd) = tool_root(&d, "w");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (_c, root) = d
        .granted(&record_with_root(&["shell"], "/w"), &[fd.as_fd()])
        .await;
    // A: holds the connection's shell worker until the marker file `go` appears.
    // The command sees the root at /w (its worker's view), the test at `dir`.
    let go = dir.join("go");
    let a_args =
        r#"{"command":"while [ ! -e /w/go ]; do sleep 0.05; done; echo A done"}"#.to_string();
    let a = open_call(&root, "shell").await;
    a.write_all(0, a_args.as_bytes()).await.unwrap();
    let a_len = a_args.len() as u64;
    let a_task = tokio::spawn(async move { a.read_to_end(a_len).await.unwrap() });
    // B: waits for its turn behind A; if it ever ran it would create `ran-b`.
    let ran_b = dir.join("ran-b");
    let b_args = r#"{"command":"touch /w/ran-b"}"#.to_string();
    let b = open_call(&root, "shell").await;
    b.write_all(0, b_args.as_bytes()).await.unwrap();
    tokio::select! {
        r = b.read(b_args.len() as u64, 65536) => panic!("B cannot have run while A holds the worker: {r:?}"),
        () = async {
            // toolfs logs when a call queues behind another on its worker.
            for _ in 0..1000 {
                if d.log().contains("call waits for its turn on the worker") { return }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("B never queued: {}", d.log());
        } => {}
    }
    // B's read was flushed while it waited: withdrawn. Its fid says so and it never runs.
    assert_eq!(
        b.read(b_args.len() as u64, 65536).await.err(),
        Some(warren_9p::Errno::ECANCELED)
    );
    std::fs::write(&go, "").unwrap();
    let a_env = warren_toolfs::Envelope::parse(&a_task.await.unwrap()).unwrap();
    assert!(a_env.content.contains("A done"), "{}", a_env.content);
    // A later call on the same worker runs (so B had every chance to run, had it been queued).
    let env = call_envelope(&root, "shell", br#"{"command":"echo C"}"#).await;
    assert!(env.content.contains('C'), "{}", env.content);
    assert!(!ran_b.exists(), "the withdrawn call ran");
    assert!(
        d.log()
            .contains("call withdrawn: its read was flushed before it started"),
        "{}",
        d.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_toolfs_and_its_workers() {
    let mut d = Daemon::start();
    let (dir, fd) = tool_root(&d, "t");
    std::fs::write(dir.join("f"), "x").unwrap();
    std::fs::set_permissions(dir.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_c, root) = d
        .granted(&record_with_root(&["fs_read"], "/t"), &[fd.as_fd()])
        .await;
    assert_eq!(
        call_envelope(&root, "fs_read", br#"{"path":"/t/f"}"#)
            .await
            .status,
        Status::Ok
    );
    let workers = d.workers();
    assert_eq!(workers.len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    for _ in 0..500 {
        if !d.is_running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!d.is_running(), "toolfs did not stop on SIGTERM");
    // Its lifelines closed with it: nsd's holder kills the worker and reaps it.
    let gone = || !std::path::Path::new(&format!("/proc/{}", workers[0])).exists();
    for _ in 0..500 {
        if gone() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone(), "the worker outlived toolfs");
}
